"""The outcome asset of the binding partitions: observed vs predicted after applying recommendations."""

import numpy as np
from dagster import (
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    multi_asset,
)

from optimizer_pipeline import outcomes, plots
from optimizer_pipeline.assets.batch import StepReport
from optimizer_pipeline.assets.partitions import BINDINGS
from optimizer_pipeline.contracts import OutcomeVerdict, iso_utc
from optimizer_pipeline.ledger import OutcomeRecord
from optimizer_pipeline.resources.ledger import LedgerResource

OUTCOMES_GROUP = "outcomes"
RECENT_ROWS = 20  # outcomes listed in the UI table (newest first)


def _outcome_table(rows: list[OutcomeRecord]) -> MetadataValue:
    columns = [("outcome_id", "string"), ("recommendation_id", "string"), ("applied_at", "string"),
               ("verdict", "string"), ("hits", "int"), ("trials", "int"), ("inside_share", "float"),
               ("p_value", "float"), ("block_covered", "bool"), ("reason", "string")]
    records = [TableRecord({"outcome_id": r.id, "recommendation_id": r.recommendation_id,
                            "applied_at": iso_utc(r.applied_at), "verdict": r.verdict.value,
                            "hits": r.details.get("hits"), "trials": r.details.get("trials"),
                            "inside_share": r.details.get("inside_share"), "p_value": r.details.get("p_value"),
                            "block_covered": r.details.get("block_covered"),
                            "reason": r.details.get("verdict_reason")}) for r in rows]
    return MetadataValue.table(records, schema=TableSchema(columns=[TableColumn(n, t) for n, t in columns]))


def _delta_table(row: OutcomeRecord) -> MetadataValue:
    """Per step: observed, predicted, delta (engineering units) and inside-the-band per CV."""
    delta = row.delta
    tags = delta["cv_tags"]
    columns = [TableColumn("step", "int"), TableColumn("judged", "bool")] + [
        TableColumn(f"{kind}:{t}", "bool" if kind == "inside" else "float")
        for t in tags for kind in ("observed", "predicted", "delta", "inside")]
    records = [TableRecord({"step": step, "judged": judged, **{
        f"{kind}:{t}": delta[kind][k][j] for j, t in enumerate(tags) for kind in ("observed", "predicted", "delta", "inside")}})
        for k, (step, judged) in enumerate(zip(delta["steps"], delta["judged"]))]
    return MetadataValue.table(records, schema=TableSchema(columns=columns))


def _plot(row: OutcomeRecord) -> MetadataValue:
    """Predicted vs observed CVs of one outcome, with the reported band, against time since applied."""
    delta = row.delta
    tags = delta["cv_tags"]
    band = row.details.get("band") or {}
    t_s = np.asarray(delta["t"], float) - row.applied_at.timestamp()
    return MetadataValue.md(plots.figure_markdown(lambda: plots.outcome_figure(
        tags, t_s, np.asarray(delta["predicted"], float), np.asarray(delta["observed"], float),
        [band.get(t) for t in tags], title=f"{row.recommendation_id}: {row.verdict.value}"), "predicted vs observed"))


@multi_asset(name="outcome_stage", specs=[AssetSpec(
    "outcome_deltas", group_name=OUTCOMES_GROUP, partitions_def=BINDINGS, deps=["recommendation"], skippable=True,
    description="Applied recommendations vs what the plant did: deltas per CV and step, band hits, verdicts.")],
    can_subset=True, backfill_policy=BackfillPolicy.single_run())
def outcome_deltas(context: AssetExecutionContext, ledger: LedgerResource):
    store, report = ledger.ledger(), StepReport()
    for binding_id in context.partition_keys:
        written = outcomes.evaluate_pending(store, binding_id)
        if written:
            context.log.info(f"evaluated {len(written)} pending observation(s) of {binding_id}: "
                             + ", ".join(f"{o.id} {o.verdict.value}" for o in written))
        judged = [r for r in store.list_outcomes(binding_id) if r.verdict is not None]
        counts = {v.value: sum(r.verdict == v for r in judged) for v in OutcomeVerdict}
        newest = sorted(judged, key=lambda r: (r.applied_at, r.created_at, r.id), reverse=True)
        metadata = {**{f"verdicts_{k}": n for k, n in counts.items()}, "outcomes_evaluated_now": len(written),
                    "outcomes": _outcome_table(newest[:RECENT_ROWS])}
        if newest:
            metadata["latest_outcome_id"] = newest[0].id
            hits, trials = newest[0].details.get("hits"), newest[0].details.get("trials")
            if isinstance(hits, int) and isinstance(trials, int) and trials > 0:
                metadata["latest_hit_rate"] = hits / trials  # a plain number: the Plots tab trends it
            metadata["latest_deltas"] = _delta_table(newest[0])
            metadata["plot"] = _plot(newest[0])
        report.materialize("outcome_deltas", binding_id, metadata)
    report.log_to(context)
    return
    yield  # the materializations are logged per binding (assets.batch): nothing to store but the ledger
