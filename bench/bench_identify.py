"""Benchmark: ARX identification time and quality against a one-step least-squares baseline.

Run: `.venv/bin/python bench/bench_identify.py`. Prints
1. the best wall time of `identify` for a 2 MV / 2 CV binding with ~5000 train rows and unset orders
   (budget: well under 0.5 s; 100 bindings must fit in 60 s all included);
2. per plant (the demo plants through the real data pipeline, plus a synthetic non-minimum-phase
   plant with dead time and output noise): chosen orders, gates and the test P-step rollout NRMSE of
   the product vs a plain one-step least-squares ARX with the same orders.
"""

import time

import numpy as np

from optimizer_pipeline.contracts import HistorySplit, Normalisation, RunSeries, binding_from_dict
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.data.ingest import validate_history_frame
from optimizer_pipeline.model import arx_of, identify
from optimizer_pipeline.model.arx import Orders, rollout_nrmse, stack_runs
from optimizer_pipeline.model.fit import RidgeProblem
from optimizer_pipeline.plants import demo_plants

BUDGET_S = 0.5


def binding(n_mv: int, n_cv: int, horizon: int, orders: dict | None = None):
    return binding_from_dict({
        "id": "bench-identify", "sample_period_s": 1,
        "mvs": [{"tag": f"u{i}", "lo": -50, "hi": 50, "max_move": 5} for i in range(n_mv)],
        "cvs": [{"tag": f"y{i}", "lo": -50, "hi": 50, "target": 0} for i in range(n_cv)],
        "model": {"horizon": horizon, **(orders or {})},
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
    })


def split_from(spec, u, y, n_train, n_val, n_test) -> HistorySplit:
    runs = [RunSeries(f"r{i}", np.arange(u.shape[1], dtype=float), u[i], y[i], np.empty((u.shape[1], 0)))
            for i in range(u.shape[0])]
    train = runs[:n_train]
    data = np.hstack([np.concatenate([r.u for r in train]), np.concatenate([r.y for r in train])])
    norm = Normalisation(spec.tags, tuple(data.mean(axis=0)), tuple(data.std(axis=0)))
    return HistorySplit(tuple(train), tuple(runs[n_train:n_train + n_val]),
                        tuple(runs[n_train + n_val:n_train + n_val + n_test]), None, norm, {}, "bench")


def steps(rng, runs, n, width, hold=10):
    return np.repeat(rng.normal(size=(runs, n // hold + 1, width)), hold, axis=1)[:, :n]


def two_by_two(rng):
    """2x2 ARX(2, 2) with delay 2, equation noise: 10 train runs x 500 rows."""
    A = np.array([[[1.2, 0.1], [0.0, 1.0]], [[-0.4, 0.0], [0.05, -0.25]]])
    B = np.array([[[0.3, 0.1], [0.1, 0.2]], [[0.1, 0.0], [0.05, 0.1]]])
    u = steps(rng, 16, 500, 2)
    y = np.zeros((16, 500, 2))
    e = 0.05 * rng.normal(size=y.shape)
    for t in range(3, 500):
        y[:, t] = y[:, t - 1] @ A[0].T + y[:, t - 2] @ A[1].T + u[:, t - 2] @ B[0].T + u[:, t - 3] @ B[1].T + e[:, t]
    return binding(2, 2, 10), split_from(binding(2, 2, 10), u, y, 10, 3, 3)


def non_minimum_phase(rng):
    """SISO, zero at 1.6 (inverse response), dead time 3, output (measurement) noise."""
    u = steps(rng, 16, 400, 1, hold=15)
    x = np.zeros((16, 400, 1))
    for t in range(4, 400):
        x[:, t] = 1.5 * x[:, t - 1] - 0.56 * x[:, t - 2] - 0.5 * u[:, t - 3] + 0.8 * u[:, t - 4]
    y = x + 0.15 * x.std() * rng.normal(size=x.shape)
    spec = binding(1, 1, 15)
    return spec, split_from(spec, u, y, 10, 3, 3)


def baseline_nrmse(split, spec, orders: Orders) -> float:
    """Plain one-step least squares (no ridge to speak of, no refinement), test rollout NRMSE at P."""
    tags = (spec.mv_tags, spec.cv_tags, spec.dv_tags)
    train, test = (stack_runs(runs, split.normalisation, *tags) for runs in (split.train, split.test))
    model = RidgeProblem.for_orders(train, [orders]).fit(orders, 0.0)
    return float(np.max(rollout_nrmse(model, test, spec.model.horizon)))


def report(name, spec, split) -> None:
    started = time.perf_counter()
    artifact = identify(split, spec, 1)
    seconds = time.perf_counter() - started
    tags = (spec.mv_tags, spec.cv_tags, spec.dv_tags)
    test = stack_runs(split.test, split.normalisation, *tags)
    ours = float(np.max(rollout_nrmse(arx_of(artifact), test, spec.model.horizon)))
    base = baseline_nrmse(split, spec, Orders(artifact.na, artifact.nb, artifact.delay))
    gates = " ".join(f"{g.name}={'-' if g.value is None else f'{g.value:.3g}'}{'' if g.passed else '!'}"
                     for g in artifact.gates)
    refined = artifact.selection["refinement"].get("kept")
    print(f"{name:>12}: na={artifact.na} nb={artifact.nb} delay={artifact.delay} "
          f"ridge={artifact.selection['final']['ridge']:g} refined={refined} | {gates} | "
          f"test P-step NRMSE ours {ours:.3f} vs one-step LS {base:.3f} | {seconds:.3f} s")


def main() -> None:
    rng = np.random.default_rng(0)
    spec, split = two_by_two(rng)
    identify(split, spec, 1)  # warm-up (imports, caches)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        identify(split, spec, 1)
        times.append(time.perf_counter() - started)
    rows = sum(len(r) for r in split.train)
    print(f"identify 2 MV x 2 CV, {rows} train rows, orders unset: best {min(times):.3f} s, "
          f"median {np.median(times):.3f} s (budget {BUDGET_S} s, ratio {min(times) / BUDGET_S:.2f})")

    report("2x2 arx", spec, split)
    report("nmp+delay", *non_minimum_phase(rng))
    for plant in demo_plants():
        frame = validate_history_frame(plant.generate_history(seed=1), plant.spec, plant.name)
        report(plant.name, plant.spec, prepare_history(frame, plant.spec, seed=1))


if __name__ == "__main__":
    main()
