"""The several-hosts ledger backend: PostgreSQL through psycopg 3, with a connection pool.

Chosen by the setting `ledger.url` (`postgresql://user:password@host:port/db`). Transactions run
at READ COMMITTED; `record_solve` and `upsert_binding` lock the binding's row (`lock_binding`: SELECT ... FOR
UPDATE), and a partial unique index on the open recommendations of a binding is the backstop
(schema v4). A transaction that PostgreSQL aborts for a serialization failure (40001), a deadlock
(40P01) or the backstop (23505) is retried from the start, a bounded number of times with
jittered back-off; a connection lost mid-transaction (a server restart) likewise. Nothing of a
failed transaction is written.

After a server restart the pool reconnects in rounds of RECONNECT_S (`_reconnect_for_waiters`), so a
request that waits for a connection gets one within ~2 s of the server answering again, not after
psycopg_pool's default back-off of up to minutes.

The URL's password never appears in a message, a log line or the `location` shown to users.
"""

import logging
import os
import random
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit

import orjson
import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from optimizer_pipeline.ledger.errors import LedgerBusyError, LedgerError
from optimizer_pipeline.ledger.schema import POSTGRES, apply_schema
from optimizer_pipeline.settings import redact_url

log = logging.getLogger(__name__)
REACH_TIMEOUT_S = 2  # how long the direct connection that tells why the pool had none may take
# the pool's own warnings (a connection discarded, a reconnect that failed while the server was
# down) go to the application's logging when it has any, never bare to a CLI user's stderr: what a
# user needs is in the ledger's one-line errors
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

RETRY_SQLSTATES = {"40001": "serialization failure", "40P01": "deadlock"}
# 23505 is retried only for the open-recommendation backstop: a concurrent writer published first
# (any other unique violation is a bug a retry would only repeat)
BACKSTOP_INDEX = "one_open_recommendation_per_binding"
MAX_ATTEMPTS = 5
POOL_MAX = 4  # connections per process: a step, a sensor thread and the figure-free rest
# a retried transaction waits this long times 2**attempt (jittered) before the next attempt
BACKOFF_S = 0.02
SCHEMA_LOCK_KEY = 7_301_2026  # pg_advisory_xact_lock key of the schema migrations
# psycopg_pool retries a failed connection after 1, 2, 4, 8 ... s (AttemptWithBackoff) for up to its
# reconnect_timeout (default 300 s), and a request waiting for a connection cannot bring the next attempt
# forward: after an outage of over 7 s (attempts 0, 1, 3, 7 s after the loss) the next came at 15 s,
# past the 10 s a request waits, although the server was back (a binding of a refresh lost that way).
# Rounds of RECONNECT_S keep the attempts 1-2 s apart: 0, 1, 3 s, give up, and `_reconnect_for_waiters`
# starts the next round at once.
RECONNECT_S = 3.0


def _pg(sql: str) -> str:
    """The repository's `?` placeholders as psycopg's `%s` (no statement of ours holds a literal `?`
    or `%`)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Cursor:
    """What `execute` returns to the repository: `fetchall()` and `rowcount`, as with DuckDB."""

    def __init__(self, cursor: psycopg.Cursor):
        self._cursor = cursor
        self.description = cursor.description
        self.rowcount = cursor.rowcount

    def fetchall(self) -> list[tuple]:
        return self._cursor.fetchall() if self._cursor.description is not None else []


class _Transaction:
    """A psycopg connection inside a transaction, taking the repository's `?` SQL."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        return _Cursor(self.conn.execute(_pg(sql), list(params)))


class _Session:
    __slots__ = ("conn", "in_transaction")

    def __init__(self, conn: psycopg.Connection):
        self.conn: psycopg.Connection | None = conn  # None: a lost one was given back, no new one came
        self.in_transaction = False


