"""The site overview read (a mixin of Ledger): every binding's current revision with its latest
recommendation, its newest live publication and its newest stage failure, in one query."""

import json
from dataclasses import asdict, dataclass
from datetime import datetime

from optimizer_pipeline.contracts import as_utc
from optimizer_pipeline.ledger.base import LedgerBase


@dataclass(frozen=True)
class BindingOverview:
    """One binding as the site overview shows it; times are aware UTC datetimes.

    status / first_reason / recommendation_*: of the binding's latest recommendation (None without
    one; first_reason None when it has no reason, i.e. verified). updated_at: when that status was
    last confirmed — the recommendation's creation or the live service's newest publication after
    it. failure: the newest failed stage ("stage: message") when it is newer than the recommendation.
    """

    binding_id: str
    revision: int
    status: str | None
    first_reason: str | None
    recommendation_id: str | None
    recommendation_revision: int | None
    updated_at: datetime | None
    failure: str | None

    def to_json_dict(self) -> dict:
        doc = asdict(self)
        doc["updated_at"] = self.updated_at and self.updated_at.isoformat()
        return doc


class OverviewRows(LedgerBase):
    """Part of Ledger."""

    def site_overview(self) -> list[BindingOverview]:
        """Every binding, by id (see BindingOverview)."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, """
            WITH current_revision AS (
                SELECT binding_id, max(revision) AS revision FROM binding_revisions GROUP BY binding_id),
            latest AS (
                SELECT binding_id, id, binding_revision, status, reasons_json, expired_reason, created_at,
                       row_number() OVER (PARTITION BY binding_id ORDER BY created_at DESC, id DESC) AS n
                FROM optimizer_recommendations),
            live AS (
                SELECT binding_id, max(published_at) AS published_at FROM live_publications GROUP BY binding_id),
            failure AS (
                SELECT binding_id, stage, message, created_at,
                       row_number() OVER (PARTITION BY binding_id ORDER BY created_at DESC, id DESC) AS n
                FROM binding_failures)
            SELECT c.binding_id, c.revision, l.id, l.binding_revision, l.status, l.reasons_json, l.expired_reason,
                   l.created_at, v.published_at, f.stage, f.message, f.created_at
            FROM current_revision c
            LEFT JOIN latest l ON l.binding_id = c.binding_id AND l.n = 1
            LEFT JOIN live v ON v.binding_id = c.binding_id
            LEFT JOIN failure f ON f.binding_id = c.binding_id AND f.n = 1
            ORDER BY c.binding_id""")
        return [_overview(*row) for row in rows]


def _overview(binding_id, revision, rec_id, rec_revision, status, reasons_json, expired_reason, created_at,
              published_at, stage, message, failed_at) -> BindingOverview:
    reasons = json.loads(reasons_json) if reasons_json else []
    first = expired_reason if status == "expired" and expired_reason else (reasons[0] if reasons else None)
    updated = max((t for t in (created_at, published_at) if t is not None), default=None)
    newer_failure = failed_at is not None and (created_at is None or failed_at > created_at)
    return BindingOverview(binding_id, int(revision), status, first, rec_id,
                           None if rec_revision is None else int(rec_revision),
                           None if updated is None else as_utc(updated),
                           f"{stage}: {message}" if newer_failure else None)

