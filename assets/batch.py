"""How a step over many binding partitions reports to Dagster: one materialization per binding that
succeeded, one check evaluation per binding, and ledger sessions across bindings.

A run covers one binding partition (sensors) or a range of them (a refresh of every binding, a UI
backfill: `BackfillPolicy.single_run()`), and one step loops over `context.partition_keys`. The
values live in the ledger; the step yields no outputs. It logs an AssetMaterialization for each
(asset, binding) that completed, so a binding that failed is simply not materialized while the
others are (Dagster materializes every partition of a yielded output, which is why nothing is
yielded), and one AssetCheckEvaluation per partition (`conditions_check`) pointing at that
partition's materialization of the run's last stage. The materializations go to the instance in one
batch per asset (`compat.log_materializations`: two SQLite transactions each on the embedded home, not
two per event).
Measured (BENCHMARKS.md): ~1.8 s of Dagster per run, paid once per run, and ~0.04 s per binding.
"""

import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Generic, Iterable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from optimizer_pipeline import pipeline
from optimizer_pipeline.assets.compat import check_target, log_materializations
from optimizer_pipeline.contracts import (
    Calibration,
    Condition,
    HistorySplit,
    ModelArtifact,
    ProblemIR,
    Scores,
    SolveResult,
    StoredBinding,
)
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plots import FigureQueue
from optimizer_pipeline.settings import Settings

T = TypeVar("T")
# how long a step keeps the ledger's lock and connection across bindings before it lets other
# processes (sensors, the CLI, other steps) have a turn; opening + closing a connection costs ~20 ms
SESSION_HOLD_S = 1.0
CONDITIONS_CHECK = "conditions"  # a binding's one check (assets/bindings.py)


class Check(NamedTuple):
    """One evaluation of an asset's check on one binding partition."""

    asset: str
    binding_id: str
    name: str
    passed: bool
    metadata: Mapping[str, Any]
    severity: AssetCheckSeverity = AssetCheckSeverity.WARN


def conditions_table(conditions: Iterable[Condition]) -> MetadataValue:
    """Conditions as a table: whether each holds, the value it was judged on, its limit, its name, and
    for one that fails the reason it gives. The short columns first: a long name or reason pushes the
    columns after it out of a 1400 px window."""
    columns = [TableColumn("holds", "bool"), TableColumn("value", "string"), TableColumn("limit", "string"),
               TableColumn("condition", "string"), TableColumn("reason", "string")]
    return MetadataValue.table([TableRecord({"holds": c.holds, "value": c.value, "limit": c.limit,
                                             "condition": c.name, "reason": "" if c.holds else c.reason})
                                for c in conditions], schema=TableSchema(columns=columns))


def conditions_check(asset: str, binding_id: str, conditions: Sequence[Condition],
                     metadata: Mapping[str, Any]) -> Check:
    """The one check evaluation of a binding in a run (or a live publication): it passes when every
    condition judged holds (on the recommendation: every condition for `verified`), WARN naming the
    ones that do not, with the whole table in its metadata."""
    failed = [c for c in conditions if not c.holds]
    return Check(asset, binding_id, CONDITIONS_CHECK, not failed, {
        "failed": MetadataValue.json([c.name for c in failed]),
        "reasons": MetadataValue.json([c.reason for c in failed]),
        "conditions": conditions_table(conditions), **metadata})


