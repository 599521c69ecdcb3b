"""The append-only ledger: one `Ledger` interface (the only code with SQL), typed records, backends."""

from optimizer_pipeline.contracts import StoredBinding  # a ledger read; defined with the binding vocabulary
from optimizer_pipeline.ledger.errors import LedgerBusyError, LedgerError, NotFoundError, RunStateError
from optimizer_pipeline.ledger.records import (
    BindingFailure,
    BindingUpsert,
    CalibrationRecord,
    CandidateRecord,
    HistorySplitRecord,
    NewRun,
    OutcomeRecord,
    RecommendationRecord,
    RunRecord,
    RunStatus,
    VerdictRecord,
    WhatIfRecord,
    candidate_id,
    new_id,
)
from optimizer_pipeline.ledger.exclusion_rows import ExclusionRecord
from optimizer_pipeline.ledger.live_rows import LivePublication, LiveService, Publication, Written
from optimizer_pipeline.ledger.overview_rows import BindingOverview
from optimizer_pipeline.ledger.repository import Ledger, open_ledger
from optimizer_pipeline.ledger.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "BindingFailure", "BindingOverview", "BindingUpsert", "CalibrationRecord",
           "CandidateRecord", "ExclusionRecord", "HistorySplitRecord", "Ledger", "LedgerBusyError", "LedgerError",
           "LivePublication", "LiveService", "NewRun", "NotFoundError", "OutcomeRecord", "Publication",
           "RecommendationRecord", "RunRecord", "RunStateError", "RunStatus", "StoredBinding", "VerdictRecord",
           "WhatIfRecord", "Written", "candidate_id", "new_id", "open_ledger"]
