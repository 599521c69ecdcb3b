"""The recommendation of each binding partition of the run: compile, solve in the worker pool, verify, decide, record."""

from typing import Callable

from dagster import AssetExecutionContext, MetadataValue, Output, TableColumn, TableRecord, TableSchema

from optimizer_pipeline.assets.batch import Check, add_partition_metadata, binding_asset, in_ledger_sessions, record_checks
from optimizer_pipeline.assets.partitions import RECOMMENDATION_GROUP
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
from optimizer_pipeline.resources.ledger import LedgerResource
from optimizer_pipeline.resources.plant_store import PlantStoreResource
from optimizer_pipeline.resources.solver import SolverPoolResource


def _plan_table(rec) -> MetadataValue:
    """One row per step: MV values held during the step and predicted CVs at its end (engineering units)."""
    columns = [TableColumn("step", "int")] + [TableColumn(f"mv:{t}", "float") for t in rec.mv_tags] + \
              [TableColumn(f"cv:{t}", "float") for t in rec.cv_tags]
    rows = [TableRecord({"step": k, **{f"mv:{t}": float(u) for t, u in zip(rec.mv_tags, controls)},
                         **{f"cv:{t}": float(y) for t, y in zip(rec.cv_tags, predicted)}})
            for k, (controls, predicted) in enumerate(zip(rec.controls, rec.predicted))]
    return MetadataValue.table(rows, schema=TableSchema(columns=columns))


def plan_plot(figures: plots.FigureQueue, spec: BindingSpec, split: HistorySplit, rec: Recommendation,
              model_horizon: int) -> Callable[[], str]:
    """Markdown (when called): the last HISTORY_HORIZONS * P samples of the live run and the plan with its band."""
    n_history = plots.HISTORY_HORIZONS * model_horizon
    return figures.add(f"{spec.id}: {rec.status.value} plan", plots.recommendation_figure,
                       plots.plan_series(spec, split.live, rec, n_history))


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


@binding_asset(RECOMMENDATION_GROUP,
               "Move plan (or steady-state targets) with status verified / unverified / rejected and its evidence.",
               checks=[("candidate_verified", "The chosen candidate is feasible and its independent cost agrees")])
def recommendation(context: AssetExecutionContext, model_artifact: dict[str, ModelArtifact],
                   plant_history: dict[str, HistorySplit], uq_calibration: dict[str, pipeline.Calibration],
                   ledger: LedgerResource, plant_store: PlantStoreResource, solver: SolverPoolResource):
    store, settings = ledger.ledger(), ledger.settings()
    bindings = plant_store.bindings_by_id(context.partition_keys)
    recommendations, metadata, checks = {}, {}, []
    with plots.FigureQueue(len(bindings)) as figures:
        with in_ledger_sessions(store, bindings.items()) as items:
            for binding_id, stored in items:
                artifact, split = model_artifact[binding_id], plant_history[binding_id]
                calibration = uq_calibration[binding_id]
                record = pipeline.recommend(stored, artifact, split, calibration,
                                            lambda problem: SolveResult.from_dict(solver.solve(problem)),
                                            store, settings, plant_store.source(stored.spec.id), utc_now())
                rec, chosen = record.recommendation, record.chosen
                metadata[binding_id] = {
                    "status": rec.status.value, "status_label": rec.status_label,
                    "plot": plan_plot(figures, stored.spec, split, rec, artifact.horizon),
                    "reasons": MetadataValue.json(list(rec.reasons)),
                    "conditions": _conditions_table(record.conditions),
                    "recommendation_id": rec.id, "run_id": rec.run_id, "valid_until": rec.valid_until,
                    "problem_ir_hash": rec.problem_ir_hash, "model_artifact_hash": rec.model_artifact_hash,
                    "calibration_id": calibration.calibration_id, "training_data_hash": artifact.training_data_hash,
                    "evidence": MetadataValue.json(dict(rec.evidence)),
                    "plan": _plan_table(rec),
                    "candidates": _candidates_table(record.result.candidates),
                    "expired_past_valid_until": record.expired_before,
                }
                checks.append(Check(binding_id, "candidate_verified", bool(chosen and chosen.feasible and chosen.verified),
                                    {"candidate_id": rec.candidate_id or "none",
                                     "verify_report": MetadataValue.json(dict(chosen.verify_report) if chosen else {})}))
                recommendations[binding_id] = rec.to_json_dict()
        add_partition_metadata(context, metadata)
    context.log.info(f"solver pool: {solver.stats()}")
    yield Output(recommendations, output_name="recommendation")
    record_checks(context, "recommendation", checks)