class PostgresBackend:
    """Connections, transactions and bulk inserts of a PostgreSQL ledger."""

    dialect = POSTGRES

    def __init__(self, url: str, *, pool_max: int = POOL_MAX, connect_timeout_s: float = 10.0):
        self.url = url
        self.location = redact_url(url)
        self._sessions = threading.local()
        # connections handed out and not yet returned: the pool's own size also counts connections it
        # is still (re)connecting, so only this tells "all in use" from "reconnecting"
        self._in_use, self._in_use_lock = 0, threading.Lock()
        try:
            # one direct connection first: an unreachable server or a bad login fails here at once,
            # with the driver's reason, instead of in the pool's background threads
            psycopg.connect(url, connect_timeout=int(connect_timeout_s)).close()
            # check: a connection is tried before it is handed out, so that one left idle across a
            # server restart is replaced instead of failing the next write
            self._pool = ConnectionPool(url, min_size=1, max_size=pool_max, open=True, timeout=connect_timeout_s,
                                        check=ConnectionPool.check_connection, reconnect_timeout=RECONNECT_S,
                                        reconnect_failed=_reconnect_for_waiters,
                                        kwargs={"autocommit": False, "connect_timeout": int(connect_timeout_s)})
            self._pool.wait(timeout=connect_timeout_s)
        except (PoolTimeout, psycopg.Error) as exc:
            raise LedgerError(f"ledger {self.location} cannot be reached: {_reason(exc, url)}") from None
        with self.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(?)", [SCHEMA_LOCK_KEY])  # one migrating process at a time
            applied = apply_schema(tx, dialect=POSTGRES)
        if applied:
            log.info("ledger %s: applied schema versions %s", self.location, applied)

    def close(self) -> None:
        self._pool.close()

    # ------------------------------------------------------------------ sharing (the embedded backend's
    # lock hand-over and change stamps; PostgreSQL needs neither: a session holds no lock, a poll is cheap)

    @staticmethod
    def others_waiting() -> bool:
        return False

    @staticmethod
    def hand_over(max_s: float) -> float:
        return 0.0

    @staticmethod
    def let_go() -> None:
        """Nothing to give up: a session's pooled connection blocks no other process."""

    @staticmethod
    def touch(kind: str) -> None:
        """No stamps: pollers query the server."""

    @staticmethod
    def stamp(kind: str) -> str | None:
        return None

    # ------------------------------------------------------------------ connections

    def _session(self) -> _Session | None:
        return getattr(self._sessions, "current", None)

    @contextmanager
    def session(self) -> Iterator[None]:
        """One pooled connection for a batch of transactions of this thread (nested: joins)."""
        if self._session() is not None:
            yield
            return
        session = _Session(self._take())
        self._sessions.current = session
        try:
            yield
        finally:
            self._sessions.current = None
            if session.conn is not None:
                self._give(session.conn)

    def _take(self) -> psycopg.Connection:
        """A connection of the pool, waiting up to its timeout; once more when the server answers and
        the pool is only reconnecting (the server came back late in the first wait: the pool's next
        attempt is at most ~2 s away, RECONNECT_S)."""
        for wait in (1, 2):
            try:
                conn = self._pool.getconn()
                break
            except PoolTimeout:
                why, reconnecting = self._why_no_connection()
                if not reconnecting or wait == 2:
                    raise LedgerBusyError(f"ledger {self.location}: {why}") from None
        with self._in_use_lock:
            self._in_use += 1
        return conn

    def _give(self, conn: psycopg.Connection) -> None:
        """Return a connection of `_take` (a broken one: the pool replaces it)."""
        with self._in_use_lock:
            self._in_use -= 1
        self._pool.putconn(conn)

    def _why_no_connection(self) -> tuple[str, bool]:
        """Why the pool gave no connection within its timeout, and whether it is only reconnecting: the
        server cannot be reached (one direct connection tells, with the driver's reason), every
        connection is in use, or the server answers but the pool has not reconnected yet."""
        try:
            psycopg.connect(self.url, connect_timeout=REACH_TIMEOUT_S).close()
        except psycopg.Error as exc:
            return f"cannot be reached: {_reason(exc, self.url)}", False
        stats, max_size, timeout = self._pool.get_stats(), self._pool.max_size, self._pool.timeout
        if self._in_use >= max_size:
            return f"all {max_size} connections in use for {timeout:g} s", False
        # pool_size counts the connections in use, the idle ones and those being (re)connected
        idle = stats["pool_available"]
        return (f"no connection within {timeout:g} s although the server answers: the pool is reconnecting "
                f"after the server was unreachable ({self._in_use + idle} of {max_size} connections open, "
                f"{self._in_use} in use; {stats.get('connections_errors', 0)} connection attempts failed); "
                f"retry", True)

    def _renewed(self, session: _Session) -> None:
        """A session whose connection was lost (the server restarted) goes on with a new one; the
        pool discards the broken connection."""
        if session.conn is not None:
            self._give(session.conn)
            # given back once only: should `_take` fail, neither the session's end nor its next use
            # returns it again (the pool would add a connection it does not count)
            session.conn = None
        session.conn = self._take()

    @contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection]:
        conn = self._take()
        try:
            yield conn
        finally:
            self._give(conn)

    @contextmanager
    def connection(self) -> Iterator[_Transaction]:
        """The session's connection, else a pooled one; reads run in their own short transaction.
        A driver error comes out translated (a lost connection as RetryableError; the session takes
        a new connection on its next use)."""
        session = self._session()
        if session is not None:
            if (session.conn is None or session.conn.broken) and not session.in_transaction:
                self._renewed(session)
            try:
                yield _Transaction(session.conn)
                if not session.in_transaction:
                    session.conn.commit()
            except psycopg.Error as exc:
                if not session.in_transaction and not session.conn.broken:
                    session.conn.rollback()  # the session's next read starts clean
                raise _translated(exc, self.location) from None
            return
        with self._pooled() as conn:
            try:
                yield _Transaction(conn)
                conn.commit()
            except psycopg.Error as exc:
                raise _translated(exc, self.location) from None

    @contextmanager
    def transaction(self) -> Iterator[_Transaction]:
        """One transaction at READ COMMITTED: committed on success, rolled back on error (translated:
        RetryableError when a retry can fix it, see `retrying`)."""
        session = self._session()
        if session is not None and session.in_transaction:
            raise LedgerError(f"ledger {self.location}: a transaction is already open in this session; "
                              f"run the work inside it instead of opening another")
        if session is not None and (session.conn is None or session.conn.broken):
            self._renewed(session)
        conn_context = self._reuse(session) if session is not None else self._pooled()
        with conn_context as conn:
            if session is not None:
                session.in_transaction = True
            try:
                with conn.transaction():
                    yield _Transaction(conn)
            except psycopg.Error as exc:
                raise _translated(exc, self.location) from None
            finally:
                if session is not None:
                    session.in_transaction = False

    def retrying(self, call: Callable[[], Any], what: str) -> Any:
        """`call()` (one write, its own transaction), re-run from the start when PostgreSQL aborted
        it for a reason a retry can fix (a lost connection included: inside a session the retry
        takes a new one), at most MAX_ATTEMPTS times with jittered back-off."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return call()
            except RetryableError as exc:
                if attempt == MAX_ATTEMPTS:
                    raise LedgerBusyError(f"{exc}; {what} gave up after {attempt} attempt(s), nothing of it "
                                          f"was written") from None
                log.warning("%s; %s retried (attempt %d of %d)", exc, what, attempt + 1, MAX_ATTEMPTS)
                time.sleep(BACKOFF_S * 2 ** attempt * (0.5 + random.random()))
        raise AssertionError("unreachable")

    @staticmethod
    @contextmanager
    def _reuse(session: _Session) -> Iterator[psycopg.Connection]:
        yield session.conn

    # ------------------------------------------------------------------ statements

    @staticmethod
    def fetch(conn: _Transaction, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple]]:
        cursor = conn.execute(sql, params)
        return [d.name for d in cursor.description or ()], cursor.fetchall()

    @classmethod
    def fetch_frame(cls, conn: _Transaction, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        columns, rows = cls.fetch(conn, sql, params)
        return pd.DataFrame.from_records(rows, columns=columns)

    @staticmethod
    def changed(conn: _Transaction, sql: str, params: Sequence[Any] = ()) -> int:
        return int(conn.execute(sql, params).rowcount)

    @staticmethod
    def lock_binding(conn: _Transaction, binding_id: str) -> None:
        """Serialise the writers of one binding (others go on): its row, locked until commit."""
        conn.execute("SELECT 1 FROM bindings WHERE id = ? FOR UPDATE", [binding_id])

    @staticmethod
    def insert_table(conn: _Transaction, table: str, rows: Any, *, skip_existing: bool = False) -> int:
        """Insert an Arrow table or pandas frame whose columns are the table's, in order, by one COPY.
        With `skip_existing` (rows already stored are skipped) the COPY goes into this connection's
        staging table for `table` and one INSERT ... SELECT ... ON CONFLICT DO NOTHING moves the
        rows: COPY has no ON CONFLICT, and a row-by-row executemany of a history's samples took
        ~1.6 s per binding (bench/bench_celery.py's ingest). Numeric list columns (the candidates'
        plans) go as array literals written by orjson (`_array_literals`). Returns the number of rows
        inserted (with `skip_existing`, those not already stored)."""
        columns, records = _records(rows)
        if not records:
            return 0
        with conn.conn.cursor() as cursor:
            if not skip_existing:
                _copy(cursor, table, records)
                return len(records)
            # a temporary table: this session's only, emptied at commit (and before each use, for an
            # earlier insert of the same transaction)
            cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS staged_{table} (LIKE {table}) ON COMMIT DELETE ROWS")
            cursor.execute(f"TRUNCATE staged_{table}")
            _copy(cursor, f"staged_{table}", records)
            cursor.execute(f"INSERT INTO {table} SELECT * FROM staged_{table} ON CONFLICT DO NOTHING")
            return int(cursor.rowcount)

    @contextmanager
    def bulk(self, conn: Any) -> Iterator[None]:
        """Nothing special: PostgreSQL's WAL handles a large batch as well as a small one."""
        yield


