"""Fault, load and crash scenarios of issue 9, shared by tests/test_reliability_*.py (small counts)
and bench/reliability.py (large counts). Every scenario uses real processes: solver workers killed
with SIGKILL, ledger writers killed inside a transaction, several OS processes on one DuckDB file.
A scenario returns plain figures; `check_*` functions raise AssertionError naming what broke, so the
bench asserts exactly what the tests assert.
"""

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import numpy as np

from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import Calibration, ProblemIR, SolveResult, binding_from_dict, utc_now
from optimizer_pipeline.ledger import Ledger, StoredBinding
from optimizer_pipeline.model import current_state
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.problem import compile_problem
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver import errors
from optimizer_pipeline.solver.errors import SolverError
from optimizer_pipeline.solver.pool import SolverPool

TESTS = Path(__file__).resolve().parent
FAST_BACKOFF = (0.05, 0.05, 0.05)  # the pool's back-off schedule, shortened so a cycle costs a worker start
OPEN = ("verified", "unverified", "rejected")
WORKER_REASON = f"solver error {errors.WORKER_INTERRUPTED}"  # how decide() names the failed solve
SEED = 1

# The real worker (`optimizer_pipeline.solver.worker`), with every request line it receives appended
# to a log file as "<pid>\t<line>" before it is served: the count of what workers actually received,
# which survives the SIGKILL of the worker (each line is written and closed before it is handled).
COUNTING_WORKER = """\
import os, sys
from optimizer_pipeline.solver import worker
LOG = sys.argv[1]
_handle = worker.Worker.handle_line
def counted(self, line):
    with open(LOG, "ab") as log:
        log.write(str(os.getpid()).encode() + b"\\t" + line.rstrip(b"\\n") + b"\\n")
    return _handle(self, line)
worker.Worker.handle_line = counted
sys.exit(worker.main())
"""


def counting_worker_cmd(log_path: Path) -> list[str]:
    """worker_cmd for SolverPool: the real worker, logging received requests to `log_path`."""
    return [sys.executable, "-c", COUNTING_WORKER, str(log_path)]


