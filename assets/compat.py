"""Every private Dagster import of the code location, each with its reason and the version checked.

Checked on dagster 1.13.27 (pinned exactly in pyproject.toml). On an upgrade, run the tests in
tests/test_definitions.py, tests/test_batch_isolation.py, tests/test_event_log.py and
tests/test_several_hosts.py: they exercise each name below.
"""

import os
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from dagster import AssetExecutionContext, AssetKey, AssetMaterialization

# Not exported by dagster 1.13: the public AssetCheckResult fills it in itself, but a check
# evaluation logged for one partition of a many-partition step must name the materialization it
# evaluates (its run, storage id and time), or the UI shows it as not targeting the latest one.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
# Not exported by dagster 1.13: what Dagster's own output handling uses to hand the materializations
# of one output over many partitions to the instance as one batch (log_materializations), and the
# event kinds `SqliteEventLogStorage.store_event` mirrors in the index database (BatchedSqliteEventLogStorage).
from dagster._core.events import (
    ASSET_CHECK_EVENTS,
    ASSET_EVENTS,
    DagsterEvent,
    DagsterEventBatchMetadata,
    generate_event_batch_id,
)
# Not exported by dagster 1.13: the entry an event log storage stores (BatchedSqliteEventLogStorage).
from dagster._core.events.log import EventLogEntry
# Not exported by dagster 1.13: the embedded home's event log, which BatchedSqliteEventLogStorage extends.
from dagster._core.storage.event_log import SqliteEventLogStorage
# Not exported by dagster 1.13: the result of one insert, as `SqliteEventLogStorage.store_event` reads it.
from dagster._core.storage.sqlalchemy_compat import db_result
# Not exported by dagster 1.13: where the default SQLite storage keeps an instance's event log, which
# BatchedSqliteEventLogStorage keeps using (a home keeps its history).
from dagster._core.storage.sqlite_storage import _event_logs_directory
# Not exported by dagster 1.13: the run tags that make one run cover a range of partitions of a
# dynamic partitions definition (what a UI backfill with "single run" sets).
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG


def check_target(record) -> AssetCheckEvaluationTargetMaterializationData:
    """The target of a check evaluation: the materialization `record` (an AssetRecord of this run)."""
    return AssetCheckEvaluationTargetMaterializationData(run_id=record.run_id, storage_id=record.storage_id,
                                                         timestamp=record.timestamp)


__all__ = ["ASSET_PARTITION_RANGE_END_TAG", "ASSET_PARTITION_RANGE_START_TAG", "BatchedSqliteEventLogStorage",
           "check_target", "job_submitter", "log_materializations", "range_tags"]

BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"
BATCH_SIZE = 1000  # events per write: 200 bindings' planned materializations in one pair of transactions


class BatchedSqliteEventLogStorage(SqliteEventLogStorage):
    """The embedded home's event log: Dagster's SQLite event log with a `store_event_batch` of one
    transaction per database (optimizer_pipeline/deployment.py; PostgreSQL homes keep
    dagster-postgres' storage).

    Dagster's SQLite event log connects and commits for every event, on the run's database and again
    on the index database for an asset event (~5-9 ms per event here). A run over many binding
    partitions starts with one "materialization planned" event per asset and partition (five per
    binding) and its step ends with one materialization per asset and partition
    (`log_materializations`); Dagster hands them over in batches when batch writing is on
    (`DAGSTER_EVENT_BATCH_SIZE` > 0), and the base class writes a batch one event at a time. Here a
    batch is written in two transactions, each event exactly as `store_event` writes it (its rows,
    tags and asset index), so the UI's partition status (failed / in progress needs one planned event
    per partition) is unchanged: tests/test_event_log.py compares the rows with the base class's.

    Creating it turns batch writing on for the process: Dagster reads the variable at every event,
    and every process that opens the home's instance (CLI, daemon, webserver, run) creates this
    storage first."""

    def __init__(self, base_dir: str, inst_data: Any = None):
        super().__init__(base_dir, inst_data=inst_data)
        os.environ.setdefault(BATCH_ENV, str(BATCH_SIZE))

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> "BatchedSqliteEventLogStorage":
        """`base_dir` is the instance's directory (as in `storage: sqlite: base_dir`): the events stay
        where Dagster's default SQLite storage keeps them, so a home keeps its history."""
        return cls(_event_logs_directory(config_value["base_dir"]), inst_data=inst_data)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        by_run: dict[str, list[EventLogEntry]] = {}
        for event in events:
            by_run.setdefault(event.run_id, []).append(event)
        for run_id, run_events in by_run.items():
            inserts = [(event, self.prepare_insert_event(event)) for event in run_events]
            with self.run_connection(run_id) as conn:
                for _, insert in inserts:
                    conn.execute(insert)
            with self.index_transaction() as conn:  # asset events mirrored in the index database
                for event, insert in inserts:
                    if event.dagster_event_type in ASSET_EVENTS:
                        with db_result(conn, insert) as result:
                            event_id = result.inserted_primary_key[0]
                        self._store_asset_event_tags(conn, [event], [event_id])
                        self._store_asset_event(conn, event, event_id)
            for event, insert in inserts:
                if event.dagster_event_type in ASSET_CHECK_EVENTS:
                    with self.index_connection() as conn, db_result(conn, insert) as result:
                        event_id = result.inserted_primary_key[0]
                    self.store_asset_check_event(event, event_id)


