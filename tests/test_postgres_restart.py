"""PostgreSQL restarted while a writer records solves, and during a refresh (issue 14, faults): the
write in flight is retried (or refused with a clear message), nothing partial is left, every
commit the writer reported is there, and each binding still has exactly one open recommendation.
The connection pool after an outage: a request that waits through it gets a connection once the
server is back, and a request refused says what is true (all connections in use, or reconnecting).

"In flight" is made certain, not left to timing: another connection holds the binding's row lock
(the lock `record_solve` takes to publish, after writing its run and candidates in the same
transaction), the test waits until PostgreSQL shows the write blocked on it, and only then takes the
server away, in immediate mode (as a crash). Not fast mode: it terminates the sessions one by one,
newest first, so the lock holder could end first and the held write commit before its own session
is terminated (seen on a loaded machine); in immediate mode no session releases anything. The
writer's log of the backend's retries tells a retried write from a refused one.

How long the server stays away is made certain too, not left to the machine's load: it is stopped
(immediate), brought back only once the pool's reconnect attempts have failed (counted in-process
from the pool's stats, or for another process by a stand-in listening on the server's port), and
its crash recovery syncs the data directory by one syncfs (`_crashed`)."""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable

import psycopg
import pytest
import yaml

from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.ledger import LedgerBusyError, LedgerError
from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
from optimizer_pipeline.plants import get_plant

from ledger_helpers import ledger_at
from reliability_helpers import check_ledger_whole

TESTS = Path(__file__).resolve().parent
BINDING = "restart"

# records solves in a loop, one line per event: "TRY <run id>" before a write, "RETRY <message>" for
# each retry the PostgreSQL backend logs, then "OK <run id>" once committed or "ERR <run id> <error
# type> <message>" when refused
WRITER = """\
import logging, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[2])
from optimizer_pipeline.ledger import LedgerError, new_id
from ledger_helpers import candidates, ledger_at, recommendation, run_row

class Retries(logging.Handler):
    def emit(self, record):
        print("RETRY " + record.getMessage(), flush=True)

logging.getLogger("optimizer_pipeline.ledger.postgres_backend").addHandler(Retries(logging.WARNING))
ledger = ledger_at(sys.argv[1])
while True:
    run = replace(run_row(sys.argv[3]), id=new_id("or"))
    print("TRY " + run.id, flush=True)
    try:
        ledger.record_solve(run, candidates(), "m" * 64, recommendation(run.id, sys.argv[3]),
                            run_status="succeeded", independent_cost=2.0, diagnostics={"iterations": 12},
                            evidence_source="simulation")
        print("OK " + run.id, flush=True)
    except LedgerError as exc:
        print("ERR " + run.id + " " + type(exc).__name__ + " " + str(exc), flush=True)
"""


class _Lines:
    """A process's stdout lines, read by a thread so that a wait for them keeps its timeout."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines, self._queue = proc, [], queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, done: Callable[[list[str]], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done(self.lines):
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {what} after {timeout_s:g} s; the writer printed "
                                     f"{self.lines[-20:]}") from None
            assert line is not None, f"the writer exited: {self.proc.stderr.read()[-2000:]}"
            self.lines.append(line)

    def rest(self, timeout_s: float = 30) -> None:
        """The lines up to the end of the output, once the process has ended."""
        while (line := self._queue.get(timeout=timeout_s)) is not None:
            self.lines.append(line)


def _holding_the_binding_lock(url: str, binding_id: str) -> psycopg.Connection:
    """A connection whose open transaction holds the binding's row lock, as `lock_binding` takes it."""
    holder = psycopg.connect(url)
    assert holder.execute("SELECT 1 FROM bindings WHERE id = %s FOR UPDATE", [binding_id]).fetchall() == [(1,)]
    return holder


