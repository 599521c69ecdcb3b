"""The embedded ledger backend: one DuckDB file, shared by processes through a lock file.

DuckDB admits one process with the file open at a time: while one holds a connection, any other
open fails, even read-only (docs/ARCHITECTURE.md, "Platform behaviour we rely on"). So every
reader and writer (Dagster step processes, sensors, the CLI) takes the cross-process lock file
beside the database and holds a short-lived connection for one short transaction (the file attached
to an in-memory instance of the thread's for it, `_Instance`). Lock waits and
DuckDB's own lock conflicts (a process outside our lock, e.g. a user's shell) are retried with
jittered back-off up to a bound; past it a LedgerBusyError says so.

`session()` is the explicit exception for batch work (one Dagster step over many bindings, bulk
CLI commands, the live service's busy stretches): it takes the lock and ONE connection for the
`with` block, and every ledger call of that thread on the same file runs on it, each unit of work
still its own transaction. Opening and closing a connection costs ~8 ms (attach ~5 ms, the
checkpoint of the detach ~3 ms); a write inside a session a few ms. Other processes wait for the
session while it holds the ledger: keep it to one step's work.

Handing the ledger over. The file lock is not fair: a waiter tries again every LOCK_POLL_S while a
holder that releases and re-takes it does so in microseconds, so a process that keeps coming back
(the live service) could starve the others. A process whose first try fails therefore leaves a
waiter mark (a file named after its pid and thread in `<ledger>.waiting/`) until it has the lock.
A session looks for marks after each call (outside a transaction): when someone waits it lets the
ledger go and `hand_over()` lets the waiters have their turn before its next call takes the lock
again; before heavy computation (identification, scoring, a solve) its caller lets it go
(`let_go`). So no process waits for a session longer than one of its calls.

Change stamps. A writer of a kind of rows (samples) writes a new stamp beside the file, under the
lock; a poller compares `stamp(kind)` with the one it read at its last query and opens the file
only when it differs (opening costs ~8 ms, a stamp ~20 us).
"""

import hashlib
import logging
import os
import random
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import duckdb
import pandas as pd
import pyarrow as pa
from filelock import FileLock, Timeout

from optimizer_pipeline.ledger.errors import LedgerBusyError, LedgerError
from optimizer_pipeline.ledger.schema import DUCKDB, apply_schema

log = logging.getLogger(__name__)

# ledger files whose schema this process has already brought up to date
_SCHEMA_CHECKED: set[str] = set()
LOCK_POLL_S = 0.05  # how often a waiter tries the lock again
HAND_OVER_POLL_S = 0.005  # how often hand_over() looks whether the waiters had their turn
HAND_OVER_MAX_S = 2.0  # the longest a session that let the ledger go to waiters lets them go first


class _Session:
    """An open `session()`: its connection (None while it has let the ledger go: the lock is not held
    then, and the next call takes it again) and whether a transaction is open on it."""

    __slots__ = ("conn", "in_transaction", "in_use")

    def __init__(self) -> None:
        self.conn: duckdb.DuckDBPyConnection | None = None
        self.in_transaction = False
        self.in_use = 0  # calls on the connection now (a call may run inside another's `connection()`)


# open sessions of this thread by resolved ledger path: every backend of the same file in the same
# thread joins the session (a second FileLock on the file would wait for the first one forever)
_THREAD_SESSIONS = threading.local()


def _sessions() -> dict[str, _Session]:
    sessions = getattr(_THREAD_SESSIONS, "by_path", None)
    if sessions is None:
        sessions = _THREAD_SESSIONS.by_path = {}
    return sessions


class _Instance:
    """This thread's in-memory DuckDB instance, to which a ledger file is ATTACHed for a connection and
    DETACHed after it: ~8 ms an open and close, where a DuckDB instance of its own per connection
    (duckdb.connect of the file) costs ~40 ms, 30 of them creating the instance whatever the file.
    DETACH writes the file's WAL into it (a checkpoint, as closing did) and releases the file, so other
    processes can open it. `attached` counts the open connections of each attached file (a call may
    open one inside another's on the same file, as connect of one file twice in a process did)."""

    def __init__(self) -> None:
        self.root = duckdb.connect(":memory:", config={"threads": 1})
        self.attached: dict[str, int] = {}

    def close(self) -> None:
        """Drop the instance (every file attached to it released): after a DETACH failed."""
        self.root.close()
        self.attached.clear()


_THREAD_INSTANCE = threading.local()


def _instance() -> _Instance:
    instance = getattr(_THREAD_INSTANCE, "instance", None)
    if instance is None:
        instance = _THREAD_INSTANCE.instance = _Instance()
    return instance


