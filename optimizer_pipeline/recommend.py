"""Choosing the candidate to publish and deciding how far it can be trusted (DESIGN.md, the
conditions for `verified`): evidence, coverage, freshness, input distance, feasibility, cost
agreement, model gates and, with `uq.gate = strict`, the Clopper-Pearson / exchangeability tests.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from optimizer_pipeline.contracts import (
    BindingSpec,
    CandidateKind,
    ModelArtifact,
    ProblemIR,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    SolveResult,
    iso_utc,
)
from optimizer_pipeline.ledger import candidate_id, new_id


@dataclass(frozen=True)
class EvidenceSnapshot:
    """What the calibration says at decision time (engineering-free; plain values)."""

    source: str  # simulation | real (where the calibration data came from)
    has_evidence: bool
    uq: Mapping[str, Any] | None  # the UQ evidence document as stored
    calibration_fresh: bool
    input_distance: float | None
    gate_failures: tuple[str, ...] = ()  # uq.gate_failures under the configured gate (coverage, strict tests)
    no_evidence_reasons: tuple[str, ...] = ()  # why there is no evidence, when there is none


def choose_candidate(result: SolveResult) -> SolveCandidate | None:
    """The robust optimum when it is feasible, else the nominal one; never the hold baseline."""
    by_kind = {c.kind: c for c in result.candidates}
    for kind in (CandidateKind.ROBUST, CandidateKind.NOMINAL):
        candidate = by_kind.get(kind)
        if candidate is not None and candidate.feasible and candidate.controls:
            return candidate
    return None


def failed_conditions(artifact: ModelArtifact, evidence: EvidenceSnapshot, candidate: SolveCandidate | None,
                      max_input_distance: float) -> list[str]:
    """Every condition for `verified` that does not hold, as user-facing text ([] when verified)."""
    reasons: list[str] = []
    if candidate is None:
        reasons.append("no feasible candidate")
    if not evidence.has_evidence:
        detail = "; ".join(evidence.no_evidence_reasons) or "no calibration"
        reasons.append(f"no UQ evidence ({detail})")
    else:
        reasons.extend(f"UQ gate: {failure}" for failure in evidence.gate_failures)
        if not evidence.calibration_fresh:
            reasons.append("calibration is not fresh")
    if evidence.input_distance is None:
        reasons.append("input distance unknown (missing or non-finite current values)")
    elif evidence.input_distance > max_input_distance:
        reasons.append(f"input distance {_fmt(evidence.input_distance)} exceeds {max_input_distance:g}")
    for gate in artifact.gates:
        if not gate.passed:
            reasons.append(f"model gate {gate.name} failed: {gate.description} = {_fmt(gate.value)} "
                           f"(threshold {_fmt(gate.threshold)})")
    if candidate is not None and not candidate.verified:
        why = candidate.verify_report.get("reasons") or ["independent check disagrees"]
        reasons.append("candidate not verified: " + "; ".join(str(r) for r in why))
    return reasons


def decide(binding: BindingSpec, binding_revision: int, artifact: ModelArtifact, problem: ProblemIR,
           result: SolveResult, evidence: EvidenceSnapshot, band_engineering: Sequence[float | None],
           max_input_distance: float, run_id: str, now: datetime,
           extra_reasons: Sequence[str] = ()) -> Recommendation:
    """Build the recommendation of one solve: `rejected` without a feasible candidate, `verified`
    when every condition holds, `unverified` otherwise (with every failed condition listed)."""
    candidate = choose_candidate(result) if result.ok else None
    reasons = failed_conditions(artifact, evidence, candidate, max_input_distance) + list(extra_reasons)
    if not result.ok:
        reasons.insert(0, f"solver error {result.error_code}: {result.error_message}")
    if candidate is None:
        status = RecommendationStatus.REJECTED
    elif reasons:
        status = RecommendationStatus.UNVERIFIED
    else:
        status = RecommendationStatus.VERIFIED
    return Recommendation(
        id=new_id("rec"), binding_id=binding.id, binding_revision=binding_revision, run_id=run_id,
        candidate_id=None if candidate is None else candidate_id(run_id, candidate.seq),
        template=binding.profile.template, status=status, reasons=tuple(reasons), created_at=iso_utc(now),
        valid_until=iso_utc(now + timedelta(seconds=binding.profile.valid_for_s)),
        mv_tags=binding.mv_tags, cv_tags=binding.cv_tags,
        controls=() if candidate is None else candidate.controls,
        predicted=() if candidate is None else candidate.predicted,
        band=tuple(band_engineering), cost=None if candidate is None else candidate.cost,
        independent_cost=None if candidate is None else candidate.independent_cost,
        problem_ir_hash=problem.hash, model_artifact_hash=artifact.artifact_hash,
        evidence={"source": evidence.source if evidence.has_evidence else "unassessed", "uq": evidence.uq,
                  "input_distance": evidence.input_distance, "calibration_fresh": evidence.calibration_fresh,
                  "coverage_threshold": None if evidence.uq is None else evidence.uq.get("coverage_threshold")},
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