def _wait_for_the_write_held_in_flight(url: str, holder: psycopg.Connection, writing: Callable[[], bool],
                                       timeout_s: float) -> None:
    """Wait until one write is blocked on `holder`'s lock: the publishing step of a record_solve whose
    transaction has already written its run and candidates (PostgreSQL's own view of it)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as watch:
        while not (blocked := watch.execute("SELECT pid, query FROM pg_stat_activity WHERE %s = ANY("
                                            "pg_blocking_pids(pid))", [holder.info.backend_pid]).fetchall()):
            assert writing(), "the writer ended before it reached the held lock"
            assert time.monotonic() < deadline, f"no write blocked on the binding's lock after {timeout_s:g} s"
            time.sleep(0.05)
        [(pid, query)] = blocked
        assert "FROM bindings WHERE id = $1 FOR UPDATE" in query, query
        written = {name for (name,) in watch.execute("SELECT relation::regclass::text FROM pg_locks WHERE pid = %s "
                                                     "AND mode = 'RowExclusiveLock'", [pid]).fetchall()}
    assert {"optimizer_runs", "optimizer_candidates"} <= written, written  # uncommitted rows of the write


class _StandIn:
    """Listens on a stopped server's port in its place and closes every connection at once, as a server
    that is not up yet (the client's attempt fails), counting them: the reconnect attempts of a pool in
    another process, seen from outside it."""

    def __init__(self, port: int):
        self._socket = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: the server's TIME_WAITs
        self._socket.settimeout(0.05)  # how soon the accept loop sees `close`
        self.attempts, self._seen, self._closing = 0, threading.Condition(), threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            conn.close()
            with self._seen:
                self.attempts += 1
                self._seen.notify_all()

    def until(self, attempts: int, timeout_s: float) -> None:
        with self._seen:
            assert self._seen.wait_for(lambda: self.attempts >= attempts, timeout_s), \
                f"{self.attempts} connection attempts in {timeout_s:g} s, not {attempts}"

    def __enter__(self) -> "_StandIn":
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._thread.join()
        self._socket.close()


@contextmanager
def _crashed(postgres):
    """The server stopped in immediate mode (as a crash) for the `with` block, started after it as
    `postgres.start()` does but with its crash recovery syncing the data directory by one syncfs
    instead of an fsync of each file: the fsyncs took 6.8-14.7 s for a cluster of 6 databases on a
    loaded machine (each test's database adds ~500 files), syncfs 0.4 s; an outage that long outlasts
    the 10 s a write waits for a connection, and its length would be the machine's, not the test's."""
    postgres.stop(mode="immediate")
    try:
        yield
    finally:
        proc = postgres.pg_ctl("-l", str(postgres.root / "log"), "-w", "-o",
                               f"-p {postgres.port} -k {postgres.root} -c listen_addresses=127.0.0.1 -c fsync=on "
                               f"-c recovery_init_sync_method=syncfs", "start", timeout=120)
        assert proc.returncode == 0, f"pg_ctl start failed: {proc.stderr or proc.stdout}"


class _Refused(psycopg.Connection):
    """A pool's connection class that cannot connect, as while the server is still down (the server
    itself answers the backend's direct connection)."""

    @classmethod
    def connect(cls, *args, **kwargs):
        raise psycopg.OperationalError("connection refused (test: the server is still starting)")


def _events(lines: list[str], kind: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in lines if line.startswith(kind + " ")]


@pytest.mark.timeout(480)  # its waits: 60 + 60 s, pg_ctl 60 + 60 s + 120 s, 60 + 120 s, the rest 30 s
@pytest.mark.parametrize("outage", ["restart", "down"])
def test_a_write_in_flight_is_retried_once_through_a_restart_and_refused_whole_when_the_server_stays_down(
        postgres, outage):
    """`restart` (stopped, started again once the writer's pool has failed 6 connection attempts, see
    the refresh test below): the held write loses its connection, is retried on a new one and committed
    once; the writer goes on. `down` (stopped for longer than the backend's 10 s wait for a
    connection): the held write is retried, then refused with a one-line LedgerBusyError naming the
    ledger, and nothing of it is in the ledger once the server is back."""
    url = postgres.new_database()
    setup = ledger_at(url)  # the schema, and the binding's row to lock
    setup.upsert_binding(binding_from_dict({**get_plant("heater").binding_doc(), "id": BINDING}))
    setup.backend.close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url, str(TESTS), BINDING], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out = _Lines(proc)
    down = ExitStack()  # `down`: the server stopped until the writer is killed
    try:
        out.until(lambda lines: len(_events(lines, "OK")) >= 3, 60, "three commits")
        holder = _holding_the_binding_lock(url, BINDING)
        try:
            _wait_for_the_write_held_in_flight(url, holder, lambda: proc.poll() is None, timeout_s=60)
            if outage == "restart":
                with _crashed(postgres), _StandIn(postgres.port) as stand_in:
                    stand_in.until(6, timeout_s=60)
            else:
                down.enter_context(_crashed(postgres))
        finally:
            holder.close()
        out.until(lambda lines: any(line.startswith(("RETRY ", "ERR ")) for line in lines), 60,
                  "retry or refusal of the write in flight")
        first = next(i for i, line in enumerate(out.lines) if line.startswith(("RETRY ", "ERR ")))
        if outage == "restart":  # the write in flight, then three more after it
            out.until(lambda lines: len(_events(lines[first:], "OK")) >= 4, 120, "commits after the restart")
        else:  # the backend waits 10 s for a connection before it refuses
            out.until(lambda lines: bool(_events(lines[first:], "ERR")), 60, "refusal of the write in flight")
    finally:
        proc.kill()
        proc.wait()
        down.close()
    out.rest()  # what it wrote after the lines waited for (committed too, some of them)
    in_flight = _events(out.lines[:first], "TRY")[-1]  # the write the writer was in when it lost the server
    after = out.lines[first:]
    retries = [line.split(" ", 1)[1] for line in after[:next(i for i, line in enumerate(after)
                                                             if not line.startswith("RETRY "))]]
    # its first attempt lost its connection, and the backend retried it (attempt 2, 3, ... of 5)
    assert retries and retries[0].startswith("ledger postgresql://") and "connection lost" in retries[0], after[:10]
    assert [r.rsplit("; ", 1)[1] for r in retries] == [f"record_solve retried (attempt {n} of 5)"
                                                       for n in range(2, len(retries) + 2)], retries
    errors = [e.split(" ", 2) for e in _events(out.lines, "ERR")]  # [run id, error type, message]
    assert all(kind == "LedgerBusyError" and message.startswith("ledger postgresql://")
               for _, kind, message in errors), errors
    if outage == "restart":
        assert after[len(retries)] == f"OK {in_flight}", after[:10]  # retried, then committed
    else:
        assert after[len(retries)].startswith(f"ERR {in_flight} "), after[:10]  # retried, then refused
        assert all(": cannot be reached: " in message for _, _, message in errors), errors  # not "busy"
    committed, refused = set(_events(out.lines, "OK")), {run_id for run_id, _, _ in errors}

    ledger = ledger_at(url)
    runs = set(ledger.query("SELECT id FROM optimizer_runs")["id"])
    last_tried = _events(out.lines, "TRY")[-1]  # the writer was killed in it, or after it: committed or not
    assert committed <= runs <= committed | {last_tried}, (runs - committed, last_tried)
    assert (in_flight in runs) == (outage == "restart")
    written = {*ledger.query("SELECT run_id FROM optimizer_candidates")["run_id"],
               *ledger.query("SELECT run_id FROM optimizer_recommendations")["run_id"]}
    assert not (runs | written) & refused  # nothing of a refused write, not even a candidate
    assert check_ledger_whole(ledger, sorted(committed)) == len(runs)  # each run whole, one open recommendation
    assert [r.status for r in ledger.list_recommendations(BINDING)].count("verified") == 1


@pytest.mark.timeout(960)  # its waits: 180 s + pg_ctl's 60 s + 60 s + pg_ctl's 120 s + 300 s + 300 s
def test_a_server_restart_during_a_refresh_retries_the_write_in_flight_and_the_next_refresh_completes(postgres,
                                                                                                      tmp_path):
    """`materialize --all` on a PostgreSQL ledger, the server stopped (immediate) while one binding's
    record_solve is held in flight (its binding's row locked by the test) and started again once the
    command's pool has failed 6 connection attempts (the stand-in on the port counts them): the write is
    retried on a new connection, so the command ends with exit 0, no traceback, every binding published
    once and the held one with exactly one run; the next refresh gives every binding its one open
    recommendation. (A refused write would show as exit 2 with one `error:` line naming it.)

    6 attempts: the pool replaces two connections (the lost one, and one it grows by for the waiting
    write), each tried 0, 1, 3, 7, 15 s after the loss with psycopg_pool's default back-off; the stand-in
    listens from just after the loss, so it sees the sixth at ~7 s and the next would come at ~15 s, past
    the 10 s the write waits for a connection: it was refused with "all 4 connections in use" although
    the server was back (seen once on a loaded machine, where the restart took long). Now the pool
    tries every 1-2 s and the sixth comes at ~4 s."""
    url = postgres.new_database()
    ledger = ledger_at(url)
    plant = get_plant("heater")
    bindings = [f"heater-{i}" for i in range(3)]  # one published before the held one and one after it
    history = plant.history(1).frame
    for binding_id in bindings:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), history, "simulation")
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_text(yaml.safe_dump({"ledger": {"url": url}}))
    command = [sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), "materialize", "--all"]
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    held = bindings[1]  # the binding in the middle: another is published before it and another after it
    holder = _holding_the_binding_lock(url, held)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            _wait_for_the_write_held_in_flight(url, holder, lambda: proc.poll() is None, timeout_s=180)
            assert ledger.list_recommendations(held) == []  # its write waits, uncommitted
            with _crashed(postgres), _StandIn(postgres.port) as stand_in:
                stand_in.until(6, timeout_s=60)
        finally:
            holder.close()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 0, err[-3000:]  # exit 2 and an `error:` line had the write been refused
    # the backend's warning of the retry (Python's last-resort handler: the CLI configures no logging)
    retries = [line for line in err.splitlines() if " retried (attempt " in line]
    assert retries and "connection lost" in retries[0], err[-3000:]
    assert all(line.startswith("ledger postgresql://") and "; record_solve retried" in line
               for line in retries), retries
    docs = {doc["binding_id"]: doc for doc in json.loads(out)}
    assert {b: (doc["ok"], doc["error"], doc["status"]) for b, doc in docs.items()} == {
        b: (True, None, "verified") for b in bindings}
    runs = ledger.query("SELECT binding_id, count(*) AS n FROM optimizer_runs GROUP BY binding_id")
    assert dict(zip(runs["binding_id"], runs["n"])) == {b: 1 for b in bindings}  # the held write once
    assert check_ledger_whole(ledger, candidates_per_run=None) == len(bindings)

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for binding_id in bindings:
        statuses = [r.status for r in ledger.list_recommendations(binding_id)]
        assert statuses.count("verified") == 1, (binding_id, statuses)
    assert check_ledger_whole(ledger, candidates_per_run=None) == 2 * len(bindings)


