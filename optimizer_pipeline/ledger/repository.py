"""The ledger repository: the one store of truth of the pipeline, and the only code that writes SQL.

`Ledger` is the interface every caller uses (assets, sensors, the CLI); its reads return typed
records (ledger.records). Where the rows live is the backend's business: connections, locking,
sessions and bulk inserts (ledger.duckdb_backend for the embedded DuckDB file). Each public write is
one transaction; a method that is part of a bigger unit of work has a private `_name(tx, ...)` form
that runs inside the caller's transaction.

Append-only: rows are never deleted. The only UPDATE paths are `finish_run` / `close_stale_runs`
(a run leaves `running` exactly once) and expiry (`expire*`: status -> expired, the row is kept).
A run with its candidates and recommendation is written in one transaction, superseding the
binding's open recommendation, so a binding has at most one open recommendation.
"""

from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import orjson
import pandas as pd

from optimizer_pipeline.contracts import (
    BindingSpec,
    ContractError,
    EvidenceSource,
    Outcome,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    StoredBinding,
    binding_from_json,
    canonical_json,
)
from optimizer_pipeline.ledger.candidates import BULK_CANDIDATE_ROWS, candidate_table
from optimizer_pipeline.ledger.duckdb_backend import DuckDBBackend
from optimizer_pipeline.ledger.evidence_rows import EvidenceRows
from optimizer_pipeline.ledger.exclusion_rows import ExclusionRows
from optimizer_pipeline.ledger.live_rows import LiveRows
from optimizer_pipeline.ledger.overview_rows import OverviewRows
from optimizer_pipeline.ledger.whatif_rows import WhatIfRows
from optimizer_pipeline.ledger.wiring_rows import WiringRows
from optimizer_pipeline.ledger.errors import LedgerError, NotFoundError, RunStateError
from optimizer_pipeline.ledger.schema import DUCKDB
from optimizer_pipeline.ledger.writes import retried
from optimizer_pipeline.ledger.records import (
    BindingUpsert,
    CandidateRecord,
    NewRun,
    OutcomeRecord,
    R,
    RecommendationRecord,
    RunRecord,
    RunStatus,
    VerdictRecord,
    end_status,
    naive,
    naive_now,
    new_id,
)
from optimizer_pipeline.validation import nearest

SAMPLE_SOURCES = (EvidenceSource.SIMULATION.value, EvidenceSource.REAL.value)
OPEN_STATUSES = (RecommendationStatus.VERIFIED.value, RecommendationStatus.UNVERIFIED.value,
                 RecommendationStatus.REJECTED.value)
COUNTED_TABLES = ("bindings", "binding_revisions", "binding_wiring", "plant_samples", "history_splits",
                  "model_artifacts", "uq_block_scores", "uq_calibrations", "optimizer_runs", "optimizer_candidates",
                  "optimizer_recommendations", "optimizer_outcomes", "binding_failures", "whatif_runs",
                  "live_services", "live_publications", "exclusions")


