"""The code location loads and validates (issue 5). Runs under Dagster's default multiprocess executor,
several at once: tests/test_reliability_scaling.py."""

import os
import subprocess
import sys
from pathlib import Path

from dagster import Definitions

from optimizer_pipeline.definitions import build_definitions

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
