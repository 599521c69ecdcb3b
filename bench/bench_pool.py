"""Benchmark: solver round trip through the worker pool vs in-process OSQP, cvxpy, a process per solve
and the original system's probe + process per solve.

Issue 4 "Performance" / issue 8. Two plants, 200 receding-horizon re-solves each (N = 30):
  * quadruple tank (Johansson's linearised 4-tank: 4 states, 2 MVs, 2 CVs), sampled at 5 s;
  * a random stable system, nx = 10, nu = 3, ny = 3 (seeded).
The closed loop is run once in process (the plan's first move applied to the model, targets stepped
half way) to record 200 ProblemIRs; every mode then solves that same sequence, so warm starts see
the same re-solves. Modes (seconds per solve):
  bare      the nominal QP alone on one warm osqp.OSQP object: update(q, l, u) + solve (the floor)
  cvxpy     the same nominal QP as a cvxpy problem with q, l, u as Parameters, re-solved with OSQP
            and warm_start (skipped with a note when cvxpy is not installed; never a dependency)
  raw       solve_problem(problem, cache) in this process, one SolverCache (warm): HOLD + NOMINAL +
            ROBUST + verification, i.e. exactly the work a worker does per request
  codec     raw plus the pool's wire codec both ways (solver/codec.py: orjson, NaN / inf check),
            no IPC (where the pool's overhead goes)
  pool      SolverPool(size=1).solve(problem): JSON over a pipe to a long-lived worker (warm cache)
  process   a fresh worker process per solve (spawn, imports, ready, one solve, exit)
  original  the original system's way: the capability probe process
            (`python -m optimizer_pipeline.solver.probe`) before every solve, then a process per solve
  probe     the probe process alone (part of `original`)
bare / cvxpy / raw / codec / pool are interleaved step by step so they see the same machine load;
raw_inside / pool_inside are solve_problem's own time (diagnostics.elapsed_s) here and in the worker,
which splits pool - raw into "the solve ran slower (colder) in the worker" and IPC + codec;
process / original run `process_samples` solves each and the 200-solve total is extrapolated.
Targets: pool p50 <= raw p50 + 1 ms, and a process per solve >= 100x the pool's p50.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_pool.py [--steps 200] [--process-samples 20] [--seed 7]

bench/run.py calls `measure` for repeated rounds and reports medians, spreads and ratios.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import time

import numpy as np
import osqp
import scipy.sparse as sparse
from scipy.linalg import expm

from optimizer_pipeline.contracts import ProblemIR, SolveResult, StateSpace, Template
from optimizer_pipeline.solver import codec, mpc
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.solve import OSQP_SETTINGS, SolverCache, solve_problem

HORIZON = 30
INTERLEAVED = ("bare", "cvxpy", "raw", "codec", "pool")
SPAWNED = ("process", "original", "probe")


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


def plants(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The two benchmark plants by display name."""
    return {"quadruple tank (nx 4, nu 2, ny 2)": quadruple_tank(),
            "random stable (nx 10, nu 3, ny 3)": random_stable(10, 3, 3, seed)}


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


class BareQP:
    """The nominal QP of a problem sequence on one osqp.OSQP object (the product's settings)."""

    def __init__(self, first: ProblemIR) -> None:
        P, A = mpc.matrices(first)
        q, l, u, _ = self.vectors(first)
        self.solver = osqp.OSQP()
        self.solver.setup(P=sparse.triu(P, format="csc"), q=q, A=A, l=l, u=u, **OSQP_SETTINGS)
        self.P, self.A = P, A

    @staticmethod
    def vectors(problem: ProblemIR) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        return mpc.vectors(problem, np.asarray(problem.y_lo, float), np.asarray(problem.y_hi, float))

    def solve(self, q: np.ndarray, l: np.ndarray, u: np.ndarray) -> np.ndarray:
        self.solver.update(q=q, l=l, u=u)
        result = self.solver.solve(raise_error=False)
        assert result.info.status == "solved", result.info.status
        return np.asarray(result.x)


