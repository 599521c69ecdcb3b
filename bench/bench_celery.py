"""Benchmark: a refresh through 2 Celery workers vs the in-process single run on the same machine (issue 14).

Usage:
    .venv/bin/python bench/bench_celery.py [SIZE] [--bindings N] [--per-run 25[,50...]] [--single-runs 4]
                                           [--plant tanks] [--no-duckdb-anchor] [--max-load L] [--baseline REF]
SIZE / --bindings: bindings refreshed (default 100; `--bindings 20` for a quick look).

Started the way tests/test_several_hosts.py starts things (its helpers are imported): a throwaway
PostgreSQL and Redis (tests/servers.py), a home per process with settings.yaml `ledger.url`,
`dagster.postgres_url`, `dagster.run_launcher: celery`, `dagster.broker`,
`dagster.max_partitions_per_run`; `optimizer-pipeline worker --name a` and `--name b`, and
`optimizer-pipeline daemon` as subprocesses (stopped by SIGTERM at the end, also on error; the
servers by their context managers). Every timed refresh is the CLI, `optimizer-pipeline
materialize` as a user runs it (process start and imports included), waiting for its runs.

Phases, all on the same machine, one after the other; each is printed when it ends:
  ingest      SIZE '--plant' bindings into the PostgreSQL ledger (timed, not a figure of the refresh)
  in-process  `materialize --all` from a home with the ledger and the instance on the same servers
              but no Celery: ONE in-process Dagster run over all bindings (automation.run_partitions). The
              same-backend anchor; it also solves every binding first, so that the daemon's
              binding_changes sensor finds them solved and launches nothing of its own.
  celery      the 2 workers and the daemon are started and waited for (not timed); a warm-up refresh of
              2 bindings in runs of 1 (not a figure: the first runs are cold); then, for each
              value of --per-run, `materialize --all` from a submitter home with that
              max_partitions_per_run: runs of at most that many bindings, queued, launched by the
              daemon onto the 2 workers (fair dispatch), waited for. A run that fails is reported
              with Dagster's reason (the bench goes on).
  single      --single-runs bindings in runs of ONE binding (max_partitions_per_run 1), through
              the same warm workers: the per-run cost.
  duckdb      (unless --no-duckdb-anchor) bench/bench_pipeline.py --bindings SIZE as a subprocess:
              the embedded default (DuckDB file, SQLite instance, one in-process run; BENCHMARKS.md's
              refresh figure, run_partitions alone), after the servers are stopped.
Per-run overhead vs per-binding cost: the duration of each successful Celery run (Dagster's run
start -> end) is fitted as a + b x bindings over all run sizes (a: the run's own cost, b: one more
binding in a run); the gap between a worker's runs is the rest of the per-run cost. Dispatch
(`materialize` start -> the first run's start: CLI start, the submission of every run from that
process, the daemon's dequeue, Celery) + the CLI's wait after the last run are paid once per refresh, fitted against the
number of runs when two --per-run values are given. N workers on N hosts (one worker each, N runs of
ceil(SIZE / N)) are estimated as that + a + ceil(SIZE / N) x b, with b as measured
here (two workers sharing 2 cores: about one core each) and with the in-process run's duration per
binding (a worker with a host like this one to itself; its run's own cost included).
"""

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench", ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from baseline import installed  # noqa: E402
from ledger_helpers import ledger_at  # noqa: E402
from quiet import add_quiet_arguments, wait_if_asked  # noqa: E402
from test_several_hosts import LIVE_AGE_S, _env, _group_gone, _home, _start, _stop, _wait_for  # noqa: E402

OPEN = ("verified", "unverified", "rejected")
CLI_TIMEOUT_S = 3 * 3600
MODEL_BINDINGS = 10_000  # the site size of issue 39's target for the N-host model


def load() -> float:
    return os.getloadavg()[0]


def _count(values: Any) -> dict:
    out: dict = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def cli(home: Path, *args: str) -> dict:
    """`optimizer-pipeline --home HOME ARGS` as a user runs it: start (epoch s), wall (s), exit code,
    the printed JSON docs (materialize prints them also when a binding failed) and stderr."""
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args], env=_env(),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    wall = time.time() - started
    try:
        docs = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"optimizer-pipeline {' '.join(args)} exited {proc.returncode} without its JSON:\n"
                           f"{proc.stderr[-3000:]}") from None
    return {"submitted": started, "wall": wall, "code": proc.returncode,
            "docs": docs if isinstance(docs, list) else [docs], "stderr": proc.stderr}


