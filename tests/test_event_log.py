"""The embedded home's event log (assets/compat.py `BatchedSqliteEventLogStorage`) writes a batch of
events in one transaction per database and leaves exactly the rows Dagster's own SQLite event log
leaves writing them one by one, so the UI's partition status (materialized, failed) is the same."""

import itertools
import os
import sqlite3
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from dagster._core.events import BATCH_WRITABLE_EVENTS
from dagster._core.storage.event_log import SqliteEventLogStorage
from pipeline_fixtures import seed_one_unidentifiable

from optimizer_pipeline import cli
from optimizer_pipeline.assets.compat import BATCH_ENV, BatchedSqliteEventLogStorage
from optimizer_pipeline.settings import dagster_home

STAGES = ("plant_history", "model_artifact", "uq_block_scores", "uq_calibration", "recommendation")
TABLES = ("event_logs", "asset_keys", "asset_event_tags", "asset_check_executions")


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory):
    """A home after `materialize --all` over two good bindings and one that fails its first stage."""
    saved = {name: os.environ.pop(name, None) for name in ("OPTIMIZER_HOME", "DAGSTER_HOME", BATCH_ENV)}
    home = tmp_path_factory.mktemp("event-log") / "home"
    seed_one_unidentifiable(home)
    assert cli.main(["--home", str(home), "materialize", "--all"]) == cli.EXIT_USER_ERROR
    yield home
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def test_the_home_writes_through_the_batched_storage_with_batching_on(refreshed, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # an instance opened from its directory alone
    with DagsterInstance.from_config(str(dagster_home(refreshed))) as instance:
        assert isinstance(instance.event_log_storage, BatchedSqliteEventLogStorage)
        assert Path(instance.event_log_storage._base_dir) == dagster_home(refreshed) / "history" / "runs"
    assert int(os.environ[BATCH_ENV]) > 1


def test_a_failed_binding_is_a_failed_partition_of_every_stage_and_the_others_materialized(refreshed):
    with DagsterInstance.from_config(str(dagster_home(refreshed))) as instance:
        [run] = instance.get_runs()
        assert run.is_failure
        for stage in STAGES:
            storage = instance.event_log_storage
            attempts = storage.get_latest_asset_partition_materialization_attempts_without_materializations(
                AssetKey(stage))
            assert set(attempts) == {"bad-c"} and attempts["bad-c"][0] == run.run_id, stage  # failed in the UI
            assert instance.get_materialized_partitions(AssetKey(stage)) == {"good-a", "good-b"}, stage


def test_batched_writes_leave_the_rows_of_writing_one_by_one(refreshed, tmp_path):
    """Every event of the run replayed into Dagster's storage one by one and into ours in the
    batches Dagster hands over (consecutive batch-writable events of one type): same rows."""
    with DagsterInstance.from_config(str(dagster_home(refreshed))) as instance:
        [run] = instance.get_runs()
        events = instance.all_logs(run.run_id)
    one_by_one = SqliteEventLogStorage(str(tmp_path / "one"))
    batched = BatchedSqliteEventLogStorage(str(tmp_path / "batched"))
    batches = 0
    for event_type, group in itertools.groupby(events, key=lambda e: e.dagster_event_type):
        group = list(group)
        for event in group:
            one_by_one.store_event(event)
        if event_type in BATCH_WRITABLE_EVENTS and len(group) > 1:
            batched.store_event_batch(group)
            batches += 1
        else:
            for event in group:
                batched.store_event(event)
    assert batches >= 2  # the planned materializations and the step's materializations
    for database in (f"{run.run_id}.db", "index.db"):
        for table in TABLES:
            assert _rows(tmp_path / "batched" / database, table) == _rows(tmp_path / "one" / database, table), \
                (database, table)
    index_events = [row for row in _rows(tmp_path / "one" / "index.db", "event_logs")]  # the comparison saw rows:
    assert sum("ASSET_MATERIALIZATION_PLANNED" in str(row) for row in index_events) == 5 * 3  # 5 stages x 3 bindings
    assert len(_rows(tmp_path / "one" / "index.db", "asset_keys")) == 5


def _rows(database: Path, table: str) -> list[tuple]:
    """The rows of `table`, without the columns the database fills with the time of the write."""
    with sqlite3.connect(database) as conn:
        columns = [name for _, name, _, _, default, _ in conn.execute(f"PRAGMA table_info({table})")
                   if "CURRENT_TIMESTAMP" not in str(default).upper()]
        if not columns:
            return []
        return conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1").fetchall()  # noqa: S608


def test_the_step_hands_its_materializations_over_one_batch_per_asset(tmp_path, monkeypatch):
    """As Dagster batches one output's partitions: a batch never mixes assets (dagster-postgres updates an
    asset's record from the last event of a batch), and each ends with its end mark."""
    from dagster import DagsterEventType

    seen = []
    handle = DagsterInstance.handle_new_event

    def spy(self, event, *, batch_metadata=None):
        if event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION:
            seen.append((event.dagster_event.asset_key, batch_metadata))
        return handle(self, event, batch_metadata=batch_metadata)

    monkeypatch.setattr(DagsterInstance, "handle_new_event", spy)
    for name in ("OPTIMIZER_HOME", "DAGSTER_HOME"):  # set by the CLI: unset again after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    seed_one_unidentifiable(tmp_path / "home")
    assert cli.main(["--home", str(tmp_path / "home"), "materialize", "--all"]) == cli.EXIT_USER_ERROR
    batches: dict[str, list] = {}
    for asset_key, batch in seen:
        assert batch is not None
        batches.setdefault(batch.id, []).append((asset_key, batch.is_end))
    assert len(seen) == 5 * 2 and len(batches) == 5  # 5 stages x the 2 good bindings, one batch per stage
    for events in batches.values():
        assert len({key for key, _ in events}) == 1
        assert [end for _, end in events] == [False] * (len(events) - 1) + [True]
