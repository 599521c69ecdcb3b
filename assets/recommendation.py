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
from optimizer_pipeline import pipeline, plots, uq
from optimizer_pipeline.contracts import (
    BindingSpec,
    HistorySplit,
    ModelArtifact,
    Recommendation,
    SolveCandidate,
    SolveResult,
    parse_iso_utc,
    utc_now,
)
from optimizer_pipeline.settings import Settings
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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def condition_rows(rec: Recommendation, artifact: ModelArtifact, calibration: pipeline.Calibration,
                   chosen: SolveCandidate | None, settings: Settings) -> list[dict]:
    """Every condition for `verified` (recommend.failed_conditions) with the value it was judged on,
    its limit and whether it holds; freshness and input distance are the values recorded at decision."""
    ev = calibration.evidence
    rows = [{"condition": "feasible candidate", "limit": "robust, else nominal, feasible",
             "value": "none" if chosen is None else f"{chosen.kind.value} (seq {chosen.seq})",
             "holds": chosen is not None and chosen.feasible},
            {"condition": "UQ evidence", "limit": f"{uq.SPLIT_CONFORMAL} or {uq.EMPIRICAL_MAX}",
             "value": ev.method or "none: " + "; ".join(ev.reasons), "holds": ev.has_evidence}]
    if ev.has_evidence:
        rows.append({"condition": "test coverage (worst CV)", "value": _fmt(ev.coverage),
                     "limit": f">= {ev.coverage_threshold:.4g}", "holds": ev.coverage >= ev.coverage_threshold})
        if settings.uq_gate == "strict":
            rows += [{"condition": "coverage 95% lower bound", "value": _fmt(ev.coverage_lower_95),
                      "limit": f">= {uq.STRICT_MIN_COVERAGE_LOWER:g}",
                      "holds": ev.coverage_lower_95 >= uq.STRICT_MIN_COVERAGE_LOWER},
                     {"condition": "val/test exchangeability p", "value": _fmt(ev.exchangeability_p),
                      "limit": f">= {uq.STRICT_MIN_EXCHANGEABILITY_P:g}",
                      "holds": ev.exchangeability_p >= uq.STRICT_MIN_EXCHANGEABILITY_P}]
        if ev.calibrated_at is None:
            when = "calibration time unknown"
        else:
            age = (parse_iso_utc(rec.created_at) - parse_iso_utc(ev.calibrated_at)).total_seconds() / 86400
            when = f"calibrated {ev.calibrated_at} ({age:.3g} days before)"
        rows.append({"condition": "calibration fresh", "value": when,
                     "limit": f"<= {settings.uq_fresh_days:g} days", "holds": bool(rec.evidence["calibration_fresh"])})
    distance = rec.evidence["input_distance"]
    rows.append({"condition": "input distance (max |z| of current MVs, CVs)", "value": _fmt(distance),
                 "limit": f"<= {settings.uq_max_input_distance:g}",
                 "holds": distance is not None and distance <= settings.uq_max_input_distance})
    rows += [{"condition": f"model gate {g.name}", "value": _fmt(g.value), "limit": g.description, "holds": g.passed}
             for g in artifact.gates]
    if chosen is not None:
        rows.append({"condition": "candidate verified independently", "limit": "feasible and costs agree",
                     "value": f"cost {_fmt(chosen.cost)}, independent {_fmt(chosen.independent_cost)}",
                     "holds": chosen.verified})
    rows += [{"condition": "model from the binding's revision", "value": f"r{artifact.binding_revision}",
              "limit": f"r{rec.binding_revision}", "holds": artifact.binding_revision == rec.binding_revision},
             {"condition": "calibration of this model", "value": calibration.artifact_hash[:12],
              "limit": artifact.artifact_hash[:12], "holds": calibration.artifact_hash == artifact.artifact_hash}]
    return rows


def _candidates_table(candidates: tuple[SolveCandidate, ...]) -> MetadataValue:
    """Every candidate with its solver and independent costs (normalised units) and verdicts."""
    columns = [TableColumn("seq", "int"), TableColumn("kind", "string"), TableColumn("solver_status", "string"),
               TableColumn("cost", "float"), TableColumn("independent_cost", "float"), TableColumn("feasible", "bool"),
               TableColumn("verified", "bool")]
    return MetadataValue.table(
        [TableRecord({"seq": c.seq, "kind": c.kind.value, "solver_status": c.solver_status, "cost": c.cost,
                      "independent_cost": c.independent_cost, "feasible": c.feasible, "verified": c.verified})
         for c in candidates], schema=TableSchema(columns=columns))


def _conditions_table(rows: list[dict]) -> MetadataValue:
    columns = [TableColumn("condition", "string"), TableColumn("value", "string"), TableColumn("limit", "string"),
               TableColumn("holds", "bool")]
    return MetadataValue.table([TableRecord({c.name: r[c.name] for c in columns}) for r in rows],
                               schema=TableSchema(columns=columns))


@asset(partitions_def=BINDINGS, group_name=RECOMMENDATION_GROUP,
       check_specs=[AssetCheckSpec(name="candidate_verified", asset="recommendation",
                                   description="The chosen candidate is feasible and its independent cost agrees")],
       description="Move plan (or steady-state targets) with status verified / unverified / rejected and its evidence.")
def recommendation(context: AssetExecutionContext, model_artifact: ModelArtifact, plant_history: HistorySplit,
                   uq_calibration: pipeline.Calibration, ledger: LedgerResource, plant_store: PlantStoreResource,
                   solver: SolverPoolResource):
    store, settings = ledger.ledger(), ledger.settings()
    expired = store.expire_past_valid_until()
    stored = plant_store.binding(context.partition_key)
    record = pipeline.recommend(stored, model_artifact, plant_history, uq_calibration,
                                lambda problem: SolveResult.from_dict(solver.solve(problem)),
                                store, settings, plant_store.source(stored.spec.id), utc_now())
    rec = record.recommendation
    context.log.info(f"solver pool: {solver.stats()}")
    chosen = next((c for c in record.result.candidates
                   if rec.candidate_id and rec.candidate_id.endswith(f"-{c.seq}")), None)
    yield Output(rec.to_json_dict(), metadata={
        "status": rec.status.value, "status_label": rec.status_label,
        "plot": MetadataValue.md(plan_plot(stored.spec, plant_history, rec, model_artifact.horizon)),
        "reasons": MetadataValue.json(list(rec.reasons)),
        "conditions": _conditions_table(condition_rows(rec, model_artifact, uq_calibration, chosen, settings)),
        "recommendation_id": rec.id, "run_id": rec.run_id, "valid_until": rec.valid_until,
        "problem_ir_hash": rec.problem_ir_hash, "model_artifact_hash": rec.model_artifact_hash,
        "calibration_id": uq_calibration.calibration_id, "training_data_hash": model_artifact.training_data_hash,
        "evidence": MetadataValue.json(dict(rec.evidence)),
        "plan": _plan_table(rec),
        "candidates": _candidates_table(record.result.candidates),
        "expired_past_valid_until": expired,
    })
    yield AssetCheckResult(
        check_name="candidate_verified", passed=bool(chosen and chosen.feasible and chosen.verified),
        severity=AssetCheckSeverity.WARN,
        metadata={"candidate_id": rec.candidate_id or "none",
                  "verify_report": MetadataValue.json(dict(chosen.verify_report) if chosen else {})})
