"""Typed rows of the ledger: what its reads return (frozen dataclasses, one per table).

Column names stay inside the ledger package: callers read named fields. JSON columns are decoded
(`context_json` -> `context`), plans are nested lists of floats, timestamps aware UTC datetimes and
statuses enums; a row converts back to plain JSON with `to_json_dict()` (the `ledger --json` output:
timestamps ISO 8601 UTC text, statuses their values).
"""

import dataclasses
import functools
import json
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Mapping, Sequence, TypeVar, get_args, get_type_hints

from optimizer_pipeline.contracts import (
    OutcomeVerdict,
    ProblemIR,
    RecommendationStatus,
    as_utc,
    iso_utc,
    parse_iso_utc,
    utc_now,
)
from optimizer_pipeline.ledger.errors import LedgerError

R = TypeVar("R")


class _Record:
    """A row of the ledger; `to_json_dict` is its plain JSON (the `ledger --json` output)."""

    def to_json_dict(self) -> dict[str, Any]:
        return {name: _json_value(value) for name, value in dataclasses.asdict(self).items()}


def _json_value(value: Any) -> Any:
    """A record's field as plain JSON: a time as ISO 8601 UTC text, a status as its value."""
    if isinstance(value, datetime):
        return iso_utc(value)
    return value.value if isinstance(value, Enum) else value


class RunStatus(str, Enum):
    """An optimizer run's status: `running` while its writer works, then one end status, exactly once."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # its worker died (never replayed), or a writer left it running


@dataclass(frozen=True)
class BindingUpsert:
    """What storing a binding did: a new binding, a new revision, or nothing (same spec); and whether
    its OPC UA wiring, which is no part of a revision, changed."""

    binding_id: str
    revision: int
    created: bool  # first revision of a new binding
    changed: bool  # a new revision was written
    expired: int  # open recommendations expired by the change
    wiring_changed: bool  # a wiring row was written: the wiring differs from the binding's latest


@dataclass(frozen=True)
class NewRun:
    """An optimizer run to write (`insert_run`, `record_solve`, `record_whatif`): the binding revision
    and profile it solves, its problem (a ProblemIR or its JSON mapping) and context; without an id
    it gets a new one, without `started_at` it started now."""

    binding_id: str
    binding_revision: int
    profile_id: str
    profile_version: int
    problem_ir_hash: str | None
    context: Mapping[str, Any]
    problem: ProblemIR | Mapping[str, Any] | None
    id: str | None = None
    started_at: datetime | None = None


@dataclass(frozen=True)
class RunRecord(_Record):
    """One optimizer run (`optimizer_runs`): a solve of one ProblemIR, `running` until it ends once."""

    id: str
    binding_id: str
    binding_revision: int
    profile_id: str
    profile_version: int
    problem_ir_hash: str | None
    context: dict[str, Any]
    problem: dict[str, Any] | None
    diagnostics: dict[str, Any] | None
    status: RunStatus
    independent_cost: float | None
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class CandidateRecord(_Record):
    """One candidate of a run (`optimizer_candidates`); plans in engineering units (steps x tags)."""

    id: str
    run_id: str
    seq: int
    kind: str
    solver_status: str
    controls: list[list[float]]
    predicted: list[list[float]]
    cost: float | None
    constraints: dict[str, Any]
    feasible: bool
    verified: bool
    independent_cost: float | None
    verify_report: dict[str, Any]
    model_id: str
    created_at: datetime


@dataclass(frozen=True)
class RecommendationRecord(_Record):
    """One published recommendation (`optimizer_recommendations`) with its current status; `payload`
    is the recommendation JSON as created."""

    id: str
    run_id: str
    binding_id: str
    binding_revision: int
    candidate_id: str | None
    template: str
    problem_ir_hash: str
    model_artifact_hash: str
    evidence_source: str
    uq_evidence: dict[str, Any] | None
    status: RecommendationStatus
    status_label: str
    reasons: list[str]
    payload: dict[str, Any]
    created_at: datetime
    valid_until: datetime
    expired_at: datetime | None
    expired_reason: str | None

    def document(self) -> dict[str, Any]:
        """The recommendation JSON (docs/recommendation.md): the published payload with the
        current status, and the reason when it expired."""
        doc = dict(self.payload, status=self.status.value, status_label=self.status_label)
        if self.status == RecommendationStatus.EXPIRED:
            doc["expired_reason"] = self.expired_reason
        return doc


@dataclass(frozen=True)
class OutcomeRecord(_Record):
    """One outcome (`optimizer_outcomes`): an observation after applying a recommendation, and its verdict."""

    id: str
    recommendation_id: str
    binding_id: str
    applied_at: datetime
    observed: dict[str, Any]
    delta: dict[str, Any]
    verdict: OutcomeVerdict | None
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class VerdictRecord(_Record):
    """A judged outcome (`optimizer_outcomes` with a verdict) as the drift rule reads it, without the
    outcome's `observed` and `delta` documents."""

    id: str
    recommendation_id: str
    binding_id: str
    applied_at: datetime
    verdict: OutcomeVerdict
    details: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class CalibrationRecord(_Record):
    """One stored calibration (`uq_calibrations`) of a model artifact."""

    id: str
    binding_id: str
    binding_revision: int
    artifact_hash: str
    calibrated_at: datetime
    has_evidence: bool
    method: str | None
    coverage: float | None
    threshold: float | None
    evidence: dict[str, Any]
    reasons: list[str]


