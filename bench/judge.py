"""Judge recommendations the way docs/ARCHITECTURE.md, "How recommendations are judged" says, on the demo plants
and on variants the pipeline has not been tuned on (non-minimum-phase quadruple tank, orders left
to the data, another seed).

For each plant: the recommended plan is applied open-loop to the true (nonlinear) plant from the
live state. Reported: final tracking error as a fraction of holding the current MVs (goal <= 0.20),
the worst MV bound / rate violation as a fraction of the MV range (goal <= 1e-4), the share of steps
within P whose realised CVs lie inside the reported band (goal >= 0.85), and the status.

Usage: .venv/bin/python bench/judge.py [--seeds 1 2]
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer_pipeline import pipeline  # noqa: E402
from optimizer_pipeline.contracts import Template, utc_now  # noqa: E402
from optimizer_pipeline.data import prepare_history, validate_history_frame  # noqa: E402
from optimizer_pipeline.ledger import Ledger, StoredBinding  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.plants import demo_plants  # noqa: E402
from optimizer_pipeline.plants.base import Excitation, Plant  # noqa: E402
from optimizer_pipeline.plants.tanks import QuadrupleTank  # noqa: E402
from optimizer_pipeline.settings import Settings  # noqa: E402
from optimizer_pipeline.solver.solve import SolverCache, solve_problem  # noqa: E402


@dataclass(frozen=True)
class NonMinimumPhaseTank(QuadrupleTank):
    """Johansson's non-minimum-phase setting (gamma1 + gamma2 < 1): a right-half-plane zero."""

    name: ClassVar[str] = "tanks_nmp"
    gamma: ClassVar[tuple[float, float]] = (0.43, 0.34)
    binding: ClassVar[dict] = {**QuadrupleTank.binding, "id": "tanks-nmp", "model": {"horizon": 12},
                               "cvs": [{"tag": "y1", "lo": 2.0, "hi": 9.5, "target": 6.2, "weight": 1.0},
                                       {"tag": "y2", "lo": 2.0, "hi": 9.5, "target": 6.6, "weight": 1.0}]}


@dataclass(frozen=True)
class IllConditionedColumn(Plant):
    """Skogestad's LV distillation gains [[0.878, -0.864], [1.082, -1.096]] (condition number ~140)
    on first-order lags of 75 s with a 2-sample dead time and a saturation of the outputs (tanh);
    orders left to the data. Reaching the targets needs a move with a component along the weak
    direction."""

    name: ClassVar[str] = "column"
    n_cont: ClassVar[int] = 2
    settling_time_s: ClassVar[float] = 600.0
    delay_samples: ClassVar[int] = 2
    substeps: ClassVar[int] = 5
    cv_noise: ClassVar[tuple[float, ...]] = (0.003, 0.003)
    excitation: ClassVar[Excitation] = Excitation(mv_band=((-1.5, 1.5), (-1.5, 1.5)), mv_hold=(4, 25),
                                                  mv_live=(0.0, 0.0))
    binding: ClassVar[dict] = {
        "id": "column-lv", "unit": "ill-conditioned 2x2 column", "sample_period_s": 10,
        "mvs": [{"tag": "reflux", "lo": -2.0, "hi": 2.0, "max_move": 0.2},
                {"tag": "boilup", "lo": -2.0, "hi": 2.0, "max_move": 0.2}],
        # targets = the steady outputs of u = (1.2, 0.5): reachable inside the MV bounds
        "cvs": [{"tag": "x_top", "lo": -1.0, "hi": 1.0, "target": 0.521, "weight": 1.0},
                {"tag": "x_bottom", "lo": -1.0, "hi": 1.0, "target": 0.587, "weight": 1.0}],
        "dvs": [], "model": {"horizon": 12},
        "profile": {"id": "column-track", "version": 1, "template": "linear_mpc_quadratic@1", "horizon": 60,
                    "move_weight": 0.1, "valid_for_s": 3600}}
    G: ClassVar[np.ndarray] = np.array([[0.878, -0.864], [1.082, -1.096]])

    def _rhs(self, xc, u, d):
        return (u @ self.G.T * self.gain - xc) / 75.0

    def _outputs(self, xc):
        return np.tanh(xc / 0.8) * 0.8  # saturation: the gain falls off away from the operating point

    def _equilibrium(self, u, d):
        return self.G @ u * self.gain


