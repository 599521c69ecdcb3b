"""Slices of a binding's history excluded by hand (a mixin of Ledger): append-only, an exclusion and,
later, perhaps a row revoking it (docs/ARCHITECTURE.md, "Flagged samples")."""

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

from optimizer_pipeline.contracts import Exclusion
from optimizer_pipeline.ledger.base import LedgerBase
from optimizer_pipeline.ledger.errors import LedgerError, NotFoundError
from optimizer_pipeline.ledger.records import _Record, naive_now, new_id
from optimizer_pipeline.ledger.writes import retried


@dataclass(frozen=True)
class ExclusionRecord(_Record):
    """One row of the exclusions table as `ledger` lists it: an exclusion (revokes None; `revoked_by`
    the row that withdrew it, if any) or a revocation (revokes: the exclusion it withdraws)."""

    exclusion_id: str
    binding_id: str
    start_s: float | None
    end_s: float | None
    tags: tuple[str, ...]
    reason: str
    revokes: str | None
    revoked_by: str | None
    created_at: datetime

    def to_json_dict(self) -> dict[str, Any]:
        # created_at as `ledger --json` has always written it: str() of the datetime (a space, not a T)
        return asdict(self)


class ExclusionRows(LedgerBase):
    """Part of Ledger."""

    @retried
    def record_exclusion(self, binding_id: str, start_s: float, end_s: float, tags: Sequence[str], reason: str) -> str:
        """Append an exclusion of binding_id's samples start_s <= t < end_s of `tags` (empty: every tag);
        the caller checked them (optimizer_pipeline/exclusions.py). Returns its id."""
        exclusion_id = new_id("ex")
        with self.backend.transaction() as tx:
            tx.execute("INSERT INTO exclusions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [exclusion_id, binding_id, float(start_s), float(end_s), json.dumps(list(tags)), reason, None,
                        naive_now()])
        return exclusion_id

    @retried
    def revoke_exclusion(self, binding_id: str, exclusion_id: str, reason: str) -> str:
        """Append a row withdrawing `exclusion_id` (an exclusion of binding_id in force); returns its id.
        NotFoundError / LedgerError naming the id otherwise."""
        with self.backend.transaction() as tx:
            self.backend.lock_binding(tx, binding_id)
            _, rows = self.backend.fetch(tx, "SELECT revokes FROM exclusions WHERE exclusion_id = ? AND binding_id = ?",
                                         [exclusion_id, binding_id])
            if not rows or rows[0][0] is not None:
                raise NotFoundError(f"binding {binding_id}: no exclusion {exclusion_id!r} (`optimizer-pipeline "
                                    f"ledger --binding {binding_id}` lists them)")
            _, done = self.backend.fetch(tx, "SELECT exclusion_id FROM exclusions WHERE revokes = ?", [exclusion_id])
            if done:
                raise LedgerError(f"binding {binding_id}: exclusion {exclusion_id} was revoked already by {done[0][0]}")
            revocation = new_id("ex")
            tx.execute("INSERT INTO exclusions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [revocation, binding_id, None, None, None, reason, exclusion_id, naive_now()])
        return revocation

    def exclusions(self, binding_id: str) -> list[Exclusion]:
        """The binding's exclusions in force (not revoked), oldest first."""
        return [Exclusion(r.exclusion_id, r.binding_id, r.start_s, r.end_s, r.tags, r.reason)
                for r in self.list_exclusions(binding_id) if r.revokes is None and r.revoked_by is None]

    def all_exclusions(self, binding_id: str) -> list[Exclusion]:
        """The binding's exclusions, revoked or not (a recorded split names those it applied), oldest first."""
        return [Exclusion(r.exclusion_id, r.binding_id, r.start_s, r.end_s, r.tags, r.reason)
                for r in self.list_exclusions(binding_id) if r.revokes is None]

    def list_exclusions(self, binding_id: str | None = None) -> list[ExclusionRecord]:
        """Every exclusion and revocation (of one binding), oldest first."""
        where, params = ("WHERE e.binding_id = ?", [binding_id]) if binding_id else ("", [])
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, f"""
                SELECT e.exclusion_id, e.binding_id, e.start_ts, e.end_ts, e.tags_json, e.reason, e.revokes,
                       r.exclusion_id, e.created_at
                FROM exclusions e LEFT JOIN exclusions r ON r.revokes = e.exclusion_id
                {where} ORDER BY e.created_at, e.exclusion_id""", params)
        return [_record(row) for row in rows]


def _record(row: Sequence[Any]) -> ExclusionRecord:
    exclusion_id, binding_id, start, end, tags, reason, revokes, revoked_by, created = row
    return ExclusionRecord(exclusion_id, binding_id, start, end, tuple(json.loads(tags)) if tags else (), reason,
                           revokes, revoked_by, created.replace(tzinfo=timezone.utc))
