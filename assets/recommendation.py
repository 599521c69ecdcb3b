"""The recommendation of one binding partition: compile, solve in the worker pool, verify, decide, record."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MetadataValue,
    Output,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from assets.partitions import BINDINGS, RECOMMENDATION_GROUP
from optimizer_pipeline import pipeline, plots
from optimizer_pipeline.contracts import (
    BindingSpec,
    Condition,
    HistorySplit,
    ModelArtifact,
    Recommendation,
    SolveCandidate,
    SolveResult,
    utc_now,
)
from resources.ledger import LedgerResource
from resources.plant_store import PlantStoreResource
from resources.solver import SolverPoolResource


def _plan_table(rec) -> MetadataValue:
    """One row per step: MV values held during the step and predicted CVs at its end (engineering units)."""
    columns = [TableColumn("step", "int")] + [TableColumn(f"mv:{t}", "float") for t in rec.mv_tags] + \
              [TableColumn(f"cv:{t}", "float") for t in rec.cv_tags]
    rows = [TableRecord({"step": k, **{f"mv:{t}": float(u) for t, u in zip(rec.mv_tags, controls)},
                         **{f"cv:{t}": float(y) for t, y in zip(rec.cv_tags, predicted)}})
            for k, (controls, predicted) in enumerate(zip(rec.controls, rec.predicted))]
    return MetadataValue.table(rows, schema=TableSchema(columns=columns))


def plan_plot(spec: BindingSpec, split: HistorySplit, rec: Recommendation, model_horizon: int) -> str:
    """Markdown: the last HISTORY_HORIZONS * P samples of the live run and the plan with its band."""
    n_history = plots.HISTORY_HORIZONS * model_horizon
    return plots.figure_markdown(
        lambda: plots.recommendation_figure(plots.plan_series(spec, split.live, rec, n_history)),
        f"{spec.id}: {rec.status.value} plan")


def _candidates_table(candidates: tuple[SolveCandidate, ...]) -> MetadataValue:
    """Every candidate with its solver and independent costs (normalised units) and verdicts."""
    columns = [TableColumn("seq", "int"), TableColumn("kind", "string"), TableColumn("solver_status", "string"),
               TableColumn("cost", "float"), TableColumn("independent_cost", "float"), TableColumn("feasible", "bool"),
               TableColumn("verified", "bool")]
    return MetadataValue.table(
        [TableRecord({"seq": c.seq, "kind": c.kind.value, "solver_status": c.solver_status, "cost": c.cost,
                      "independent_cost": c.independent_cost, "feasible": c.feasible, "verified": c.verified})
         for c in candidates], schema=TableSchema(columns=columns))


def _conditions_table(conditions: tuple[Condition, ...]) -> MetadataValue:
    """Every condition for `verified` with the value it was judged on, its limit and whether it holds."""
    columns = [TableColumn("condition", "string"), TableColumn("value", "string"), TableColumn("limit", "string"),
               TableColumn("holds", "bool")]
    return MetadataValue.table([TableRecord({"condition": c.name, "value": c.value, "limit": c.limit,
                                             "holds": c.holds}) for c in conditions],
                               schema=TableSchema(columns=columns))


@asset(partitions_def=BINDINGS, group_name=RECOMMENDATION_GROUP,
       check_specs=[AssetCheckSpec(name="candidate_verified", asset="recommendation",
                                   description="The chosen candidate is feasible and its independent cost agrees")],
       description="Move plan (or steady-state targets) with status verified / unverified / rejected and its evidence.")
def recommendation(context: AssetExecutionContext, model_artifact: ModelArtifact, plant_history: HistorySplit,
                   uq_calibration: pipeline.Calibration, ledger: LedgerResource, plant_store: PlantStoreResource,
                   solver: SolverPoolResource):
    store, settings = ledger.ledger(), ledger.settings()
    stored = plant_store.binding(context.partition_key)
    record = pipeline.recommend(stored, model_artifact, plant_history, uq_calibration,
                                lambda problem: SolveResult.from_dict(solver.solve(problem)),
                                store, settings, plant_store.source(stored.spec.id), utc_now())
    rec = record.recommendation
    context.log.info(f"solver pool: {solver.stats()}")
    chosen = record.chosen
    yield Output(rec.to_json_dict(), metadata={
        "status": rec.status.value, "status_label": rec.status_label,
        "plot": MetadataValue.md(plan_plot(stored.spec, plant_history, rec, model_artifact.horizon)),
        "reasons": MetadataValue.json(list(rec.reasons)),
        "conditions": _conditions_table(record.conditions),
        "recommendation_id": rec.id, "run_id": rec.run_id, "valid_until": rec.valid_until,
        "problem_ir_hash": rec.problem_ir_hash, "model_artifact_hash": rec.model_artifact_hash,
        "calibration_id": uq_calibration.calibration_id, "training_data_hash": model_artifact.training_data_hash,
        "evidence": MetadataValue.json(dict(rec.evidence)),
        "plan": _plan_table(rec),
        "candidates": _candidates_table(record.result.candidates),
        "expired_past_valid_until": record.expired_before,
    })
    yield AssetCheckResult(
        check_name="candidate_verified", passed=bool(chosen and chosen.feasible and chosen.verified),
        severity=AssetCheckSeverity.WARN,
        metadata={"candidate_id": rec.candidate_id or "none",
                  "verify_report": MetadataValue.json(dict(chosen.verify_report) if chosen else {})})
