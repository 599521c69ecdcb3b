"""One store of truth (issue 13): a batch over several bindings isolates a failing binding, the values
live in the ledger only, and a later one-binding run reads what a batch wrote from the ledger.

The three bindings are seeded once per module; each test runs on a copy of that home (a copied DuckDB
file is a real ledger; no Dagster folder yet: each test's commands make their own)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetKey, AssetRecordsFilter, DagsterInstance
from pipeline_fixtures import seed_one_unidentifiable

from optimizer_pipeline import cli
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import dagster_home, ledger_path

STAGES = ("plant_history", "model_artifact", "uq_block_scores", "uq_calibration", "recommendation")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    home = tmp_path_factory.mktemp("seeded") / "home"
    seed_one_unidentifiable(home)
    return home


@pytest.fixture
def home(tmp_path, monkeypatch, seeded):
    """Two good heater bindings and one whose history is a single short run (unidentifiable)."""
    for name in ("OPTIMIZER_HOME", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    shutil.copytree(seeded, home)
    yield home
    os.environ.pop("DAGSTER_HOME", None)
    os.environ.pop("OPTIMIZER_HOME", None)


def _materialized(instance: DagsterInstance, asset: str) -> set[str]:
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(asset)), limit=100).records
    return {r.partition_key for r in records}


def test_a_batch_with_one_unidentifiable_binding_gives_the_others_their_recommendations_and_ledger_shows_the_failure(
        home, capsys):
    """The batch, and then the `ledger` command on its home showing the failed binding's failure (one
    test: the batch is the expensive setup of both)."""
    code = cli.main(["--home", str(home), "materialize", "--all"])
    out, err = capsys.readouterr()

    assert code == cli.EXIT_USER_ERROR
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: materialize: 1 of 3 binding(s) failed: bad-c (plant_history: ")
    assert "good-a" not in lines[0] and "good-b" not in lines[0]
    printed = {doc["binding_id"]: doc for doc in json.loads(out)}
    assert printed["good-a"]["ok"] and printed["good-a"]["status"] == "verified"
    assert printed["good-b"]["ok"] and printed["good-b"]["recommendation_id"].startswith("rec-")
    assert not printed["bad-c"]["ok"] and printed["bad-c"]["recommendation_id"] is None
    assert "usable run" in printed["bad-c"]["error"]

    ledger = Ledger(ledger_path(home))
    assert ledger.latest_recommendation("good-a") is not None and ledger.latest_recommendation("good-b") is not None
    assert ledger.latest_recommendation("bad-c") is None
    # nothing partial for the failed binding: no split, artifact, calibration or run
    assert ledger.latest_split("bad-c", 1) is None and ledger.latest_artifact("bad-c", 1) is None
    assert ledger.latest_calibration("bad-c") is None and ledger.list_runs("bad-c") == []
    [failure] = ledger.list_failures("bad-c")
    assert (failure.stage, failure.binding_revision) == ("plant_history", 1)
    assert failure.message == printed["bad-c"]["error"].removeprefix("plant_history: ")
    assert ledger.list_failures("good-a") == []

    with DagsterInstance.from_config(str(dagster_home(home))) as instance:
        for stage in STAGES:
            assert _materialized(instance, stage) == {"good-a", "good-b"}, stage
        run = instance.get_run_by_id(failure.dagster_run_id)
        assert run is not None and run.is_failure
        evaluations = [e for e in instance.all_logs(run.run_id)
                       if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
        checks = {(e.dagster_event.event_specific_data.asset_key.to_user_string(),
                   e.dagster_event.event_specific_data.partition): e.dagster_event.event_specific_data
                  for e in evaluations if e.dagster_event.event_specific_data.check_name == "conditions"}
    # one evaluation per binding: on the stage that failed, else on the run's last stage
    assert len(evaluations) == 3 and set(checks) == {
        ("plant_history", "bad-c"), ("recommendation", "good-a"), ("recommendation", "good-b")}
    failed = checks[("plant_history", "bad-c")]
    assert not failed.passed and failed.severity == AssetCheckSeverity.ERROR
    assert failed.metadata["message"].value == failure.message
    for good in ("good-a", "good-b"):  # passes exactly when every condition for verified holds
        check = checks[("recommendation", good)]
        assert check.passed == (ledger.latest_recommendation(good).status == "verified")
        assert check.severity == AssetCheckSeverity.WARN and check.metadata["reasons"].value == list(
            ledger.latest_recommendation(good).reasons)

    # the ledger command shows the failure of a binding
    assert cli.main(["--home", str(home), "ledger", "--binding", "bad-c", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [failure] = doc["failures"]
    assert failure["binding_id"] == "bad-c" and failure["stage"] == "plant_history"
    assert "usable run" in failure["message"]
    assert cli.main(["--home", str(home), "ledger", "--binding", "bad-c"]) == 0
    assert "plant_history" in capsys.readouterr().out.split("failures (1)")[1]


def test_a_later_solve_run_reads_the_calibration_a_batch_wrote_from_the_ledger(home, capsys):
    assert cli.main(["--home", str(home), "materialize", "good-a", "good-b", "--job", "recalibrate"]) == 0
    ledger = Ledger(ledger_path(home))
    calibration = ledger.latest_calibration("good-a")
    artifact = ledger.latest_artifact("good-a", 1)
    capsys.readouterr()

    assert cli.main(["--home", str(home), "materialize", "good-a", "--job", "solve"]) == 0
    rec = ledger.latest_recommendation("good-a")
    assert rec.model_artifact_hash == artifact.artifact_hash
    [run] = ledger.list_runs("good-a")
    assert run.context["calibration_id"] == calibration.id
    # the solve run computed no calibration of its own
    assert [c.id for c in ledger.latest_calibrations() if c.binding_id == "good-a"] == [calibration.id]
    # no asset value was pickled anywhere under the home (the ledger is the one store)
    assert not [p for p in Path(dagster_home(home)).rglob("*") if p.is_file() and p.parent.name in STAGES]


def test_a_solve_without_a_calibration_in_the_ledger_fails_that_binding_naming_what_to_run(home, capsys):
    code = cli.main(["--home", str(home), "materialize", "good-a", "--job", "solve"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USER_ERROR
    assert "good-a (recommendation: binding good-a revision 1: no model artifact in the ledger" in err
    assert Ledger(ledger_path(home)).list_runs("good-a") == []
