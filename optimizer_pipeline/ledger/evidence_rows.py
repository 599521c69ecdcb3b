"""The ledger's rows of the calibration stages: history splits, model artifacts, UQ block scores,
calibrations, and the failures of binding stages (a mixin of Ledger, with its backend and readers)."""

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import ModelArtifact, as_utc, canonical_json
from optimizer_pipeline.ledger.base import LedgerBase
from optimizer_pipeline.ledger.errors import NotFoundError
from optimizer_pipeline.ledger.records import (
    BindingFailure,
    CalibrationRecord,
    HistorySplitRecord,
    naive,
    naive_now,
    new_id,
)
from optimizer_pipeline.ledger.writes import retried


class EvidenceRows(LedgerBase):
    """Part of Ledger."""

    # ------------------------------------------------------------------ history splits

    @retried
    def put_split(self, binding_id: str, revision: int, *, samples_through: datetime, seed: int, data_hash: str,
                  runs: Mapping[str, Sequence[str]], live_run: str | None, report: Mapping[str, Any]) -> str:
        split_id = new_id("hs")
        with self.backend.transaction() as tx:
            self.backend.touch("models")
            tx.execute("INSERT INTO history_splits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [split_id, binding_id, revision, naive(samples_through), seed, data_hash,
                        canonical_json(list(runs["train"])), canonical_json(list(runs["val"])),
                        canonical_json(list(runs["test"])), live_run, canonical_json(dict(report)), naive_now()])
        return split_id

    def latest_split(self, binding_id: str, revision: int) -> HistorySplitRecord | None:
        return self._one(HistorySplitRecord, """SELECT * FROM history_splits WHERE binding_id = ? AND binding_revision = ?
                                                ORDER BY created_at DESC, id DESC LIMIT 1""", [binding_id, revision])

    # ------------------------------------------------------------------ model artifacts and UQ

    @retried
    def put_artifact(self, artifact: ModelArtifact) -> str:
        """Idempotent by content hash."""
        with self.backend.transaction() as tx:
            self.backend.touch("models")
            tx.execute("INSERT INTO model_artifacts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       [artifact.artifact_hash, artifact.binding_id, artifact.binding_revision, artifact.gates_passed,
                        canonical_json(artifact), naive_now()])
        return artifact.artifact_hash

    def get_artifact(self, artifact_hash: str) -> ModelArtifact:
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT artifact_json FROM model_artifacts WHERE artifact_hash = ?",
                                         [artifact_hash])
        if not rows:
            raise NotFoundError(f"model artifact {artifact_hash} is not in the ledger")
        return ModelArtifact.from_dict(json.loads(rows[0][0]))

    def latest_artifact(self, binding_id: str, revision: int) -> ModelArtifact | None:
        """The newest model artifact identified for this revision of the binding."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, """SELECT artifact_json FROM model_artifacts
                WHERE binding_id = ? AND binding_revision = ? ORDER BY created_at DESC LIMIT 1""", [binding_id, revision])
        return ModelArtifact.from_dict(json.loads(rows[0][0])) if rows else None

    @retried
    def put_block_scores(self, artifact: ModelArtifact, rule: str, segment: str, run_ids: Sequence[str],
                         block_starts: Sequence[int], scores: Any) -> int:
        """Block scores (n_blocks, n_cv) by the score rule `rule` (uq.rule_key), idempotent per (artifact,
        rule, segment, run, block, cv)."""
        n_cv = len(artifact.cv_tags)
        scores = np.asarray(scores, float).reshape(len(run_ids), n_cv)
        frame = pd.DataFrame({
            "artifact_hash": artifact.artifact_hash, "binding_id": artifact.binding_id,
            "binding_revision": artifact.binding_revision, "segment": segment,
            "run_id": np.repeat(np.asarray(run_ids, dtype=object), n_cv),
            "block_start": np.repeat(np.asarray(block_starts, dtype=np.int64), n_cv),
            "cv_tag": np.tile(np.asarray(artifact.cv_tags, dtype=object), len(run_ids)),
            "score": scores.reshape(-1), "created_at": naive_now(), "score_rule": rule})
        with self.backend.transaction() as tx:
            self.backend.insert_table(tx, "uq_block_scores", frame, skip_existing=True)
        return len(frame)

    def block_scores(self, artifact_hash: str, rule: str) -> pd.DataFrame:
        """segment, run_id, block_start, cv_tag, score of an artifact by the score rule `rule`, in block order."""
        return self.query("""SELECT segment, run_id, block_start, cv_tag, score FROM uq_block_scores
                             WHERE artifact_hash = ? AND score_rule = ?
                             ORDER BY segment, run_id, block_start, cv_tag""", [artifact_hash, rule])

    @retried
    def put_calibration(self, artifact: ModelArtifact, evidence: Mapping[str, Any], *, has_evidence: bool,
                        method: str | None, coverage: float | None, threshold: float | None,
                        reasons: Sequence[str], calibrated_at: datetime | None = None) -> str:
        cal_id = new_id("cal")
        with self.backend.transaction() as tx:
            self.backend.touch("models")
            tx.execute("INSERT INTO uq_calibrations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [cal_id, artifact.binding_id, artifact.binding_revision, artifact.artifact_hash,
                        naive(calibrated_at), has_evidence, method, coverage, threshold,
                        canonical_json(evidence), canonical_json(list(reasons))])
        return cal_id

    def latest_calibration(self, binding_id: str, binding_revision: int | None = None,
                           artifact_hash: str | None = None) -> CalibrationRecord | None:
        sql, params = "SELECT * FROM uq_calibrations WHERE binding_id = ?", [binding_id]
        for column, value in (("binding_revision", binding_revision), ("artifact_hash", artifact_hash)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        return self._one(CalibrationRecord, sql + " ORDER BY calibrated_at DESC, id DESC LIMIT 1", params)

    def latest_calibrations(self) -> list[CalibrationRecord]:
        """The newest calibration of every binding (for the freshness sensor)."""
        return self._read(CalibrationRecord, """SELECT * FROM uq_calibrations c WHERE calibrated_at =
            (SELECT max(calibrated_at) FROM uq_calibrations WHERE binding_id = c.binding_id) ORDER BY binding_id""")

    # ------------------------------------------------------------------ binding failures

    @retried
    def record_failure(self, binding_id: str, revision: int | None, stage: str, error: str, message: str,
                       dagster_run_id: str | None = None) -> BindingFailure:
        """Record that a stage of one binding failed (nothing of that stage was written)."""
        now = naive_now()
        failure = BindingFailure(new_id("bf"), binding_id, revision, stage, error, message, dagster_run_id, as_utc(now))
        with self.backend.transaction() as tx:
            tx.execute("INSERT INTO binding_failures VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [failure.id, binding_id, revision, stage, error, message, dagster_run_id, now])
        return failure

    def list_failures(self, binding_id: str | None = None, dagster_run_id: str | None = None) -> list[BindingFailure]:
        sql, params = "SELECT * FROM binding_failures WHERE 1 = 1", []
        for column, value in (("binding_id", binding_id), ("dagster_run_id", dagster_run_id)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        return self._read(BindingFailure, sql + " ORDER BY created_at, id", params)
