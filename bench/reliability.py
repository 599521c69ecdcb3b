"""Benchmark: the issue 9 fault, crash and load scenarios at the large counts (figures for RELIABILITY.md).

Usage: .venv/bin/python bench/reliability.py [worker|process|load|all] [--cycles 100] [--timeouts 20]
       [--kills 50] [--writers 4] [--readers 2] [--runs 50] [--workers 4] [--requests 25] [--seed 0]
The scenarios and their checks are the ones tests/test_reliability_*.py run at small counts
(tests/reliability_helpers.py); a failed check stops the script with the AssertionError.
"""

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ["OPTIMIZER_WORKER_TEST_OPS"] = "1"  # the workers' "sleep" op stands in for a slow solve

from optimizer_pipeline.ledger import Ledger  # noqa: E402
from optimizer_pipeline.solver import errors  # noqa: E402
from optimizer_pipeline.solver.pool import SolverPool  # noqa: E402

import reliability_helpers as rh  # noqa: E402


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def worker(args: argparse.Namespace, work: Path) -> None:
    case = rh.heater_case(Ledger(work / "worker.duckdb"))
    log_path = work / "received.log"
    started = time.monotonic()
    with SolverPool(size=1, request_timeout_ms=30_000, queue_wait_s=30.0, backoff_s=rh.FAST_BACKOFF,
                    worker_cmd=rh.counting_worker_cmd(log_path)) as pool:
        report = rh.worker_kill_cycles(case, pool, log_path, args.cycles)
        rh.check_kill_cycles(report, case, pool, log_path)
    wall = time.monotonic() - started
    print(f"worker SIGKILL mid-solve: {args.cycles} cycles survived in {wall:.1f} s through pipeline.recommend")
    print(f"  every request {errors.WORKER_INTERRUPTED}: {report.codes.count(errors.WORKER_INTERRUPTED)}/{args.cycles};"
          f" runs 'interrupted': {args.cycles}, left 'running': 0; solves received by workers: {args.cycles}"
          f" (0 replayed); worker pids: {args.cycles + 1}")
    print(f"  SIGKILL -> next request answered (back-off {rh.FAST_BACKOFF[0]:g} s + worker start): {_ms(report.recover_s)}")
    overshoot = []
    with SolverPool(size=1, request_timeout_ms=500, queue_wait_s=30.0, backoff_s=rh.FAST_BACKOFF) as pool:
        for _ in range(args.timeouts):
            hung = rh.hung_solve(case, pool)
            assert (hung.code, hung.run_status) == (errors.SOLVE_TIMEOUT, "failed") and rh.gone(hung.pid), hung
            assert hung.elapsed_s < 0.5 + 5, hung
            overshoot.append(hung.elapsed_s - 0.5)
            pool.ping()  # the answered request ends the failure streak, as a next caller's would
    print(f"hung solve, timeout 500 ms: {args.timeouts} killed, recorded 'failed'; recommend time past the timeout:"
          f" {_ms(overshoot)} (bound 5 s)")


def process(args: argparse.Namespace, work: Path) -> None:
    path = work / "process.duckdb"
    ledger = Ledger(path)
    rh.check_ledger_whole(ledger)
    before = rh.ledger_dump(ledger)
    started = time.monotonic()
    for point in rh.KILL_POINTS:
        assert rh.kill_paused_writer(path, point, work)
        assert rh.ledger_dump(ledger) == before, point
    print(f"writer SIGKILLed paused inside record_solve after each of {', '.join(rh.KILL_POINTS)}: ledger dump "
          f"unchanged, lock held while paused and free after ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    report = rh.random_writer_kills(path, args.kills, seed=args.seed)
    runs = rh.check_ledger_whole(ledger, report.committed)
    print(f"writer SIGKILLed at a random moment (0-500 ms after its first commit): {args.kills} kills in "
          f"{time.monotonic() - started:.1f} s; {runs} runs checked whole (2 candidates + 1 recommendation, none "
          f"running), {len(report.committed)} reported commits all present, 1 open recommendation")


def load(args: argparse.Namespace, work: Path) -> None:
    mixed = rh.mixed_readers_writers(work / "load.duckdb", args.writers, args.readers, args.runs)
    assert mixed.reader_errors == [], mixed.reader_errors
    rows = rh.check_ledger_whole(Ledger(work / "load.duckdb"), mixed.written)
    assert rows == args.writers * args.runs
    print(f"ledger: {args.writers} writer + {args.readers} reader processes, {args.runs} runs each writer: "
          f"{rows} runs present and whole, {mixed.reads} whole-ledger reads, 0 lock errors, {mixed.wall_s:.1f} s "
          f"({mixed.wall_s / rows * 1000:.0f} ms per run written)")
    log_path = work / "overload.log"
    callers = 4 * args.workers
    with SolverPool(size=args.workers, request_timeout_ms=10_000, queue_wait_s=0.25, backoff_s=rh.FAST_BACKOFF,
                    worker_cmd=rh.counting_worker_cmd(log_path)) as pool:
        report = rh.pool_overload(pool, log_path, callers, args.requests, sleep_s=0.15)
    rh.check_overload(report)
    print(f"pool: {args.workers} workers, {callers} callers x {args.requests} requests of 150 ms, queue wait 250 ms: "
          f"{report.answered} answered + {report.refused} {errors.SOLVER_QUEUE_FULL} = {report.requests}, "
          f"0 lost, 0 crossed, workers received {report.received}, {report.wall_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="all", choices=("worker", "process", "load", "all"))
    parser.add_argument("--cycles", type=int, default=100, help="worker SIGKILL cycles")
    parser.add_argument("--timeouts", type=int, default=20, help="hung solves killed by the timeout")
    parser.add_argument("--kills", type=int, default=50, help="ledger writers killed at random moments")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50, help="runs written by each writer process")
    parser.add_argument("--workers", type=int, default=4, help="pool size for the overload (callers = 4x)")
    parser.add_argument("--requests", type=int, default=25, help="requests per caller thread")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each fault logs a warning by design; the figures are the output
    with tempfile.TemporaryDirectory(prefix="bench-reliability-") as tmp:
        for name, scenario in (("worker", worker), ("process", process), ("load", load)):
            if args.scenario in (name, "all"):
                scenario(args, Path(tmp))


if __name__ == "__main__":
    main()
