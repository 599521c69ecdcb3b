"""The append-only ledger in DuckDB: the only code that writes SQL.

Every reader and writer (assets in several step processes, sensors, the CLI) goes through one
cross-process lock file beside the database and holds a short-lived connection for one short
transaction (DAGSTER-NOTES.md: DuckDB admits one writing process at a time and refuses even
read-only opens meanwhile). Lock waits and DuckDB lock conflicts are retried with jittered
back-off up to a bound; past it a LedgerBusyError says so.

`Ledger.session()` is the explicit exception for batch work (one Dagster step over many bindings,
bulk CLI commands): it takes the lock and one connection for the duration of the `with` block and
every ledger call of that thread inside it runs on that connection, each unit of work still its
own transaction. Opening and closing a connection costs ~20 ms (connect ~12 ms, checkpoint on
close ~6 ms, DAGSTER-NOTES.md); a write inside a session costs a few ms. Other processes wait for
the whole session, so a session should span one step's work, not a long-lived service.

Candidate plans (`controls`, `predicted`) are numeric DOUBLE[][] columns built straight into the
Arrow table (schema version 2); the candidates' report columns are JSON written by contracts.fast_json (orjson): valid
JSON with the same values as canonical JSON (nothing hashes them), ~10x faster to build for
10 000 candidates. Documents that are hashed or compared as text stay canonical JSON.

Append-only: rows are never deleted. The only UPDATE paths are `finish_run` / `close_stale_runs`
(a run leaves `running` exactly once) and expiry (`expire*`: status -> expired, the row is kept).
"""

import json
import logging
import math
import random
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import duckdb
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from filelock import FileLock, Timeout

from optimizer_pipeline.contracts import (
    BindingSpec,
    ContractError,
    EvidenceSource,
    ModelArtifact,
    Outcome,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    binding_from_json,
    canonical_json,
    fast_json,
    parse_iso_utc,
    utc_now,
)
from optimizer_pipeline.ledger.schema import apply_schema

log = logging.getLogger(__name__)

SAMPLE_SOURCES = (EvidenceSource.SIMULATION.value, EvidenceSource.REAL.value)
RUN_END_STATUSES = ("succeeded", "failed", "interrupted")
OPEN_STATUSES = (RecommendationStatus.VERIFIED.value, RecommendationStatus.UNVERIFIED.value,
                 RecommendationStatus.REJECTED.value)


class LedgerError(Exception):
    """A ledger operation was refused (its message says why)."""


class LedgerBusyError(LedgerError):
    """The ledger stayed locked by other processes past the retry bound."""


class RunStateError(LedgerError):
    """A run transition that the ledger refuses (e.g. finishing a run twice)."""


class NotFoundError(LedgerError):
    pass


# a candidate batch this large commits by a checkpoint, skipping the WAL (see _checkpoint_on_commit)
BULK_CANDIDATE_ROWS = 1000

# ledger files whose schema this process has already brought up to date
_SCHEMA_CHECKED: set[str] = set()


class _Session:
    """The connection of an open `Ledger.session()` and whether a transaction is open on it."""

    __slots__ = ("conn", "in_transaction")

    def __init__(self, conn: duckdb.DuckDBPyConnection):
        self.conn = conn
        self.in_transaction = False


# open sessions of this thread by resolved ledger path: every Ledger object of the same file in the
# same thread joins the session (a second FileLock on the file would wait for the first one forever)
_THREAD_SESSIONS = threading.local()


def _sessions() -> dict[str, _Session]:
    sessions = getattr(_THREAD_SESSIONS, "by_path", None)
    if sessions is None:
        sessions = _THREAD_SESSIONS.by_path = {}
    return sessions


def _now() -> datetime:
    return utc_now().replace(tzinfo=None)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def candidate_id(run_id: str, seq: int) -> str:
    """DESIGN.md ids: candidates are `oc-<run suffix>-<seq>`."""
    return f"oc-{run_id.removeprefix('or-')}-{seq}"


@dataclass(frozen=True)
class BindingUpsert:
    binding_id: str
    revision: int
    created: bool  # first revision of a new binding
    changed: bool  # a new revision was written
    expired: int  # open recommendations expired by the change


@dataclass(frozen=True)
class StoredBinding:
    spec: BindingSpec
    revision: int
    spec_hash: str
    created_at: datetime


