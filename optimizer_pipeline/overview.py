"""The site overview: one line per binding with its latest status, how long ago that status was last
confirmed and its first reason, the bindings that need a look first. `optimizer-pipeline status`
prints it; the UI's `site_overview` asset shows it as a table (assets/overview.py)."""

from dataclasses import dataclass
from datetime import datetime

from optimizer_pipeline.ledger import BindingOverview
from optimizer_pipeline.recommendation_text import duration

NO_RECOMMENDATION = "none"
# Worst first: what cannot be acted on, then what may not be, then what is fine.
ORDER = ("rejected", "unverified", "expired", NO_RECOMMENDATION, "verified")


@dataclass(frozen=True)
class OverviewLine:
    """age_s: since the status was last confirmed (None without a recommendation); reason: the first
    reason, a failed stage newer than the recommendation, or "-" for a verified one without any."""

    binding_id: str
    revision: int
    status: str
    age_s: float | None
    reason: str
    recommendation_id: str | None

    @property
    def age(self) -> str:
        return "-" if self.age_s is None else duration(self.age_s)

    def to_json_dict(self) -> dict:
        return {"binding_id": self.binding_id, "revision": self.revision, "status": self.status,
                "age_s": self.age_s, "reason": self.reason, "recommendation_id": self.recommendation_id}


def overview_lines(rows: list[BindingOverview], now: datetime) -> list[OverviewLine]:
    """The ledger's overview rows as lines, worst status first, then by binding id."""
    lines = [OverviewLine(row.binding_id, row.revision, row.status or NO_RECOMMENDATION,
                          None if row.updated_at is None else max(0.0, (now - row.updated_at).total_seconds()),
                          _reason(row), row.recommendation_id) for row in rows]
    return sorted(lines, key=lambda line: (ORDER.index(line.status) if line.status in ORDER else 0, line.binding_id))


def _reason(row: BindingOverview) -> str:
    if row.failure:
        return f"the latest run failed at {row.failure}"
    if row.status is None:
        return "no recommendation yet"
    return row.first_reason or "-"


def counts(lines: list[OverviewLine]) -> str:
    """e.g. "4 bindings: 3 verified, 1 unverified" (statuses in ORDER)."""
    found = [status for status in ORDER if any(line.status == status for line in lines)]
    per_status = ", ".join(f"{sum(line.status == s for line in lines)} {s}" for s in found)
    return f"{len(lines)} binding{'s' if len(lines) != 1 else ''}" + (f": {per_status}" if per_status else "")


def overview_text(lines: list[OverviewLine], width: int | None = None) -> str:
    """The overview as a terminal table; with `width`, each line cut to it (the reason's end)."""
    id_width = max([len("binding"), *(len(line.binding_id) for line in lines)])
    header = f"{'binding':<{id_width}}  {'rev':>3}  {'status':<10}  {'age':>9}  reason"
    rows = [counts(lines), "", header, "-" * len(header)]
    for line in lines:
        text = f"{line.binding_id:<{id_width}}  {line.revision:>3}  {line.status:<10}  {line.age:>9}  {line.reason}"
        rows.append(text if width is None or len(text) <= width else text[:width - 1] + "…")
    return "\n".join(rows)