class CvxpyQP:
    """The same nominal QP in cvxpy: q, l, u are Parameters, re-solved with OSQP, warm-started."""

    def __init__(self, bare: BareQP) -> None:
        import cvxpy as cp  # bench-only, optional

        n, m = bare.A.shape[1], bare.A.shape[0]
        self.z = cp.Variable(n)
        self.q, self.l, self.u = cp.Parameter(n), cp.Parameter(m), cp.Parameter(m)
        objective = 0.5 * cp.quad_form(self.z, cp.psd_wrap(bare.P)) + self.q @ self.z
        self.problem = cp.Problem(cp.Minimize(objective), [bare.A @ self.z >= self.l, bare.A @ self.z <= self.u])
        self.settings = {"eps_abs": OSQP_SETTINGS["eps_abs"], "eps_rel": OSQP_SETTINGS["eps_rel"],
                         "polish": True, "max_iter": OSQP_SETTINGS["max_iter"]}

    def solve(self, q: np.ndarray, l: np.ndarray, u: np.ndarray) -> np.ndarray:
        self.q.value, self.l.value, self.u.value = q, l, u
        self.problem.solve(solver="OSQP", warm_start=True, **self.settings)
        assert self.problem.status == "optimal", self.problem.status
        return np.asarray(self.z.value)


def cvxpy_version() -> str | None:
    if importlib.util.find_spec("cvxpy") is None:
        return None
    import cvxpy

    return cvxpy.__version__


def time_interleaved(pool: SolverPool, problems: list[ProblemIR], use_cvxpy: bool) -> dict[str, list[float]]:
    """Seconds per solve of the interleaved modes (module docstring), plus the largest |cvxpy - bare|
    of the first MV move (normalised units) as a check that both solve the same QP."""
    bare = BareQP(problems[0])
    cvx = CvxpyQP(bare) if use_cvxpy else None
    cache, codec_cache = SolverCache(), SolverCache()
    times: dict[str, list[float]] = {mode: [] for mode in INTERLEAVED + ("raw_inside", "pool_inside")}
    worst_move_gap = 0.0
    for problem in problems:
        q, l, u, _ = bare.vectors(problem)
        t = time.perf_counter()
        z_bare = bare.solve(q, l, u)
        times["bare"].append(time.perf_counter() - t)
        if cvx is not None:
            t = time.perf_counter()
            z_cvx = cvx.solve(q, l, u)
            times["cvxpy"].append(time.perf_counter() - t)
            first_moves = [mpc.plan(problem, z)[0][0] for z in (z_cvx, z_bare)]
            worst_move_gap = max(worst_move_gap, float(np.max(np.abs(first_moves[0] - first_moves[1]))))
        t = time.perf_counter()
        local: SolveResult = solve_problem(problem, cache)
        times["raw"].append(time.perf_counter() - t)
        t = time.perf_counter()
        payload = codec.decode(b'{"problemIr":' + codec.encode(problem) + b"}")  # pool -> worker
        codec.decode(codec.encode(solve_problem(ProblemIR.from_dict(payload["problemIr"]), codec_cache)))  # and back
        times["codec"].append(time.perf_counter() - t)
        t = time.perf_counter()
        remote = pool.solve(problem)
        times["pool"].append(time.perf_counter() - t)
        assert local.ok and remote["ok"], (local.error_message, remote.get("error_message"))
        times["raw_inside"].append(local.diagnostics["elapsed_s"])
        times["pool_inside"].append(remote["diagnostics"]["elapsed_s"])
    times["cvxpy_move_gap"] = [worst_move_gap] if cvx is not None else []
    return times