class Ledger:
    """One DuckDB ledger file. Cheap to construct; opens a connection per operation, or uses the
    connection of an open `session()`."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 120.0, connect_attempts: int = 10):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.connect_attempts = connect_attempts
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path) + ".lock", timeout=lock_timeout_s)
        self._key = str(self.path.resolve())
        if self._key not in _SCHEMA_CHECKED:
            with self.transaction() as conn:
                applied = apply_schema(conn)
            if applied:
                log.info("ledger %s: applied schema versions %s", self.path, applied)
            _SCHEMA_CHECKED.add(self._key)

    # ------------------------------------------------------------------ connections

    @contextmanager
    def session(self) -> Iterator["Ledger"]:
        """Hold the cross-process lock and ONE connection for a batch of ledger calls (this thread).

        Inside the `with` block every method of any Ledger of this file called from this thread
        runs on the session's connection instead of opening its own; each write is still its own
        BEGIN / COMMIT, so a failing unit of work rolls back alone and the earlier ones stay
        committed. Other processes (and other threads) wait for the lock for the whole block, with
        their usual bounded retries: keep a session to one step's work. A nested `session()` joins
        the open one. Acquiring the lock or opening the file fails with the same errors as any
        call (LedgerBusyError).
        """
        sessions = _sessions()
        if self._key in sessions:
            yield self
            return
        with self._locked_connection() as conn:
            sessions[self._key] = _Session(conn)
            try:
                yield self
            finally:
                del sessions[self._key]

    @contextmanager
    def _connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The open session's connection, else the lock and a connection closed at the end."""
        session = _sessions().get(self._key)
        if session is not None:
            yield session.conn
            return
        with self._locked_connection() as conn:
            yield conn

    @contextmanager
    def _locked_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        try:
            self._lock.acquire()
        except Timeout:
            raise LedgerBusyError(f"ledger {self.path} stayed locked for {self.lock_timeout_s:g} s by other "
                                  f"processes; retry later or raise the bound") from None
        try:
            conn = self._open()
            try:
                yield conn
            finally:
                conn.close()
        finally:
            self._lock.release()

    def _open(self) -> duckdb.DuckDBPyConnection:
        """Connect, retrying DuckDB's own lock conflicts (a process outside our lock, e.g. a user's shell)."""
        delay = 0.05
        for attempt in range(1, self.connect_attempts + 1):
            try:
                # one thread: the ledger runs many tiny statements, where DuckDB's parallel scheduling
                # costs more than it gains (record_solve ~1 ms less of ~6 ms on 2 cores)
                return duckdb.connect(str(self.path), config={"threads": 1})
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or attempt == self.connect_attempts:
                    raise LedgerBusyError(f"ledger {self.path} cannot be opened: {str(exc).splitlines()[0]}") from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One short transaction under the cross-process lock: committed on success, rolled back on error.
        Inside a session it runs on the session's connection; a transaction cannot be opened inside
        another one there (pass its connection to the method instead)."""
        with self._connection() as conn:
            session = _sessions().get(self._key)
            if session is not None:
                if session.in_transaction:
                    raise LedgerError(f"ledger {self.path}: a transaction is already open in this session; "
                                      f"pass its connection (conn=) instead of opening another")
                session.in_transaction = True
            try:
                conn.execute("BEGIN TRANSACTION")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                if session is not None:
                    session.in_transaction = False

    def query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Read-only SQL for the CLI / UI (runs inside the lock like every other access)."""
        with self._connection() as conn:
            return conn.execute(sql, list(params)).df()

    # ------------------------------------------------------------------ bindings

    def upsert_binding(self, spec: BindingSpec, conn: duckdb.DuckDBPyConnection | None = None) -> BindingUpsert:
        """Identical spec -> same revision, nothing written. Changed spec -> revision + 1, a revision
        row and the binding's open recommendations expired, all in one transaction."""
        if conn is None:
            with self.transaction() as tx:
                return self.upsert_binding(spec, tx)
        row = _first(conn.execute("""SELECT revision, spec_hash FROM binding_revisions WHERE binding_id = ?
                              ORDER BY revision DESC LIMIT 1""", [spec.id]).fetchall())
        now = _now()
        if row is not None and row[1] == spec.spec_hash:
            return BindingUpsert(spec.id, row[0], created=False, changed=False, expired=0)
        revision = 1 if row is None else row[0] + 1
        if row is None:
            conn.execute("INSERT INTO bindings VALUES (?, ?)", [spec.id, now])
        conn.execute("INSERT INTO binding_revisions VALUES (?, ?, ?, ?, ?)",
                     [spec.id, revision, spec.spec_hash, spec.canonical_json(), now])
        expired = 0 if row is None else self._expire(conn, "binding_id = ?", [spec.id],
                                                     f"binding {spec.id} changed to revision {revision}")
        return BindingUpsert(spec.id, revision, created=row is None, changed=True, expired=expired)

    def get_binding(self, binding_id: str, revision: int | None = None) -> StoredBinding:
        sql = "SELECT spec_json, revision, spec_hash, created_at FROM binding_revisions WHERE binding_id = ?"
        params: list[Any] = [binding_id]
        if revision is not None:
            sql += " AND revision = ?"
            params.append(revision)
        with self._connection() as conn:
            row = _first(conn.execute(sql + " ORDER BY revision DESC LIMIT 1", params).fetchall())
        if row is None:
            what = f"binding {binding_id!r}" + (f" revision {revision}" if revision is not None else "")
            raise NotFoundError(f"{what} is not in the ledger {self.path}")
        return StoredBinding(binding_from_json(row[0], source=f"ledger binding {binding_id}"), row[1], row[2], row[3])

    def list_bindings(self) -> list[StoredBinding]:
        with self._connection() as conn:
            rows = conn.execute("""SELECT spec_json, revision, spec_hash, created_at FROM binding_revisions r
                WHERE revision = (SELECT max(revision) FROM binding_revisions WHERE binding_id = r.binding_id)
                ORDER BY binding_id""").fetchall()
        return [StoredBinding(binding_from_json(r[0]), r[1], r[2], r[3]) for r in rows]

    def binding_revisions(self, binding_id: str) -> list[tuple[int, str, datetime]]:
        with self._connection() as conn:
            return [tuple(r) for r in conn.execute("""SELECT revision, spec_hash, created_at FROM binding_revisions
                WHERE binding_id = ? ORDER BY revision""", [binding_id]).fetchall()]

    # ------------------------------------------------------------------ plant samples

    def append_samples(self, binding_id: str, frame: pd.DataFrame, tags: Sequence[str], source: str,
                       conn: duckdb.DuckDBPyConnection | None = None) -> int:
        """Append a wide history frame (run_id, timestamp, tags...); samples already stored are skipped.
        Returns the number of new sample rows."""
        if conn is None:
            with self.transaction() as tx:
                return self.append_samples(binding_id, frame, tags, source, tx)
        if source not in SAMPLE_SOURCES:
            raise ContractError(f"sample source must be 'simulation' or 'real', got {source!r}")
        long = frame.melt(id_vars=["run_id", "timestamp"], value_vars=list(tags), var_name="tag", value_name="value")
        long = long.dropna(subset=["value"])
        samples = pd.DataFrame({
            "binding_id": binding_id, "run_id": long["run_id"].astype(str), "ts": long["timestamp"].astype(float),
            "tag": long["tag"].astype(str), "value": long["value"].astype(float), "source": source,
            "ingest_id": new_id("ing"), "ingested_at": _now()})
        before = conn.execute("SELECT count(*) FROM plant_samples WHERE binding_id = ?", [binding_id]).fetchall()[0][0]
        # a registered frame is connection-local; after a failed insert DuckDB refuses unregister until
        # the rollback, so the name stays until the next insert replaces it or the connection closes
        conn.register("new_samples", samples)
        conn.execute("INSERT INTO plant_samples SELECT * FROM new_samples ON CONFLICT DO NOTHING")
        conn.unregister("new_samples")
        after = conn.execute("SELECT count(*) FROM plant_samples WHERE binding_id = ?", [binding_id]).fetchall()[0][0]
        return int(after - before)

    def ingest(self, spec: BindingSpec, frame: pd.DataFrame, source: str) -> tuple[BindingUpsert, int]:
        """Store the binding and append its history in one transaction (all or nothing)."""
        with self.transaction() as conn:
            upsert = self.upsert_binding(spec, conn)
            rows = self.append_samples(spec.id, frame, spec.tags, source, conn)
        return upsert, rows

    def history_frame(self, binding_id: str, tags: Sequence[str]) -> pd.DataFrame:
        """Stored samples as a wide frame: run_id, timestamp, tags (NaN where a tag has no sample)."""
        with self._connection() as conn:
            long = conn.execute("""SELECT run_id, ts, tag, value FROM plant_samples
                                   WHERE binding_id = ? ORDER BY run_id, ts""", [binding_id]).df()
        if long.empty:
            return pd.DataFrame(columns=["run_id", "timestamp", *tags])
        wide = long.pivot_table(index=["run_id", "ts"], columns="tag", values="value", aggfunc="first")
        wide = wide.reindex(columns=list(tags)).reset_index().rename(columns={"ts": "timestamp"})
        wide.columns.name = None
        return wide.sort_values(["run_id", "timestamp"], kind="stable").reset_index(drop=True)

    def sample_source(self, binding_id: str) -> str | None:
        """'real' when any stored sample of the binding is real plant data, else 'simulation'; None without samples."""
        with self._connection() as conn:
            rows = {r[0] for r in conn.execute("SELECT DISTINCT source FROM plant_samples WHERE binding_id = ?",
                                               [binding_id]).fetchall()}
        real, simulation = EvidenceSource.REAL.value, EvidenceSource.SIMULATION.value
        return None if not rows else (real if real in rows else simulation)

    # ------------------------------------------------------------------ model artifacts and UQ

    def put_artifact(self, artifact: ModelArtifact) -> str:
        """Idempotent by content hash."""
        digest = artifact.artifact_hash
        with self.transaction() as conn:
            conn.execute("INSERT INTO model_artifacts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         [digest, artifact.binding_id, artifact.binding_revision, artifact.gates_passed,
                          canonical_json(artifact), _now()])
        return digest

    def get_artifact(self, artifact_hash: str) -> ModelArtifact:
        with self._connection() as conn:
            row = _first(conn.execute("SELECT artifact_json FROM model_artifacts WHERE artifact_hash = ?",
                               [artifact_hash]).fetchall())
        if row is None:
            raise NotFoundError(f"model artifact {artifact_hash} is not in the ledger")
        return ModelArtifact.from_dict(json.loads(row[0]))

    def put_block_scores(self, artifact: ModelArtifact, segment: str, run_ids: Sequence[str],
                         block_starts: Sequence[int], scores: Any) -> int:
        """Block scores (n_blocks, n_cv), idempotent per (artifact, segment, run, block, cv)."""
        scores = np.asarray(scores, float).reshape(len(run_ids), len(artifact.cv_tags))
        n = len(run_ids)
        frame = pd.DataFrame({
            "artifact_hash": artifact.artifact_hash, "binding_id": artifact.binding_id,
            "binding_revision": artifact.binding_revision, "segment": segment,
            "run_id": np.repeat(np.asarray(run_ids, dtype=object), len(artifact.cv_tags)),
            "block_start": np.repeat(np.asarray(block_starts, dtype=np.int64), len(artifact.cv_tags)),
            "cv_tag": np.tile(np.asarray(artifact.cv_tags, dtype=object), n),
            "score": scores.reshape(-1), "created_at": _now()})
        with self.transaction() as conn:
            conn.register("new_scores", frame)  # connection-local: see append_samples
            conn.execute("INSERT INTO uq_block_scores SELECT * FROM new_scores ON CONFLICT DO NOTHING")
            conn.unregister("new_scores")
        return len(frame)

    def block_scores(self, artifact_hash: str) -> pd.DataFrame:
        return self.query("""SELECT segment, run_id, block_start, cv_tag, score FROM uq_block_scores
                             WHERE artifact_hash = ? ORDER BY segment, run_id, block_start, cv_tag""", [artifact_hash])

    def put_calibration(self, artifact: ModelArtifact, evidence: Mapping[str, Any], *, has_evidence: bool,
                        method: str | None, coverage: float | None, threshold: float | None,
                        reasons: Sequence[str], calibrated_at: datetime | None = None) -> str:
        cal_id = new_id("cal")
        with self.transaction() as conn:
            conn.execute("INSERT INTO uq_calibrations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         [cal_id, artifact.binding_id, artifact.binding_revision, artifact.artifact_hash,
                          _naive(calibrated_at), has_evidence, method, coverage, threshold,
                          canonical_json(evidence), canonical_json(list(reasons))])
        return cal_id

    def latest_calibration(self, binding_id: str, binding_revision: int | None = None) -> dict[str, Any] | None:
        sql = "SELECT * FROM uq_calibrations WHERE binding_id = ?"
        params: list[Any] = [binding_id]
        if binding_revision is not None:
            sql += " AND binding_revision = ?"
            params.append(binding_revision)
        rows = _records(self.query(sql + " ORDER BY calibrated_at DESC LIMIT 1", params))
        return rows[0] if rows else None

    def latest_calibrations(self) -> list[dict[str, Any]]:
        """The newest calibration of every binding (for the freshness sensor)."""
        return _records(self.query("""SELECT * FROM uq_calibrations c WHERE calibrated_at =
            (SELECT max(calibrated_at) FROM uq_calibrations WHERE binding_id = c.binding_id) ORDER BY binding_id"""))

    # ------------------------------------------------------------------ runs, candidates, recommendations

    def insert_run(self, run: Mapping[str, Any], conn: duckdb.DuckDBPyConnection | None = None) -> str:
        """Insert a run in status `running`. `run` holds id (optional), binding_id, binding_revision,
        profile_id, profile_version, problem_ir_hash, context, problem."""
        if conn is None:
            with self.transaction() as tx:
                return self.insert_run(run, tx)
        return self._insert_run_row(conn, run, "running", None, None, None)

    def insert_finished_run(self, run: Mapping[str, Any], status: str, *, independent_cost: float | None,
                            diagnostics: Mapping[str, Any], conn: duckdb.DuckDBPyConnection) -> str:
        """A run whose outcome is already known (record_solve), written with its end status in one
        INSERT inside the caller's transaction: nobody ever sees it `running`."""
        _check_end_status(status)
        return self._insert_run_row(conn, run, status, independent_cost, canonical_json(diagnostics), _now())

    @staticmethod
    def _insert_run_row(conn: duckdb.DuckDBPyConnection, run: Mapping[str, Any], status: str,
                        independent_cost: float | None, diagnostics_json: str | None,
                        finished_at: datetime | None) -> str:
        run_id = run.get("id") or new_id("or")
        conn.execute("INSERT INTO optimizer_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     [run_id, run["binding_id"], run["binding_revision"], run["profile_id"], run["profile_version"],
                      run.get("problem_ir_hash"), canonical_json(run.get("context", {})),
                      None if run.get("problem") is None else canonical_json(run["problem"]),
                      diagnostics_json, status, independent_cost, _naive(run.get("started_at")), finished_at])
        return run_id

    def finish_run(self, run_id: str, status: str, *, independent_cost: float | None = None,
                   diagnostics: Mapping[str, Any] | None = None, conn: duckdb.DuckDBPyConnection | None = None) -> None:
        """`running` -> succeeded | failed | interrupted, exactly once; a second finish raises RunStateError."""
        _check_end_status(status)
        if conn is None:
            with self.transaction() as tx:
                return self.finish_run(run_id, status, independent_cost=independent_cost,
                                       diagnostics=diagnostics, conn=tx)
        changed = conn.execute("""UPDATE optimizer_runs SET status = ?, independent_cost = ?, diagnostics_json = ?,
                                  finished_at = ? WHERE id = ? AND status = 'running'""",
                               [status, independent_cost, canonical_json(diagnostics or {}), _now(),
                                run_id]).fetchall()[0][0]
        if changed:
            return
        row = _first(conn.execute("SELECT status FROM optimizer_runs WHERE id = ?", [run_id]).fetchall())
        if row is None:
            raise NotFoundError(f"run {run_id} is not in the ledger")
        raise RunStateError(f"run {run_id} is already finished ({row[0]}); a run leaves 'running' once")

    def insert_candidates(self, run_id: str, candidates: Sequence[SolveCandidate], model_id: str,
                          conn: duckdb.DuckDBPyConnection | None = None) -> list[str]:
        """All candidates of a run as one batch (one Arrow table insert). A non-finite number in a
        candidate's controls, predicted or reports is refused with a ContractError before any write."""
        table = _candidate_table(run_id, candidates, model_id)
        if conn is not None:
            _insert_candidates(conn, table)
        elif table.num_rows < BULK_CANDIDATE_ROWS:
            with self.transaction() as tx:
                _insert_candidates(tx, table)
        else:
            with self.session(), self._connection() as own, _checkpoint_on_commit(own), self.transaction() as tx:
                _insert_candidates(tx, table)
        return table.column("id").to_pylist()

    def insert_recommendation(self, rec: Recommendation, evidence_source: str,
                              conn: duckdb.DuckDBPyConnection | None = None) -> str:
        if conn is None:
            with self.transaction() as tx:
                return self.insert_recommendation(rec, evidence_source, tx)
        conn.execute("INSERT INTO optimizer_recommendations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                     "NULL, NULL)",
                     [rec.id, rec.run_id, rec.binding_id, rec.binding_revision, rec.candidate_id, rec.template.value,
                      rec.problem_ir_hash, rec.model_artifact_hash, evidence_source,
                      canonical_json(rec.evidence.get("uq")), rec.status.value, rec.status_label,
                      canonical_json(list(rec.reasons)), _payload_text(rec), _naive(rec.created_at),
                      _naive(rec.valid_until)])
        return rec.id

    def record_solve(self, run: Mapping[str, Any], candidates: Sequence[SolveCandidate], model_id: str,
                     recommendation: Recommendation | None, *, run_status: str, independent_cost: float | None,
                     diagnostics: Mapping[str, Any], evidence_source: str, supersede: bool = True) -> str:
        """Run (with its end status) + candidates + recommendation (superseding the binding's open
        ones) in ONE transaction: four statements between BEGIN and COMMIT."""
        with self.transaction() as conn:
            run_id = self.insert_finished_run(run, run_status, independent_cost=independent_cost,
                                              diagnostics=diagnostics, conn=conn)
            self.insert_candidates(run_id, candidates, model_id, conn)
            if recommendation is not None:
                if supersede:
                    self._expire(conn, "binding_id = ?", [recommendation.binding_id],
                                 f"superseded by {recommendation.id}")
                self.insert_recommendation(recommendation, evidence_source, conn)
        return run_id

    def close_stale_runs(self, older_than_s: float, now: datetime | None = None,
                         conn: duckdb.DuckDBPyConnection | None = None) -> int:
        """Reconciliation: runs still `running` after `older_than_s` (their writer died) become
        `interrupted`; returns how many. Normal writes never leave a run running (one transaction)."""
        if conn is None:
            with self.transaction() as tx:
                return self.close_stale_runs(older_than_s, now, tx)
        cutoff = _naive(now) - timedelta(seconds=older_than_s)
        count = conn.execute("SELECT count(*) FROM optimizer_runs WHERE status = 'running' AND started_at < ?",
                             [cutoff]).fetchall()[0][0]
        if count:
            conn.execute("""UPDATE optimizer_runs SET status = 'interrupted', finished_at = ?,
                            diagnostics_json = ? WHERE status = 'running' AND started_at < ?""",
                         [_now(), canonical_json({"reconciled": f"still running after {older_than_s:g} s"}), cutoff])
        return int(count)

    def housekeeping(self, stale_after_s: float, now: datetime | None = None) -> tuple[int, int]:
        """Before a solve, in one transaction: expire open recommendations past `valid_until` and close
        runs left `running` by a dead writer. Returns (expired, reconciled)."""
        with self.transaction() as conn:
            expired = self.expire_past_valid_until(now, conn)
            return expired, self.close_stale_runs(stale_after_s, now, conn)

    def get_run(self, run_id: str) -> dict[str, Any]:
        rows = _records(self.query("SELECT * FROM optimizer_runs WHERE id = ?", [run_id]))
        if not rows:
            raise NotFoundError(f"run {run_id} is not in the ledger")
        return rows[0]

    def list_runs(self, binding_id: str | None = None) -> list[dict[str, Any]]:
        return _records(self._select("optimizer_runs", binding_id, "started_at"))

    def list_candidates(self, run_id: str | None = None, binding_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT c.* FROM optimizer_candidates c JOIN optimizer_runs r ON r.id = c.run_id WHERE 1 = 1"
        params: list[Any] = []
        if run_id is not None:
            sql += " AND c.run_id = ?"
            params.append(run_id)
        if binding_id is not None:
            sql += " AND r.binding_id = ?"
            params.append(binding_id)
        return _records(self.query(sql + " ORDER BY c.created_at, c.run_id, c.seq", params))

    def get_recommendation(self, rec_id: str) -> dict[str, Any]:
        rows = _records(self.query("SELECT * FROM optimizer_recommendations WHERE id = ?", [rec_id]))
        if not rows:
            raise NotFoundError(f"recommendation {rec_id} is not in the ledger")
        return rows[0]

    def latest_recommendation(self, binding_id: str) -> dict[str, Any] | None:
        rows = _records(self.query("""SELECT * FROM optimizer_recommendations WHERE binding_id = ?
                                      ORDER BY created_at DESC, id DESC LIMIT 1""", [binding_id]))
        return rows[0] if rows else None

    def list_recommendations(self, binding_id: str | None = None) -> list[dict[str, Any]]:
        return _records(self._select("optimizer_recommendations", binding_id, "created_at"))

    # ------------------------------------------------------------------ expiry (the only other UPDATE)

    def _expire(self, conn: duckdb.DuckDBPyConnection, where: str, params: list[Any], reason: str) -> int:
        placeholders = ", ".join("?" for _ in OPEN_STATUSES)
        condition = f"({where}) AND status IN ({placeholders})"
        # one statement: DuckDB's UPDATE returns the number of rows it changed
        return int(conn.execute(f"""UPDATE optimizer_recommendations SET status = ?, status_label = ?, expired_at = ?,
                                    expired_reason = ? WHERE {condition}""",
                                [RecommendationStatus.EXPIRED.value, RecommendationStatus.EXPIRED.label, _now(),
                                 reason, *params, *OPEN_STATUSES]).fetchall()[0][0])

    def expire(self, *, binding_id: str | None = None, run_id: str | None = None,
               problem_ir_hash: str | None = None, reason: str) -> int:
        """Expire the open recommendations matching every given key; returns how many changed (idempotent)."""
        clauses, params = [], []
        for column, value in (("binding_id", binding_id), ("run_id", run_id), ("problem_ir_hash", problem_ir_hash)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if not clauses:
            raise LedgerError("expire needs a binding id, a run id or a problem hash")
        with self.transaction() as conn:
            return self._expire(conn, " AND ".join(clauses), params, reason)

    def expire_past_valid_until(self, now: datetime | None = None,
                                conn: duckdb.DuckDBPyConnection | None = None) -> int:
        """Record expiry of every open recommendation whose valid_until has passed."""
        if conn is None:
            with self.transaction() as tx:
                return self.expire_past_valid_until(now, tx)
        return self._expire(conn, "valid_until < ?", [_naive(now)], "valid_until passed")

    # ------------------------------------------------------------------ outcomes

    def insert_outcome(self, outcome: Outcome) -> str:
        with self.transaction() as conn:
            self._append_outcome(conn, outcome)
        return outcome.id

    def insert_outcome_if_absent(self, outcome: Outcome) -> bool:
        """Append an outcome whose id is deterministic (an evaluation row that a retried or concurrent
        step may repeat): written once, in one transaction; False when that id is already stored."""
        with self.transaction() as conn:
            if _first(conn.execute("SELECT 1 FROM optimizer_outcomes WHERE id = ?", [outcome.id]).fetchall()):
                return False
            self._append_outcome(conn, outcome)
        return True

    @staticmethod
    def _append_outcome(conn: duckdb.DuckDBPyConnection, outcome: Outcome) -> None:
        row = _first(conn.execute("SELECT status FROM optimizer_recommendations WHERE id = ?",
                           [outcome.recommendation_id]).fetchall())
        if row is None:
            raise NotFoundError(f"recommendation {outcome.recommendation_id} is not in the ledger")
        conn.execute("INSERT INTO optimizer_outcomes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     [outcome.id, outcome.recommendation_id, outcome.binding_id, _naive(outcome.applied_at),
                      canonical_json(outcome.observed), canonical_json(outcome.delta),
                      None if outcome.verdict is None else outcome.verdict.value,
                      canonical_json(outcome.details), _now()])

    def list_outcomes(self, binding_id: str | None = None, recommendation_id: str | None = None) -> list[dict[str, Any]]:
        if recommendation_id is not None:
            return _records(self.query("SELECT * FROM optimizer_outcomes WHERE recommendation_id = ? "
                                       "ORDER BY created_at", [recommendation_id]))
        return _records(self._select("optimizer_outcomes", binding_id, "created_at"))

    # ------------------------------------------------------------------ helpers

    def _select(self, table: str, binding_id: str | None, order: str) -> pd.DataFrame:
        if binding_id is None:
            return self.query(f"SELECT * FROM {table} ORDER BY {order}, id")
        return self.query(f"SELECT * FROM {table} WHERE binding_id = ? ORDER BY {order}, id", [binding_id])

    def counts(self) -> dict[str, int]:
        tables = ["bindings", "binding_revisions", "plant_samples", "model_artifacts", "uq_block_scores",
                  "uq_calibrations", "optimizer_runs", "optimizer_candidates", "optimizer_recommendations",
                  "optimizer_outcomes"]
        with self._connection() as conn:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables}


