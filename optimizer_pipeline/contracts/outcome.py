"""Outcomes: what the plant did after a recommendation was applied, and the verdict on it."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class OutcomeVerdict(str, Enum):
    CONFIRMED = "confirmed"
    DEVIATED = "deviated"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Outcome:
    id: str
    recommendation_id: str
    binding_id: str
    applied_at: str
    observed: Mapping[str, Any]
    delta: Mapping[str, Any]
    verdict: OutcomeVerdict | None
    details: Mapping[str, Any] = field(default_factory=dict)
