"""The Dagster code location: assets, checks, resources, jobs, schedule and sensors wired for one home."""

import os
from pathlib import Path

from dagster import Definitions, load_assets_from_modules

from optimizer_pipeline.assets import calibration as calibration_assets
from optimizer_pipeline.assets import outcomes as outcome_assets
from optimizer_pipeline.assets import recommendation as recommendation_assets
from optimizer_pipeline.assets.outcomes import OUTCOMES_GROUP
from optimizer_pipeline.assets.partitions import CALIBRATION_GROUP, RECOMMENDATION_GROUP
from optimizer_pipeline.automation import (
    binding_changes_sensor,
    outcome_drift_sensor,
    outcomes_job,
    recalibrate_job,
    recalibration_schedule,
    recommendation_expiry_sensor,
    refresh_job,
    solve_job,
    uq_freshness_sensor,
)
from optimizer_pipeline.settings import load_settings, resolve_home
from optimizer_pipeline.resources.asset_store import BindingsIOManager
from optimizer_pipeline.resources.ledger import LedgerResource
from optimizer_pipeline.resources.plant_store import PlantStoreResource
from optimizer_pipeline.resources.solver import SolverPoolResource


def build_definitions(home: Path) -> Definitions:
    settings = load_settings(home)
    return Definitions(
        assets=[*load_assets_from_modules([calibration_assets], group_name=CALIBRATION_GROUP),
                *load_assets_from_modules([recommendation_assets], group_name=RECOMMENDATION_GROUP),
                *load_assets_from_modules([outcome_assets], group_name=OUTCOMES_GROUP)],
        resources={
            "io_manager": BindingsIOManager(),
            "ledger": LedgerResource(home=str(home)),
            "plant_store": PlantStoreResource(home=str(home)),
            "solver": SolverPoolResource(pool_size=settings.solver_pool_size,
                                         request_timeout_ms=settings.solver_request_timeout_ms,
                                         threads=settings.solver_threads),
        },
        jobs=[recalibrate_job, solve_job, refresh_job, outcomes_job],
        schedules=[recalibration_schedule(settings)],
        sensors=[binding_changes_sensor(), uq_freshness_sensor(), recommendation_expiry_sensor(),
                 outcome_drift_sensor()],
    )


defs = build_definitions(resolve_home(os.environ.get("OPTIMIZER_HOME")))