def _naive(moment: str | datetime | None) -> datetime:
    """UTC naive datetime for DuckDB TIMESTAMP columns (None -> now)."""
    if moment is None:
        return _now()
    if isinstance(moment, str):
        moment = parse_iso_utc(moment)
    return moment if moment.tzinfo is None else moment.astimezone(timezone.utc).replace(tzinfo=None)


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _check_end_status(status: str) -> None:
    if status not in RUN_END_STATUSES:
        raise LedgerError(f"run status must be one of {', '.join(RUN_END_STATUSES)}, got {status!r}")


def _payload_text(rec: Recommendation) -> str:
    """The recommendation JSON as created: to_json_dict has been through canonical_json (non-finite
    numbers refused, -0.0 folded), so orjson with sorted keys writes the same values as canonical
    JSON, ~0.2 ms sooner per solve; nothing hashes this text."""
    return orjson.dumps(rec.to_json_dict(), option=orjson.OPT_SORT_KEYS).decode()


# a plan: steps x variables, engineering units (DOUBLE[][] in DuckDB). Cost measured on DuckDB 2.0.1:
# the WAL serialises each inner list (one per step) on its own, so a small commit of 3 candidates
# with 30-step plans takes ~0.6 ms longer than with JSON text (~1.3 vs ~0.6 ms); bulk batches skip
# the WAL (_checkpoint_on_commit). A flat DOUBLE[] or per-variable lists would cost ~0.2 ms.
PLAN_ARROW_TYPE = pa.list_(pa.list_(pa.float64()))

