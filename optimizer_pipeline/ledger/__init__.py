"""The append-only DuckDB ledger (the only module with SQL)."""

from optimizer_pipeline.ledger.schema import SCHEMA_VERSION
from optimizer_pipeline.ledger.store import (
    BindingUpsert,
    Ledger,
    LedgerBusyError,
    LedgerError,
    NotFoundError,
    RunStateError,
    StoredBinding,
    candidate_id,
    new_id,
)

__all__ = ["SCHEMA_VERSION", "BindingUpsert", "Ledger", "LedgerBusyError", "LedgerError", "NotFoundError",
           "RunStateError", "StoredBinding", "candidate_id", "new_id"]
