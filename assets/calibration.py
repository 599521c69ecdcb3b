"""Calibration assets of one binding partition: plant_history -> model_artifact -> uq_block_scores -> uq_calibration."""

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

from assets.partitions import BINDINGS, CALIBRATION_GROUP
from optimizer_pipeline import pipeline, plots, uq
from optimizer_pipeline.contracts import HistorySplit, ModelArtifact, utc_now
from optimizer_pipeline.data import prepare_history, validate_history_frame
from optimizer_pipeline.model import identify
from resources.ledger import LedgerResource
from resources.plant_store import PlantStoreResource

GATE_CHECKS = ("G1", "G2", "G3", "G4")


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> MetadataValue:
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in columns])
    return MetadataValue.table([TableRecord({k: r.get(k) for k, _ in columns}) for r in rows], schema=schema)


def _float_or_none(value: float | None) -> float | None:
    """A gate that could not be measured has value None (model.artifact): shown as empty, not a crash."""
    return None if value is None else float(value)


def fit_plot(artifact: ModelArtifact, split: HistorySplit) -> str:
    """Markdown: measured vs P-step open-loop rollouts on the first test run."""
    if not split.test:
        return "*no test run to show the model on*"
    run = split.test[0]
    title = f"{artifact.binding_id} r{artifact.binding_revision}: model vs test run {run.run_id}"
    return plots.figure_markdown(lambda: plots.model_fit_figure(plots.model_fit_series(artifact, run), title),
                                 "measured vs rolled-out prediction")


def coverage_rows(evidence: uq.UQEvidence, artifact: ModelArtifact) -> list[dict]:
    """Per CV: qhat (normalised), the band in engineering units, test coverage vs the threshold."""
    if not evidence.has_evidence:
        return [{"cv": tag} for tag in evidence.cv_tags]
    band = uq.band_engineering(evidence, artifact)
    return [{"cv": tag, "qhat": q, "band": b, "coverage": c, "threshold": evidence.coverage_threshold,
             "meets_threshold": c >= evidence.coverage_threshold}
            for tag, q, b, c in zip(evidence.cv_tags, evidence.qhat, band, evidence.coverage_per_cv)]


def scores_plot(scores: pipeline.Scores, evidence: uq.UQEvidence, title: str) -> str:
    """Markdown: val and test block scores per CV against qhat."""
    return plots.figure_markdown(
        lambda: plots.calibration_figure(evidence.cv_tags, scores.val.scores, scores.test.scores, evidence.qhat,
                                         evidence.coverage_per_cv, evidence.coverage_threshold, title),
        "block scores against qhat")


@asset(partitions_def=BINDINGS, group_name=CALIBRATION_GROUP,
       description="Stored plant history of the binding, cleaned, aligned to its sample grid and split by run.")
def plant_history(context: AssetExecutionContext, plant_store: PlantStoreResource):
    stored = plant_store.binding(context.partition_key)
    frame = validate_history_frame(plant_store.history(stored), stored.spec, f"stored history of {stored.spec.id}")
    split = prepare_history(frame, stored.spec, seed=pipeline.SPLIT_SEED)
    cleaning = split.report["cleaning"]
    changed = [r for r in cleaning["runs"] if r["action"] != "kept" or r["outliers"] or r["interpolated"]]
    return Output(split, metadata={
        "binding_revision": stored.revision,
        "rows": int(sum(len(r) for r in (*split.train, *split.val, *split.test))),
        "runs_train": len(split.train), "runs_val": len(split.val), "runs_test": len(split.test),
        "live_run": split.live.run_id if split.live else "none",
        "runs_changed_or_dropped": _table(changed, [("run_id", "string"), ("action", "string"), ("reason", "string"),
                                                    ("rows_in", "int"), ("rows_out", "int"), ("outliers", "int"),
                                                    ("interpolated", "int")]),
        "warnings": MetadataValue.json(list(split.report.get("warnings", []))),
    })


@asset(partitions_def=BINDINGS, group_name=CALIBRATION_GROUP,
       check_specs=[AssetCheckSpec(name=f"gate_{g}", asset="model_artifact",
                                   description=f"Model quality gate {g}") for g in GATE_CHECKS],
       description="ARX model identified on the train runs, with its state-space realisation and gates G1-G4.")