# optimizer_candidates, column for column (tests check it against the table)
CANDIDATE_ARROW_SCHEMA = pa.schema([
    ("id", pa.string()), ("run_id", pa.string()), ("seq", pa.int32()), ("kind", pa.string()),
    ("solver_status", pa.string()), ("controls", PLAN_ARROW_TYPE), ("predicted", PLAN_ARROW_TYPE),
    ("cost", pa.float64()), ("constraints_json", pa.string()), ("feasible", pa.bool_()), ("verified", pa.bool_()),
    ("independent_cost", pa.float64()), ("verify_report_json", pa.string()), ("model_id", pa.string()),
    ("created_at", pa.timestamp("us"))])


def _candidate_table(run_id: str, candidates: Sequence[SolveCandidate], model_id: str) -> pa.Table:
    """The optimizer_candidates rows of one run as an Arrow table (costs: non-finite -> NULL)."""
    n = len(candidates)
    seqs = [c.seq for c in candidates]

    def where(column: str) -> Callable[[int], str]:
        return lambda i: f"candidate {seqs[i]} of run {run_id}, {column}"

    def texts(column: str, values: list[Any]) -> list[str]:
        return _json_texts(values, where(column))

    columns = [
        [candidate_id(run_id, seq) for seq in seqs], [run_id] * n, seqs, [c.kind.value for c in candidates],
        [c.solver_status for c in candidates], _plan_array([c.controls for c in candidates], where("controls")),
        _plan_array([c.predicted for c in candidates], where("predicted")),
        [_finite_or_none(c.cost) for c in candidates],
        texts("constraints", [c.constraints for c in candidates]), [c.feasible for c in candidates],
        [c.verified for c in candidates], [_finite_or_none(c.independent_cost) for c in candidates],
        texts("verify_report", [c.verify_report for c in candidates]), [model_id] * n, [_now()] * n]
    return pa.Table.from_arrays([values if isinstance(values, pa.Array) else pa.array(values, field.type)
                                 for values, field in zip(columns, CANDIDATE_ARROW_SCHEMA)],
                                schema=CANDIDATE_ARROW_SCHEMA)


