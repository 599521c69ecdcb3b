"""The calibration stages of one binding, for the Dagster step: plant_history -> model_artifact ->
uq_block_scores -> uq_calibration. Each runs the domain stage (optimizer_pipeline.pipeline, which
writes the ledger) and describes the result for the UI: metadata, plots, the conditions it judged."""

from typing import Callable

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from optimizer_pipeline import pipeline, plots, recommend, uq
from optimizer_pipeline.assets.batch import BindingInputs, StageEnv, StageResult
from optimizer_pipeline.contracts import (
    BindingSpec,
    Calibration,
    HistorySplit,
    ModelArtifact,
    Scores,
    iso_from_seconds,
    utc_now,
)
from optimizer_pipeline.model.step_response import step_response_table

def _table(rows: list[dict], columns: list[tuple[str, str]]) -> MetadataValue:
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in columns])
    return MetadataValue.table([TableRecord({k: r.get(k) for k, _ in columns}) for r in rows], schema=schema)


def _float_or_none(value: float | None) -> float | None:
    """A gate that could not be measured has value None (model.artifact): shown as empty, not a crash."""
    return None if value is None else float(value)


def fit_plot(figures: plots.FigureQueue, artifact: ModelArtifact, split: HistorySplit) -> Callable[[], str]:
    """Markdown (when called): measured vs P-step open-loop rollouts on the first test run."""
    if not split.test:
        return lambda: "*no test run to show the model on*"
    run = split.test[0]
    title = f"{artifact.binding_id} r{artifact.binding_revision}: model vs test run {run.run_id}"
    return figures.add("measured vs rolled-out prediction", plots.model_fit_figure,
                       plots.model_fit_series(artifact, run), title)


def step_response_plot(figures: plots.FigureQueue, artifact: ModelArtifact) -> Callable[[], str]:
    """Markdown (when called): the step-response matrix, each response with its ±2 standard-error band
    (`identify` records it in every artifact it makes)."""
    title = f"{artifact.binding_id} r{artifact.binding_revision}: step responses (unit steps, engineering units)"
    return figures.add("step-response matrix", plots.step_response_figure, dict(artifact.step_response), title)


def coverage_rows(evidence: uq.UQEvidence, artifact: ModelArtifact) -> list[dict]:
    """Per CV: qhat (normalised), the band in engineering units, test coverage vs the threshold."""
    if not evidence.has_evidence:
        return [{"cv": tag} for tag in evidence.cv_tags]
    band = uq.band_engineering(evidence, artifact)
    return [{"cv": tag, "qhat": q, "band": b, "coverage": c, "threshold": evidence.coverage_threshold,
             "meets_threshold": c >= evidence.coverage_threshold}
            for tag, q, b, c in zip(evidence.cv_tags, evidence.qhat, band, evidence.coverage_per_cv)]


def scores_plot(figures: plots.FigureQueue, scores: Scores, evidence: uq.UQEvidence,
                title: str) -> Callable[[], str]:
    """Markdown (when called): val and test block scores per CV against qhat."""
    return figures.add("block scores against qhat", plots.calibration_figure, evidence.cv_tags, scores.val.scores,
                       scores.test.scores, evidence.qhat, evidence.coverage_per_cv, evidence.coverage_threshold, title)


def flags_plot(figures: plots.FigureQueue, spec: BindingSpec, split: HistorySplit) -> Callable[[], str]:
    """Markdown (when called): the flagged tags' most flagged runs with their flag spans shaded."""
    spans = split.report["cleaning"]["flags"]
    if not spans:
        return lambda: "*no sample flagged*"
    runs = [*split.train, *split.val, *split.test, *([split.live] if split.live else [])]
    return figures.add("flagged samples", plots.flags_figure, plots.flag_series(spec, runs, spans),
                       f"{spec.id}: flagged samples (data/flags.py) in the most flagged runs")


def plant_history(env: StageEnv, inputs: BindingInputs) -> StageResult[HistorySplit]:
    """Clean and split the binding's stored samples; the split is recorded in the ledger. What cleaning
    flagged (data/flags.py) shows as a table, per tag and rule, and as a figure."""
    stored = inputs.stored
    split = pipeline.prepare_split(env.ledger, stored)
    cleaning = split.report["cleaning"]
    changed = [r for r in cleaning["runs"] if r["action"] != "kept" or r["flagged"] or r["interpolated"]]
    spans = [{**s, "start": iso_from_seconds(s["start_s"]), "end": iso_from_seconds(s["end_s"])}
             for s in cleaning["flags"]]
    return StageResult(split, {
        "flagged_samples": MetadataValue.json(cleaning["totals"]["flagged"]),
        "flags": _table(spans, [("tag", "string"), ("run_id", "string"), ("rule", "string"), ("start", "string"),
                                ("end", "string"), ("samples", "int")]),
        "flags_plot": flags_plot(env.figures, stored.spec, split),
        "binding_revision": stored.revision,
        "rows": int(sum(len(r) for r in (*split.train, *split.val, *split.test))),
        "runs_train": len(split.train), "runs_val": len(split.val), "runs_test": len(split.test),
        "live_run": split.live.run_id if split.live else "none",
        "data_hash": split.data_hash,
        "runs_changed_or_dropped": _table(changed, [
            ("run_id", "string"), ("action", "string"), ("reason", "string"), ("rows_in", "int"),
            ("rows_out", "int"), ("flagged", "int"), ("interpolated", "int")]),
        "warnings": MetadataValue.json(list(split.report.get("warnings", []))),
    })


