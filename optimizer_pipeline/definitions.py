"""The Dagster code location: assets, checks, resources, jobs, schedule and sensors wired for one home."""

import gc
import os
from pathlib import Path

from dagster import BackfillPolicy, Definitions, in_process_executor

from optimizer_pipeline.assets.bindings import binding_stages
from optimizer_pipeline.assets.outcomes import outcome_deltas
from optimizer_pipeline.assets.overview import SITE_OVERVIEW_SPEC
from optimizer_pipeline.automation import (
    binding_changes_sensor,
    history_inbox_sensor,
    live_service_sensor,
    new_samples_sensor,
    outcome_drift_sensor,
    outcomes_job,
    recalibrate_job,
    recalibration_schedule,
    recommendation_expiry_sensor,
    refresh_job,
    site_overview_sensor,
    solve_job,
    uq_freshness_sensor,
)
from optimizer_pipeline.resources.ledger import LedgerResource, SettingsResource
from optimizer_pipeline.resources.solver import SolverPoolResource, SolverResource
from optimizer_pipeline.settings import load_settings, resolve_home


def build_definitions(home: Path, solver: SolverResource | None = None) -> Definitions:
    """The code location of `home`. `solver` replaces the worker pool (tests pass the in-process fake
    when the worker process is not their subject)."""
    settings = load_settings(home)
    # several hosts: a refresh (UI backfill, `materialize`) spreads over the workers in runs of at
    # most dagster.max_partitions_per_run bindings; embedded: one run for the whole range
    policy = BackfillPolicy.multi_run(settings.dagster_max_partitions_per_run) \
        if settings.dagster_run_launcher == "celery" else BackfillPolicy.single_run()
    return Definitions(
        assets=[binding_stages.with_attributes(backfill_policy=policy), outcome_deltas, SITE_OVERVIEW_SPEC],
        resources={
            "ledger": LedgerResource(home=str(home)),
            "settings": SettingsResource(home=str(home)),
            "solver": solver or SolverPoolResource(pool_size=settings.solver_pool_size,
                                                   request_timeout_ms=settings.solver_request_timeout_ms,
                                                   threads=settings.solver_threads,
                                                   cache_entries=settings.solver_cache_entries),
        },
        jobs=[recalibrate_job, solve_job, refresh_job, outcomes_job],
        # every job is one step: run it in the run's own process (a Celery worker, the default run
        # launcher's run process), not in a step subprocess that imports and loads everything again
        executor=in_process_executor,
        schedules=[recalibration_schedule(settings)],
        sensors=[binding_changes_sensor(), history_inbox_sensor(), new_samples_sensor(), uq_freshness_sensor(),
                 recommendation_expiry_sensor(), outcome_drift_sensor(), live_service_sensor(),
                 site_overview_sensor()],
    )


defs = build_definitions(resolve_home(os.environ.get("OPTIMIZER_HOME")))
# Every process that loads the code location (a run, the daemon, the UI's code server, a CLI command)
# keeps what the imports allocated until it ends: moved out of the collector's reach, it is not
# scanned again by each full collection nor at exit (about 1 s of a command's 5-6 s on one core)
gc.freeze()
