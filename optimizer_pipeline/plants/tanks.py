"""The quadruple tank (Johansson 2000, IEEE TCST 8(3)): coupled tanks with interaction, binding `tanks-1`.

Two pumps v1, v2 (V) feed four tanks; valve splits gamma1 = 0.70, gamma2 = 0.60 put the plant in
its minimum-phase setting (gamma1 + gamma2 > 1). Tank 3 drains into tank 1 and tank 4 into tank 2,
each outflow a * sqrt(2 g h) (Torricelli), so the steady levels grow with the square of the
pump voltages. CVs are the lower tank levels as sensor voltages y = kc * h (V).
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from optimizer_pipeline.plants.base import Excitation, Plant

# Johansson (2000), table I and the P- operating point; cm, s, V.
AREA = np.array([28.0, 32.0, 28.0, 32.0])  # A1..A4, cm^2
OUTLET = np.array([0.071, 0.057, 0.071, 0.057])  # a1..a4, cm^2
PUMP = np.array([3.33, 3.35])  # k1, k2, cm^3 / (V s)
SENSOR = 0.50  # kc, V / cm
GRAVITY = 981.0  # cm / s^2

BINDING: dict[str, Any] = {
    "id": "tanks-1",
    "unit": "quadruple tank (Johansson 2000), minimum-phase setting",
    "sample_period_s": 10,
    "mvs": [
        {"tag": "v1", "lo": 0.5, "hi": 5.0, "max_move": 0.25},
        {"tag": "v2", "lo": 0.5, "hi": 5.0, "max_move": 0.25},
    ],
    "cvs": [
        {"tag": "y1", "lo": 2.0, "hi": 9.5, "target": 7.0, "weight": 1.0},
        {"tag": "y2", "lo": 2.0, "hi": 9.5, "target": 7.5, "weight": 1.0},
    ],
    "dvs": [],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 12},
    "profile": {"id": "tanks-track", "version": 1, "template": "linear_mpc_quadratic@1",
                "horizon": 50, "move_weight": 0.1, "valid_for_s": 3600},
}


@dataclass(frozen=True)
class QuadrupleTank(Plant):
    """States h1..h4 (cm); MVs v1, v2 (V); CVs y1 = kc h1, y2 = kc h2 (V). Slowest time constant ~90 s."""

    name: ClassVar[str] = "tanks"
    binding: ClassVar[dict[str, Any]] = BINDING
    n_cont: ClassVar[int] = 4
    settling_time_s: ClassVar[float] = 1500.0  # slowest tank ~115 s at the top of the band
    substeps: ClassVar[int] = 10  # 1 s RK4 steps; fastest tank ~23 s
    cv_noise: ClassVar[tuple[float, ...]] = (0.02, 0.02)
    gamma: ClassVar[tuple[float, float]] = (0.70, 0.60)  # valve splits; gamma1 + gamma2 < 1 is non-minimum phase
    excitation: ClassVar[Excitation] = Excitation(
        mv_band=((2.2, 3.6), (2.2, 3.6)),  # keeps both lower levels below 19 cm (tanks are 20 cm tall)
        mv_hold=(4, 30),
        mv_live=(3.0, 3.0),  # Johansson's operating point: y ~ (6.1, 6.4) V, targets (7.0, 7.5)
    )

    def _rhs(self, xc: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        outflow = OUTLET * np.sqrt(2.0 * GRAVITY * np.maximum(xc, 0.0))  # (m, 4) cm^3/s
        pumped = PUMP * u  # (m, 2) cm^3/s
        gamma = self.gamma
        inflow = np.stack([
            gamma[0] * pumped[:, 0] + outflow[:, 2],
            gamma[1] * pumped[:, 1] + outflow[:, 3],
            (1.0 - gamma[1]) * pumped[:, 1],
            (1.0 - gamma[0]) * pumped[:, 0],
        ], axis=1)
        return (inflow - outflow) / AREA

    def _outputs(self, xc: np.ndarray) -> np.ndarray:
        return SENSOR * xc[:, :2]

    def _equilibrium(self, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        # Each tank's outflow equals its total inflow; the lower tanks also receive the upper outflow.
        pumped = PUMP * u
        gamma = self.gamma
        inflow = np.array([
            gamma[0] * pumped[0] + (1.0 - gamma[1]) * pumped[1],
            gamma[1] * pumped[1] + (1.0 - gamma[0]) * pumped[0],
            (1.0 - gamma[1]) * pumped[1],
            (1.0 - gamma[0]) * pumped[0],
        ])
        return (inflow / OUTLET) ** 2 / (2.0 * GRAVITY)
