"""The steps of one binding partition as plain functions: the Dagster assets call these, and so can
tests and benchmarks without Dagster. history -> model -> block scores -> calibration -> recommendation.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

import numpy as np

from optimizer_pipeline import uq
from optimizer_pipeline.contracts import (
    BindingSpec,
    Condition,
    HistorySplit,
    ModelArtifact,
    ProblemIR,
    Recommendation,
    SolveCandidate,
    SolveResult,
    Template,
    iso_utc,
)
from optimizer_pipeline.ledger import Ledger, StoredBinding, new_id
from optimizer_pipeline.model import current_state
from optimizer_pipeline.problem import compile_problem
from optimizer_pipeline.recommend import EvidenceSnapshot, decide
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver.errors import WORKER_INTERRUPTED, SolverError

log = logging.getLogger(__name__)

SPLIT_SEED = 0  # runs are split with a fixed seed so that a recalibration of the same data is reproducible


@dataclass(frozen=True)
class Scores:
    val: uq.BlockScores
    test: uq.BlockScores


@dataclass(frozen=True)
class Calibration:
    """UQ evidence of one artifact as calibrated at `calibrated_at` (stored as `calibration_id`)."""

    calibration_id: str
    artifact_hash: str
    evidence: uq.UQEvidence


@dataclass(frozen=True)
class SolveRecord:
    run_id: str
    problem: ProblemIR
    result: SolveResult
    recommendation: Recommendation
    chosen: SolveCandidate | None
    conditions: tuple[Condition, ...]  # every condition for `verified`, holding or not
    expired_before: int  # open recommendations expired past valid_until just before this solve


def block_length(binding: BindingSpec, artifact: ModelArtifact) -> int:
    """DESIGN UQ rule: h = the artifact's training horizon P; the steady-state template uses h = 1."""
    return 1 if binding.profile.template is Template.STEADY_RESPONSE else artifact.horizon


def score_blocks(binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit) -> Scores:
    h = block_length(binding, artifact)
    return Scores(uq.block_scores(artifact, split.val, h=h), uq.block_scores(artifact, split.test, h=h))


def persist_scores(ledger: Ledger, artifact: ModelArtifact, scores: Scores) -> int:
    return sum(ledger.put_block_scores(artifact, segment, s.run_ids.tolist(), s.starts.tolist(), s.scores)
               for segment, s in (("val", scores.val), ("test", scores.test)))


def calibrate(ledger: Ledger, artifact: ModelArtifact, scores: Scores, settings: Settings,
              now: datetime) -> Calibration:
    """Compute the evidence (DESIGN UQ rules) and record it in `uq_calibrations`."""
    evidence = uq.compute_block_uq(scores.val, scores.test, alpha=settings.uq_alpha, calibrated_at=iso_utc(now))
    cal_id = ledger.put_calibration(artifact, evidence.to_dict(), has_evidence=evidence.has_evidence,
                                    method=evidence.method, coverage=evidence.coverage,
                                    threshold=evidence.coverage_threshold, reasons=evidence.reasons,
                                    calibrated_at=now)
    return Calibration(cal_id, artifact.artifact_hash, evidence)


def evidence_snapshot(calibration: Calibration, artifact: ModelArtifact, u_now: np.ndarray, y_now: np.ndarray,
                      source: str, settings: Settings, now: datetime) -> EvidenceSnapshot:
    evidence = calibration.evidence
    return EvidenceSnapshot(
        source=source, has_evidence=evidence.has_evidence, uq=evidence.to_dict(),
        uq_checks=tuple(uq.gate_checks(evidence, settings.uq_gate)), calibrated_at=evidence.calibrated_at,
        calibration_fresh=uq.is_fresh(evidence.calibrated_at, now, settings.uq_fresh_days),
        fresh_days=settings.uq_fresh_days, input_distance=uq.input_distance(artifact, u_now, y_now))


