"""Solver results: the candidates of one ProblemIR (hold, nominal, robust) in engineering units."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from optimizer_pipeline.contracts.canonical import tuple2


class CandidateKind(str, Enum):
    HOLD = "hold"  # seq 0: current MVs held
    NOMINAL = "nominal"  # seq 1
    ROBUST = "robust"  # seq 2: CV limits tightened by the UQ band


@dataclass(frozen=True)
class SolveCandidate:
    """One solution of a ProblemIR. controls (N, nu) and predicted (N, ny) in engineering units."""

    seq: int
    kind: CandidateKind
    solver_status: str  # osqp status text, or "hold" for the baseline
    controls: tuple[tuple[float, ...], ...]
    predicted: tuple[tuple[float, ...], ...]
    cost: float | None  # solver objective (normalised units, constant terms included)
    constraints: Mapping[str, Any]  # solver-side constraint report (slack used, ...)
    feasible: bool = False  # set by the verifier
    verified: bool = False  # feasible and independent cost agrees
    independent_cost: float | None = None
    verify_report: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "SolveCandidate":
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        return SolveCandidate(
            seq=int(doc["seq"]), kind=CandidateKind(doc["kind"]), solver_status=doc["solver_status"],
            controls=tuple2(doc["controls"]), predicted=tuple2(doc["predicted"]), cost=opt(doc.get("cost")),
            constraints=doc.get("constraints", {}), feasible=bool(doc.get("feasible", False)),
            verified=bool(doc.get("verified", False)), independent_cost=opt(doc.get("independent_cost")),
            verify_report=doc.get("verify_report", {}))


@dataclass(frozen=True)
class SolveResult:
    problem_ir_hash: str
    ok: bool
    candidates: tuple[SolveCandidate, ...]
    diagnostics: Mapping[str, Any]
    error_code: str | None = None
    error_message: str | None = None

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "SolveResult":
        """The inverse of canonical_json(result) (what a solver worker sends back)."""
        return SolveResult(
            problem_ir_hash=doc["problem_ir_hash"], ok=bool(doc["ok"]),
            candidates=tuple(SolveCandidate.from_dict(c) for c in doc.get("candidates", ())),
            diagnostics=doc.get("diagnostics", {}), error_code=doc.get("error_code"),
            error_message=doc.get("error_message"))
