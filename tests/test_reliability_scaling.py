"""Several Dagster runs at once on one host (issue 9, "past one machine", docs/SCALING.md): two
`dagster asset materialize` processes under the default multiprocess executor, both for the same
partition, leave exactly one open recommendation and no run left running. (N processes released
together on one binding, on both ledger backends: tests/test_ledger_race.py.)
(Here the upstream assets
are materialized once in process and the concurrent runs select `recommendation`, the step that
writes the ledger, so the test stays a few seconds per run on two cores.)
"""

import os
import subprocess
import sys
import pytest

from collections import Counter

from dagster import DagsterInstance

from optimizer_pipeline.definitions import build_definitions
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

from pipeline_fixtures import seed_home
from reliability_helpers import check_ledger_whole

OPEN = {"verified", "unverified", "rejected"}


@pytest.mark.timeout(900)  # two Dagster CLI processes at once: minutes on a loaded 2-core box
def test_two_concurrent_runs_of_one_partition_leave_one_open_recommendation(tmp_path):
    home, dagster_home = tmp_path / "home", tmp_path / "dagster"
    plants = [get_plant("heater")]
    seed_home(home, plants)
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions("bindings", [p.spec.id for p in plants])
        job = build_definitions(home).resolve_job_def("refresh")
        for plant in plants:  # the upstream stages land in the ledger, read by the runs below
            assert job.execute_in_process(partition_key=plant.spec.id, instance=instance).success
    env = dict(os.environ, OPTIMIZER_HOME=str(home), DAGSTER_HOME=str(dagster_home))
    partitions = ["heater-1", "heater-1"]
    procs = [subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize", "-m",
                               "optimizer_pipeline.definitions", "--select", "recommendation", "--partition", key],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for key in partitions]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    ledger = Ledger(ledger_path(home))
    runs = ledger.list_runs()
    assert Counter(r.binding_id for r in runs) == Counter(partitions) + Counter(p.spec.id for p in plants)
    assert {r.status for r in runs} == {"succeeded"}
    recs = ledger.list_recommendations()
    open_per_binding = Counter(r.binding_id for r in recs if r.status in OPEN)
    assert open_per_binding == {"heater-1": 1}
    superseded = [r for r in recs if r.binding_id == "heater-1" and r.status == "expired"]
    assert len(superseded) == 2 and all(r.expired_reason.startswith("superseded by ") for r in superseded)
    assert check_ledger_whole(ledger, [r.id for r in runs], candidates_per_run=None) == len(runs)
