"""Every private Dagster import of the code location, each with its reason and the version checked.

Checked on dagster 1.13.27 (pinned exactly in pyproject.toml). On an upgrade, run the tests in
tests/test_definitions.py, tests/test_batch_isolation.py and tests/test_several_hosts.py: they
exercise each name below.
"""

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

# Not exported by dagster 1.13: the public AssetCheckResult fills it in itself, but a check
# evaluation logged for one partition of a many-partition step must name the materialization it
# evaluates (its run, storage id and time), or the UI shows it as not targeting the latest one.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
# Not exported by dagster 1.13: the run tags that make one run cover a range of partitions of a
# dynamic partitions definition (what a UI backfill with "single run" sets).
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG


def check_target(record) -> AssetCheckEvaluationTargetMaterializationData:
    """The target of a check evaluation: the materialization `record` (an AssetRecord of this run)."""
    return AssetCheckEvaluationTargetMaterializationData(run_id=record.run_id, storage_id=record.storage_id,
                                                         timestamp=record.timestamp)


__all__ = ["ASSET_PARTITION_RANGE_END_TAG", "ASSET_PARTITION_RANGE_START_TAG", "check_target", "job_submitter",
           "range_tags"]


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
