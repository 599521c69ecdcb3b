"""Every private Dagster import of the code location, each with its reason and the version checked.

Checked on dagster 1.13.27 (pinned exactly in pyproject.toml). On an upgrade, run the tests in
tests/test_definitions.py and tests/test_batch_isolation.py: they exercise each name below.
"""

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


__all__ = ["ASSET_PARTITION_RANGE_END_TAG", "ASSET_PARTITION_RANGE_START_TAG", "check_target", "range_tags"]


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that make one run cover the binding partitions first..last."""
    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}