def variants() -> list:
    plants = demo_plants()
    unset = []
    for plant in plants:
        doc = plant.binding_doc()
        if doc["model"].get("na") is not None:
            cls = type(plant)
            unset.append(type(f"{cls.__name__}Unset", (cls,), {
                "name": cls.name + "_unset",
                "binding": {**doc, "id": doc["id"] + "-unset", "model": {"horizon": doc["model"]["horizon"]}}})())
    return plants + unset + [NonMinimumPhaseTank(), IllConditionedColumn()]


def judge(plant, seed: int, ledger: Ledger, cache: SolverCache) -> dict:
    spec = plant.spec
    history = plant.history(seed)
    split = prepare_history(validate_history_frame(history.frame, spec, "judge"), spec)
    artifact = identify(split, spec, 1)
    settings = Settings()
    scores = pipeline.score_blocks(spec, artifact, split)
    calibration = pipeline.calibrate(ledger, artifact, scores, settings, utc_now())
    record = pipeline.recommend(StoredBinding(spec, 1, spec.spec_hash, None), artifact, split, calibration,
                                lambda p: solve_problem(p, cache), ledger, settings, "simulation", utc_now())
    rec = record.recommendation
    live = history.live
    out = {"status": rec.status.value, "reasons": rec.reasons, "orders": (artifact.na, artifact.nb, artifact.delay)}
    if not rec.controls:
        return out
    controls = np.asarray(rec.controls)
    lo, hi = np.array([m.lo for m in spec.mvs]), np.array([m.hi for m in spec.mvs])
    rng = hi - lo
    moves = np.diff(np.vstack([live.u, controls]), axis=0)
    max_move = np.array([m.max_move for m in spec.mvs])
    bound = np.max(np.maximum(0, np.maximum(lo - controls, controls - hi)) / rng)
    rate = np.max(np.maximum(0, np.abs(moves) - max_move) / rng)
    applied = controls
    if spec.profile.template is Template.STEADY_RESPONSE:
        applied = np.repeat(controls, int(plant.settling_time_s / spec.sample_period_s) + 1, axis=0)
    target = np.array([c.target for c in spec.cvs])
    span = np.array([c.hi - c.lo for c in spec.cvs])
    y = plant.apply_plan(live, applied)
    y_hold = plant.apply_plan(live, np.repeat(live.u[None], len(applied), axis=0))
    ratio = np.linalg.norm((y[-1] - target) / span) / max(np.linalg.norm((y_hold[-1] - target) / span), 1e-12)
    P = artifact.horizon
    pred = np.asarray(rec.predicted)
    band = np.asarray([b if b is not None else 0.0 for b in rec.band])
    if spec.profile.template is Template.STEADY_RESPONSE:
        hits = np.abs(y[-1] - pred[0]) <= band
    else:
        hits = np.abs(y[:P] - pred[:P]) <= band
    out.update(ratio=float(ratio), mv_violation=float(max(bound, rate)), band_hits=float(np.mean(hits)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    import tempfile

    ledger = Ledger(Path(tempfile.mkdtemp()) / "judge.duckdb")
    cache = SolverCache()
    print(f"{'plant':<14}{'seed':>5}  {'orders':<10}{'status':<11}{'err/hold':>9}{'MV viol':>9}{'band hits':>10}")
    for plant in variants():
        for seed in args.seeds:
            r = judge(plant, seed, ledger, cache)
            print(f"{plant.spec.id:<14}{seed:>5}  {str(r['orders']):<10}{r['status']:<11}"
                  f"{r.get('ratio', float('nan')):>9.3f}{r.get('mv_violation', float('nan')):>9.1e}"
                  f"{r.get('band_hits', float('nan')):>10.2f}")
            if r["status"] != "verified":
                print("      reasons:", "; ".join(r["reasons"])[:300])


if __name__ == "__main__":
    main()
