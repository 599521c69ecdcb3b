"""The recommendation: its status and label, the conditions for `verified`, where the evidence came
from and what it said at decision time (docs/ARCHITECTURE.md, "Recommendation JSON")."""

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from optimizer_pipeline.contracts.binding import Template
from optimizer_pipeline.contracts.canonical import canonical_json


class RecommendationStatus(str, Enum):
    VERIFIED = "verified"
    UNVERIFIED = "unverified"
    REJECTED = "rejected"
    EXPIRED = "expired"

    @property
    def label(self) -> str:
        return _STATUS_LABELS[self]


_STATUS_LABELS = {
    RecommendationStatus.VERIFIED: "Verified: evidence supports acting on this plan",
    RecommendationStatus.UNVERIFIED: "Unverified: feasible plan, but the evidence is incomplete; review before acting",
    RecommendationStatus.REJECTED: "Rejected: no feasible plan; do not act",
    RecommendationStatus.EXPIRED: "Expired: superseded or out of date; do not act",
}


class EvidenceSource(str, Enum):
    SIMULATION = "simulation"
    REAL = "real"
    UNASSESSED = "unassessed"


@dataclass(frozen=True)
class Condition:
    """One condition for `verified`: the value it was judged on, its limit, whether it holds, and the
    user-facing reason listed in `reasons` when it does not."""

    name: str
    value: str
    limit: str
    holds: bool
    reason: str = ""


@dataclass(frozen=True)
class Recommendation:
    """The candidate chosen for action (docs/ARCHITECTURE.md, "Recommendation JSON")."""

    id: str
    binding_id: str
    binding_revision: int
    run_id: str
    candidate_id: str | None
    template: Template
    status: RecommendationStatus
    reasons: tuple[str, ...]
    created_at: str  # ISO 8601 UTC
    valid_until: str
    mv_tags: tuple[str, ...]
    cv_tags: tuple[str, ...]
    controls: tuple[tuple[float, ...], ...]
    predicted: tuple[tuple[float, ...], ...]
    band: tuple[float | None, ...]
    cost: float | None
    independent_cost: float | None
    problem_ir_hash: str
    model_artifact_hash: str
    evidence: Mapping[str, Any]
    # plan steps from step 0 for which `band` is a calibrated claim (a move plan's first min(P, N), a
    # steady target's settled row); beyond them the band is not evidence. None without evidence.
    band_steps: int | None = None

    @property
    def status_label(self) -> str:
        return self.status.label

    def to_json_dict(self) -> dict[str, Any]:
        doc = json.loads(canonical_json(self))
        doc["status_label"] = self.status_label
        return doc


@dataclass(frozen=True)
class EvidenceSnapshot:
    """What the calibration and the live state say at decision time."""

    source: str  # simulation | real (where the calibration data came from)
    has_evidence: bool
    uq: Mapping[str, Any] | None  # the UQ evidence document as stored
    uq_checks: tuple[Condition, ...]  # uq.gate_checks under the configured gate
    calibrated_at: str | None
    calibration_fresh: bool
    fresh_days: float
    input_distance: float | None
    live_sample_at: str | None = None  # ISO 8601 UTC of the live run's last sample; None = unknown
    live_age_s: float | None = None  # seconds from that sample to the decision; None = unknown (fails)
    live_max_age_s: float | None = None  # the limit applied (live.max_age_s or its default)
    # the live state's values by tag, engineering units: {"mvs": {tag: value}, "cvs": {...}}; None = unknown
    live_values: Mapping[str, Mapping[str, float | None]] | None = None