def _plan_array(plans: list[Any], where: Callable[[int], str]) -> pa.ListArray:
    """The plans (each a sequence of rows of numbers) as one Arrow list<list<double>> array; a
    missing, non-numeric or non-finite number is refused with a ContractError naming the plan by
    `where(i)` (canonical_json's message and path for a non-finite one).

    pa.array converts the nested tuples in C (~25 ms for 10 000 plans of 30 x 2, about half of a
    flat numpy buffer + offsets built in Python); the finiteness check is one numpy pass over the
    flat values, which pa.array leaves as NaN / inf rather than nulls."""
    array = _checked_plans(plans)
    if array is not None:
        return array
    for i, plan in enumerate(plans):  # only for bad input: find and name the first bad plan
        if _checked_plans([plan]) is None:
            _fast_text(plan, where, i)  # raises for a non-finite number, naming its path
            raise ContractError(f"{where(i)}: a plan must be rows of numbers, got {plan!r:.80}")
    raise AssertionError("unreachable: the plans failed together but each passed alone")


def _checked_plans(plans: list[Any]) -> pa.ListArray | None:
    """list<list<double>> of the plans, or None when one holds a null, a non-number or a non-finite number."""
    try:
        array = pa.array(plans, PLAN_ARROW_TYPE)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    numbers = array.values.values
    if array.null_count or array.values.null_count or numbers.null_count \
            or not np.isfinite(numbers.to_numpy()).all():
        return None
    return array


