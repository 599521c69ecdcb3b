"""Benchmark: solver round trip through the worker pool vs in-process OSQP vs a process per solve.

Issue 4 "Performance". Two plants, 200 receding-horizon re-solves each (N = 30):
  * quadruple tank (Johansson's linearised 4-tank: 4 states, 2 MVs, 2 CVs), sampled at 5 s;
  * a random stable system, nx = 10, nu = 3, ny = 3 (seeded).
The closed loop is run once in process (the plan's first move applied to the model, targets stepped
half way) to record 200 ProblemIRs; every mode then solves that same sequence, so warm starts see
the same re-solves (raw and pool interleaved step by step: on a shared machine both see the same load):
  raw      solve_problem(problem, cache) in this process, one SolverCache (warm start)
  pool     SolverPool(size=1).solve(problem): JSON over a pipe to a long-lived worker (warm cache)
  process  a fresh worker process per solve (spawn, imports, ready, one solve, exit); 20 measured,
           the 200-solve total extrapolated
  cvxpy    a parameterised re-solve, if cvxpy is installed
Targets: pool p50 <= raw p50 + 1 ms, and >= 100x faster than a process per solve.

    .venv/bin/python bench/bench_pool.py [--steps 200] [--process-samples 20] [--seed 7]
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import time

import numpy as np
from scipy.linalg import expm

from optimizer_pipeline.contracts import ProblemIR, SolveResult, StateSpace, Template, canonical_json
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.solve import SolverCache, solve_problem

HORIZON = 30


def quadruple_tank(sample_s: float = 5.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discrete (A, B, C) of Johansson's quadruple tank linearised at the minimum-phase point (levels in cm, pumps in V)."""
    area = np.array([28.0, 32.0, 28.0, 32.0])  # cm^2
    outlet = np.array([0.071, 0.057, 0.071, 0.057])  # cm^2
    h0 = np.array([12.4, 12.7, 1.8, 1.4])  # cm
    k, gamma, kc, g = (3.33, 3.35), (0.70, 0.60), 0.5, 981.0
    T = area / outlet * np.sqrt(2.0 * h0 / g)  # s
    Ac = np.diag(-1.0 / T)
    Ac[0, 2], Ac[1, 3] = area[2] / (area[0] * T[2]), area[3] / (area[1] * T[3])
    Bc = np.array([[gamma[0] * k[0] / area[0], 0.0], [0.0, gamma[1] * k[1] / area[1]],
                   [0.0, (1 - gamma[1]) * k[1] / area[2]], [(1 - gamma[0]) * k[0] / area[3], 0.0]])
    C = np.array([[kc, 0, 0, 0], [0, kc, 0, 0]], float)
    # zero-order hold: expm of the augmented [[Ac, Bc], [0, 0]] gives [[Ad, Bd], [0, I]]
    n, m = Bc.shape
    block = expm(np.block([[Ac, Bc], [np.zeros((m, n + m))]]) * sample_s)
    return block[:n, :n], block[:n, n:], C


def random_stable(nx: int, nu: int, ny: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A = Q diag(lambda) Q^T with lambda in [0.5, 0.95] (stable), B and C Gaussian."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((nx, nx)))
    A = Q @ np.diag(rng.uniform(0.5, 0.95, nx)) @ Q.T
    return A, 0.3 * rng.standard_normal((nx, nu)), rng.standard_normal((ny, nx))


def problem_at(A: np.ndarray, B: np.ndarray, C: np.ndarray, x0: np.ndarray, u_prev: np.ndarray,
               target: np.ndarray) -> ProblemIR:
    """linear_mpc_quadratic@1 at state x0 with identity normalisation (engineering = model units)."""
    nx, nu = B.shape
    ny = C.shape[0]
    rows = lambda M: tuple(tuple(map(float, r)) for r in M)  # noqa: E731
    model = StateSpace(rows(A), rows(B), ((),) * nx, (0.0,) * nx, rows(C))  # no DVs: E is (nx, 0)
    ones_u, ones_y = (1.0,) * nu, (1.0,) * ny
    return ProblemIR(
        template=Template.LINEAR_MPC, binding_id="bench", binding_revision=1, profile_id="bench", profile_version=1,
        model_artifact_hash="0" * 64, horizon=HORIZON, mv_tags=tuple(f"u{i}" for i in range(nu)),
        cv_tags=tuple(f"y{j}" for j in range(ny)), dv_tags=(), model=model, x0=tuple(map(float, x0)),
        u_prev=tuple(map(float, u_prev)), d=(), bias=(0.0,) * ny, u_lo=(-3.0,) * nu, u_hi=(3.0,) * nu,
        du_max=(0.5,) * nu, y_lo=(-5.0,) * ny, y_hi=(5.0,) * ny, y_target=tuple(map(float, target)),
        y_weight=ones_y, move_weight=0.1, slack_weight=1e3, band=(0.05,) * ny,
        u_mean=(0.0,) * nu, u_std=ones_u, y_mean=(0.0,) * ny, y_std=ones_y)


def closed_loop(A: np.ndarray, B: np.ndarray, C: np.ndarray, steps: int, seed: int) -> list[ProblemIR]:
    """The ProblemIRs of a receding-horizon run: apply the nominal plan's first move, re-solve."""
    rng = np.random.default_rng(seed)
    ny, (nx, nu) = C.shape[0], B.shape
    targets = [rng.uniform(-1.0, 1.0, ny), rng.uniform(-1.0, 1.0, ny)]
    x, u = np.zeros(nx), np.zeros(nu)
    cache, problems = SolverCache(), []
    for k in range(steps):
        problem = problem_at(A, B, C, x, u, targets[k * 2 // steps])
        problems.append(problem)
        result = solve_problem(problem, cache)
        nominal = next((c for c in result.candidates if c.kind.value == "nominal" and c.controls), None)
        if nominal is not None:
            u = np.asarray(nominal.controls[0])
        x = A @ x + B @ u
    return problems


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    ms = np.asarray(samples_s) * 1000.0
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 90))


def time_raw_and_pool(pool: SolverPool, problems: list[ProblemIR]) -> tuple[list[float], list[float], list[float]]:
    """Seconds per solve in process, in process through the pool's JSON codec, and through the pool.

    The three are interleaved step by step so they see the same machine load. The codec path does
    the CPU work of a pool round trip without the pipes and process switches: problem to canonical
    JSON, parse + ProblemIR.from_dict, solve, result to canonical JSON, parse.
    """
    cache, codec_cache, raw, codec, pooled = SolverCache(), SolverCache(), [], [], []
    for problem in problems:
        t = time.perf_counter()
        local: SolveResult = solve_problem(problem, cache)
        raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        decoded = ProblemIR.from_dict(json.loads(problem.canonical_json()))
        json.loads(canonical_json(solve_problem(decoded, codec_cache)))
        codec.append(time.perf_counter() - t)
        t = time.perf_counter()
        remote = pool.solve(problem)
        pooled.append(time.perf_counter() - t)
        assert local.ok and remote["ok"], (local.error_message, remote.get("error_message"))
    return raw, codec, pooled


def time_process_per_solve(problems: list[ProblemIR], samples: int) -> list[float]:
    """Spawn a worker, wait for ready, one solve, close: what a process-per-solve design pays."""
    times = []
    for problem in problems[:samples]:
        frame = json.dumps({"protocolVersion": 1, "reqId": 1, "op": "solve", "payload": {"problemIr": problem.to_dict()}})
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "optimizer_pipeline.solver.worker"], input=frame.encode() + b"\n",
                              capture_output=True, check=True)
        times.append(time.perf_counter() - t)
        assert json.loads(done.stdout.splitlines()[-1])["ok"]
    return times


