"""The code location loads and validates (issue 5), and a partition range runs as one run under
Dagster's default multiprocess executor (issue 8). Several runs at once: tests/test_reliability_scaling.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, Definitions

from optimizer_pipeline import plots
from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.definitions import build_definitions
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_are_loadable_with_every_job_schedule_and_sensor(tmp_path):
    defs = build_definitions(tmp_path)
    Definitions.validate_loadable(defs)
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"recalibrate", "solve", "refresh", "outcomes"}
    assert defs.resolve_schedule_def("daily_recalibration").job_name == "refresh"  # recalibrate, then re-solve
    assert {defs.resolve_sensor_def(name).job_name for name in ("uq_freshness", "outcome_drift")} == {"refresh"}
    assert {s.name for s in defs.sensors} >= {"binding_changes", "uq_freshness", "recommendation_expiry",
                                               "outcome_drift"}
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys >= {"plant_history", "model_artifact", "uq_block_scores", "uq_calibration", "recommendation",
                    "outcome_deltas"}


def _env(home: Path, dagster_home: Path) -> dict:
    env = dict(os.environ, OPTIMIZER_HOME=str(home), DAGSTER_HOME=str(dagster_home))
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return env


def test_dagster_definitions_validate_passes_on_the_workspace(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env(tmp_path / "home", tmp_path / "dagster"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "All code locations passed validation" in proc.stdout + proc.stderr


@pytest.mark.timeout(400)  # the materialize command's 300 s, and the ingest and instance reads around it
def test_a_partition_range_runs_as_one_run_under_the_multiprocess_executor(tmp_path):
    """What a UI backfill of several bindings launches: one run over the range, each step its own
    process, the figures of >= 4 bindings drawn by spawned background processes of those steps."""
    plant = get_plant("heater")
    ledger = Ledger(ledger_path(tmp_path / "home"))
    ids = [f"heater-{i}" for i in range(plots.BACKGROUND_MIN_FIGURES)]
    for binding_id in ids:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), plant.history(1).frame,
                      "simulation")
    env = _env(tmp_path / "home", tmp_path / "dagster")
    with DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        instance.add_dynamic_partitions("bindings", ids)
    proc = subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m",
                           "optimizer_pipeline.definitions", "--select", "*",
                           "--partition-range", f"{ids[0]}...{ids[-1]}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [ledger.latest_recommendation(b).status for b in ids] == ["verified"] * len(ids)
    with DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        (run,) = instance.get_runs()
        for binding_id in ids:
            (record,) = instance.fetch_materializations(AssetRecordsFilter(
                asset_key=AssetKey("recommendation"), asset_partitions=[binding_id]), limit=1).records
            assert record.run_id == run.run_id
            assert record.asset_materialization.metadata["recommendation_id"].value == \
                ledger.latest_recommendation(binding_id).id
            assert plots.PNG_DATA_URI_PREFIX in record.asset_materialization.metadata["plot"].value
