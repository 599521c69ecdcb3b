"""What the command line (and benches) start besides a run: the home's Dagster instance directory, the
broker check of a Celery deployment, and a what-if solved outside Dagster with a solver pool of its own
(started inside `solve_whatif`). No Dagster here (automation.py `run_partitions` launches the runs): the
CLI imports this module on start.
"""

import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from optimizer_pipeline.settings import Settings, dagster_home, load_settings

if TYPE_CHECKING:  # the ledger and the what-if pull in pandas and duckdb: imported by solve_whatif
    from optimizer_pipeline.contracts import StoredBinding
    from optimizer_pipeline.ledger import Ledger
    from optimizer_pipeline.whatif import Override, WhatIfSolve

class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


WRITTEN_BY = "# written by optimizer-pipeline from the home's settings; edit settings.yaml, not this file\n"


def prepare_dagster_home(home: Path) -> Path:
    """`<home>/dagster` (or $DAGSTER_HOME) with its dagster.yaml written from the settings
    (optimizer_pipeline/deployment.py: telemetry off; PostgreSQL storage, Celery runs when set);
    a dagster.yaml the user wrote (without our first line) is left alone. Exported for Dagster."""
    from optimizer_pipeline.deployment import dagster_yaml

    path = dagster_home(home)
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists() or config.read_text(encoding="utf-8").startswith(WRITTEN_BY):
        config.write_text(WRITTEN_BY + dagster_yaml(load_settings(home), path), encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(path)
    os.environ["OPTIMIZER_HOME"] = str(home)
    return path


def require_broker(settings: Any) -> None:
    """UserError when the Celery deployment's broker cannot be reached."""
    from optimizer_pipeline.deployment import broker_problem
    from optimizer_pipeline.settings import redact_url

    problem = broker_problem(settings.dagster_broker)
    if problem is not None:
        raise UserError(f"broker {redact_url(settings.dagster_broker)} cannot be reached ({problem}); start Redis "
                        f"or correct dagster.broker")


def solve_whatif(ledger: "Ledger", stored: "StoredBinding", overrides: Sequence["Override"], settings: Settings,
                 now: datetime, *, requested_by: str) -> "WhatIfSolve":
    """`whatif.solve_whatif` outside Dagster (the CLI): the split plant_history last recorded, the
    revision's model artifact and calibration from the ledger (MissingInputError names what to run
    first), and a solver pool of one worker, the same worker process and protocol as every solve,
    stopped after."""
    from optimizer_pipeline import pipeline, whatif
    from optimizer_pipeline.contracts import EvidenceSource, SolveResult
    from optimizer_pipeline.solver.shared import acquire  # the worker pool, started only here

    artifact = pipeline.load_artifact(ledger, stored)
    split, calibration = pipeline.load_split(ledger, stored), pipeline.load_calibration(ledger, artifact)
    source = ledger.sample_source(stored.spec.id) or EvidenceSource.REAL.value
    pool, owned = acquire(1, settings.solver_request_timeout_ms, settings.solver_threads,
                          settings.solver_cache_entries)
    try:
        return whatif.solve_whatif(stored, overrides, artifact, split, calibration,
                                   lambda problem: SolveResult.from_dict(pool.solve(problem)), ledger, settings,
                                   source, now, requested_by=requested_by)
    finally:
        if owned:
            pool.shutdown()