class Ledger(EvidenceRows, ExclusionRows, WhatIfRows, LiveRows, OverviewRows, WiringRows):
    """The pipeline's append-only store. `Ledger(path)` opens the embedded DuckDB file; a backend
    (DuckDBBackend, PostgresBackend: the same interface) may be given instead (see `open_ledger`)."""

    def __init__(self, where: Any, **backend_options: Any):
        self.backend = DuckDBBackend(where, **backend_options) if isinstance(where, (str, Path)) else where

    @property
    def path(self) -> str:
        """Where the ledger is, for messages."""
        return self.backend.location

    @contextmanager
    def session(self) -> Iterator["Ledger"]:
        """One connection (and, for DuckDB, the lock) for a batch of calls of this thread; each write
        is still its own transaction, so a failing unit of work rolls back alone."""
        with self.backend.session():
            yield self

    def transaction(self):
        """One transaction on the backend's connection (for tests and tools that write raw SQL)."""
        return self.backend.transaction()

    def others_waiting(self) -> bool:
        """Whether another process waits for the ledger (DuckDB: for its lock; PostgreSQL: never, a
        session holds no lock): a long session ends its stretch early then (ledger/duckdb_backend.py)."""
        return self.backend.others_waiting()

    def let_go(self) -> None:
        """Inside a session, before heavy computation: give the ledger up (DuckDB: the lock and the
        connection) until the session's next call, so that no other process waits for the computation."""
        self.backend.let_go()

    def hand_over(self, max_s: float) -> float:
        """After a session: let the processes waiting for the ledger have it first, waiting at most
        `max_s`; returns how long it waited."""
        return self.backend.hand_over(max_s)

    def models_stamp(self) -> str | None:
        """A stamp that changes with every write of what a binding's fingerprint covers (a revision, a
        split, an artifact, a calibration, an outcome), read without opening the ledger (None: no
        stamps on this backend)."""
        return self.backend.stamp("models")

    def samples_stamp(self) -> str | None:
        """A stamp that changes with every append of samples, read without opening the ledger (None:
        this backend has none, poll the ledger itself; it is cheap there)."""
        return self.backend.stamp("samples")

    # ------------------------------------------------------------------ bindings

    @retried
    def upsert_binding(self, spec: BindingSpec) -> BindingUpsert:
        """Identical spec -> same revision, no revision written. Changed spec -> revision + 1, a revision
        row and the binding's open recommendations expired, all in one transaction. Its OPC UA wiring,
        no part of the revision, is written in the same transaction when it changed (WiringRows)."""
        with self.backend.transaction() as tx:
            return self._upsert_binding(tx, spec)

    def _upsert_binding(self, tx: Any, spec: BindingSpec) -> BindingUpsert:
        # a solve publishing for this binding either commits first (its recommendation is then expired
        # below) or reads the new revision after this commits (its recommendation is born expired)
        self.backend.lock_binding(tx, spec.id)
        _, rows = self.backend.fetch(tx, """SELECT revision, spec_hash FROM binding_revisions WHERE binding_id = ?
                                            ORDER BY revision DESC LIMIT 1""", [spec.id])
        row, now = (rows[0] if rows else None), naive_now()
        if row is not None and row[1] == spec.spec_hash:
            return BindingUpsert(spec.id, row[0], created=False, changed=False, expired=0,
                                 wiring_changed=self._store_wiring(tx, spec.id, spec.opcua, now))
        revision = 1 if row is None else row[0] + 1
        if row is None:
            tx.execute("INSERT INTO bindings VALUES (?, ?)", [spec.id, now])
        self.backend.touch("models")
        tx.execute("INSERT INTO binding_revisions VALUES (?, ?, ?, ?, ?)",
                   [spec.id, revision, spec.spec_hash, spec.canonical_json(), now])
        expired = 0 if row is None else self._expire(tx, "binding_id = ?", [spec.id],
                                                     f"binding {spec.id} changed to revision {revision}")
        return BindingUpsert(spec.id, revision, created=row is None, changed=True, expired=expired,
                             wiring_changed=self._store_wiring(tx, spec.id, spec.opcua, now))

    def get_binding(self, binding_id: str, revision: int | None = None) -> StoredBinding:
        """The latest revision of the binding, or the given one, with the binding's latest wiring."""
        sql = "SELECT spec_json, revision, spec_hash, created_at FROM binding_revisions WHERE binding_id = ?"
        params: list[Any] = [binding_id]
        if revision is not None:
            sql += " AND revision = ?"
            params.append(revision)
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, sql + " ORDER BY revision DESC LIMIT 1", params)
            wiring = self._latest_wiring(conn, binding_id)
        if not rows:
            what = f"binding {binding_id!r}" + (f" revision {revision}" if revision is not None else "")
            raise NotFoundError(f"{what} is not in the ledger {self.path}{self._known_bindings(binding_id)}")
        spec_json, rev, spec_hash, created_at = rows[0]
        spec = binding_from_json(spec_json, source=f"ledger binding {binding_id}")
        return StoredBinding(replace(spec, opcua=wiring), rev, spec_hash, created_at)

    def _known_bindings(self, binding_id: str) -> str:
        """" (2 bindings; closest: a, b)" for a message about an unknown `binding_id`."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT id FROM bindings")
        if not rows:
            return " (it holds no binding yet: ingest one first)"
        count = f"{len(rows)} binding" + ("s" if len(rows) > 1 else "")
        return f" ({count}; closest: {', '.join(nearest(binding_id, [r[0] for r in rows]))})"

    def list_bindings(self) -> list[StoredBinding]:
        """The latest revision of every binding, by id, with its latest wiring."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, """SELECT binding_id, spec_json, revision, spec_hash, created_at
                FROM binding_revisions r
                WHERE revision = (SELECT max(revision) FROM binding_revisions WHERE binding_id = r.binding_id)
                ORDER BY binding_id""")
            wirings = self._latest_wirings(conn)
        return [StoredBinding(replace(binding_from_json(spec_json), opcua=wirings.get(binding_id)), revision,
                              spec_hash, created_at) for binding_id, spec_json, revision, spec_hash, created_at in rows]

    def binding_revisions(self, binding_id: str) -> list[tuple[int, str, datetime]]:
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, """SELECT revision, spec_hash, created_at FROM binding_revisions
                                                  WHERE binding_id = ? ORDER BY revision""", [binding_id])
        return [tuple(r) for r in rows]

    # ------------------------------------------------------------------ plant samples

    @retried
    def append_samples(self, binding_id: str, frame: pd.DataFrame, tags: Sequence[str], source: str) -> int:
        """Append a wide history frame (run_id, timestamp, tags...); samples already stored are
        skipped. Returns the number of new sample rows."""
        with self.backend.transaction() as tx:
            return self._append_samples(tx, binding_id, frame, tags, source)

    @retried
    def append_samples_many(self, items: Sequence[tuple[str, pd.DataFrame, Sequence[str]]], source: str) -> int:
        """`append_samples` of several (binding, frame, tags) in ONE transaction and one insert (the
        live service's batch of inbox files); returns the new sample rows of them all."""
        with self.backend.transaction() as tx:
            return self._insert_samples(tx, [_sample_rows(b, frame, tags, source) for b, frame, tags in items])

    def _append_samples(self, tx: Any, binding_id: str, frame: pd.DataFrame, tags: Sequence[str], source: str) -> int:
        return self._insert_samples(tx, [_sample_rows(binding_id, frame, tags, source)])

    def _insert_samples(self, tx: Any, parts: list[dict[str, np.ndarray]]) -> int:
        table = pd.DataFrame({name: np.concatenate([part[name] for part in parts]) for name in parts[0]})
        self.backend.touch("samples")
        return self.backend.insert_table(tx, "plant_samples", table, skip_existing=True)

    @retried
    def ingest(self, spec: BindingSpec, frame: pd.DataFrame, source: str) -> tuple[BindingUpsert, int]:
        """Store the binding and append its history in one transaction (all or nothing)."""
        with self.backend.transaction() as tx:
            upsert = self._upsert_binding(tx, spec)
            return upsert, self._append_samples(tx, spec.id, frame, spec.tags, source)

    def samples_through(self, binding_id: str) -> datetime | None:
        """When the newest stored sample of the binding was ingested (None without samples)."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT max(ingested_at) FROM plant_samples WHERE binding_id = ?",
                                         [binding_id])
        return rows[0][0]

    def history_frame(self, binding_id: str, tags: Sequence[str], through: datetime | None = None) -> pd.DataFrame:
        """Stored samples as a wide frame: run_id, timestamp, tags (NaN where a tag has no sample);
        with `through`, only the samples ingested up to that moment (an earlier step's view)."""
        sql, params = "SELECT run_id, ts, tag, value FROM plant_samples WHERE binding_id = ?", [binding_id]
        if through is not None:
            sql += " AND ingested_at <= ?"
            params.append(naive(through))
        with self.backend.connection() as conn:
            long = self.backend.fetch_frame(conn, sql + " ORDER BY run_id, ts", params)
        if long.empty:
            return pd.DataFrame(columns=["run_id", "timestamp", *tags])
        wide = long.pivot(index=["run_id", "ts"], columns="tag", values="value")  # unique: the primary key
        wide = wide.reindex(columns=list(tags)).reset_index().rename(columns={"ts": "timestamp"})
        wide.columns.name = None
        return wide.sort_values(["run_id", "timestamp"], kind="stable").reset_index(drop=True)

    def newest_samples(self) -> dict[str, float]:
        """The newest sample time (s since epoch) of every binding with samples."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT binding_id, max(ts) FROM plant_samples GROUP BY binding_id")
        return {binding_id: float(ts) for binding_id, ts in rows}

    def run_counts(self) -> dict[str, int]:
        """The number of runs stored of every binding with samples."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT binding_id, count(DISTINCT run_id) FROM plant_samples "
                                               "GROUP BY binding_id")
        return {binding_id: int(n) for binding_id, n in rows}

    def sample_source(self, binding_id: str) -> str | None:
        """'real' when any stored sample of the binding is real plant data, else 'simulation'; None without samples."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT DISTINCT source FROM plant_samples WHERE binding_id = ?",
                                         [binding_id])
        sources = {r[0] for r in rows}
        real, simulation = EvidenceSource.REAL.value, EvidenceSource.SIMULATION.value
        return None if not sources else (real if real in sources else simulation)

    # ------------------------------------------------------------------ runs, candidates, recommendations

    @retried
    def insert_run(self, run: NewRun, tx: Any = None) -> str:
        """Insert a run in status `running`; returns its id. With `tx`, inside that transaction."""
        if tx is not None:
            return self._insert_run_row(tx, run, RunStatus.RUNNING.value, None, None, None)
        with self.backend.transaction() as own:
            return self._insert_run_row(own, run, RunStatus.RUNNING.value, None, None, None)

    @retried
    def finish_run(self, run_id: str, status: str, *, independent_cost: float | None = None,
                   diagnostics: Mapping[str, Any] | None = None) -> None:
        """`running` -> succeeded | failed | interrupted, exactly once; a second finish raises RunStateError."""
        self._finish_run(run_id, status, independent_cost, diagnostics)

    def _finish_run(self, run_id: str, status: str, independent_cost: float | None,
                    diagnostics: Mapping[str, Any] | None) -> None:
        status = end_status(status)
        with self.backend.transaction() as tx:
            changed = self.backend.changed(tx, """UPDATE optimizer_runs SET status = ?, independent_cost = ?,
                diagnostics_json = ?, finished_at = ? WHERE id = ? AND status = 'running'""",
                [status, independent_cost, canonical_json(diagnostics or {}), naive_now(), run_id])
            if changed:
                return
            _, rows = self.backend.fetch(tx, "SELECT status FROM optimizer_runs WHERE id = ?", [run_id])
        if not rows:
            raise NotFoundError(f"run {run_id} is not in the ledger")
        raise RunStateError(f"run {run_id} is already finished ({rows[0][0]}); a run leaves 'running' once")

    @retried
    def insert_candidates(self, run_id: str, candidates: Sequence[SolveCandidate], model_id: str) -> list[str]:
        """All candidates of a run as one batch (one Arrow table insert). A non-finite number in a
        candidate's controls, predicted or reports is refused with a ContractError before any write;
        a batch of BULK_CANDIDATE_ROWS or more commits in the backend's bulk mode."""
        table = candidate_table(run_id, candidates, model_id)
        if table.num_rows < BULK_CANDIDATE_ROWS:
            with self.backend.transaction() as tx:
                self._insert_candidate_table(tx, table)
        else:
            with self.backend.session(), self.backend.connection() as conn, self.backend.bulk(conn), \
                    self.backend.transaction() as tx:
                self._insert_candidate_table(tx, table)
        return table.column("id").to_pylist()

    @retried
    def insert_recommendation(self, rec: Recommendation, evidence_source: str) -> str:
        """A recommendation without its run's other rows (tools and tests); it supersedes nothing, so
        the database refuses it while the binding has an open one."""
        with self.backend.transaction() as tx:
            self._insert_recommendation(tx, rec, evidence_source)
            if self.backend.dialect == DUCKDB and rec.status.value in OPEN_STATUSES:
                tx.execute("INSERT INTO open_recommendations VALUES (?, ?)", [rec.binding_id, rec.id])
        return rec.id

    @staticmethod
    def _insert_recommendation(tx: Any, rec: Recommendation, evidence_source: str,
                               expired_reason: str | None = None) -> str:
        """Insert the row; with `expired_reason` it is born expired (its payload keeps the status it was
        decided with)."""
        status, label = rec.status.value, rec.status_label
        expired_at = None
        if expired_reason is not None:
            status, label, expired_at = (RecommendationStatus.EXPIRED.value, RecommendationStatus.EXPIRED.label,
                                         naive_now())
        tx.execute("INSERT INTO optimizer_recommendations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [rec.id, rec.run_id, rec.binding_id, rec.binding_revision, rec.candidate_id, rec.template.value,
                    rec.problem_ir_hash, rec.model_artifact_hash, evidence_source,
                    canonical_json(rec.evidence.get("uq")), status, label,
                    canonical_json(list(rec.reasons)), _payload_text(rec), naive(rec.created_at),
                    naive(rec.valid_until), expired_at, expired_reason])
        return rec.id

    @retried
    def record_solve(self, run: NewRun, candidates: Sequence[SolveCandidate], model_id: str,
                     recommendation: Recommendation | None, *, run_status: str, independent_cost: float | None,
                     diagnostics: Mapping[str, Any], evidence_source: str, supersede: bool = True) -> str:
        """Run (with its end status) + candidates + recommendation (superseding the binding's open
        one) in ONE transaction: nobody ever sees the run `running` or a run without its candidates.

        Before publishing, the binding is locked (PostgreSQL: its `bindings` row FOR UPDATE, as
        `upsert_binding` does; DuckDB: the file lock already serialises writers) and its revision
        read again: a recommendation solved
        for a revision that changed while it was solving is recorded born `expired` (reason: the
        binding changed while solving) and supersedes nothing. So a binding has at most one open
        recommendation, and it is always for the binding's current revision."""
        return self._record_solve(run, candidates, model_id, recommendation, run_status, independent_cost, diagnostics,
                                  evidence_source, supersede)

    def _record_solve(self, run: NewRun, candidates: Sequence[SolveCandidate], model_id: str,
                      recommendation: Recommendation | None, run_status: str, independent_cost: float | None,
                      diagnostics: Mapping[str, Any], evidence_source: str, supersede: bool) -> str:
        # undecorated (mutmut mutates no decorated function: the invariant code is mutated here)
        write = self._solve_write(run, candidates, model_id, recommendation, run_status, independent_cost, diagnostics,
                                  evidence_source, supersede)
        with self.backend.transaction() as tx:
            return write(tx)

    def _solve_write(self, run: NewRun, candidates: Sequence[SolveCandidate], model_id: str,
                     recommendation: Recommendation | None, run_status: str, independent_cost: float | None,
                     diagnostics: Mapping[str, Any], evidence_source: str, supersede: bool) -> Callable[[Any], str]:
        """The writes of `record_solve` as a function of the transaction to run them in (returns the
        run id); its input is checked first (bad numbers refused before any write)."""
        write_run = self._run_write(run, candidates, model_id, run_status, independent_cost, diagnostics)

        def write(tx: Any) -> str:
            run_id = write_run(tx)
            if recommendation is not None:
                self._publish(tx, recommendation, evidence_source, supersede)
            return run_id

        return write

    def _publish(self, tx: Any, rec: Recommendation, evidence_source: str, supersede: bool) -> None:
        self.backend.lock_binding(tx, rec.binding_id)
        # a statement of its own: at READ COMMITTED its snapshot is taken after the lock was granted, so
        # it sees a revision committed by the writer the lock waited for
        _, rows = self.backend.fetch(tx, "SELECT max(revision) FROM binding_revisions WHERE binding_id = ?",
                                     [rec.binding_id])
        current = rows[0][0]
        if current is not None and current != rec.binding_revision:
            self._insert_recommendation(tx, rec, evidence_source, expired_reason=(
                f"binding {rec.binding_id} changed to revision {current} while solving revision "
                f"{rec.binding_revision}"))
            return
        if supersede:
            self._expire(tx, "binding_id = ?", [rec.binding_id], f"superseded by {rec.id}")
        self._insert_recommendation(tx, rec, evidence_source)
        if self.backend.dialect == DUCKDB and rec.status.value in OPEN_STATUSES:
            # the primary key refuses a second open recommendation of the binding (schema v4)
            tx.execute("INSERT INTO open_recommendations VALUES (?, ?)", [rec.binding_id, rec.id])

    @retried
    def close_stale_runs(self, older_than_s: float, now: datetime | None = None) -> int:
        """Reconciliation: runs still `running` after `older_than_s` (their writer died) become
        `interrupted`; returns how many. Normal writes never leave a run running (one transaction)."""
        with self.backend.transaction() as tx:
            return self._close_stale_runs(tx, older_than_s, now)

    def _close_stale_runs(self, tx: Any, older_than_s: float, now: datetime | None) -> int:
        cutoff = naive(now) - timedelta(seconds=older_than_s)
        return self.backend.changed(tx, """UPDATE optimizer_runs SET status = 'interrupted', finished_at = ?,
            diagnostics_json = ? WHERE status = 'running' AND started_at < ?""",
            [naive_now(), canonical_json({"reconciled": f"still running after {older_than_s:g} s"}), cutoff])

    @retried
    def housekeeping(self, stale_after_s: float, now: datetime | None = None) -> tuple[int, int]:
        """Before a solve, in one transaction: expire open recommendations past `valid_until` and close
        runs left `running` by a dead writer. Returns (expired, reconciled)."""
        with self.backend.transaction() as tx:
            expired = self._expire(tx, "valid_until < ?", [naive(now)], "valid_until passed")
            return expired, self._close_stale_runs(tx, stale_after_s, now)

    def get_run(self, run_id: str) -> RunRecord:
        return self._one(RunRecord, "SELECT * FROM optimizer_runs WHERE id = ?", [run_id],
                         missing=f"run {run_id} is not in the ledger")

    def list_runs(self, binding_id: str | None = None) -> list[RunRecord]:
        return self._select(RunRecord, "optimizer_runs", binding_id, "started_at")

    def list_candidates(self, run_id: str | None = None, binding_id: str | None = None) -> list[CandidateRecord]:
        sql = "SELECT c.* FROM optimizer_candidates c JOIN optimizer_runs r ON r.id = c.run_id WHERE 1 = 1"
        params: list[Any] = []
        for column, value in (("c.run_id", run_id), ("r.binding_id", binding_id)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        return self._read(CandidateRecord, sql + " ORDER BY c.created_at, c.run_id, c.seq", params)

    def get_recommendation(self, rec_id: str) -> RecommendationRecord:
        return self._one(RecommendationRecord, "SELECT * FROM optimizer_recommendations WHERE id = ?", [rec_id],
                         missing=f"recommendation {rec_id} is not in the ledger")

    def latest_recommendation(self, binding_id: str) -> RecommendationRecord | None:
        return self._one(RecommendationRecord, """SELECT * FROM optimizer_recommendations WHERE binding_id = ?
                                                  ORDER BY created_at DESC, id DESC LIMIT 1""", [binding_id])

    def list_recommendations(self, binding_id: str | None = None) -> list[RecommendationRecord]:
        return self._select(RecommendationRecord, "optimizer_recommendations", binding_id, "created_at")

    # ------------------------------------------------------------------ expiry (the only other UPDATE)

    def _expire(self, tx: Any, where: str, params: list[Any], reason: str) -> int:
        placeholders = ", ".join("?" for _ in OPEN_STATUSES)
        changed = self.backend.changed(tx, f"""UPDATE optimizer_recommendations SET status = ?, status_label = ?,
            expired_at = ?, expired_reason = ? WHERE ({where}) AND status IN ({placeholders})""",
            [RecommendationStatus.EXPIRED.value, RecommendationStatus.EXPIRED.label, naive_now(), reason, *params,
             *OPEN_STATUSES])
        if changed and self.backend.dialect == DUCKDB:
            tx.execute(f"""DELETE FROM open_recommendations WHERE recommendation_id NOT IN
                (SELECT id FROM optimizer_recommendations WHERE status IN ({placeholders}))""", list(OPEN_STATUSES))
        return changed

    @retried
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
        with self.backend.transaction() as tx:
            return self._expire(tx, " AND ".join(clauses), params, reason)

    @retried
    def expire_past_valid_until(self, now: datetime | None = None) -> int:
        """Record expiry of every open recommendation whose valid_until has passed."""
        with self.backend.transaction() as tx:
            return self._expire(tx, "valid_until < ?", [naive(now)], "valid_until passed")

    # ------------------------------------------------------------------ outcomes

    @retried
    def insert_outcome(self, outcome: Outcome) -> str:
        with self.backend.transaction() as tx:
            self._append_outcome(tx, outcome)
        return outcome.id

    @retried
    def insert_outcome_if_absent(self, outcome: Outcome) -> bool:
        """Append an outcome whose id is deterministic (an evaluation row that a retried or concurrent
        step may repeat): written once, in one transaction; False when that id is already stored."""
        with self.backend.transaction() as tx:
            if self.backend.fetch(tx, "SELECT 1 FROM optimizer_outcomes WHERE id = ?", [outcome.id])[1]:
                return False
            self._append_outcome(tx, outcome)
        return True

    def _append_outcome(self, tx: Any, outcome: Outcome) -> None:
        if not self.backend.fetch(tx, "SELECT status FROM optimizer_recommendations WHERE id = ?",
                                  [outcome.recommendation_id])[1]:
            raise NotFoundError(f"recommendation {outcome.recommendation_id} is not in the ledger")
        self.backend.touch("models")  # a verdict is part of a binding's fingerprint
        tx.execute("INSERT INTO optimizer_outcomes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [outcome.id, outcome.recommendation_id, outcome.binding_id, naive(outcome.applied_at),
                    canonical_json(outcome.observed), canonical_json(outcome.delta),
                    None if outcome.verdict is None else outcome.verdict.value,
                    canonical_json(outcome.details), naive_now()])

    def list_outcomes(self, binding_id: str | None = None, recommendation_id: str | None = None) -> list[OutcomeRecord]:
        if recommendation_id is not None:
            return self._read(OutcomeRecord, "SELECT * FROM optimizer_outcomes WHERE recommendation_id = ? "
                                             "ORDER BY created_at, id", [recommendation_id])
        return self._select(OutcomeRecord, "optimizer_outcomes", binding_id, "created_at")

    def list_verdicts(self, binding_id: str) -> list[VerdictRecord]:
        """The binding's judged outcomes (a verdict) in the order they were recorded, without their
        `observed` and `delta` documents: what the drift rule reads, at a solve's cost."""
        return self._read(VerdictRecord, """SELECT id, recommendation_id, binding_id, applied_at, verdict,
                                                   details_json, created_at
                                            FROM optimizer_outcomes WHERE binding_id = ? AND verdict IS NOT NULL
                                            ORDER BY created_at, id""", [binding_id])

    # ------------------------------------------------------------------ helpers

    def _select(self, kind: type[R], table: str, binding_id: str | None, order: str) -> list[R]:
        if binding_id is None:
            return self._read(kind, f"SELECT * FROM {table} ORDER BY {order}, id")
        return self._read(kind, f"SELECT * FROM {table} WHERE binding_id = ? ORDER BY {order}, id", [binding_id])

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        with self.backend.connection() as conn:
            return {t: self.backend.fetch(conn, f"SELECT count(*) FROM {t}")[1][0][0] for t in COUNTED_TABLES}


