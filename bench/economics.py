"""Judge economic recommendations (issue 17): how much of the true plant's economic optimum they earn.

Variants (seeds 1-6 each): the demo's `blend-econ-1` (steady_response@1: conc held at 7 g/L, the
level only kept under 1.4 m, both feeds earn), the same binding as a move plan steered by the
steady-state layer (`-mpc`, two layers), and the quadruple tank run for the cheapest pumping
(`tanks-econ`, a move plan: y1 held at 7 V, y2 only kept inside [5.5, 9.5] V, v1 cheaper than v2).

For each variant and seed the product identifies, calibrates, solves and decides as `recommend`
does; the plan is applied open-loop to the true nonlinear plant from the live state and its last
move held until the plant settles. Reported: status; `captured`, the share of the true optimum's
economic gain over holding the current MVs that the settled plant earns,
(J_hold - J_settled) / (J_hold - J_opt), with J_opt from SLSQP on the plant's steady-state
equations (targets as equalities, CV limits, MV bounds, the binding's move reach); the settled
targeted CVs' error as a fraction of their range; the largest CV limit violation on the true plant
as a fraction of the range; for a steady target whether its band covers every settled CV.

Usage: .venv/bin/python bench/economics.py [--seeds 1 2 3 4 5 6] [--only tanks-econ ...] [--markdown FILE]
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer_pipeline import pipeline  # noqa: E402
from optimizer_pipeline.contracts import Template, utc_now  # noqa: E402
from optimizer_pipeline.data.prepare import prepare_history  # noqa: E402
from optimizer_pipeline.data.ingest import validate_history_frame  # noqa: E402
from optimizer_pipeline.economics import economic_value  # noqa: E402
from optimizer_pipeline.ledger import Ledger, StoredBinding  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.plants import EconomicBlendTank, QuadrupleTank  # noqa: E402
from optimizer_pipeline.settings import Settings  # noqa: E402
from optimizer_pipeline.solver.solve import SolverCache, solve_problem  # noqa: E402


def _variant(base: type, name: str, **changes) -> type:
    """A plant class like `base` whose binding document is changed by `changes` (top-level keys)."""
    doc = {**base.binding, **changes}
    return type(f"{base.__name__}_{name.replace('-', '_')}", (base,), {"name": name, "binding": doc})


BlendEconomicMPC = _variant(EconomicBlendTank, "blend-econ-mpc", id="blend-econ-mpc",
                            profile={"id": "blend-profit-mpc", "version": 1, "template": "linear_mpc_quadratic@1",
                                     "horizon": 60, "move_weight": 0.1, "valid_for_s": 7200})
TanksEconomic = _variant(QuadrupleTank, "tanks-econ", id="tanks-econ",
                         mvs=[{"tag": "v1", "lo": 0.5, "hi": 5.0, "max_move": 0.25, "cost": 1.0},
                              {"tag": "v2", "lo": 0.5, "hi": 5.0, "max_move": 0.25, "cost": 1.4}],
                         cvs=[{"tag": "y1", "lo": 2.0, "hi": 9.5, "target": 7.0},
                              {"tag": "y2", "lo": 5.5, "hi": 9.5}])


def variants() -> list:
    return [EconomicBlendTank(), BlendEconomicMPC(), TanksEconomic()]


def true_optimum(plant, u_now: np.ndarray, d_now: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(u, y, J) of the plant's economic optimum from its steady-state equations (SLSQP from u_now):
    targets as equalities, CV limits, MV bounds and the move reach of the binding's profile."""
    spec = plant.spec
    reach = np.array([m.max_move for m in spec.mvs]) * spec.profile.horizon
    bounds = [(max(m.lo, u - r), min(m.hi, u + r)) for m, u, r in zip(spec.mvs, u_now, reach)]

    def y_of(u):
        return plant.steady_output(u, d_now)

    constraints = []
    for j, c in enumerate(spec.cvs):
        if c.target is not None:
            constraints.append({"type": "eq", "fun": lambda u, j=j, t=c.target: y_of(u)[j] - t})
        constraints += [{"type": "ineq", "fun": lambda u, j=j, lo=c.lo: y_of(u)[j] - lo},
                        {"type": "ineq", "fun": lambda u, j=j, hi=c.hi: hi - y_of(u)[j]}]
    best = minimize(lambda u: economic_value(spec, u, y_of(u)), u_now, method="SLSQP", bounds=bounds,
                    constraints=constraints, options={"ftol": 1e-12, "maxiter": 500})
    if not best.success:
        raise RuntimeError(f"{spec.id}: SLSQP found no optimum ({best.message})")
    return best.x, y_of(best.x), float(best.fun)