@pytest.mark.timeout(300)  # its waits: pg_ctl's 60 s + 60 s + pg_ctl's 120 s + 60 s
def test_a_request_waiting_through_an_outage_gets_a_connection_once_the_server_is_back(postgres):
    """The server stopped (immediate) under a pool holding an idle connection, a request for a
    connection made during the outage, the server kept down until the pool's reconnect attempts have
    failed 8 times (its stats): once the server is back the request is served within its 10 s wait.
    With psycopg_pool's default back-off (the two connections it replaces tried 0, 1, 3, 7, 15 s after
    the request) the next attempt came at ~15 s, and the request was refused with "all 4 connections
    in use" although none was and the server answered."""
    backend = PostgresBackend(postgres.new_database())
    outcome: dict[str, object] = {}

    def request() -> None:
        started = time.monotonic()
        try:
            with backend.connection() as conn:
                outcome["rows"] = conn.execute("SELECT 1").fetchall()
        except LedgerBusyError as exc:
            outcome["error"] = str(exc)
        outcome["waited_s"] = time.monotonic() - started

    waiting = threading.Thread(target=request)
    with _crashed(postgres):
        waiting.start()
        deadline = time.monotonic() + 60
        while backend._pool.get_stats().get("connections_errors", 0) < 8:
            assert waiting.is_alive(), f"the request ended while the server was down: {outcome}"
            assert time.monotonic() < deadline, f"the pool's stats after 60 s: {backend._pool.get_stats()}"
            time.sleep(0.05)  # the pool's stats have no event to wait on
        assert waiting.is_alive(), f"the request ended while the server was down: {outcome}"
    waiting.join(60)
    try:
        assert outcome.get("rows") == [(1,)], outcome
    finally:
        backend.close()