def report(name: str, problems: list[ProblemIR], pool: SolverPool, process_samples: int) -> dict[str, float]:
    raw, codec, pooled = time_raw_and_pool(pool, problems)
    spawned = time_process_per_solve(problems, process_samples)
    (raw50, raw90), (pool50, pool90), (proc50, proc90) = percentiles(raw), percentiles(pooled), percentiles(spawned)
    codec50, codec90 = percentiles(codec)
    payload_kb = len(canonical_json(problems[0])) / 1024
    print(f"\n{name}: {len(problems)} receding-horizon re-solves, N = {HORIZON}, ProblemIR {payload_kb:.1f} kB")
    print(f"  raw in-process solve_problem (warm)  p50 {raw50:8.3f} ms  p90 {raw90:8.3f} ms  total {sum(raw):7.2f} s")
    print(f"  in-process + pool JSON codec, no IPC p50 {codec50:8.3f} ms  p90 {codec90:8.3f} ms  total {sum(codec):7.2f} s")
    print(f"  pool round trip (1 worker, warm)     p50 {pool50:8.3f} ms  p90 {pool90:8.3f} ms  total {sum(pooled):7.2f} s")
    print(f"  fresh process per solve ({len(spawned)} runs)   p50 {proc50:8.1f} ms  p90 {proc90:8.1f} ms  "
          f"total for {len(problems)} ~{np.mean(spawned) * len(problems):7.1f} s (extrapolated)")
    print(f"  pool overhead p50 {pool50 - raw50:+.3f} ms (target <= +1 ms: {'met' if pool50 <= raw50 + 1 else 'MISSED'}); "
          f"process-per-solve / pool p50 = {proc50 / pool50:.0f}x (target >= 100x: {'met' if proc50 >= 100 * pool50 else 'MISSED'})")
    return {"raw_p50": raw50, "pool_p50": pool50, "process_p50": proc50}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--process-samples", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    with SolverPool(size=1, request_timeout_ms=10_000) as pool:
        stats = pool.stats()
        print(f"worker start-to-ready {stats['ready_ms'][0]:.0f} ms (spawn, imports, ready frame)")
        pings = []
        for _ in range(500):
            t = time.perf_counter()
            pool.ping()
            pings.append(time.perf_counter() - t)
        p50, p90 = percentiles(pings)
        print(f"ping round trip (protocol + pipes + threads, no solve): p50 {p50:.3f} ms  p90 {p90:.3f} ms")
        report("quadruple tank (nx 4, nu 2, ny 2)", closed_loop(*quadruple_tank(), args.steps, args.seed),
               pool, args.process_samples)
        report("random stable (nx 10, nu 3, ny 3)", closed_loop(*random_stable(10, 3, 3, args.seed), args.steps, args.seed),
               pool, args.process_samples)
    cvxpy = "not installed" if importlib.util.find_spec("cvxpy") is None else "installed, no formulation written"
    print(f"\ncvxpy parameterised re-solve: skipped ({cvxpy})")


if __name__ == "__main__":
    main()
