"""Benchmark: peak resident memory of a solver worker and of a 100-binding refresh process.

Issue 8. Linux only (reads /proc). Figures (MiB):
  worker ready      VmHWM of a pool worker right after its ready frame (imports only)
  worker peak       VmHWM of the same worker after 2 x 200 receding-horizon solves (bench_pool's two
                    plants, N = 30), i.e. its high-water mark with warm OSQP caches
  refresh process   peak RSS of `bench/bench_pipeline.py --bindings 100` (Dagster in process, ledger,
                    identification, UQ, the split measurement): getrusage of the reaped process
  refresh workers   the largest VmHWM among its children (solver workers, figure workers), sampled every 0.2 s
  refresh tree      the largest sampled sum of VmRSS over the process and its children

    .venv/bin/python bench/bench_memory.py [--bindings 100] [--steps 200]

bench/run.py calls `worker_peak` and `run_tree` (the latter also gives the pipeline figures).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_pool
from optimizer_pipeline.solver.pool import SolverPool

BENCH = Path(__file__).resolve().parent


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (KiB) of a live process from /proc/<pid>/status; {} once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def children(pid: int) -> list[int]:
    """Direct children of a live process (all its threads' /proc children lists)."""
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def worker_peak(steps: int, seed: int) -> dict[str, float]:
    """MiB: a fresh worker's VmHWM at ready and after `steps` solves of each bench_pool plant."""
    with SolverPool(size=1, request_timeout_ms=10_000) as pool:
        pid = pool.stats()["pids"][0]
        ready = status_kib(pid)["VmHWM"]
        for A, B, C in bench_pool.plants(seed).values():
            for problem in bench_pool.closed_loop(A, B, C, steps, seed):
                assert pool.solve(problem)["ok"]
        peak = status_kib(pid)["VmHWM"]
    return {"ready_mib": ready / 1024, "peak_mib": peak / 1024}


def run_tree(cmd: list[str], env: dict[str, str] | None = None, poll_s: float = 0.2) -> tuple[str, dict[str, float]]:
    """Run `cmd` to completion; (its stdout, MiB figures: process = its own peak RSS from wait4,
    workers = the largest sampled VmHWM of its children, tree = the largest sampled RSS sum)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(cmd, stdout=out, stderr=errors, env=env)  # files: a full pipe would block it
        worker_hwm, tree_rss = 0, 0
        while True:
            done, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if done:
                break
            kids = children(proc.pid)
            worker_hwm = max([worker_hwm] + [status_kib(k).get("VmHWM", 0) for k in kids])
            tree_rss = max(tree_rss, sum(status_kib(p).get("VmRSS", 0) for p in [proc.pid, *kids]))
            time.sleep(poll_s)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: "
                               f"{errors.read().decode('utf-8', 'replace')[-2000:]}")
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    # ru_maxrss (KiB on Linux) of a reaped child is the largest of it and its own reaped children:
    # the refresh process itself is far larger than its workers, so this is its peak.
    return text, {"process_mib": usage.ru_maxrss / 1024, "workers_mib": worker_hwm / 1024, "tree_mib": tree_rss / 1024}


def pipeline_cmd(bindings: int) -> list[str]:
    return [sys.executable, str(BENCH / "bench_pipeline.py"), "--bindings", str(bindings)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    worker = worker_peak(args.steps, args.seed)
    print(f"solver worker VmHWM: {worker['ready_mib']:.1f} MiB at ready, {worker['peak_mib']:.1f} MiB after "
          f"2 x {args.steps} solves")
    text, tree = run_tree(pipeline_cmd(args.bindings))
    print(text.rstrip())
    print(f"refresh of {args.bindings} bindings: process peak RSS {tree['process_mib']:.0f} MiB, largest worker "
          f"VmHWM {tree['workers_mib']:.0f} MiB, largest sampled tree RSS {tree['tree_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