def time_spawned(problems: list[ProblemIR], samples: int) -> dict[str, list[float]]:
    """A fresh worker per solve (spawn, imports, ready, one solve, exit), and the original system's
    way: the probe process first, then the fresh worker. The two alternate so they see the same load."""
    times: dict[str, list[float]] = {mode: [] for mode in SPAWNED}
    worker = [sys.executable, "-m", "optimizer_pipeline.solver.worker"]
    probe = [sys.executable, "-m", "optimizer_pipeline.solver.probe"]
    for problem in problems[:samples]:
        frame = json.dumps({"protocolVersion": 1, "reqId": 1, "op": "solve",
                            "payload": {"problemIr": problem.to_dict()}}).encode() + b"\n"
        t = time.perf_counter()
        done = subprocess.run(worker, input=frame, capture_output=True, check=True)
        times["process"].append(time.perf_counter() - t)
        assert json.loads(done.stdout.splitlines()[-1])["ok"]
        t = time.perf_counter()
        subprocess.run(probe, capture_output=True, check=True, stdin=subprocess.DEVNULL)
        probed = time.perf_counter()
        done = subprocess.run(worker, input=frame, capture_output=True, check=True)
        times["original"].append(time.perf_counter() - t)
        times["probe"].append(probed - t)
        assert json.loads(done.stdout.splitlines()[-1])["ok"]
    return times


def measure(pool: SolverPool, steps: int, process_samples: int, seed: int,
            use_cvxpy: bool = True) -> dict[str, dict[str, list[float]]]:
    """One round: {plant name: {mode: seconds per solve}} for every mode of the module docstring."""
    use_cvxpy = use_cvxpy and cvxpy_version() is not None
    out = {}
    for name, (A, B, C) in plants(seed).items():
        problems = closed_loop(A, B, C, steps, seed)
        out[name] = {**time_interleaved(pool, problems, use_cvxpy), **time_spawned(problems, process_samples)}
    return out


def ms(samples_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--process-samples", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    with SolverPool(size=1, request_timeout_ms=10_000) as pool:
        print(f"worker start-to-ready {pool.stats()['ready_ms'][0]:.0f} ms (spawn, imports, ready frame)")
        pings = []
        for _ in range(500):
            t = time.perf_counter()
            pool.ping()
            pings.append(time.perf_counter() - t)
        print(f"ping round trip (protocol + pipes + threads, no solve): p50 {ms(pings, 50):.3f} ms  "
              f"p90 {ms(pings, 90):.3f} ms")
        results = measure(pool, args.steps, args.process_samples, args.seed)
    version = cvxpy_version()
    for name, times in results.items():
        print(f"\n{name}: {args.steps} receding-horizon re-solves, N = {HORIZON}")
        for mode in INTERLEAVED + SPAWNED:
            if times[mode]:
                print(f"  {mode:<9} p50 {ms(times[mode], 50):9.3f} ms  p90 {ms(times[mode], 90):9.3f} ms  "
                      f"({len(times[mode])} solves)")
        raw50, pool50, proc50 = (ms(times[m], 50) for m in ("raw", "pool", "process"))
        inside = [ms(times[m], 50) for m in ("raw_inside", "pool_inside")]
        print(f"  solve_problem's own time p50: {inside[0]:.3f} ms here, {inside[1]:.3f} ms in the worker "
              f"(pool - raw - that difference = IPC + codec: {pool50 - raw50 - inside[1] + inside[0]:+.3f} ms)")
        print(f"  pool - raw p50 {pool50 - raw50:+.3f} ms (target <= +1 ms: {'PASS' if pool50 <= raw50 + 1 else 'MISS'}); "
              f"process / pool p50 {proc50 / pool50:.0f}x (target >= 100x: {'PASS' if proc50 >= 100 * pool50 else 'MISS'})")
        if not times["cvxpy"]:
            print("  cvxpy: skipped (not installed; `pip install cvxpy` into the venv for this bench only)")
        else:
            print(f"  cvxpy {version}: largest |first move - bare OSQP's| {times['cvxpy_move_gap'][0]:.2e}")


if __name__ == "__main__":
    main()
