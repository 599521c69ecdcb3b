"""Benchmark: how well identification methods get the steady-state gains of MIMO plants whose
channels have dead times of their own (issue 15), on the judge's columns (bench/judge_plants.py).

Methods, all on the same train runs in the same normalised units:
* product      `identify` (a delay per channel or one delay, by val rollout; refined; model/select.py)
* one delay    `identify` with the per-channel search switched off (the identification before issue 15)
* one-step LS  ridge 1e-9 least squares ARX with the judge's reference orders (one delay, long numerator)
* FIR          ridge least squares FIR of every channel, as long as the plant's settling time; the
               gain is the sum of the coefficients (FIR + reduction to the steady state)
* N4SID        subspace identification, package nfoursid (bench-only: `pip install nfoursid`; skipped
               with a note when missing), order 2 x (CVs + inputs) + 2, 20 block rows; its API takes one
               record, so the train runs are concatenated (their boundaries are small steps)

Reported per plant and method: the relative steady-state gain error ||G_hat - G|| / ||G|| (Frobenius,
MV gains, normalised units) against the plant's true gain (linear copies: exact; the judge's
saturating plants: the local gain at the live MVs), the error of the weak singular value, and the
identification time. Run: `.venv/bin/python bench/bench_identify_methods.py [--seeds 1 2 3]`.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optimizer_pipeline.model.artifact as artifact_module  # noqa: E402
from judge import REFERENCE_RIDGE, reference_orders  # noqa: E402
from judge_plants import DeadTimeColumn, IllConditionedDeadTimeColumn  # noqa: E402

from optimizer_pipeline.data.prepare import prepare_history  # noqa: E402
from optimizer_pipeline.data.ingest import validate_history_frame  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.model.arx import stack_runs  # noqa: E402
from optimizer_pipeline.model.fit import RidgeProblem, Structure  # noqa: E402
from optimizer_pipeline.model.statespace import steady_state  # noqa: E402


def linear(cls: type) -> type:
    """The plant without its output saturation: its gain is exactly K."""
    return type(cls.__name__ + "Linear", (cls,), {"name": cls.name + "_linear", "SATURATION": 1e9})


def true_gain(plant, history) -> np.ndarray:
    u, d = history.live.u, history.live.d
    return np.column_stack([(plant.steady_output(u + e * 1e-4, d) - plant.steady_output(u - e * 1e-4, d)) / 2e-4
                            for e in np.eye(len(u))])


def product(plant, split, per_channel: bool = True) -> np.ndarray:
    if per_channel:
        return np.asarray(identify(split, plant.spec, 1).steady_gain["gain"])
    original = artifact_module.per_channel
    artifact_module.per_channel = lambda binding: False
    try:
        return np.asarray(identify(split, plant.spec, 1).steady_gain["gain"])
    finally:
        artifact_module.per_channel = original


def stacked(plant, split):
    spec = plant.spec
    return stack_runs(split.train, split.normalisation, spec.mv_tags, spec.cv_tags, spec.dv_tags)


def one_step_ls(plant, split) -> np.ndarray:
    orders = reference_orders(plant)
    model = RidgeProblem.for_orders(stacked(plant, split), [orders]).fit(orders, REFERENCE_RIDGE)
    return steady_state(model.realise())[0]


def fir(plant, split) -> np.ndarray:
    train = stacked(plant, split)
    ny, nu, nd = train.y.shape[1], train.u.shape[1], train.d.shape[1]
    length = min(150, int(plant.settling_time_s / plant.sample_period_s))
    model = RidgeProblem(train, 1, length).fit(Structure(0, length, ((1,) * (nu + nd),) * ny), 1e-4)
    return model.B.sum(axis=0)


def n4sid(plant, split) -> np.ndarray | None:
    try:
        import pandas as pd
        from nfoursid.nfoursid import NFourSID
    except ImportError:
        return None
    train = stacked(plant, split)
    ny, nu, nd = train.y.shape[1], train.u.shape[1], train.d.shape[1]
    frame = pd.DataFrame(np.hstack([train.y, train.u, train.d]),
                         columns=[f"y{i}" for i in range(ny)] + [f"v{j}" for j in range(nu + nd)])
    model = NFourSID(frame, output_columns=[f"y{i}" for i in range(ny)],
                     input_columns=[f"v{j}" for j in range(nu + nd)], num_block_rows=20)
    model.subspace_identification()
    ss, _ = model.system_identification(rank=2 * (ny + nu + nd) + 2)
    gain = ss.c @ np.linalg.solve(np.eye(ss.a.shape[0]) - ss.a, ss.b) + ss.d
    return gain[:, :nu]


METHODS = {"product": product, "one delay": lambda p, s: product(p, s, per_channel=False), "one-step LS": one_step_ls,
           "FIR": fir, "N4SID": n4sid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    plants = [linear(DeadTimeColumn)(), linear(IllConditionedDeadTimeColumn)(), DeadTimeColumn(),
              IllConditionedDeadTimeColumn()]
    print("| plant | method | gain error median (worst) | weak singular value error median (worst) | seconds |")
    print("|---|---|---|---|---|")
    for plant in plants:
        errors: dict[str, list] = {name: [] for name in METHODS}
        for seed in args.seeds:
            history = plant.history(seed)
            split = prepare_history(validate_history_frame(history.frame, plant.spec, "bench"), plant.spec)
            mu, su = split.normalisation.of(plant.spec.mv_tags)
            my, sy = split.normalisation.of(plant.spec.cv_tags)
            truth = true_gain(plant, history) * su[None, :] / sy[:, None]
            weak = np.linalg.svd(truth, compute_uv=False)[-1]
            for name, method in METHODS.items():
                started = time.perf_counter()
                gain = method(plant, split)
                seconds = time.perf_counter() - started
                if gain is None:
                    continue
                errors[name].append((np.linalg.norm(gain - truth) / np.linalg.norm(truth),
                                     abs(np.linalg.svd(gain, compute_uv=False)[-1] - weak) / weak, seconds))
        for name, rows in errors.items():
            if not rows:
                print(f"| {plant.spec.id}{' (linear)' if 'linear' in plant.name else ''} | {name} | "
                      f"skipped (nfoursid not installed) | | |")
                continue
            g, w, t = np.array(rows).T
            print(f"| {plant.spec.id}{' (linear)' if 'linear' in plant.name else ''} | {name} | "
                  f"{np.median(g):.3f} ({g.max():.3f}) | {np.median(w):.3f} ({w.max():.3f}) | {np.median(t):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
