"""Benchmark: UQ block scoring throughput (rows / s) of 1e6 samples vs a straightforward per-block loop.

Issue 8. 2 MV, 2 CV, ARX na = nb = 2, delay 1, P = 10, 100 runs of 10 000 rows (engineering units with
a non-trivial normalisation). `uq.block_scores` (normalisation, block states, the held disturbances,
rollouts and scores all included) is timed `repeat` times; the anchor is a per-block Python loop over the ARX
difference equation (module docstring of model/arx.py) written here, timed on the first
`loop_runs` runs and checked to give the same scores as block_scores on those runs.
Target: >= 6.5 M rows / s (1e6 rows in <= 0.154 s).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_uq.py [--samples N] [--runs R] [--repeat K] [--loop-runs L]

bench/run.py calls `measure` for repeated rounds and reports medians, spreads and ratios.
"""

import argparse
import os
import time
from typing import Sequence

import numpy as np

from optimizer_pipeline.contracts import ModelArtifact, Normalisation, RunSeries, binding_from_dict
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.model.arx import disturbance_window
from optimizer_pipeline.uq import block_scores

TARGET_ROWS_PER_S = 6.5e6

BINDING = {
    "id": "bench-uq", "sample_period_s": 1,
    "mvs": [{"tag": "u1", "lo": -10, "hi": 10, "max_move": 1}, {"tag": "u2", "lo": -10, "hi": 10, "max_move": 1}],
    "cvs": [{"tag": "y1", "lo": -10, "hi": 10, "target": 0}, {"tag": "y2", "lo": -10, "hi": 10, "target": 0}],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 10},
    "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
}
MODEL = ArxModel(Orders(2, 2, 1), A=np.array([[[0.9, 0.05], [0.0, 0.8]], [[-0.1, 0.0], [0.02, -0.05]]]),
                 B=np.array([[[0.2, 0.05], [0.1, 0.3]], [[0.05, 0.0], [0.0, 0.05]]]),
                 D=np.zeros((2, 2, 0)), c=np.array([0.01, -0.02]))
NORMALISATION = Normalisation(("u1", "u2", "y1", "y2"), (0.5, -0.2, 1.0, 2.0), (2.0, 1.5, 0.5, 3.0))


def workload(samples: int, runs: int, seed: int = 0) -> tuple[ModelArtifact, list[RunSeries]]:
    """The artifact and `runs` runs of samples // runs rows each (Gaussian u, y in engineering units)."""
    rng = np.random.default_rng(seed)
    artifact = artifact_from_model(MODEL, binding_from_dict(BINDING), 1, NORMALISATION)
    n = samples // runs
    return artifact, [RunSeries(f"r{i}", np.arange(n, dtype=float), rng.normal(size=(n, 2)), rng.normal(size=(n, 2)),
                                np.empty((n, 0))) for i in range(runs)]


def loop_scores(model: ArxModel, norm: Normalisation, runs: Sequence[RunSeries], h: int, window: int) -> np.ndarray:
    """The anchor: (n_blocks, n_cv) block scores, one block and one step at a time.

    Blocks start at rows k = first_state_row + window, then every h rows while k + h < n; each predicts
    y[k+1 .. k+h] from measured y up to k (its own predictions after k) and measured u, in normalised
    units, with a constant bias added to every step: the bias that, added to every step of the same
    recursion run over the `window` rows before k, fits their measured y best (np.linalg.lstsq on the
    recursion's response to each unit bias). The score is max over the block of |measured - predicted| per CV.
    """
    na, nb, delay = model.orders.na, model.orders.nb, model.orders.delay
    first = model.orders.first_state_row
    u_mean, u_std = norm.of(("u1", "u2"))
    y_mean, y_std = norm.of(("y1", "y2"))
    ny = len(y_mean)

    def simulate(u, y, start, steps, bias):  # y[start+1 .. start+steps] from measured y up to start
        known = {t: y[t] for t in range(start - na + 1, start + 1)}
        for t in range(start + 1, start + steps + 1):
            predicted = model.c + bias
            for i in range(1, na + 1):
                predicted = predicted + model.A[i - 1] @ known[t - i]
            for j in range(nb):
                predicted = predicted + model.B[j] @ u[t - delay - j]
            known[t] = predicted
        return np.array([known[t] for t in range(start + 1, start + steps + 1)])

    scores = []
    for run in runs:
        u, y = (run.u - u_mean) / u_std, (run.y - y_mean) / y_std
        for k in range(first + window, len(run) - h, h):
            free = simulate(u, y, k - window, window, np.zeros(ny))
            response = np.stack([simulate(u, y, k - window, window, unit) - free for unit in np.eye(ny)], axis=-1)
            bias = np.linalg.lstsq(response.reshape(-1, ny), (y[k - window + 1:k + 1] - free).ravel(), rcond=None)[0]
            scores.append(np.max(np.abs(y[k + 1:k + h + 1] - simulate(u, y, k, h, bias)), axis=0))
    return np.array(scores)


def measure(samples: int, runs: int, repeat: int, loop_runs: int) -> dict[str, float | list[float]]:
    """One round: block_scores seconds per repeat (rows = samples), the loop's seconds on `loop_rows`
    rows, and the largest |block_scores - loop| score difference on those rows."""
    artifact, series = workload(samples, runs)
    block_scores(artifact, series[:2])  # warm-up (imports, allocator)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        scores = block_scores(artifact, series)
        times.append(time.perf_counter() - started)
    subset = series[:loop_runs]
    started = time.perf_counter()
    anchor = loop_scores(MODEL, NORMALISATION, subset, artifact.horizon,
                         disturbance_window(artifact.state_space, artifact.horizon))
    loop_s = time.perf_counter() - started
    fast = block_scores(artifact, subset).scores
    assert anchor.shape == fast.shape, (anchor.shape, fast.shape)
    return {"rows": float(sum(len(r) for r in series)), "times": times, "blocks": float(scores.n_blocks),
            "loop_rows": float(sum(len(r) for r in subset)), "loop_s": loop_s,
            "max_abs_diff": float(np.max(np.abs(anchor - fast)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loop-runs", type=int, default=5, help="runs scored by the per-block loop anchor")
    args = parser.parse_args()

    result = measure(args.samples, args.runs, args.repeat, args.loop_runs)
    rates = result["rows"] / np.asarray(result["times"])
    loop_rate = result["loop_rows"] / result["loop_s"]
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print(f"block_scores: {result['rows']:.0f} rows in {args.runs} runs, {result['blocks']:.0f} blocks; "
          f"median {np.median(result['times']):.4f} s = {np.median(rates) / 1e6:.2f} M rows/s "
          f"(min-max {rates.min() / 1e6:.2f}-{rates.max() / 1e6:.2f}) over {args.repeat} repeats; "
          f"target {TARGET_ROWS_PER_S / 1e6:.1f} M rows/s: {'PASS' if np.median(rates) >= TARGET_ROWS_PER_S else 'MISS'}")
    print(f"per-block loop anchor: {result['loop_rows']:.0f} rows in {result['loop_s']:.2f} s = "
          f"{loop_rate / 1e3:.1f} k rows/s; block_scores / loop = {np.median(rates) / loop_rate:.0f}x; "
          f"largest |score difference| {result['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main()