@contextmanager
def _checkpoint_on_commit(conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Commits inside the block checkpoint instead of writing the WAL.

    A commit that would take the WAL past checkpoint_threshold checkpoints instead, and DuckDB then
    skips writing that transaction to the WAL: 10 000 candidates (~10 MB of plans) are written once
    to the database file rather than to the WAL on commit and again by the checkpoint on close
    (~60 ms less, issue 8). Only around bulk inserts: with a 1 MB threshold every small commit
    checkpoints (DuckDB's size estimate of a few rows is large), record_solve ~6 -> ~17 ms."""
    conn.execute("SET checkpoint_threshold = '1MB'")
    try:
        yield
    finally:
        conn.execute("RESET checkpoint_threshold")


def _insert_candidates(conn: duckdb.DuckDBPyConnection, new_candidates: pa.Table) -> None:
    if new_candidates.num_rows:
        # DuckDB reads the Arrow table by its Python name (replacement scan): one statement, ~0.5 ms
        # less than from_arrow().insert_into() or register + unregister for the 3 rows of a solve
        conn.execute("INSERT INTO optimizer_candidates SELECT * FROM new_candidates")


def _json_texts(values: list[Any], where: Callable[[int], str]) -> list[str]:
    """Valid JSON of each document (contracts.fast_json: canonical JSON's values, ~10x faster),
    refusing non-finite numbers with a ContractError whose message starts with `where(i)`."""
    return [_fast_text(value, where, i) for i, value in enumerate(values)]


def _fast_text(value: Any, where: Callable[[int], str], i: int) -> str:
    try:
        return fast_json(value).decode()
    except ContractError as exc:
        raise ContractError(f"{where(i)}: {exc}") from None


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts; *_json columns decoded; list columns (plans: DuckDB hands them to pandas as
    object arrays of float arrays) as nested Python lists of floats; timestamps as ISO UTC text."""
    out = []
    for row in frame.to_dict("records"):
        record: dict[str, Any] = {}
        for key, value in row.items():
            if key.endswith("_json"):
                record[key[:-5]] = None if value is None or (isinstance(value, float) and value != value) \
                    else json.loads(value)
            elif isinstance(value, np.ndarray):
                record[key] = _nested_list(value)
            elif isinstance(value, (pd.Timestamp, datetime)):
                record[key] = None if pd.isna(value) else pd.Timestamp(value).tz_localize("UTC").isoformat()
            elif value is pd.NaT:
                record[key] = None
            elif isinstance(value, float) and value != value:
                record[key] = None
            else:
                record[key] = value
        out.append(record)
    return out


def _nested_list(value: np.ndarray) -> list[Any]:
    if value.dtype != object:
        return value.tolist()
    return [_nested_list(item) if isinstance(item, np.ndarray) else item for item in value]


def _first(rows: list[tuple]) -> tuple | None:
    # fetchall, not fetchone: duckdb 2.x refuses further work on a connection with an unfinished result
    return rows[0] if rows else None
