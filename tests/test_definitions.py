"""The code location loads, validates and runs under Dagster's default multiprocess executor (issue 5)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from dagster import Definitions

from optimizer_pipeline.definitions import build_definitions
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

from pipeline_fixtures import seed_home

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_are_loadable_with_every_job_schedule_and_sensor(tmp_path):
    defs = build_definitions(tmp_path)
    Definitions.validate_loadable(defs)
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"recalibrate", "solve", "refresh", "outcomes"}
    assert defs.resolve_schedule_def("daily_recalibration").job_name == "recalibrate"
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


def test_partitions_materialize_at_once_under_the_multiprocess_executor(tmp_path):
    home, dagster_home = tmp_path / "home", tmp_path / "dagster"
    plants = [get_plant("heater"), get_plant("blend")]
    seed_home(home, plants)
    env = _env(home, dagster_home)
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions("bindings", [p.spec.id for p in plants])
    procs = [subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize", "-m",
                               "optimizer_pipeline.definitions", "--select", "*", "--partition", p.spec.id],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for p in plants]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
        assert "multiprocess" in log.lower() or "Launching subprocess" in log or "STEP_START" in log
    ledger = Ledger(ledger_path(home))
    for plant in plants:
        rec = ledger.latest_recommendation(plant.spec.id)
        assert rec is not None and rec["status"] == "verified", json.dumps(rec and rec["reasons"])
    assert {r["status"] for r in ledger.list_runs()} == {"succeeded"}