def received(log_path: Path) -> list[tuple[int, Any, str]]:
    """(worker pid, reqId, op) of every request line the counting workers received, in order."""
    if not log_path.exists():
        return []
    out = []
    for line in log_path.read_bytes().splitlines():
        pid, text = line.split(b"\t", 1)
        frame = json.loads(text)
        out.append((int(pid), frame.get("reqId"), frame.get("op")))
    return out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout_s`. The default is a
    bound, not a pause: a restarted worker is ready in ~1.5 s on a quiet machine and ~4 s at load 3 on 2
    cores, so 60 s only ever runs out on a hang."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.005)


def ledger_dump(ledger: Ledger) -> dict[str, tuple[int, str]]:
    """Row count and an order-independent hash of every row, per table (equal dumps = same ledger)."""
    row_hash = "hash(r)" if ledger.backend.dialect == "duckdb" else "hashtext(r::text)::bigint"
    with ledger.transaction() as conn:
        return {t: tuple(conn.execute(f"SELECT count(*), coalesce(sum({row_hash}), 0)::VARCHAR FROM {t} r")
                         .fetchall()[0]) for t in ledger.counts()}


# ---------------------------------------------------------------------------- a real binding to recommend for


@dataclass
class Case:
    """One ingested, identified and calibrated binding, ready for `pipeline.recommend`."""

    ledger: Ledger
    stored: StoredBinding
    artifact: Any
    split: Any
    calibration: Calibration
    settings: Settings

    def recommend(self, solve: Callable[[ProblemIR], SolveResult], now: datetime | None = None) -> pipeline.SolveRecord:
        return pipeline.recommend(self.stored, self.artifact, self.split, self.calibration, solve, self.ledger,
                                  self.settings, "simulation", now or utc_now())

    def problems(self, n: int, seed: int = 0) -> list[ProblemIR]:
        """`n` distinct problems of this binding: the live state with the state vector perturbed."""
        live = self.split.live
        x0, bias = current_state(self.artifact, live)
        rng = np.random.default_rng(seed)
        return [compile_problem(self.stored.spec, self.artifact, np.asarray(x0) + 0.05 * rng.standard_normal(len(x0)),
                                bias, live.u[-1], live.d[-1], np.asarray(self.calibration.evidence.qhat))
                for _ in range(n)]


def heater_case(ledger: Ledger, doc: dict | None = None, frame=None, settings: Settings | None = None,
                ingest: bool = True) -> Case:
    """The heater demo binding (or `doc` / `frame` derived from it) through the domain steps, no Dagster."""
    plant = get_plant("heater")
    spec = binding_from_dict(doc or plant.binding_doc())
    if ingest:
        ledger.ingest(spec, plant.history(SEED).frame if frame is None else frame, "simulation")
    stored = ledger.get_binding(spec.id)
    split = pipeline.prepare_split(ledger, stored)
    artifact = pipeline.identify_model(ledger, stored, split)
    scores = pipeline.score_and_store(ledger, spec, artifact, split)
    settings = settings or Settings()
    calibration = pipeline.calibrate(ledger, artifact, scores, settings, utc_now())
    return Case(ledger, stored, artifact, split, calibration, settings)


def pool_solve(pool: SolverPool) -> Callable[[ProblemIR], SolveResult]:
    return lambda problem: SolveResult.from_dict(pool.solve(problem))


def sleeping_solve(pool: SolverPool, seconds: float = 60.0) -> Callable[[ProblemIR], SolveResult]:
    """A solve that hangs in the worker (test op "sleep"): it ends only by a kill or the pool's timeout."""
    return lambda problem: SolveResult.from_dict(pool.request("sleep", {"seconds": seconds}))


# ---------------------------------------------------------------------------- worker faults


@dataclass
class KillCycles:
    cycles: int
    codes: list[str] = field(default_factory=list)  # error code each interrupted request ended with
    run_ids: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)  # SIGKILL -> the next request answered


def worker_kill_cycles(case: Case, pool: SolverPool, log_path: Path, cycles: int) -> KillCycles:
    """`cycles` times: pipeline.recommend with a solve in flight in the (single) worker, SIGKILL that
    worker once the worker has received the request, then one ping once the pool restarted it."""
    report = KillCycles(cycles)
    for cycle in range(cycles):
        wait_until(lambda: pool.stats()["ready"] == 1, "a ready worker")
        pid = pool.stats()["pids"][0]
        outcome: list = []
        caller = threading.Thread(target=lambda: outcome.append(case.recommend(sleeping_solve(pool))))
        caller.start()
        wait_until(lambda: sum(op == "sleep" for _, _, op in received(log_path)) == cycle + 1,
                   f"the worker to receive the solve of cycle {cycle}")
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        caller.join(timeout=120)  # the ledger write of the interrupted run: well under 1 s quiet
        assert outcome, f"cycle {cycle}: pipeline.recommend did not return after the worker was killed"
        record = outcome[0]
        report.codes.append(record.result.error_code)
        report.run_ids.append(record.run_id)
        report.killed_pids.append(pid)
        answer = pool.ping()  # waits in the queue for the restarted worker
        report.recover_s.append(time.monotonic() - killed_at)
        assert answer["pid"] != pid, f"cycle {cycle}: the killed worker {pid} answered"
    return report


def check_kill_cycles(report: KillCycles, case: Case, pool: SolverPool, log_path: Path) -> None:
    """Every request interrupted, recorded as an `interrupted` run with a rejected recommendation, no
    request replayed, every killed worker gone, the pool healthy."""
    n = report.cycles
    assert report.codes == [errors.WORKER_INTERRUPTED] * n, Counter(report.codes)
    runs = {r.id: r for r in case.ledger.list_runs(case.stored.spec.id)}
    assert [runs[i].status for i in report.run_ids] == ["interrupted"] * n
    assert not [r for r in runs.values() if r.status == "running"], "a run was left running"
    recs = [r for r in case.ledger.list_recommendations(case.stored.spec.id) if r.run_id in report.run_ids]
    assert len(recs) == n and all(WORKER_REASON in " ".join(r.reasons) for r in recs)
    assert [r.status for r in recs].count("rejected") == 1 and sum(r.status in OPEN for r in recs) == 1
    log = received(log_path)
    sleeps = [req for _, req, op in log if op == "sleep"]
    assert len(sleeps) == n and len(set(sleeps)) == n, f"{len(sleeps)} solves received for {n} requests (replayed?)"
    assert [op for _, _, op in log] == ["sleep", "ping"] * n, "a worker received a request nobody sent"
    assert len({pid for pid, _, _ in log}) == n + 1 and all(gone(pid) for pid in report.killed_pids)
    stats = pool.stats()
    assert (stats["degraded"], stats["consecutive_failures"], stats["ready"]) == (False, 0, 1), stats


@dataclass
class HungSolve:
    elapsed_s: float  # request start -> SOLVE_TIMEOUT raised (worker killed): the solve call alone
    code: str
    run_status: str
    pid: int


def hung_solve(case: Case, pool: SolverPool) -> HungSolve:
    """pipeline.recommend whose solve hangs past the pool's request timeout."""
    wait_until(lambda: pool.stats()["ready"] == 1, "a ready worker")
    pid = pool.stats()["pids"][0]
    hanging, timed = sleeping_solve(pool), []

    def solve(problem: ProblemIR) -> SolveResult:
        # timed around the pool request only: what pipeline.recommend does before and after it (compile
        # the problem, write the run to the ledger) is no part of "killed within timeout + 5 s", and takes
        # seconds of its own on a loaded machine
        started = time.monotonic()
        try:
            return hanging(problem)
        finally:
            timed.append(time.monotonic() - started)

    record = case.recommend(solve)
    return HungSolve(timed[0], record.result.error_code, case.ledger.get_run(record.run_id).status, pid)


# ---------------------------------------------------------------------------- process faults

# The steps of Ledger.record_solve's one transaction (its private `_name(tx, ...)` forms).
KILL_POINTS = ("_insert_run_row", "_insert_candidate_table", "_insert_recommendation")

# A ledger writer that stops (sleeps) right after `Ledger.<point>` inside record_solve's transaction,
# after saying so in a file: the parent then kills it with the transaction open and the lock held.
PAUSED_WRITER = """\
import inspect, os, sys, time
sys.path.insert(0, sys.argv[4])
from optimizer_pipeline.ledger import Ledger
from ledger_helpers import ledger_at, solve
path, point, ready = sys.argv[1:4]
original = inspect.getattr_static(Ledger, point)
static = isinstance(original, staticmethod)
step = original.__func__ if static else original
def paused(*args, **kwargs):
    out = step(*args, **kwargs)
    with open(ready, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)
    return out
setattr(Ledger, point, staticmethod(paused) if static else paused)
solve(ledger_at(path), binding_id="crash")
"""

# A ledger writer that records solves in a loop and prints each run id once committed.
LOOPING_WRITER = """\
import sys
sys.path.insert(0, sys.argv[2])
from optimizer_pipeline.ledger import Ledger
from ledger_helpers import solve
ledger = Ledger(sys.argv[1])
while True:
    print(solve(ledger, binding_id="crash")[0], flush=True)
"""


def kill_paused_writer(path: Path, point: str, workdir: Path, timeout_s: float = 60.0) -> bool:
    """Start a writer paused inside record_solve after `point`; SIGKILL it there. Returns whether the
    ledger lock was held while it was paused (it must be: the transaction was open)."""
    ready = workdir / f"ready-{point}"
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, str(path), point, str(ready), str(TESTS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: ready.exists() and ready.read_text() != "" or proc.poll() is not None,
                   f"the writer to pause after {point}", timeout_s)
        assert proc.poll() is None, f"writer exited early: {proc.stderr.read().decode()[-2000:]}"
        held = _lock_held(path)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    return held


def _lock_held(path: Path | str) -> bool:
    """DuckDB: the file lock is taken; PostgreSQL: a connection sits inside an open transaction."""
    from optimizer_pipeline.ledger import LedgerBusyError

    if str(path).startswith("postgresql://"):
        from ledger_helpers import ledger_at

        return int(ledger_at(str(path)).query("""SELECT count(*) AS n FROM pg_stat_activity
            WHERE state = 'idle in transaction' AND datname = current_database()""")["n"][0]) > 0
    try:
        Ledger(path, lock_timeout_s=0.2).query("SELECT 1")
    except LedgerBusyError:
        return True
    return False


@dataclass
class RandomKills:
    kills: int
    committed: list[str] = field(default_factory=list)  # run ids the writers printed after their commit
    delays_s: list[float] = field(default_factory=list)


def random_writer_kills(path: Path, kills: int, seed: int, max_delay_s: float = 0.5) -> RandomKills:
    """`kills` times: a writer looping over record_solve is SIGKILLed at a random moment after its
    first commit. Returns the run ids it reported as committed (all must be in the ledger)."""
    rng = random.Random(seed)
    report = RandomKills(kills)
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", LOOPING_WRITER, str(path), str(TESTS)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        wait_until(lambda: bool(lines) or proc.poll() is not None, "the writer's first commit")
        delay = rng.uniform(0.0, max_delay_s)
        time.sleep(delay)  # the kill's random moment is the scenario: whatever the writer did by then, it must hold
        proc.kill()
        proc.wait()
        reader.join(timeout=60)  # EOF at once: the writer is dead; a bound, not a pause
        assert not reader.is_alive(), "the writer's output was not read to its end"
        proc.stdout.close()
        report.committed += [line.strip() for line in lines if line.strip()]
        report.delays_s.append(delay)
    return report


def check_ledger_whole(ledger: Ledger, committed: list[str] = (), candidates_per_run: int | None = 2) -> int:
    """No partial write: every run finished, with its candidates (`candidates_per_run`, the count
    ledger_helpers writes; None: at least one) and its recommendation, one open recommendation per
    binding, and every run id in `committed` present. Returns the runs checked."""
    rows = ledger.query("""SELECT r.id, r.status,
            (SELECT count(*) FROM optimizer_candidates c WHERE c.run_id = r.id) AS candidates,
            (SELECT count(*) FROM optimizer_recommendations o WHERE o.run_id = r.id) AS recommendations
        FROM optimizer_runs r""")
    wrong_candidates = rows["candidates"] < 1 if candidates_per_run is None else rows["candidates"] != candidates_per_run
    partial = rows[(rows["status"] == "running") | wrong_candidates | (rows["recommendations"] != 1)]
    assert partial.empty, f"partial writes left in the ledger:\n{partial}"
    missing = set(committed) - set(rows["id"])
    assert not missing, f"{len(missing)} committed runs lost, e.g. {sorted(missing)[:3]}"
    doubled = ledger.query("""SELECT binding_id, count(*) AS n FROM optimizer_recommendations
        WHERE status IN ('verified', 'unverified', 'rejected') GROUP BY binding_id HAVING count(*) > 1""")
    assert doubled.empty, f"bindings with more than one open recommendation:\n{doubled}"
    return len(rows)


# ---------------------------------------------------------------------------- load


def _mixed_writer(path: str, index: int, runs: int, start, queue) -> None:
    sys.path.insert(0, str(TESTS))
    from ledger_helpers import solve

    ledger = Ledger(path)
    start.wait(timeout=120)
    written = [solve(ledger, binding_id=f"w{index}")[0] for _ in range(runs)]
    queue.put(("wrote", (written, time.time())))


def _mixed_reader(path: str, start, stop, queue) -> None:
    """Reads until `stop`: every snapshot must be whole (runs with candidates and recommendation)."""
    ledger = Ledger(path)
    start.wait(timeout=120)
    starts, errors_seen = [], []
    while not stop.is_set() or not starts:
        try:
            started = time.time()
            check_ledger_whole(ledger)
            ledger.latest_recommendation("w0")
            starts.append(started)
        except Exception as exc:  # reported to the parent, which fails the check
            errors_seen.append(f"{type(exc).__name__}: {exc}")
            break
    queue.put(("read", (starts, errors_seen)))


@dataclass
class MixedLoad:
    writers: int
    readers: int
    runs_each: int
    written: list[str]
    reads: int
    reads_during_writes: int  # whole-ledger reads that began before the last writer finished
    reader_errors: list[str]
    wall_s: float


def mixed_readers_writers(path: Path, writers: int, readers: int, runs_each: int) -> MixedLoad:
    """`writers` + `readers` OS processes on one ledger file at once (spawned, so nothing is shared)."""
    Ledger(path)
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    start = ctx.Barrier(writers + readers)  # every process imported and connected: the load overlaps
    started = time.monotonic()
    procs = [ctx.Process(target=_mixed_writer, args=(str(path), i, runs_each, start, queue)) for i in range(writers)]
    procs += [ctx.Process(target=_mixed_reader, args=(str(path), start, stop, queue)) for _ in range(readers)]
    for proc in procs:
        proc.start()
    written, read_starts, reader_errors, writes_end = [], [], [], 0.0
    for _ in range(writers + readers):
        kind, value = queue.get(timeout=300)
        if kind == "wrote":
            written += value[0]
            writes_end = max(writes_end, value[1])
        else:
            read_starts += value[0]
            reader_errors += value[1]
        if len(written) == writers * runs_each:
            stop.set()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"process {proc.pid} exited {proc.exitcode}"
    during = sum(start < writes_end for start in read_starts)
    return MixedLoad(writers, readers, runs_each, written, len(read_starts), during, reader_errors,
                     time.monotonic() - started)


@dataclass
class Overload:
    requests: int
    answered: int
    refused: int
    other: list[str]
    crossed: int  # answers that belong to another request
    received: int  # requests the workers received
    wall_s: float


def pool_overload(pool: SolverPool, log_path: Path, callers: int, requests_each: int, sleep_s: float) -> Overload:
    """`callers` threads, each sending `requests_each` slow requests (test op "sleep" of a unique
    duration, so an answer names the request it belongs to) to a pool with fewer workers."""
    answered, refused, other, crossed = [0], [0], [], [0]
    lock = threading.Lock()

    def caller(index: int) -> None:
        for k in range(requests_each):
            seconds = round(sleep_s + (index * requests_each + k) * 1e-6, 6)
            try:
                result = pool.request("sleep", {"seconds": seconds})
            except SolverError as exc:
                with lock:
                    if exc.code == errors.SOLVER_QUEUE_FULL:
                        refused[0] += 1
                    else:
                        other.append(exc.code)
                continue
            with lock:
                answered[0] += 1
                crossed[0] += result["slept"] != seconds

    before = sum(op == "sleep" for _, _, op in received(log_path))
    started = time.monotonic()
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    got = sum(op == "sleep" for _, _, op in received(log_path)) - before
    return Overload(callers * requests_each, answered[0], refused[0], other, crossed[0], got, wall)


def check_overload(report: Overload) -> None:
    """Every request answered (by its own answer) or refused with SOLVER_QUEUE_FULL; none lost:
    the workers received exactly the answered ones (a refused request never reached a worker)."""
    assert report.other == [], Counter(report.other)
    assert report.answered + report.refused == report.requests, report
    assert report.crossed == 0 and report.received == report.answered, report