@dataclass(frozen=True)
class HistorySplitRecord(_Record):
    """How `plant_history` split a binding's stored samples (`history_splits`): enough to rebuild the
    same split later (the samples ingested up to `samples_through`, split again with `seed`) and to
    check it (`data_hash`)."""

    id: str
    binding_id: str
    binding_revision: int
    samples_through: datetime
    seed: int
    data_hash: str
    train_runs: list[str]
    val_runs: list[str]
    test_runs: list[str]
    live_run: str | None
    report: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class BindingFailure(_Record):
    """A stage of one binding that failed in a batch (`binding_failures`): nothing of that stage was
    written; the other bindings of the batch went on."""

    id: str
    binding_id: str
    binding_revision: int | None
    stage: str
    error: str
    message: str
    dagster_run_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class WhatIfRecord(_Record):
    """One what-if solve (`whatif_runs`): a binding solved with overrides, recorded beside the
    binding's open recommendation, never instead of it. `result` is the decision as a recommendation
    JSON would hold it (status, reasons, controls, predicted, band, ...) plus `economic_value`; its
    run and candidates are in optimizer_runs / optimizer_candidates under `run_id`."""

    run_id: str
    binding_id: str
    binding_revision: int
    overrides: list[dict[str, Any]]
    spec: dict[str, Any]
    compared_recommendation_id: str | None
    result: dict[str, Any]
    requested_by: str
    dagster_run_id: str | None
    created_at: datetime


RUN_END_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.INTERRUPTED)


def end_status(status: "RunStatus | str") -> str:
    """The text stored for a run's end status; LedgerError naming the allowed ones for anything else."""
    if status not in RUN_END_STATUSES:
        raise LedgerError(f"run status must be one of {', '.join(s.value for s in RUN_END_STATUSES)}, "
                          f"got {status!r}")
    return RunStatus(status).value


def new_id(prefix: str) -> str:
    """A ledger id: `<kind prefix>-<16 hex digits>` (runs `or-`, recommendations `rec-`, outcomes `out-` ...)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def candidate_id(run_id: str, seq: int) -> str:
    """Candidate ids are `oc-<run suffix>-<seq>`."""
    return f"oc-{run_id.removeprefix('or-')}-{seq}"


def naive_now() -> datetime:
    """Now as naive UTC (the ledger's TIMESTAMP columns)."""
    return utc_now().replace(tzinfo=None)


def naive(moment: "str | datetime | None") -> datetime:
    """UTC naive datetime for TIMESTAMP columns (None -> now)."""
    if moment is None:
        return naive_now()
    if isinstance(moment, str):
        moment = parse_iso_utc(moment)
    return moment if moment.tzinfo is None else moment.astimezone(timezone.utc).replace(tzinfo=None)


def _decode(name: str, value: Any, enums: dict[str, type[Enum]]) -> tuple[str, Any]:
    if name.endswith("_json"):
        return name[:-5], None if value is None else json.loads(value)
    if isinstance(value, datetime):
        return name, as_utc(value)
    if isinstance(value, float) and math.isnan(value):
        return name, None
    return name, value if value is None or name not in enums else enums[name](value)


@functools.cache
def _enums(kind: type) -> dict[str, type[Enum]]:
    """The fields of record `kind` that hold an enum (`X` or `X | None`), with their enum."""
    return {name: t for name, hint in get_type_hints(kind).items() for t in (hint, *get_args(hint))
            if isinstance(t, type) and issubclass(t, Enum)}


def from_rows(kind: type[R], columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[R]:
    """Rows of a `SELECT *` (in table order) as records of `kind`; a column the record does not name
    is an error here, not a silently dropped field."""
    enums = _enums(kind)
    out = []
    for row in rows:
        fields = dict(_decode(name, value, enums) for name, value in zip(columns, row))
        out.append(kind(**fields))
    return out