def run_figures(instance: Any, docs: list[dict], submitted: float, worker_of: dict[str, str]) -> list[dict]:
    """Per Dagster run of `docs`: its bindings, the worker that ran it (from the ledger runs' context),
    its status (and Dagster's reason when it failed), dispatch (submission -> its start), duration
    (start -> end), the gap since the previous run of its worker ended, and its steps."""
    from dagster import DagsterEventType

    by_run: dict[str, list[str]] = {}
    for doc in docs:
        by_run.setdefault(doc["dagster_run_id"], []).append(doc["binding_id"])
    out = []
    for run_id, bindings in by_run.items():
        stats = instance.get_run_stats(run_id)
        steps = instance.get_run_step_stats(run_id)
        status = instance.get_run_by_id(run_id).status.value
        failure = ""
        if status != "SUCCESS":
            events = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
            failure = events[-1].dagster_event.message.splitlines()[0] if events else "?"
        start, end = stats.start_time, stats.end_time
        out.append({"run_id": run_id, "bindings": len(bindings), "worker": worker_of.get(bindings[0], "-"),
                    "status": status, "failure": failure, "enqueued": stats.enqueued_time,
                    "launched": stats.launch_time, "start": start, "end": end,
                    "dispatch": None if start is None else start - submitted,
                    "duration": None if start is None or end is None else end - start, "steps": len(steps),
                    "step_s": sum(s.end_time - s.start_time for s in steps if s.start_time and s.end_time)})
    for run in out:
        before = [r["end"] for r in out if r["worker"] == run["worker"] and r["end"] and run["start"]
                  and r["end"] <= run["start"]]
        run["gap"] = run["start"] - max(before) if before else None
    return out


def open_breaks(ledger: Any, binding_ids: list[str]) -> int:
    frame = ledger.query(f"""SELECT binding_id, count(*) AS n FROM optimizer_recommendations
                             WHERE status IN ({', '.join(f"'{s}'" for s in OPEN)}) GROUP BY binding_id""")
    per = dict(zip(frame["binding_id"], frame["n"]))
    return sum(1 for b in binding_ids if per.get(b, 0) != 1)


def run_ids(ledger: Any) -> set[str]:
    return {run.id for run in ledger.list_runs()}


def workers_of(ledger: Any, before: set[str]) -> dict[str, str]:
    """binding -> the worker name (context_json.worker) of its ledger run that is not in `before`."""
    return {run.binding_id: run.context.get("worker", "?") for run in ledger.list_runs() if run.id not in before}


def refresh(label: str, home: Path, ledger: Any, *targets: str) -> dict:
    """One timed `materialize` (waiting for its runs) with its runs' figures; printed at once."""
    from dagster import DagsterInstance

    before, load_before = run_ids(ledger), load()
    out = cli(home, "materialize", *targets)
    out.update(label=label, load=(load_before, load()), ok=sum(1 for d in out["docs"] if d["ok"]),
               statuses=_count(d["status"] for d in out["docs"] if d["ok"]))
    worker_of = workers_of(ledger, before)
    out["workers"] = _count(worker_of.values())
    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        out["runs"] = run_figures(instance, out["docs"], out["submitted"], worker_of)
    n = len(out["docs"])
    print(f"\n{label}: {out['wall']:.1f} s wall, {out['wall'] / n:.3f} s per binding, {len(out['runs'])} run(s), "
          f"{out['ok']} of {n} bindings ok {out['statuses']}; bindings per worker {out['workers']} "
          f"(load {out['load'][0]:.2f} -> {out['load'][1]:.2f})", flush=True)
    for r in sorted(out["runs"], key=lambda r: r["start"] or float("inf")):
        timing = "never started" if r["start"] is None else (
            f"dispatch {r['dispatch']:6.1f} s, duration {r['duration']:6.1f} s"
            + ("" if r["gap"] is None else f", gap {r['gap']:5.1f} s"))
        launched = "" if r["launched"] is None else f"launched {r['launched'] - r['enqueued']:4.1f} s after queued, "
        print(f"    {r['bindings']:3d} bindings on {r['worker']:<5} {r['status']:<7} {launched}{timing} "
              f"({r['steps']} step(s), {r['step_s']:.1f} s in steps){'  ' + r['failure'] if r['failure'] else ''}",
              flush=True)
    return out