def shown(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as Dagster shows it: a value given as a callable (a `plots.FigureQueue` entry) is
    waited for and shown as markdown."""
    return {k: MetadataValue.md(v()) if callable(v) else v for k, v in metadata.items()}


@dataclass
class StepReport:
    """What one step tells Dagster about its bindings, logged together at the end (`log_to`):
    materialization metadata per (asset, binding) and check evaluations. A metadata value given
    as a callable (a `plots.FigureQueue` entry) is waited for then and shown as markdown."""

    materialized: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def materialize(self, asset: str, binding_id: str, metadata: Mapping[str, Any]) -> None:
        self.materialized[(asset, binding_id)] = metadata

    def check(self, check: Check) -> None:
        self.checks.append(check)

    def log_to(self, context: AssetExecutionContext) -> None:
        log_materializations(context, [AssetMaterialization(asset_key=asset, partition=binding_id, metadata=shown(metadata))
                                       for (asset, binding_id), metadata in self.materialized.items()])
        targets = self._targets(context)
        for c in self.checks:
            context.log_event(AssetCheckEvaluation(
                asset_key=AssetKey(c.asset), check_name=c.name, passed=c.passed, metadata=dict(c.metadata),
                severity=c.severity, target_materialization_data=targets.get((c.asset, c.binding_id)),
                partition=c.binding_id))

    def _targets(self, context: AssetExecutionContext) -> dict[tuple[str, str], Any]:
        """The materialization of this run that each check evaluates, by (asset, binding)."""
        targets = {}
        for asset in sorted({c.asset for c in self.checks}):
            partitions = sorted({b for a, b in self.materialized if a == asset})
            if not partitions:
                continue
            records = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=partitions), limit=len(partitions)).records
            targets.update({(asset, r.partition_key): check_target(r) for r in records
                            if r.run_id == context.run.run_id})
        return targets


@contextmanager
def in_ledger_sessions(ledger: Ledger, items: Iterable[T], hold_s: float = SESSION_HOLD_S) -> Iterator[Iterator[T]]:
    """An iterator over `items` with a `ledger.session()` open around them: one connection for the
    ledger calls of several bindings instead of one per call, released after every `hold_s` seconds,
    or after a binding when another process waits for the ledger (which then has it first,
    Ledger.hand_over), so that the lock is never held for a whole 100-binding step. Leaving the `with`
    block (also by an exception) releases the session at once."""

    def sessions() -> Generator[T, None, None]:
        remaining = iter(items)
        for first in remaining:
            with ledger.session():
                started = time.monotonic()
                for item in itertools.chain([first], remaining):
                    yield item
                    if time.monotonic() - started > hold_s or ledger.others_waiting():
                        break
            ledger.hand_over(hold_s)

    iterator = sessions()
    try:
        yield iterator
    finally:
        iterator.close()


@dataclass
class StageEnv:
    """What every stage of a step shares: the ledger, the settings, the figure queue, the solve
    function (None unless the step solves) and the Dagster run it belongs to."""

    ledger: Ledger
    settings: Settings
    figures: FigureQueue
    solve: Callable[[ProblemIR], SolveResult] | None
    run_id: str


@dataclass
class BindingInputs:
    """The values of one binding's stages in this step, each the one an earlier stage of the same
    step produced (and wrote to the ledger; `assets.bindings.run_binding` sets it), else the one the
    ledger holds for the binding's revision, read when first asked for."""

    ledger: Ledger
    stored: StoredBinding
    history: HistorySplit | None = None  # plant_history
    model: ModelArtifact | None = None  # model_artifact
    block_scores: Scores | None = None  # uq_block_scores
    evidence: Calibration | None = None  # uq_calibration

    def split(self) -> HistorySplit:
        if self.history is None:
            self.history = pipeline.load_split(self.ledger, self.stored)
        return self.history

    def artifact(self) -> ModelArtifact:
        if self.model is None:
            self.model = pipeline.load_artifact(self.ledger, self.stored)
        return self.model

    def scores(self) -> Scores:
        if self.block_scores is None:
            self.block_scores = pipeline.load_scores(self.ledger, self.stored.spec, self.artifact(), self.split())
        return self.block_scores

    def calibration(self) -> Calibration:
        if self.evidence is None:
            self.evidence = pipeline.load_calibration(self.ledger, self.artifact())
        return self.evidence


class StageResult(NamedTuple, Generic[T]):
    """A stage's value (already in the ledger), its materialization metadata, the conditions it
    judged and what the binding's check shows beside them when this stage is the run's last."""

    value: T
    metadata: Mapping[str, Any]
    conditions: tuple[Condition, ...] = ()
    check_metadata: Mapping[str, Any] = {}