def _sample_rows(binding_id: str, frame: pd.DataFrame, tags: Sequence[str], source: str) -> dict[str, np.ndarray]:
    """plant_samples columns (long: a row per run, time and tag with a value) of a wide history frame;
    `_insert_samples` makes one table of several (a pandas frame per inbox file cost more than its insert)."""
    if source not in SAMPLE_SOURCES:
        raise ContractError(f"sample source must be 'simulation' or 'real', got {source!r}")
    values = frame[list(tags)].to_numpy(float)  # (rows, tags), row-major: rows repeat per tag below
    keep = ~np.isnan(values).ravel()
    n, kept = len(frame), int(keep.sum())
    return {
        "binding_id": np.full(kept, binding_id, dtype=object),
        "run_id": np.repeat(frame["run_id"].astype(str).to_numpy(object), len(tags))[keep],
        "ts": np.repeat(frame["timestamp"].to_numpy(float), len(tags))[keep],
        "tag": np.tile(np.asarray(tags, dtype=object), n)[keep], "value": values.ravel()[keep],
        "source": np.full(kept, source, dtype=object), "ingest_id": np.full(kept, new_id("ing"), dtype=object),
        "ingested_at": np.full(kept, np.datetime64(naive_now(), "us"))}


def _payload_text(rec: Recommendation) -> str:
    """The recommendation JSON as created: to_json_dict has been through canonical_json (non-finite
    numbers refused, -0.0 folded), so orjson with sorted keys writes the same values as canonical
    JSON, ~0.2 ms sooner per solve; nothing hashes this text."""
    return orjson.dumps(rec.to_json_dict(), option=orjson.OPT_SORT_KEYS).decode()


def open_ledger(home: Path, settings: Any = None) -> Ledger:
    """The home's ledger: PostgreSQL when the setting `ledger.url` is set (one connection pool per
    URL and process), else the DuckDB file `<home>/optimizer.duckdb`."""
    from optimizer_pipeline.settings import ledger_path, load_settings

    settings = load_settings(home) if settings is None else settings
    if settings.ledger_url:
        from optimizer_pipeline.ledger.postgres_backend import shared_backend

        return Ledger(shared_backend(settings.ledger_url))
    return Ledger(ledger_path(home))