def _artifact_metadata(artifact: ModelArtifact, plot: Callable[[], str], step_plot: Callable[[], str]) -> dict:
    return {
        "plot": plot,
        # per (CV, input): the unit step response with its jackknife band, gain, dead time, settling time;
        # the MV gain matrix's condition number and RGA (model/step_response.py)
        "step_response_plot": step_plot,
        "step_response": MetadataValue.md(step_response_table(artifact.step_response)),
        "artifact_hash": artifact.artifact_hash, "training_data_hash": artifact.training_data_hash,
        "binding_revision": artifact.binding_revision,
        "orders": f"na={artifact.na} nb={artifact.nb} delay={artifact.delay} P={artifact.horizon}",
        "orders_chosen_from_data": MetadataValue.json(dict(artifact.selection)) if artifact.selection else "given",
        # the structure: delays per CV and input (MVs, then DVs), own-CV past only (MISO) or every CV's
        "structure": MetadataValue.json(dict(artifact.selection.get("structure") or {})),
        # one delay, a delay per channel or a long numerator (model/select.py), when chosen from the data
        **({"family": artifact.selection["family"]} if "family" in (artifact.selection or {}) else {}),
        # the steady-state MV gain (normalised units): condition number and its uncertainty (jackknife)
        "steady_gain_condition": _condition(artifact),
        "steady_gain": MetadataValue.json(dict(artifact.steady_gain)),
        # CVs not declared integrating that fit a pole near 1: declare `integrating: true` on a level
        **({"maybe_integrating": MetadataValue.json(dict(artifact.selection["integrating_hint"]))}
           if (artifact.selection or {}).get("integrating_hint") else {}),
        # what a move is solved with: the identified model or its local refit around it (model/local.py)
        **({"steady_model": MetadataValue.json(dict(artifact.selection["steady_model"]))}
           if "steady_model" in (artifact.selection or {}) else {}),
        **{f"{g.name}_value": float(g.value) for g in artifact.gates if g.value is not None},
        "gates": _table([{"gate": g.name, "description": g.description, "value": _float_or_none(g.value),
                          "threshold": float(g.threshold), "passed": g.passed} for g in artifact.gates],
                        [("gate", "string"), ("description", "string"), ("value", "float"), ("threshold", "float"),
                         ("passed", "bool")]),
    }


def _condition(artifact: ModelArtifact) -> float | str:
    """The steady-state gain's condition number; None in the record means a singular gain."""
    if not artifact.steady_gain:
        return "not recorded"
    condition = artifact.steady_gain.get("condition")
    return "singular" if condition is None else float(condition)


def model_artifact(env: StageEnv, inputs: BindingInputs) -> StageResult[ModelArtifact]:
    """Identify the model on the train runs (stored by content hash); its gates are its conditions."""
    split = inputs.split()
    artifact = pipeline.identify_model(env.ledger, inputs.stored, split)
    return StageResult(artifact, _artifact_metadata(artifact, fit_plot(env.figures, artifact, split),
                                                    step_response_plot(env.figures, artifact)),
                       tuple(recommend.gate_conditions(artifact)))


def uq_block_scores(env: StageEnv, inputs: BindingInputs) -> StageResult[Scores]:
    """Val and test block scores of the artifact, stored per block and CV."""
    scores = pipeline.score_and_store(env.ledger, inputs.stored.spec, inputs.artifact(), inputs.split())
    return StageResult(scores, {
        "block_length": scores.val.h, "val_blocks": scores.val.n_blocks, "val_runs": scores.val.n_runs,
        "test_blocks": scores.test.n_blocks, "test_runs": scores.test.n_runs,
        "unique_test_steps": scores.test.n_unique_steps,
        "rows_written": (scores.val.n_blocks + scores.test.n_blocks) * len(scores.val.cv_tags),
    })


def uq_calibration(env: StageEnv, inputs: BindingInputs) -> StageResult[Calibration]:
    """Block-conformal evidence of the artifact (or the fail-closed reason), stored as a calibration."""
    artifact, scores, settings = inputs.artifact(), inputs.scores(), env.settings
    calibration = pipeline.calibrate(env.ledger, artifact, scores, settings, utc_now())
    ev = calibration.evidence
    failures = uq.gate_failures(ev, settings.uq_gate)
    title = f"{artifact.binding_id}: {ev.method or 'no UQ evidence'}, block length {ev.block_length}"
    metadata = {
        "plot": scores_plot(env.figures, scores, ev, title),
        "status": "passes the UQ gate" if not failures else "fails the UQ gate",
        "gate_failures": MetadataValue.json(failures),
        "coverage_by_cv": _table(coverage_rows(ev, artifact),
                                 [("cv", "string"), ("qhat", "float"), ("band", "float"),
                                  ("coverage", "float"), ("threshold", "float"), ("meets_threshold", "bool")]),
        "calibration_id": calibration.calibration_id, "artifact_hash": calibration.artifact_hash,
        "method": ev.method or "none (fail closed)",
        "score": ev.score or uq.MAX_RESIDUAL, "block_length": ev.block_length,
        "coverage": ev.coverage, "coverage_threshold": ev.coverage_threshold,
        "coverage_lower_95": ev.coverage_lower_95, "exchangeability_p": ev.exchangeability_p,
        "qhat": MetadataValue.json(dict(zip(ev.cv_tags, ev.qhat))) if ev.qhat else "none",
        # plain numbers: Dagster's Plots tab draws their history per partition
        **({f"qhat_{tag}": float(q) for tag, q in zip(ev.cv_tags, ev.qhat)} if ev.qhat else {}),
        "reasons": MetadataValue.json(list(ev.reasons)),
        "evidence": MetadataValue.json(ev.to_dict()),
    }
    return StageResult(calibration, metadata, tuple(uq.gate_checks(ev, settings.uq_gate)),
                       {"uq_gate": settings.uq_gate})
