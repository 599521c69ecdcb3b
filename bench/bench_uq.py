"""Benchmark: UQ block scoring of 1e6 samples (2 MV, 2 CV, na = nb = 2, P = 10) against the 0.15 s anchor.

Run: `.venv/bin/python bench/bench_uq.py [--samples N] [--runs R] [--repeat K]`. Prints the best
wall time of K repeats (normalisation, block states, rollouts and scores all included) and its
ratio to the issue's anchor.
"""

import argparse
import os
import time

import numpy as np

from optimizer_pipeline.contracts import Normalisation, RunSeries, binding_from_dict
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.uq import block_scores

ANCHOR_S = 0.15

BINDING = {
    "id": "bench-uq", "sample_period_s": 1,
    "mvs": [{"tag": "u1", "lo": -10, "hi": 10, "max_move": 1}, {"tag": "u2", "lo": -10, "hi": 10, "max_move": 1}],
    "cvs": [{"tag": "y1", "lo": -10, "hi": 10, "target": 0}, {"tag": "y2", "lo": -10, "hi": 10, "target": 0}],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 10},
    "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    binding = binding_from_dict(BINDING)
    model = ArxModel(Orders(2, 2, 1), A=np.array([[[0.9, 0.05], [0.0, 0.8]], [[-0.1, 0.0], [0.02, -0.05]]]),
                     B=np.array([[[0.2, 0.05], [0.1, 0.3]], [[0.05, 0.0], [0.0, 0.05]]]),
                     D=np.zeros((2, 2, 0)), c=np.zeros(2))
    norm = Normalisation(("u1", "u2", "y1", "y2"), (0.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0))
    artifact = artifact_from_model(model, binding, 1, norm)
    n = args.samples // args.runs
    runs = [RunSeries(f"r{i}", np.arange(n, dtype=float), rng.normal(size=(n, 2)), rng.normal(size=(n, 2)),
                      np.empty((n, 0))) for i in range(args.runs)]
    block_scores(artifact, runs[:2])  # warm-up (imports, allocator)
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        scores = block_scores(artifact, runs)
        times.append(time.perf_counter() - started)
    best = min(times)
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(f"OPENBLAS_NUM_THREADS={threads} (1 is steadiest on a shared 2-core machine)")
    print(f"block_scores: {n * args.runs} samples in {args.runs} runs, {scores.n_blocks} blocks of h={scores.h}")
    print(f"best of {args.repeat}: {best:.4f} s (median {np.median(times):.4f} s); "
          f"ratio to the {ANCHOR_S} s anchor: {best / ANCHOR_S:.2f}")


if __name__ == "__main__":
    main()