@pytest.mark.timeout(120)
def test_a_request_refused_while_the_pool_reconnects_says_so_not_that_all_connections_are_in_use(postgres,
                                                                                                 monkeypatch):
    """One connection handed out, and the pool failing to connect another while the server answers
    (its connection class refuses, as while the server was still down): the request waits twice (the
    pool is only reconnecting) and is refused with what is true, from the pool's stats: reconnecting,
    1 of 4 connections open, 1 in use. (Before: "all 4 connections in use". Every connection really
    in use: tests/test_postgres_ledger.py.)"""

    backend = PostgresBackend(postgres.new_database(), connect_timeout_s=1)  # a 1 s wait for a connection
    monkeypatch.setattr(backend._pool, "connection_class", _Refused)
    held = backend._take()  # the pool's one connection: the next request makes the pool connect another
    try:
        with pytest.raises(LedgerBusyError) as refused:
            backend._take()
        message = str(refused.value)
        assert "in use for" not in message and ": the pool is reconnecting after the server was unreachable (" \
            f"1 of {backend._pool.max_size} connections open, 1 in use; " in message, message
        assert backend._pool.get_stats()["connections_errors"] >= 1, backend._pool.get_stats()  # it did try
    finally:
        backend._give(held)
        backend.close()


@pytest.mark.timeout(120)
def test_a_session_whose_new_connection_was_refused_returns_the_lost_one_once_and_goes_on_after(postgres,
                                                                                                monkeypatch):
    """A session's connection lost (its server process terminated), its renewal refused (the pool
    cannot connect, as while the server is still down): the lost connection goes back to the pool
    once, not again at the session's next use or end (the pool would add a replacement it does not
    count); once the pool can connect, the same session goes on."""
    backend = PostgresBackend(postgres.new_database(), connect_timeout_s=1)
    try:
        with backend.session():
            with backend.connection() as conn:
                pid = conn.execute("SELECT pg_backend_pid()").fetchall()[0][0]
            with psycopg.connect(postgres.url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            with pytest.raises(LedgerError):  # the lost connection (RetryableError)
                with backend.connection() as conn:
                    conn.execute("SELECT 1")
            with monkeypatch.context() as refusing:
                refusing.setattr(backend._pool, "connection_class", _Refused)
                with pytest.raises(LedgerBusyError, match="the pool is reconnecting"):
                    with backend.transaction():
                        pass
            with backend.transaction() as tx:  # the pool connects again: the session goes on
                assert tx.execute("SELECT 1").fetchall() == [(1,)]
        stats = backend._pool.get_stats()
        assert stats["returns_bad"] == 1, stats  # the lost connection, returned once
        assert stats["pool_available"] <= stats["pool_size"] <= backend._pool.max_size, stats
    finally:
        backend.close()