def _wait_for_daemons(instance: Any, timeout_s: float) -> None:
    """Until the daemon's run queue and sensor loops have sent a heartbeat."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if {"QUEUED_RUN_COORDINATOR", "SENSOR"} <= set(instance.get_daemon_heartbeats()):
            return
        time.sleep(1)
    raise RuntimeError(f"the daemon sent no heartbeat within {timeout_s:g} s")


def celery_phases(args: argparse.Namespace, pg: Any, redis: str, tmp: Path) -> dict:
    from dagster import DagsterInstance

    from optimizer_pipeline.contracts import binding_from_dict
    from optimizer_pipeline.plants import get_plant

    ledger_url, dagster_url = pg.new_database(), pg.new_database()
    celery = {"postgres_url": dagster_url, "run_launcher": "celery", "broker": redis}

    def home(name: str, **dagster: Any) -> Path:
        # the history ends when the bench starts and the bench takes many minutes: the live
        # state's age is not what it measures (as in tests/test_several_hosts.py)
        return _home(tmp, name, {"ledger": {"url": ledger_url}, "live": {"max_age_s": LIVE_AGE_S},
                                 "dagster": dagster})

    homes = {name: home(name, **celery) for name in ("daemon", "worker-a", "worker-b")}
    out: dict[str, Any] = {"phases": []}

    plant = get_plant(args.plant)
    frame = plant.history(1).frame
    ids = [f"{args.plant}-{i:03d}" for i in range(args.bindings)]
    ledger = ledger_at(ledger_url)
    load_before, t = load(), time.perf_counter()
    for binding_id in ids:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
    out["ingest_s"] = time.perf_counter() - t
    print(f"ingest of {args.bindings} bindings into the PostgreSQL ledger: {out['ingest_s']:.1f} s "
          f"(load {load_before:.2f} -> {load():.2f})", flush=True)

    out["inprocess"] = refresh("in-process, ledger + instance on PostgreSQL, one Dagster run",
                               home("inprocess", postgres_url=dagster_url), ledger, "--all")
    logs = {name: tmp / f"{name}.log" for name in ("daemon", "worker-a", "worker-b")}
    procs: dict[str, subprocess.Popen] = {}
    try:
        t = time.perf_counter()
        procs["worker-a"] = _start(homes["worker-a"], "worker", "--name", "a", log=logs["worker-a"])
        procs["worker-b"] = _start(homes["worker-b"], "worker", "--name", "b", log=logs["worker-b"])
        procs["daemon"] = _start(homes["daemon"], "daemon", log=logs["daemon"])
        for name in ("worker-a", "worker-b"):
            _wait_for("ready.", logs[name], timeout_s=600)
        with DagsterInstance.from_config(str(homes["daemon"] / "dagster")) as instance:
            _wait_for_daemons(instance, timeout_s=600)
        print(f"\n2 workers + daemon started and ready in {time.perf_counter() - t:.1f} s (not in any figure)",
              flush=True)
        # the first runs after a start are cold (code server, imports in the workers): not a figure
        out["warmup"] = refresh("warm-up (not a figure): runs of 1 binding, one per worker",
                                home("warmup", **celery, max_partitions_per_run=1), ledger, *ids[:2])
        for per_run in args.per_run:
            out["phases"].append(refresh(f"Celery, 2 workers, runs of <= {per_run}",
                                         home(f"submitter-{per_run}", **celery, max_partitions_per_run=per_run),
                                         ledger, "--all"))
        if args.single_runs:
            out["single"] = refresh("Celery, 2 workers, runs of 1 binding",
                                    home("single", **celery, max_partitions_per_run=1), ledger,
                                    *ids[:args.single_runs])
        with DagsterInstance.from_config(str(homes["daemon"] / "dagster")) as instance:
            launched = len(instance.get_run_ids())
        out["other_runs"] = launched - sum(len(p["runs"]) for p in [out["inprocess"], out["warmup"], *out["phases"],
                                                                     *([out["single"]] if "single" in out else [])])
        out["open_breaks"] = open_breaks(ledger, ids)
    except BaseException:
        for name, path in logs.items():
            if path.exists():
                print(f"--- {name} log, last 3000 characters:\n{path.read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
        raise
    finally:
        stop_all(procs)
        ledger.backend.close()
    return out


def stop_all(procs: dict[str, subprocess.Popen]) -> None:
    """SIGTERM to every process started (tests/test_several_hosts.py `_stop`: all at once, SIGKILL to
    the group of one still running after 60 s), then SIGKILL to whatever is left of each group: the
    bench leaves nothing running, whichever way it ends."""
    problems = []
    try:
        _stop(list(procs.values()))
    except AssertionError as exc:
        problems.append(str(exc))
    for name, proc in procs.items():
        if not _group_gone(proc.pid):
            problems.append(f"{name}: a process of its group was left running (killed)")
            os.killpg(proc.pid, signal.SIGKILL)
    if problems:
        print("!! stopping:", "; ".join(problems), file=sys.stderr)


def duckdb_anchor(bindings: int, plant: str) -> dict:
    """bench/bench_pipeline.py --bindings N as a subprocess: its printout and total wall."""
    before = load()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_pipeline.py"), "--bindings", str(bindings),
                           "--plant", plant], capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")})
    if proc.returncode != 0:
        raise RuntimeError(f"bench_pipeline.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    wall = float(re.search(r"total wall: ([\d.]+) s", proc.stdout).group(1))
    print(f"\nbench_pipeline.py --bindings {bindings} (DuckDB + SQLite, in process; load {before:.2f} -> "
          f"{load():.2f}):\n{proc.stdout.rstrip()}", flush=True)
    return {"wall": wall, "load": (before, load())}


def fit(runs: list[dict]) -> tuple[float, float] | None:
    """(a, b) of duration = a + b x bindings, least squares over the runs (None without two sizes)."""
    sizes = np.array([r["bindings"] for r in runs], float)
    if len(set(sizes)) < 2:
        return None
    b, a = np.polyfit(sizes, np.array([r["duration"] for r in runs]), 1)
    return float(a), float(b)


def summary(label: str, args: argparse.Namespace, out: dict, anchor: dict | None) -> None:
    n = args.bindings
    inproc = out["inprocess"]
    print(f"\nsummary of {label}, {n} '{args.plant}' bindings, {os.cpu_count()} cores")
    print(f"  in-process on PostgreSQL (one run): {inproc['wall']:.1f} s wall")
    if anchor:
        print(f"  in-process embedded default (bench_pipeline.py, run_partitions alone): {anchor['wall']:.1f} s")
    for phase in out["phases"]:
        whole = phase["ok"] == n
        ratios = f"Celery / in-process on PostgreSQL {phase['wall'] / inproc['wall']:.2f}" + (
            f", / embedded default {phase['wall'] / anchor['wall']:.2f}" if anchor else "")
        print(f"  {phase['label']}: {phase['wall']:.1f} s wall, {phase['ok']} of {n} bindings ok; "
              f"{ratios if whole else 'NOT comparable: runs failed'}")
    print(f"  exactly one open recommendation per binding: {n - out['open_breaks']} of {n}; runs launched by "
          f"anything else (e.g. a sensor) meanwhile: {out['other_runs']}")
    runs = [r for p in [*out["phases"], out.get("single", {"runs": []})] for r in p["runs"]
            if r["status"] == "SUCCESS" and r["duration"] is not None]
    ab = fit(runs)
    whole = [p for p in out["phases"] if p["ok"] == n]
    if ab is None or not whole:
        print("  no per-run / per-binding split: needs a phase whose runs all succeeded and two run sizes")
        return
    a, b = ab
    fixed_points = []
    for phase in whole:
        first_start = min(r["start"] for r in phase["runs"])
        last_end = max(r["end"] for r in phase["runs"])
        dispatch, busy = first_start - phase["submitted"], last_end - first_start
        tail = phase["wall"] - (last_end - phase["submitted"])
        fixed_points.append((len(phase["runs"]), dispatch + tail))
        print(f"  {phase['label']}: wall {phase['wall']:.1f} s = dispatch {dispatch:.1f} s (CLI start, submission, "
              f"daemon, Celery, worker) + first run start -> last run end {busy:.1f} s + the CLI's wait after it "
              f"{tail:.1f} s")
    gaps = [r["gap"] for r in runs if r["gap"] is not None]
    gap = float(np.median(gaps)) if gaps else 0.0
    sizes = _count(r["bindings"] for r in runs)
    print(f"  fit over {len(runs)} successful runs (sizes {sizes}; the warm-up's left out): duration = a + b x "
          f"bindings, a = {a:.1f} s, b = {b:.3f} s per binding (two workers sharing 2 cores); median gap between "
          f"a worker's runs {gap:.1f} s ({len(gaps)} gaps)")
    per_run = a + gap
    size = args.per_run[0]
    print(f"  per-run overhead {per_run:.1f} s (a + gap) = {per_run / b:.0f} bindings' worth; in a run of {size}: "
          f"{per_run:.1f} s of {per_run + size * b:.1f} s ({100 * per_run / (per_run + size * b):.0f} %)")
    if len({r for r, _ in fixed_points}) >= 2:
        d1, d0 = np.polyfit(*zip(*fixed_points), 1)
        fixed_text = f"{d0:.1f} s + {d1:.1f} s x runs (dispatch + CLI wait, fitted over {len(fixed_points)} refreshes)"
    else:
        d0, d1 = fixed_points[0][1], 0.0
        fixed_text = f"{d0:.1f} s (dispatch + CLI wait, one refresh)"
    b_host = sum(r["duration"] for r in inproc["runs"]) / n
    for total in (n, MODEL_BINDINGS):
        print(f"  {total} bindings on N hosts, one worker each, N runs of ceil({total} / N): {fixed_text} + a + "
              f"ceil({total} / N) x b; speed-up against one host (target >= 0.8 N up to 16 hosts)")
        print(f"    {'N':>3}  {'b = ' + format(b, '.3f') + ' s (here)':>30}  "
              f"{'b = ' + format(b_host, '.3f') + ' s (in-process run / binding)':>48}")

        def modelled(hosts: int, per_binding: float) -> str:
            alone = d0 + d1 + a + total * per_binding
            spread = d0 + d1 * hosts + a + math.ceil(total / hosts) * per_binding
            return f"{spread:.1f} s ({alone / spread:.1f} x)"

        for hosts in (1, 2, 4, 8, 16, 32):
            print(f"    {hosts:>3}  {modelled(hosts, b):>30}  {modelled(hosts, b_host):>48}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", type=int, default=None, help="bindings (default 100)")
    parser.add_argument("--bindings", type=int, default=None, help="the same as SIZE")
    parser.add_argument("--per-run", default="25",
                        help="dagster.max_partitions_per_run of the refresh; several (25,50): one refresh each")
    parser.add_argument("--single-runs", type=int, default=4, help="bindings refreshed in runs of one (0: skip)")
    parser.add_argument("--plant", default="tanks")
    parser.add_argument("--no-duckdb-anchor", action="store_true", help="skip bench_pipeline.py")
    parser.add_argument("--baseline", metavar="REF", help="the same phases first on the code of this git commit "
                        "(bench/baseline.py): before / after in one run")
    add_quiet_arguments(parser)
    args = parser.parse_args()
    wait_if_asked(args)
    args.bindings = args.bindings or args.size or 100
    args.per_run = [int(v) for v in args.per_run.split(",")]
    args.single_runs = min(args.single_runs, args.bindings)

    import pytest

    from servers import postgres_server, redis_server

    print(f"bench_celery: {args.bindings} bindings, runs of <= {args.per_run}, load average {load():.2f} at start",
          flush=True)
    started = time.perf_counter()
    rounds = {}
    for label, ref in ([(f"baseline {args.baseline}", args.baseline)] if args.baseline else []) + [("this tree", None)]:
        print(f"\n===== {label}", flush=True)
        with (installed(ref) if ref else contextlib.nullcontext()) as site:
            os.environ.pop("PYTHONPATH", None)
            if site is not None:  # every CLI, worker and daemon process of the round runs that commit's code
                os.environ["PYTHONPATH"] = str(site)
            try:
                with postgres_server() as pg, redis_server() as redis, \
                        tempfile.TemporaryDirectory(prefix="bench-celery-") as tmp:
                    rounds[label] = celery_phases(args, pg, redis, Path(tmp))
            except pytest.skip.Exception as exc:  # servers.py skips (pytest's way) when it cannot start one
                sys.exit(f"bench_celery: {exc.msg}")
            finally:
                os.environ.pop("PYTHONPATH", None)
    anchor = None if args.no_duckdb_anchor else duckdb_anchor(args.bindings, args.plant)
    for label, out in rounds.items():
        summary(label, args, out, anchor)
    print(f"\nload average {load():.2f} at end; {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
