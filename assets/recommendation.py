"""The recommendation stage of one binding, for the Dagster step: compile from the newest live state,
solve in the worker pool, verify, decide, record in the ledger; and describe it for the UI."""

import math
from typing import Callable

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from optimizer_pipeline import pipeline, plots, whatif
from optimizer_pipeline.economics import economic_value
from optimizer_pipeline.assets.batch import BindingInputs, StageEnv, StageResult, conditions_table
from optimizer_pipeline.contracts import (
    BindingSpec,
    Condition,
    EvidenceSource,
    HistorySplit,
    Recommendation,
    SolveCandidate,
    binding_from_dict,
    utc_now,
)
from optimizer_pipeline.ledger import WhatIfRecord
from optimizer_pipeline.recommendation_text import num


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plan_table(rec) -> MetadataValue:
    """One row per step: MV values held during the step and predicted CVs at its end (engineering units,
    4 significant digits for reading: the recommendation in the ledger keeps full precision)."""
    columns = [TableColumn("step", "int")] + [TableColumn(f"mv:{t}", "string") for t in rec.mv_tags] + \
              [TableColumn(f"cv:{t}", "string") for t in rec.cv_tags]
    rows = [TableRecord({"step": k, **{f"mv:{t}": num(float(u), 4) for t, u in zip(rec.mv_tags, controls)},
                         **{f"cv:{t}": num(float(y), 4) for t, y in zip(rec.cv_tags, predicted)}})
            for k, (controls, predicted) in enumerate(zip(rec.controls, rec.predicted))]
    return MetadataValue.table(rows, schema=TableSchema(columns=columns))


def plan_plot(figures: plots.FigureQueue, spec: BindingSpec, split: HistorySplit, rec: Recommendation,
              model_horizon: int) -> Callable[[], str]:
    """Markdown (when called): the last HISTORY_HORIZONS * P samples of the live run and the plan with its band."""
    n_history = plots.HISTORY_HORIZONS * model_horizon
    return figures.add(f"{spec.id}: {rec.status.value} plan", plots.recommendation_figure,
                       plots.plan_series(spec, split.live, rec, n_history))


def _candidates_table(candidates: tuple[SolveCandidate, ...]) -> MetadataValue:
    """Every candidate with its solver and independent costs (normalised units, 4 significant digits;
    "-": none) and verdicts."""
    columns = [TableColumn("seq", "int"), TableColumn("kind", "string"), TableColumn("solver_status", "string"),
               TableColumn("cost", "string"), TableColumn("independent_cost", "string"),
               TableColumn("feasible", "bool"), TableColumn("verified", "bool")]
    return MetadataValue.table(
        [TableRecord({"seq": c.seq, "kind": c.kind.value, "solver_status": c.solver_status, "cost": num(c.cost, 4),
                      "independent_cost": num(c.independent_cost, 4), "feasible": c.feasible,
                      "verified": c.verified})
         for c in candidates], schema=TableSchema(columns=columns))


def recommendation(env: StageEnv, inputs: BindingInputs) -> StageResult[Recommendation]:
    """Solve from the live state of this step's history with the revision's model and calibration."""
    stored, ledger = inputs.stored, env.ledger
    artifact, split, calibration = inputs.artifact(), inputs.split(), inputs.calibration()
    source = ledger.sample_source(stored.spec.id) or EvidenceSource.REAL.value
    record = pipeline.recommend(stored, artifact, split, calibration, env.solve, ledger, env.settings, source,
                                utc_now())
    metadata, check_metadata = recommendation_report(
        stored.spec, split, artifact, calibration, record.recommendation, record.conditions, record.result,
        record.chosen, env.figures, expired_before=record.expired_before)
    return StageResult(record.recommendation, metadata, tuple(record.conditions), check_metadata)