def recommend(stored: StoredBinding, artifact: ModelArtifact, split: HistorySplit, calibration: Calibration,
              solve: Callable[[ProblemIR], SolveResult], ledger: Ledger, settings: Settings, source: str,
              now: datetime) -> SolveRecord:
    """Compile the problem from the live state, solve it, decide the status and write run +
    candidates + recommendation in one ledger transaction (superseding the open one)."""
    binding = stored.spec
    expired, reconciled = ledger.housekeeping(stale_after_s=settings.solver_request_timeout_ms / 1000, now=now)
    if reconciled:
        log.warning("closed %d run(s) left running by a writer that died as interrupted", reconciled)
    live = split.live
    if live is None:
        raise ValueError(f"binding {binding.id}: no live run in the history, so there is no current state")
    x0, bias = current_state(artifact, live)
    evidence = calibration.evidence
    band = np.asarray(evidence.qhat) if evidence.has_evidence else None
    problem = compile_problem(binding, artifact, x0, bias, live.u[-1], live.d[-1], band)
    run_id = new_id("or")
    try:
        result = solve(problem)
    except SolverError as exc:  # recorded as a failed run with a rejected recommendation, not lost
        log.warning("binding %s: solve failed: %s", binding.id, exc)
        result = SolveResult(problem.hash, ok=False, candidates=(), diagnostics={}, error_code=exc.code,
                             error_message=exc.message)
    snapshot = evidence_snapshot(calibration, artifact, live.u[-1], live.y[-1], source, settings, now)
    consistency = [
        Condition("model from the binding's revision", f"r{artifact.binding_revision}", f"r{stored.revision}",
                  artifact.binding_revision == stored.revision,
                  f"model artifact is from binding revision {artifact.binding_revision}, "
                  f"the binding is at revision {stored.revision}"),
        Condition("calibration of this model", calibration.artifact_hash[:12], artifact.artifact_hash[:12],
                  calibration.artifact_hash == artifact.artifact_hash, "calibration belongs to another model artifact")]
    decision = decide(binding, stored.revision, artifact, problem, result, snapshot,
                      uq.band_engineering(evidence, artifact), settings.uq_max_input_distance, run_id, now,
                      extra_conditions=consistency)
    rec, chosen = decision.recommendation, decision.chosen
    run = {"id": run_id, "binding_id": binding.id, "binding_revision": stored.revision,
           "profile_id": binding.profile.id, "profile_version": binding.profile.version,
           "problem_ir_hash": problem.hash, "problem": problem.to_dict(), "started_at": now,
           "context": {"live_run": live.run_id, "live_t": float(live.t[-1]), "calibration_id": calibration.calibration_id,
                       "model_artifact_hash": artifact.artifact_hash, "evidence_source": source}}
    ledger.record_solve(run, result.candidates, artifact.artifact_hash, rec,
                        run_status=run_status(result),
                        independent_cost=None if chosen is None else chosen.independent_cost,
                        diagnostics=dict(result.diagnostics, error_code=result.error_code,
                                         error_message=result.error_message),
                        evidence_source=rec.evidence["source"])
    log.info("binding %s: recommendation %s is %s", binding.id, rec.id, rec.status.value)
    return SolveRecord(run_id, problem, result, rec, chosen, decision.conditions, expired)


def run_status(result: SolveResult) -> str:
    """A solve whose worker died is `interrupted` (never replayed); other errors `failed`."""
    if result.ok:
        return "succeeded"
    return "interrupted" if result.error_code == WORKER_INTERRUPTED else "failed"


def recommendation_json(row: dict[str, Any]) -> dict[str, Any]:
    """The DESIGN.md recommendation JSON of a ledger row: the published payload with the current status."""
    doc = dict(row["payload"])
    doc["status"] = row["status"]
    doc["status_label"] = row["status_label"]
    if row["status"] == "expired":
        doc["expired_reason"] = row.get("expired_reason")
    return doc