def model_artifact(context: AssetExecutionContext, plant_history: HistorySplit, plant_store: PlantStoreResource,
                   ledger: LedgerResource):
    stored = plant_store.binding(context.partition_key)
    artifact = identify(plant_history, stored.spec, stored.revision)
    ledger.ledger().put_artifact(artifact)
    gates = {g.name: g for g in artifact.gates}
    yield Output(artifact, metadata={
        "plot": MetadataValue.md(fit_plot(artifact, plant_history)),
        "artifact_hash": artifact.artifact_hash, "training_data_hash": artifact.training_data_hash,
        "binding_revision": artifact.binding_revision,
        "orders": f"na={artifact.na} nb={artifact.nb} delay={artifact.delay} P={artifact.horizon}",
        "orders_chosen_from_data": MetadataValue.json(dict(artifact.selection)) if artifact.selection else "given",
        **{f"{g.name}_value": float(g.value) for g in artifact.gates if g.value is not None},
        "gates": _table([{"gate": g.name, "description": g.description, "value": _float_or_none(g.value),
                          "threshold": float(g.threshold), "passed": g.passed} for g in artifact.gates],
                        [("gate", "string"), ("description", "string"), ("value", "float"), ("threshold", "float"),
                         ("passed", "bool")]),
    })
    for name in GATE_CHECKS:
        gate = gates.get(name)
        yield AssetCheckResult(
            check_name=f"gate_{name}", passed=bool(gate and gate.passed), severity=AssetCheckSeverity.WARN,
            metadata={} if gate is None else {"value": "not measurable" if gate.value is None else float(gate.value),
                                              "threshold": float(gate.threshold), "description": gate.description})


@asset(partitions_def=BINDINGS, group_name=CALIBRATION_GROUP,
       description="Block scores (max |h-step rollout residual| per block and CV, normalised) on val and test runs.")
def uq_block_scores(context: AssetExecutionContext, model_artifact: ModelArtifact, plant_history: HistorySplit,
                    plant_store: PlantStoreResource, ledger: LedgerResource):
    stored = plant_store.binding(context.partition_key)
    scores = pipeline.score_blocks(stored.spec, model_artifact, plant_history)
    rows = pipeline.persist_scores(ledger.ledger(), model_artifact, scores)
    return Output(scores, metadata={
        "block_length": scores.val.h, "val_blocks": scores.val.n_blocks, "val_runs": scores.val.n_runs,
        "test_blocks": scores.test.n_blocks, "test_runs": scores.test.n_runs,
        "unique_test_steps": scores.test.n_unique_steps, "rows_written": rows,
    })


@asset(partitions_def=BINDINGS, group_name=CALIBRATION_GROUP,
       check_specs=[AssetCheckSpec(name="uq_coverage", asset="uq_calibration",
                                   description="UQ evidence exists and test coverage >= threshold")],
       description="Block-conformal UQ evidence: qhat per CV from val, coverage on test, or the fail-closed reason.")
def uq_calibration(context: AssetExecutionContext, uq_block_scores: pipeline.Scores, model_artifact: ModelArtifact,
                   ledger: LedgerResource):
    settings = ledger.settings()
    calibration = pipeline.calibrate(ledger.ledger(), model_artifact, uq_block_scores, settings, utc_now())
    ev = calibration.evidence
    failures = pipeline.uq.gate_failures(ev, settings.uq_gate)
    title = f"{model_artifact.binding_id}: {ev.method or 'no UQ evidence'}, block length {ev.block_length}"
    yield Output(calibration, metadata={
        "plot": MetadataValue.md(scores_plot(uq_block_scores, ev, title)),
        "status": "passes the UQ gate" if not failures else "fails the UQ gate",
        "gate_failures": MetadataValue.json(failures),
        "coverage_by_cv": _table(coverage_rows(ev, model_artifact),
                                 [("cv", "string"), ("qhat", "float"), ("band", "float"), ("coverage", "float"),
                                  ("threshold", "float"), ("meets_threshold", "bool")]),
        "calibration_id": calibration.calibration_id, "artifact_hash": calibration.artifact_hash,
        "method": ev.method or "none (fail closed)",
        "coverage": ev.coverage, "coverage_threshold": ev.coverage_threshold,
        "coverage_lower_95": ev.coverage_lower_95, "exchangeability_p": ev.exchangeability_p,
        "qhat": MetadataValue.json(dict(zip(ev.cv_tags, ev.qhat))) if ev.qhat else "none",
        "reasons": MetadataValue.json(list(ev.reasons)),
        "evidence": MetadataValue.json(ev.to_dict()),
    })
    yield AssetCheckResult(check_name="uq_coverage", passed=not failures, severity=AssetCheckSeverity.WARN,
                           metadata={"failures": MetadataValue.json(failures), "gate": settings.uq_gate})
