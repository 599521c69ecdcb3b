"""What every part of the ledger stands on: `LedgerBase`, the base of `Ledger` and of each of its row
mixins (evidence_rows.py, live_rows.py, ...): the backend, the typed reads, and the write of a
finished run (its row and its candidates) that a solve and a what-if solve share."""

from dataclasses import replace
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence, overload

import pandas as pd

from optimizer_pipeline.contracts import ProblemIR, SolveCandidate, canonical_json
from optimizer_pipeline.ledger.candidates import candidate_table
from optimizer_pipeline.ledger.errors import NotFoundError
from optimizer_pipeline.ledger.records import NewRun, R, end_status, from_rows, naive, naive_now, new_id


class LedgerBase:
    """The backend (DuckDBBackend or PostgresBackend: the same interface) and the helpers the parts
    of Ledger share."""

    backend: Any
    # Ledger's (repository.py): record_solve's writes as a function of the transaction (LiveRows writes them)
    _solve_write: Callable[..., Callable[[Any], str]]

    def query(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Read-only SQL for tools and tests, as a DataFrame."""
        with self.backend.connection() as conn:
            return self.backend.fetch_frame(conn, sql, params)

    def _read(self, kind: type[R], sql: str, params: Sequence[Any] = ()) -> list[R]:
        """The rows of a `SELECT *` (or of the columns `kind` names, in its order) as records of `kind`."""
        with self.backend.connection() as conn:
            columns, rows = self.backend.fetch(conn, sql, params)
        return from_rows(kind, columns, rows)

    @overload
    def _one(self, kind: type[R], sql: str, params: Sequence[Any]) -> R | None: ...

    @overload
    def _one(self, kind: type[R], sql: str, params: Sequence[Any], missing: str) -> R: ...

    def _one(self, kind: type[R], sql: str, params: Sequence[Any], missing: str | None = None) -> R | None:
        """The first row as a record of `kind`; without one None, or NotFoundError(`missing`) when given."""
        rows = self._read(kind, sql, params)
        if not rows and missing is not None:
            raise NotFoundError(missing)
        return rows[0] if rows else None

    def _run_write(self, run: NewRun, candidates: Sequence[SolveCandidate], model_id: str,
                   run_status: str, independent_cost: float | None,
                   diagnostics: Mapping[str, Any]) -> Callable[[Any], str]:
        """The writes of a finished run (its row with its end status, then its candidates) as a function
        of the transaction to run them in (returns the run id); its input is checked first (an unknown
        end status or bad numbers refused before any write)."""
        run_status = end_status(run_status)
        run = replace(run, id=run.id or new_id("or"))
        table = candidate_table(run.id, candidates, model_id)
        diagnostics_json = canonical_json(diagnostics)

        def write(tx: Any) -> str:
            run_id = self._insert_run_row(tx, run, run_status, independent_cost, diagnostics_json, naive_now())
            self._insert_candidate_table(tx, table)
            return run_id

        return write

    @staticmethod
    def _insert_run_row(tx: Any, run: NewRun, status: str, independent_cost: float | None,
                        diagnostics_json: str | None, finished_at: datetime | None) -> str:
        run_id = run.id or new_id("or")
        tx.execute("INSERT INTO optimizer_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [run_id, run.binding_id, run.binding_revision, run.profile_id, run.profile_version,
                    run.problem_ir_hash, canonical_json(run.context), _problem_json(run.problem),
                    diagnostics_json, status, independent_cost, naive(run.started_at), finished_at])
        return run_id

    def _insert_candidate_table(self, tx: Any, table: Any) -> None:
        if table.num_rows:
            self.backend.insert_table(tx, "optimizer_candidates", table)


def _problem_json(problem: ProblemIR | Mapping[str, Any] | None) -> str | None:
    """A run's problem as stored: a ProblemIR's canonical JSON (the text its hash is of), or a mapping's."""
    if problem is None:
        return None
    return problem.canonical_json() if isinstance(problem, ProblemIR) else canonical_json(problem)
