"""A two-feed blending tank whose steady state matters, binding `blend-1` (template steady_response@1).

A rich feed (10 g/L, MV `f_rich`, m3/h) and a lean feed (2 g/L, MV `f_lean`, m3/h) mix in a tank of
0.5 m2 that drains through a valve, outflow = K sqrt(level). Both CVs are nonlinear in the MVs
at steady state: the product concentration (`conc`, g/L) is the flow-weighted mean of the feeds, a
ratio; the level (`level`, m) grows with the square of the total flow.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from optimizer_pipeline.plants.base import Excitation, Plant

AREA = 0.5  # tank cross-section, m^2
DRAIN = 6.0  # outflow coefficient K, (m3/h) / sqrt(m)
FEED_CONC = np.array([10.0, 2.0])  # rich, lean feed concentration, g/L
MIN_LEVEL = 0.01  # m; keeps the concentration balance finite if a plan empties the tank
HOUR_S = 3600.0

BINDING: dict[str, Any] = {
    "id": "blend-1",
    "unit": "two-feed blending tank",
    "sample_period_s": 30,
    "mvs": [
        {"tag": "f_rich", "lo": 0.5, "hi": 6.0, "max_move": 1.2},
        {"tag": "f_lean", "lo": 0.5, "hi": 6.0, "max_move": 1.2},
    ],
    "cvs": [
        {"tag": "conc", "lo": 3.0, "hi": 9.0, "target": 7.0, "weight": 1.0},
        {"tag": "level", "lo": 0.2, "hi": 2.5, "target": 1.2, "weight": 1.0},
    ],
    "dvs": [],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 10},
    "profile": {"id": "blend-steady", "version": 1, "template": "steady_response@1",
                "horizon": 1, "move_weight": 0.1, "valid_for_s": 7200},
}


@dataclass(frozen=True)
class BlendTank(Plant):
    """States level (m) and concentration (g/L); MVs m3/h. Time constants ~5 min (conc), ~10 min (level)."""

    name: ClassVar[str] = "blend"
    binding: ClassVar[dict[str, Any]] = BINDING
    n_cont: ClassVar[int] = 2
    settling_time_s: ClassVar[float] = 11000.0  # level ~900 s at the top of the band
    substeps: ClassVar[int] = 5
    cv_noise: ClassVar[tuple[float, ...]] = (0.03, 0.005)
    # runs of 5 h: the steady target's evidence scores the settled response over ~60 samples, so
    # 300-sample runs would give the 2 val runs only 8 blocks (empirical_max) instead of 18
    history_run_length: ClassVar[int] = 600
    excitation: ClassVar[Excitation] = Excitation(
        mv_band=((1.5, 4.5), (1.5, 4.5)),
        mv_hold=(5, 40),
        mv_live=(3.0, 3.0),  # conc 6 g/L, level 1 m; targets 7 g/L, 1.2 m
        live_hold_fraction=0.5,  # the level settles slowly (~12 min time constant high in the band)
    )

    def _rhs(self, xc: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        level = np.maximum(xc[:, 0], MIN_LEVEL)
        conc = xc[:, 1]
        outflow = DRAIN * np.sqrt(level)
        dlevel = (u.sum(axis=1) - outflow) / (AREA * HOUR_S)
        # d(level * conc)/dt = feeds in - outflow; minus conc * dlevel leaves the mixing term
        dconc = (u @ FEED_CONC - u.sum(axis=1) * conc) / (AREA * level * HOUR_S)
        return np.stack([dlevel, dconc], axis=1)

    def _outputs(self, xc: np.ndarray) -> np.ndarray:
        return xc[:, ::-1]  # CVs in binding order: conc, level

    def _equilibrium(self, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        total = u.sum()
        return np.array([(total / DRAIN) ** 2, (u @ FEED_CONC) / total])


# The same tank run for profit: every m3/h of product sells at 3, the rich feed costs 2 and the lean
# 0.5 per m3/h, so the costs below are feed cost minus product value (negative: profit). The product's
# concentration is held at 7 g/L; the level has no target, only limits: the economic optimum runs the
# tank as full as allowed (throughput grows with level), 1.4 m -> 7.1 m3/h, rich 4.44 / lean 2.66.
ECONOMIC_BINDING: dict[str, Any] = {
    "id": "blend-econ-1",
    "unit": "two-feed blending tank, run for profit",
    "sample_period_s": 30,
    "mvs": [
        {"tag": "f_rich", "lo": 0.5, "hi": 6.0, "max_move": 1.6, "cost": -1.0},
        {"tag": "f_lean", "lo": 0.5, "hi": 6.0, "max_move": 1.6, "cost": -2.5},
    ],
    "cvs": [
        {"tag": "conc", "lo": 3.0, "hi": 9.0, "target": 7.0, "weight": 1.0},
        {"tag": "level", "lo": 0.2, "hi": 1.4},
    ],
    "dvs": [],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 10},
    "profile": {"id": "blend-profit", "version": 1, "template": "steady_response@1",
                "horizon": 1, "move_weight": 0.1, "valid_for_s": 7200},
}


@dataclass(frozen=True)
class EconomicBlendTank(BlendTank):
    """The blending tank with an economic binding (`blend-econ-1`): costs on both feeds, the level kept
    inside its limits only."""

    name: ClassVar[str] = "blend-econ"
    binding: ClassVar[dict[str, Any]] = ECONOMIC_BINDING