_SHARED: dict[tuple[int, str], "PostgresBackend"] = {}
_SHARED_LOCK = threading.Lock()


def shared_backend(url: str) -> "PostgresBackend":
    """One backend (one connection pool) per URL in this process; a forked child makes its own."""
    key = (os.getpid(), url)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = PostgresBackend(url)
        return _SHARED[key]


def _reconnect_for_waiters(pool: ConnectionPool) -> None:
    """The pool's `reconnect_failed`: one connection's round of attempts (RECONNECT_S) failed and the
    pool gave it up. While requests wait, `check()` starts the next round at once (it grows the pool by
    one when it is not growing already); with no one waiting the pool stays smaller until the next
    request grows it, instead of trying on through a long outage. (psycopg_pool counts a request that
    timed out as waiting until its next connection comes: the rounds go on until then.)"""
    if pool.get_stats()["requests_waiting"]:
        pool.check()


class RetryableError(LedgerError):
    """A transaction PostgreSQL aborted for a reason a retry can fix; nothing of it was written."""


def _copy(cursor: psycopg.Cursor, table: str, records: list[list[Any]]) -> None:
    with cursor.copy(f"COPY {table} FROM STDIN") as copy:
        for record in records:
            copy.write_row(record)


def _records(rows: Any) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows as lists of plain Python values) of an Arrow table or a pandas frame (through
    Arrow: column by column, ~4x faster than pandas' row dicts for a history's samples)."""
    if not isinstance(rows, pa.Table):
        rows = pa.Table.from_pandas(rows, preserve_index=False)
    values = [_array_literals(column) if pa.types.is_list(column.type) else column.to_pylist()
              for column in rows.columns]
    return rows.column_names, [list(row) for row in zip(*values)]


_BRACES = str.maketrans("[]", "{}")


def _array_literals(column: pa.ChunkedArray) -> list[Any]:
    """A list column of numbers as PostgreSQL array literals (`{{1.5,2.0},{...}}`, cast by the
    server to the column's type), written by orjson: psycopg's array dumper converts every element
    in Python (measured: ~4 ms of a record_solve's 3 candidates with 30-step plans of 2 x 2, in
    bench/bench_postgres.py). orjson writes NaN and inf as null, so a column with a non-finite
    number (the ledger refuses them before, in candidate_table) or of non-numbers goes to psycopg
    as Python lists instead, as before."""
    values = column.to_pylist()
    flat = column
    while pa.types.is_list(flat.type):
        flat = pc.list_flatten(flat)
    if pa.types.is_integer(flat.type) or (pa.types.is_floating(flat.type) and pc.all(pc.is_finite(flat)).as_py()
                                          is not False):
        return [None if v is None else orjson.dumps(v).decode().translate(_BRACES) for v in values]
    return values


def _translated(exc: psycopg.Error, location: str) -> LedgerError:
    state = getattr(exc, "sqlstate", None)
    if state in RETRY_SQLSTATES:
        return RetryableError(f"ledger {location}: transaction aborted ({RETRY_SQLSTATES[state]})")
    if state == "23505" and getattr(exc.diag, "constraint_name", None) == BACKSTOP_INDEX:
        return RetryableError(f"ledger {location}: transaction aborted (another open recommendation of the "
                              f"binding was published concurrently)")
    if isinstance(exc, (psycopg.OperationalError, pg_errors.AdminShutdown)):
        return RetryableError(f"ledger {location}: connection lost ({_reason(exc, '')})")
    return LedgerError(f"ledger {location}: {_reason(exc, '')}")


def _reason(exc: BaseException, url: str) -> str:
    """The first line of a driver error, with any password of `url` removed."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    password = urlsplit(url).password if url else None
    return text.replace(password, "***") if password else text
