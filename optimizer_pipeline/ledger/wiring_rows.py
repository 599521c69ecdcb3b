"""The bindings' OPC UA wiring in the ledger (a mixin of Ledger): append-only beside the revisions, a
row whenever a stored binding's wiring differs from its latest (docs/ARCHITECTURE.md, "Ledger rules").
Wiring, not model: storing it never makes a revision, and a binding read carries the binding's latest
wiring whatever revision it reads."""

from datetime import datetime
from typing import Any

from optimizer_pipeline.contracts import OpcUaWiring, wiring_from_json
from optimizer_pipeline.ledger.base import LedgerBase


class WiringRows(LedgerBase):
    """Part of Ledger."""

    def _store_wiring(self, tx: Any, binding_id: str, wiring: OpcUaWiring | None, now: datetime) -> bool:
        """Append `wiring` (None: the binding has none) when it differs from the binding's latest (a
        binding never stored with one has none); returns whether it did."""
        _, rows = self.backend.fetch(tx, """SELECT seq, wiring_json FROM binding_wiring WHERE binding_id = ?
                                            ORDER BY seq DESC LIMIT 1""", [binding_id])
        seq, latest = rows[0] if rows else (0, None)
        text = None if wiring is None else wiring.canonical_json()
        if text == latest:
            return False
        tx.execute("INSERT INTO binding_wiring VALUES (?, ?, ?, ?)", [binding_id, seq + 1, text, now])
        return True

    def _latest_wiring(self, conn: Any, binding_id: str) -> OpcUaWiring | None:
        _, rows = self.backend.fetch(conn, """SELECT wiring_json FROM binding_wiring WHERE binding_id = ?
                                              ORDER BY seq DESC LIMIT 1""", [binding_id])
        return None if not rows or rows[0][0] is None else wiring_from_json(rows[0][0])

    def _latest_wirings(self, conn: Any) -> dict[str, OpcUaWiring]:
        """The latest wiring of every binding that has one, by binding id."""
        _, rows = self.backend.fetch(conn, """SELECT binding_id, wiring_json FROM binding_wiring w
            WHERE seq = (SELECT max(seq) FROM binding_wiring WHERE binding_id = w.binding_id)
              AND wiring_json IS NOT NULL""")
        return {binding_id: wiring_from_json(text) for binding_id, text in rows}
