"""The ledger's rows of what-if solves (a mixin of Ledger): a binding solved with overridden limits,
targets or costs, written as its run + candidates + one `whatif_runs` row in one transaction, and
never as a recommendation: it supersedes nothing, expires nothing and is never the binding's latest
recommendation (docs/ARCHITECTURE.md, "What-if solves")."""

from typing import Any, Mapping, Sequence

from optimizer_pipeline.contracts import SolveCandidate, canonical_json
from optimizer_pipeline.ledger.base import LedgerBase
from optimizer_pipeline.ledger.records import NewRun, WhatIfRecord, naive_now
from optimizer_pipeline.ledger.writes import retried

REQUESTERS = ("cli", "dagster")


class WhatIfRows(LedgerBase):
    """Part of Ledger."""

    @retried
    def record_whatif(self, run: NewRun, candidates: Sequence[SolveCandidate], model_id: str, *,
                      overrides: Sequence[Mapping[str, Any]], spec: Mapping[str, Any],
                      compared_recommendation_id: str | None, result: Mapping[str, Any], run_status: str,
                      independent_cost: float | None, diagnostics: Mapping[str, Any], requested_by: str,
                      dagster_run_id: str | None = None) -> str:
        """Run (with its end status) + candidates + the what-if row in ONE transaction; nothing of
        optimizer_recommendations (or open_recommendations) is read or written. Bad numbers in a
        candidate or a document are refused before any write."""
        if requested_by not in REQUESTERS:
            raise ValueError(f"requested_by must be one of {', '.join(REQUESTERS)}, got {requested_by!r}")
        write_run = self._run_write(run, candidates, model_id, run_status, independent_cost, diagnostics)
        texts = [canonical_json(list(overrides)), canonical_json(dict(spec)), canonical_json(dict(result))]
        with self.backend.transaction() as tx:
            run_id = write_run(tx)
            tx.execute("INSERT INTO whatif_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [run_id, run.binding_id, run.binding_revision, texts[0], texts[1],
                        compared_recommendation_id, texts[2], requested_by, dagster_run_id, naive_now()])
        return run_id

    def get_whatif(self, run_id: str) -> WhatIfRecord:
        return self._one(WhatIfRecord, "SELECT * FROM whatif_runs WHERE run_id = ?", [run_id],
                         missing=f"what-if run {run_id} is not in the ledger")

    def list_whatifs(self, binding_id: str | None = None, dagster_run_id: str | None = None) -> list[WhatIfRecord]:
        """What-if solves, oldest first (of one binding, or of one Dagster run)."""
        sql, params = "SELECT * FROM whatif_runs WHERE 1 = 1", []
        if binding_id is not None:
            sql += " AND binding_id = ?"
            params.append(binding_id)
        if dagster_run_id is not None:
            sql += " AND dagster_run_id = ?"
            params.append(dagster_run_id)
        return self._read(WhatIfRecord, sql + " ORDER BY created_at, run_id", params)