def recommendation_report(spec: BindingSpec, split: HistorySplit, artifact, calibration, rec: Recommendation,
                          conditions: tuple[Condition, ...], result, chosen: SolveCandidate | None,
                          figures: plots.FigureQueue | None, *, expired_before: int | None = None,
                          extra: dict | None = None) -> tuple[dict, dict]:
    """The recommendation asset's materialization metadata and what its check shows beside the
    conditions (`batch.conditions_check`), for a publication by a run
    (the asset above) or by the live service (assets/live_report.py): one description of both.
    `figures` None: no plan figure (the live service's reports between status changes)."""
    metadata = {  # Dagster lists the entries in this order: what a reader needs first, first
        "status": rec.status.value, "status_label": rec.status_label,
        "reasons": MetadataValue.json(list(rec.reasons)),
        "conditions": conditions_table(conditions),
        **({} if figures is None else {"plot": plan_plot(figures, spec, split, rec, artifact.horizon)}),
        "plan": _plan_table(rec),
        "band_steps": rec.band_steps if rec.band_steps is not None else "no band",
        "recommendation_id": rec.id, "run_id": rec.run_id, "valid_until": rec.valid_until,
        **(extra or {}),
        "problem_ir_hash": rec.problem_ir_hash, "model_artifact_hash": rec.model_artifact_hash,
        "calibration_id": calibration.calibration_id, "training_data_hash": artifact.training_data_hash,
        "evidence": MetadataValue.json(dict(rec.evidence)),
        "candidates": _candidates_table(result.candidates),
        **({} if expired_before is None else {"expired_past_valid_until": expired_before}),
        # plain numbers: Dagster's Plots tab draws their history per partition
        **{name: float(value) for name, value in (
            ("cost", rec.cost), ("independent_cost", rec.independent_cost),
            ("input_distance", rec.evidence.get("input_distance")),
            ("economic_value", economic_value(spec, rec.controls[-1], rec.predicted[-1]) if rec.controls
             else None)) if _finite(value)},
    }
    check_metadata = {"status": rec.status.value, "candidate_id": rec.candidate_id or "none",
                      "verify_report": MetadataValue.json(dict(chosen.verify_report) if chosen else {})}
    return metadata, check_metadata


def _side_by_side_table(doc: dict) -> MetadataValue:
    """The what-if beside the recommendation it was compared with (whatif.side_by_side_rows; the ids
    are the metadata `compared_with` and `whatif_run_id`)."""
    _, *rows = whatif.side_by_side_rows(doc)
    columns = [TableColumn("row", "string"), TableColumn("open", "string"), TableColumn("what_if", "string")]
    return MetadataValue.table([TableRecord({"row": r[0], "open": r[1], "what_if": r[2]}) for r in rows],
                               schema=TableSchema(columns=columns))


def whatif_solve(env: StageEnv, inputs: BindingInputs, overrides: tuple) -> StageResult[WhatIfRecord]:
    """A what-if solve of this binding (optimizer_pipeline/whatif.py): the stored spec with `overrides`
    applied in memory, solved from the live state of the split plant_history last recorded (the state
    the open recommendation was solved from) with the revision's model and calibration, recorded as a
    what-if run; its metadata (shown as an observation of the recommendation asset, not a
    materialization) puts it beside the binding's latest recommendation."""
    stored, ledger = inputs.stored, env.ledger
    artifact, split, calibration = inputs.artifact(), inputs.split(), inputs.calibration()
    source = ledger.sample_source(stored.spec.id) or EvidenceSource.REAL.value
    solved = whatif.solve_whatif(stored, overrides, artifact, split, calibration, env.solve, ledger, env.settings,
                                 source, utc_now(), requested_by="dagster", dagster_run_id=env.run_id)
    doc = whatif.comparison(ledger, solved.record)
    result, compared = doc["whatif"], doc["open"]
    spec = binding_from_dict(solved.record.spec, source=f"what-if {solved.record.run_id}")
    plot = env.figures.add(f"{spec.id}: what-if plan", plots.recommendation_figure,
                           plots.whatif_series(spec, split.live, result, compared,
                                               plots.HISTORY_HORIZONS * artifact.horizon))
    metadata = {
        "kind": "what-if (the binding and its recommendation are unchanged)",
        "plot": plot,
        "whatif_run_id": solved.record.run_id, "status": result["status"],
        "overrides": MetadataValue.json(doc["overrides"]),
        "compared_with": compared["id"] if compared else "no recommendation yet",
        "side_by_side": _side_by_side_table(doc),
        "reasons": MetadataValue.json(list(result["reasons"])),
        "conditions": conditions_table(solved.conditions),
        "comparison": MetadataValue.json(doc),
        **{name: float(value) for name, value in (
            ("economic_value", result.get("economic_value")),
            ("open_economic_value", compared.get("economic_value") if compared else None)) if _finite(value)},
    }
    return StageResult(solved.record, metadata, ())
