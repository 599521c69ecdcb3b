"""How a binding asset handles many partitions in one run (issue 8: one run for a 100-binding refresh).

Every binding asset is a single-output `multi_asset` with `BackfillPolicy.single_run()`: a run covers
one binding partition (sensors) or a range of them (a refresh of every binding, a UI backfill), and
the asset function loops over `context.partition_keys`. Its value is a dict binding id -> value,
stored one file per partition by `resources.asset_store.BindingsIOManager`, so a later
one-partition run loads exactly the partitions it needs. Per binding, the UI metadata goes through
`context.add_asset_metadata(..., partition_key=...)` and the checks through `record_checks`
(one AssetCheckEvaluation per partition, linked to that partition's materialization in this run).
Measured (BENCHMARKS.md): ~1.5 s of Dagster per run (run storage, step events, IO), paid once per
run instead of once per binding: 100 bindings 186 s as 100 runs, 53 s as one.
"""

import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetOut,
    AssetRecordsFilter,
    BackfillPolicy,
    MetadataValue,
    PreviewWarning,
    multi_asset,
)
# not exported by dagster 1.13; the class AssetCheckResult itself fills in (pinned < 1.14 in pyproject)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from optimizer_pipeline.assets.partitions import BINDINGS
from optimizer_pipeline.ledger import Ledger

T = TypeVar("T")
# how long a step keeps the ledger's lock and connection across bindings before it lets other
# processes (sensors, the CLI, other steps) have a turn; opening + closing a connection costs ~20 ms
SESSION_HOLD_S = 1.0
_END = object()


class Check(NamedTuple):
    """One evaluation of a binding asset's check on one partition."""

    binding_id: str
    name: str
    passed: bool
    metadata: Mapping[str, Any]
    severity: AssetCheckSeverity = AssetCheckSeverity.WARN


def binding_asset(group_name: str, description: str, checks: Sequence[tuple[str, str]] = (),
                  deps: Iterable[str] = ()) -> Callable:
    """Decorator: a binding-partitioned asset named after the function, run for many partitions at
    once. `checks` are (name, description) of its per-partition checks; they are optional outputs
    (`can_subset`) because `record_checks` logs them per partition instead of yielding one result."""

    def decorate(fn: Callable):
        with warnings.catch_warnings():  # partitioned checks are "preview" in 1.13; measured to work (tests)
            warnings.simplefilter("ignore", PreviewWarning)
            specs = [AssetCheckSpec(name=name, asset=fn.__name__, description=text, partitions_def=BINDINGS)
                     for name, text in checks]
        return multi_asset(
            name=fn.__name__,
            outs={fn.__name__: AssetOut(group_name=group_name, description=description)},
            partitions_def=BINDINGS,
            backfill_policy=BackfillPolicy.single_run(),
            can_subset=True,
            deps=[AssetKey(d) for d in deps],
            check_specs=specs,
        )(fn)

    return decorate


@contextmanager
def in_ledger_sessions(ledger: Ledger, items: Iterable[T], hold_s: float = SESSION_HOLD_S) -> Iterator[Iterator[T]]:
    """An iterator over `items` with a `ledger.session()` open around them: one connection for the
    ledger calls of several bindings instead of one per call, released and re-taken after every
    `hold_s` seconds so that the lock is never held for a whole 100-binding step. Leaving the `with`
    block (also by an exception) releases the session at once."""

    def sessions() -> Iterator[T]:
        remaining = iter(items)
        item = next(remaining, _END)
        while item is not _END:
            with ledger.session():
                started = time.monotonic()
                while item is not _END:
                    yield item
                    item = next(remaining, _END)
                    if time.monotonic() - started > hold_s:
                        break

    iterator = sessions()
    try:
        yield iterator
    finally:
        iterator.close()


def add_partition_metadata(context: AssetExecutionContext, metadata: Mapping[str, Mapping[str, Any]]) -> None:
    """Attach each binding's metadata to its partition's materialization. A value given as a callable
    (a `plots.FigureQueue` entry) is waited for here and shown as markdown. Call before the Output."""
    for binding_id, values in metadata.items():
        context.add_asset_metadata({k: MetadataValue.md(v()) if callable(v) else v for k, v in values.items()},
                                   partition_key=binding_id)


def record_checks(context: AssetExecutionContext, asset: str, checks: Sequence[Check]) -> None:
    """Log each check's evaluation on its partition. Call after the asset's Output was yielded, so
    every partition's materialization of this run exists and each evaluation points at it."""
    key = AssetKey(asset)
    partitions = sorted({c.binding_id for c in checks})
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=len(partitions)).records
    targets = {r.partition_key: AssetCheckEvaluationTargetMaterializationData(
        run_id=r.run_id, storage_id=r.storage_id, timestamp=r.timestamp)
        for r in records if r.run_id == context.run.run_id}
    for c in checks:
        context.log_event(AssetCheckEvaluation(
            asset_key=key, check_name=c.name, passed=c.passed, metadata=dict(c.metadata), severity=c.severity,
            target_materialization_data=targets.get(c.binding_id), partition=c.binding_id))