class DuckDBBackend:
    """Connections, transactions and bulk inserts of one DuckDB ledger file."""

    dialect = DUCKDB

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 120.0, connect_attempts: int = 10):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.connect_attempts = connect_attempts
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._waiting = Path(str(self.path) + ".waiting")  # the waiter marks (module docstring)
        self._key = str(self.path.resolve())
        # the file's name in this thread's instance (_Instance), and its path as an SQL string literal
        # (ATTACH takes no parameters)
        self._alias = "ledger_" + hashlib.sha1(self._key.encode()).hexdigest()[:16]
        self._path_literal = "'" + self._key.replace("'", "''") + "'"
        if self._key not in _SCHEMA_CHECKED:
            with self.transaction() as conn:
                applied = apply_schema(conn)
            if applied:
                log.info("ledger %s: applied schema versions %s", self.path, applied)
            _SCHEMA_CHECKED.add(self._key)

    @property
    def location(self) -> str:
        """Where the ledger is, for messages (a file path here; never a secret)."""
        return str(self.path)

    # ------------------------------------------------------------------ connections

    @contextmanager
    def session(self) -> Iterator[None]:
        """Hold the lock and one connection for a batch of calls of this thread, from its first call to
        its end; a nested session joins the open one. A failing unit of work rolls back alone. Between
        two calls (no transaction open) the session lets the ledger go when another process waits for
        it, and lets that process have it first (hand_over), or when told to (`let_go`: heavy
        computation ahead); its next call takes the ledger again."""
        sessions = _sessions()
        if self._key in sessions:
            yield
            return
        session = sessions[self._key] = _Session()
        try:
            yield
        finally:
            del sessions[self._key]
            self._detach(session)

    @contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The open session's connection, else the lock and a connection closed at the end."""
        session = _sessions().get(self._key)
        if session is None:
            with self._locked_connection() as conn:
                yield conn
            return
        if session.conn is None:
            self._attach(session)
        session.in_use += 1
        try:
            yield session.conn
        finally:
            session.in_use -= 1
        if not session.in_use and not session.in_transaction and self.others_waiting():
            self._detach(session)
            self.hand_over(HAND_OVER_MAX_S)

    def let_go(self) -> None:
        """Give the open session's lock and connection up until its next call (nothing to do outside a
        session, or inside a transaction)."""
        session = _sessions().get(self._key)
        if session is not None and not session.in_use and not session.in_transaction:
            self._detach(session)

    def _attach(self, session: _Session) -> None:
        self._acquire()
        try:
            session.conn = self._open()
        except BaseException:
            self._lock.release()
            raise

    def _detach(self, session: _Session) -> None:
        if session.conn is None:
            return
        try:
            self._close(session.conn)
        finally:
            session.conn = None
            self._lock.release()

    @contextmanager
    def _locked_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self._acquire()
        try:
            conn = self._open()
            try:
                yield conn
            finally:
                self._close(conn)
        finally:
            self._lock.release()

    def _acquire(self) -> None:
        """Take the file lock; when it is held, as a waiter others can see (module docstring)."""
        try:
            self._lock.acquire(blocking=False)
            return
        except Timeout:
            pass
        self._waiting.mkdir(exist_ok=True)
        mark = self._waiting / f"{os.getpid()}-{threading.get_ident()}"
        mark.touch()
        started = time.monotonic()
        try:
            self._lock.acquire(poll_interval=LOCK_POLL_S)
        except Timeout:
            raise LedgerBusyError(f"ledger {self.path} stayed locked for {self.lock_timeout_s:g} s by other "
                                  f"processes; retry later or raise the bound") from None
        finally:
            mark.unlink(missing_ok=True)
        log.debug("ledger %s: waited %.3f s for the lock", self.path, time.monotonic() - started)

    def others_waiting(self) -> bool:
        """Whether another process or thread waits for the lock (a mark of a process that died is
        removed)."""
        try:
            marks = os.listdir(self._waiting)
        except FileNotFoundError:
            return False
        waiting = False
        for mark in marks:
            pid = int(mark.split("-")[0]) if mark.split("-")[0].isdigit() else 0
            if pid == os.getpid() or _alive(pid):
                waiting = True
            else:
                (self._waiting / mark).unlink(missing_ok=True)
        return waiting

    def hand_over(self, max_s: float) -> float:
        """After a session: wait while others wait for the lock (each takes it within LOCK_POLL_S of
        its release), at most `max_s`; returns how long it waited."""
        started = time.monotonic()
        while self.others_waiting() and time.monotonic() - started < max_s:
            time.sleep(HAND_OVER_POLL_S)
        return time.monotonic() - started

    def touch(self, kind: str) -> None:
        """A new change stamp for rows of `kind` (inside the transaction that writes them: under the
        lock, so a poller's stamp read before its query is older than any write it did not see)."""
        self._stamp_path(kind).write_text(uuid.uuid4().hex)

    def stamp(self, kind: str) -> str | None:
        """The change stamp of rows of `kind` ("" before the first write of them)."""
        try:
            return self._stamp_path(kind).read_text()
        except FileNotFoundError:
            return ""

    def _stamp_path(self, kind: str) -> Path:
        return Path(f"{self.path}.{kind}-stamp")

    def _open(self) -> duckdb.DuckDBPyConnection:
        """A connection with the ledger file attached to this thread's instance as its default
        catalog (_Instance), retrying DuckDB's own lock conflicts (a process outside our lock)."""
        instance, delay = _instance(), 0.05
        alias, path = self._alias, self._path_literal
        for attempt in range(1, self.connect_attempts + 1):
            conn = instance.root.cursor()  # a connection of its own (its own default catalog and transaction)
            try:
                if not instance.attached.get(alias):
                    conn.execute(f"ATTACH {path} AS {alias}")
                instance.attached[alias] = instance.attached.get(alias, 0) + 1
                conn.execute(f"USE {alias}")
                return conn
            except duckdb.IOException as exc:
                conn.close()
                if "lock" not in str(exc).lower() or attempt == self.connect_attempts:
                    raise LedgerBusyError(f"ledger {self.path} cannot be opened: {str(exc).splitlines()[0]}") from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _close(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Close a connection of `_open`; the file is detached with the thread's last one on it (a
        failed DETACH drops the thread's instance, so that the file is released all the same)."""
        instance, alias = _instance(), self._alias
        instance.attached[alias] -= 1
        try:
            if instance.attached[alias] == 0:
                del instance.attached[alias]
                conn.execute("USE memory")
                conn.execute(f"DETACH {alias}")
        except BaseException:
            instance.close()
            _THREAD_INSTANCE.instance = None
            raise
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One short transaction: committed on success, rolled back on error. Inside a session it
        runs on the session's connection; a transaction cannot be opened inside another one there."""
        with self.connection() as conn:
            session = _sessions().get(self._key)
            if session is not None:
                if session.in_transaction:
                    raise LedgerError(f"ledger {self.path}: a transaction is already open in this session; "
                                      f"run the work inside it instead of opening another")
                session.in_transaction = True
            try:
                conn.execute("BEGIN TRANSACTION")
                try:
                    yield conn
                except duckdb.ConstraintException as exc:
                    conn.execute("ROLLBACK")
                    raise LedgerError(f"ledger {self.path}: {str(exc).splitlines()[0]}") from None
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                if session is not None:
                    session.in_transaction = False

    @staticmethod
    def retrying(call: Callable[[], Any], what: str) -> Any:
        """Run a write once: the file lock serialises writers, so nothing aborts one for a retry."""
        return call()

    # ------------------------------------------------------------------ statements

    @staticmethod
    def fetch(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple]]:
        """Column names and rows of a query (fetchall: duckdb 2.x refuses further work on a
        connection with an unfinished result)."""
        cursor = conn.execute(sql, list(params))
        rows = cursor.fetchall()
        return [d[0] for d in cursor.description], rows

    @staticmethod
    def fetch_frame(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """A query's rows as a DataFrame, built by DuckDB itself (several times faster than from rows)."""
        return conn.execute(sql, list(params)).df()

    @staticmethod
    def lock_binding(conn: duckdb.DuckDBPyConnection, binding_id: str) -> None:
        """Nothing to do: the file lock already serialises every writer of the ledger."""

    @staticmethod
    def changed(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> int:
        """Run an UPDATE and return how many rows it changed (DuckDB returns the count as a row)."""
        return int(conn.execute(sql, list(params)).fetchall()[0][0])

    @staticmethod
    def insert_table(conn: duckdb.DuckDBPyConnection, table: str, rows: pa.Table | Any, *,
                     skip_existing: bool = False) -> int:
        """Insert an Arrow table or pandas frame whose columns are the table's, in order: one
        statement (DuckDB reads the object by its Python name), ~0.05 s for 10 000 rows. Returns the
        number of rows inserted (with `skip_existing`, those not already stored)."""
        new_rows = rows  # noqa: F841 - read by DuckDB's replacement scan under this name
        conflict = " ON CONFLICT DO NOTHING" if skip_existing else ""
        return int(conn.execute(f"INSERT INTO {table} SELECT * FROM new_rows{conflict}").fetchall()[0][0])

    @contextmanager
    def bulk(self, conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """Commits inside the block checkpoint instead of writing the WAL.

        A commit that would take the WAL past checkpoint_threshold checkpoints instead, and DuckDB
        then skips writing that transaction to the WAL: 10 000 candidates (~10 MB of plans) are
        written once to the database file rather than to the WAL on commit and again by the
        checkpoint on close (~60 ms less). Only around bulk inserts: with a 1 MB threshold every
        small commit checkpoints, record_solve ~6 -> ~17 ms."""
        conn.execute("SET checkpoint_threshold = '1MB'")
        try:
            yield
        finally:
            conn.execute("RESET checkpoint_threshold")


def _alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (signal 0 checks without signalling)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True