def judge(plant, seed: int, ledger: Ledger, cache: SolverCache) -> dict:
    spec = plant.spec
    history = plant.history(seed)
    split = prepare_history(validate_history_frame(history.frame, spec, "economics"), spec)
    artifact = identify(split, spec, 1)
    settings = Settings()
    calibration = pipeline.calibrate(ledger, artifact, pipeline.score_blocks(spec, artifact, split), settings,
                                     utc_now())
    record = pipeline.recommend(StoredBinding(spec, 1, spec.spec_hash, None), artifact, split, calibration,
                                lambda p: solve_problem(p, cache), ledger, settings, "simulation", utc_now())
    rec, live = record.recommendation, history.live
    out = {"status": rec.status.value, "reasons": rec.reasons}
    if not rec.controls:
        return out
    controls = np.asarray(rec.controls)
    settle = int(plant.settling_time_s / spec.sample_period_s) + 1
    applied = np.vstack([controls, np.repeat(controls[-1:], settle, axis=0)])
    y_settled = plant.apply_plan(live, applied)[-1]
    u_opt, y_opt, j_opt = true_optimum(plant, live.u, live.d)
    j_hold = economic_value(spec, live.u, plant.steady_output(live.u, live.d))
    j_settled = economic_value(spec, controls[-1], y_settled)
    span = np.array([c.hi - c.lo for c in spec.cvs])
    lo, hi = np.array([c.lo for c in spec.cvs]), np.array([c.hi for c in spec.cvs])
    targeted = [j for j, c in enumerate(spec.cvs) if c.target is not None]
    target_error = max((abs(y_settled[j] - spec.cvs[j].target) / span[j] for j in targeted), default=0.0)
    out.update(captured=(j_hold - j_settled) / (j_hold - j_opt), j_hold=j_hold, j_settled=j_settled, j_opt=j_opt,
               u_opt=u_opt.tolist(), u_end=controls[-1].tolist(), target_error=float(target_error),
               limit_violation=float(np.max(np.maximum(0, np.maximum(lo - y_settled, y_settled - hi)) / span)))
    if spec.profile.template is Template.STEADY_RESPONSE:
        band = np.array([np.inf if b is None else b for b in rec.band])
        out["band_covers"] = bool(np.all(np.abs(y_settled - np.asarray(rec.predicted[0])) <= band))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--only", nargs="+", help="binding ids of the variants to run (default: all)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    rows = ["| variant | seed | status | captured | J hold / settled / optimum | target error | limit violation | "
            "band covers |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        ledger, cache = Ledger(Path(tmp) / "economics.duckdb"), SolverCache()
        for plant in variants():
            if args.only and plant.spec.id not in args.only:
                continue
            for seed in args.seeds:
                r = judge(plant, seed, ledger, cache)
                if "captured" not in r:
                    rows.append(f"| {plant.spec.id} | {seed} | {r['status']} | (no plan) | | | | |")
                else:
                    rows.append(f"| {plant.spec.id} | {seed} | {r['status']} | {r['captured']:.3f} | "
                                f"{r['j_hold']:.4g} / {r['j_settled']:.4g} / {r['j_opt']:.4g} | "
                                f"{r['target_error']:.4f} | {r['limit_violation']:.4f} | {r.get('band_covers', '-')} |")
                print(rows[-1], flush=True)
                if r["reasons"]:
                    print(f"    reasons: {'; '.join(r['reasons'])}", flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