def log_materializations(context: AssetExecutionContext, materializations: Sequence[AssetMaterialization]) -> None:
    """`context.log_event` of each of `materializations`, handed to the instance one batch per asset, as
    Dagster hands over the materializations of one output over many partitions: on the embedded home
    one write per database and asset instead of one per materialization (BatchedSqliteEventLogStorage).
    Per asset, as Dagster's batches are: dagster-postgres' `store_event_batch` updates an asset's record
    from the last event of its batch only, should a process have batch writing on for such a home.

    Private: `log_event` takes no batch; this is its body (the event logged, and kept for the step's
    result) with the batch metadata of dagster._core.execution.plan.execute_step."""
    op_context = context.op_execution_context
    step_context = op_context.get_step_execution_context()
    by_asset: dict[AssetKey, list[AssetMaterialization]] = {}
    for materialization in materializations:
        by_asset.setdefault(materialization.asset_key, []).append(materialization)
    for batch_of_asset in by_asset.values():
        batch_id = generate_event_batch_id()
        for i, materialization in enumerate(batch_of_asset):
            batch = DagsterEventBatchMetadata(batch_id, i == len(batch_of_asset) - 1)
            event = DagsterEvent.asset_materialization(step_context, materialization, batch)
            op_context._events.append(event)  # noqa: SLF001


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that make one run cover the binding partitions first..last."""
    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}


@contextmanager
def job_submitter(instance: Any, module: str, job_name: str) -> Iterator[Any]:
    """`submit(run_id, tags)` for runs of `job_name` of the code location `module`: each created and
    submitted to `instance` (queued for the daemon) the way `dagster job launch` does it, with the
    code origin the daemon and the run workers load, but from one code server for every run of the
    submitter instead of a `dagster job launch` process (and its code server) per run.

    Private: dagster 1.13 has no public API that creates a run with its code origin from outside a
    sensor or the webserver (`DagsterGraphQLClient` needs a running webserver); this is the body of
    `dagster job launch` (dagster._cli.job.execute_launch_command), its workspace opened once."""
    from dagster import __version__
    from dagster._cli.job import _create_run
    from dagster._cli.workspace.cli_target import (
        WorkspaceOpts,
        get_code_location_from_workspace,
        get_remote_job_from_remote_repo,
        get_remote_repository_from_code_location,
        get_workspace_from_cli_opts,
    )

    with get_workspace_from_cli_opts(instance, __version__, WorkspaceOpts(module_name=(module,)),
                                     log_level="critical") as workspace:  # the code server says nothing on stdout
        location = get_code_location_from_workspace(workspace, None)
        repository = get_remote_repository_from_code_location(location, None)
        job = get_remote_job_from_remote_repo(repository, job_name)

        def submit(run_id: str, tags: Mapping[str, str]) -> None:
            run = _create_run(instance=instance, code_location=location, remote_repo=repository, remote_job=job,
                              run_config={}, tags=dict(tags), op_selection=None, run_id=run_id)
            instance.submit_run(run.run_id, workspace)

        yield submit
