"""Calibration assets of the binding partitions: plant_history -> model_artifact -> uq_block_scores -> uq_calibration.

Each asset handles every binding partition of its run (assets.batch); its value is a dict binding id -> value."""

from typing import Callable

from dagster import AssetExecutionContext, MetadataValue, Output, TableColumn, TableRecord, TableSchema

from optimizer_pipeline.assets.batch import Check, add_partition_metadata, binding_asset, in_ledger_sessions, record_checks
from optimizer_pipeline.assets.partitions import CALIBRATION_GROUP
from optimizer_pipeline import pipeline, plots, uq
from optimizer_pipeline.contracts import HistorySplit, ModelArtifact, utc_now
from optimizer_pipeline.data import prepare_history, validate_history_frame
from optimizer_pipeline.model import identify
from optimizer_pipeline.resources.ledger import LedgerResource
from optimizer_pipeline.resources.plant_store import PlantStoreResource

GATE_CHECKS = ("G1", "G2", "G3", "G4")


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


def coverage_rows(evidence: uq.UQEvidence, artifact: ModelArtifact) -> list[dict]:
    """Per CV: qhat (normalised), the band in engineering units, test coverage vs the threshold."""
    if not evidence.has_evidence:
        return [{"cv": tag} for tag in evidence.cv_tags]
    band = uq.band_engineering(evidence, artifact)
    return [{"cv": tag, "qhat": q, "band": b, "coverage": c, "threshold": evidence.coverage_threshold,
             "meets_threshold": c >= evidence.coverage_threshold}
            for tag, q, b, c in zip(evidence.cv_tags, evidence.qhat, band, evidence.coverage_per_cv)]


def scores_plot(figures: plots.FigureQueue, scores: pipeline.Scores, evidence: uq.UQEvidence,
                title: str) -> Callable[[], str]:
    """Markdown (when called): val and test block scores per CV against qhat."""
    return figures.add("block scores against qhat", plots.calibration_figure, evidence.cv_tags, scores.val.scores,
                       scores.test.scores, evidence.qhat, evidence.coverage_per_cv, evidence.coverage_threshold, title)


@binding_asset(CALIBRATION_GROUP, "Stored plant history of the binding, cleaned, aligned to its sample grid and split by run.")
def plant_history(context: AssetExecutionContext, plant_store: PlantStoreResource, ledger: LedgerResource):
    splits = {}
    bindings = plant_store.bindings_by_id(context.partition_keys)
    with in_ledger_sessions(ledger.ledger(), bindings.items()) as items:
        for binding_id, stored in items:
            frame = validate_history_frame(plant_store.history(stored), stored.spec,
                                           f"stored history of {stored.spec.id}")
            split = prepare_history(frame, stored.spec, seed=pipeline.SPLIT_SEED)
            cleaning = split.report["cleaning"]
            changed = [r for r in cleaning["runs"] if r["action"] != "kept" or r["outliers"] or r["interpolated"]]
            context.add_asset_metadata({
                "binding_revision": stored.revision,
                "rows": int(sum(len(r) for r in (*split.train, *split.val, *split.test))),
                "runs_train": len(split.train), "runs_val": len(split.val), "runs_test": len(split.test),
                "live_run": split.live.run_id if split.live else "none",
                "runs_changed_or_dropped": _table(changed, [
                    ("run_id", "string"), ("action", "string"), ("reason", "string"), ("rows_in", "int"),
                    ("rows_out", "int"), ("outliers", "int"), ("interpolated", "int")]),
                "warnings": MetadataValue.json(list(split.report.get("warnings", []))),
            }, partition_key=binding_id)
            splits[binding_id] = split
    yield Output(splits, output_name="plant_history")


def _artifact_metadata(artifact: ModelArtifact, plot: Callable[[], str]) -> dict:
    return {
        "plot": plot,
        "artifact_hash": artifact.artifact_hash, "training_data_hash": artifact.training_data_hash,
        "binding_revision": artifact.binding_revision,
        "orders": f"na={artifact.na} nb={artifact.nb} delay={artifact.delay} P={artifact.horizon}",
        "orders_chosen_from_data": MetadataValue.json(dict(artifact.selection)) if artifact.selection else "given",
        **{f"{g.name}_value": float(g.value) for g in artifact.gates if g.value is not None},
        "gates": _table([{"gate": g.name, "description": g.description, "value": _float_or_none(g.value),
                          "threshold": float(g.threshold), "passed": g.passed} for g in artifact.gates],
                        [("gate", "string"), ("description", "string"), ("value", "float"), ("threshold", "float"),
                         ("passed", "bool")]),
    }


def _gate_checks(artifact: ModelArtifact) -> list[Check]:
    gates = {g.name: g for g in artifact.gates}
    checks = []
    for name in GATE_CHECKS:
        gate = gates.get(name)
        checks.append(Check(artifact.binding_id, f"gate_{name}", bool(gate and gate.passed), {} if gate is None else {
            "value": "not measurable" if gate.value is None else float(gate.value),
            "threshold": float(gate.threshold), "description": gate.description}))
    return checks


@binding_asset(CALIBRATION_GROUP, "ARX model identified on the train runs, with its state-space realisation and gates G1-G4.",
               checks=[(f"gate_{g}", f"Model quality gate {g}") for g in GATE_CHECKS])
def model_artifact(context: AssetExecutionContext, plant_history: dict[str, HistorySplit],
                   plant_store: PlantStoreResource, ledger: LedgerResource):
    store, bindings = ledger.ledger(), plant_store.bindings_by_id(context.partition_keys)
    artifacts, metadata, checks = {}, {}, []
    with plots.FigureQueue(len(bindings)) as figures:
        with in_ledger_sessions(store, bindings.items()) as items:
            for binding_id, stored in items:
                split = plant_history[binding_id]
                artifact = identify(split, stored.spec, stored.revision)
                store.put_artifact(artifact)
                metadata[binding_id] = _artifact_metadata(artifact, fit_plot(figures, artifact, split))
                checks += _gate_checks(artifact)
                artifacts[binding_id] = artifact
        add_partition_metadata(context, metadata)
    yield Output(artifacts, output_name="model_artifact")
    record_checks(context, "model_artifact", checks)


@binding_asset(CALIBRATION_GROUP,
               "Block scores (max |h-step rollout residual| per block and CV, normalised) on val and test runs.")
def uq_block_scores(context: AssetExecutionContext, model_artifact: dict[str, ModelArtifact],
                    plant_history: dict[str, HistorySplit], plant_store: PlantStoreResource, ledger: LedgerResource):
    store = ledger.ledger()
    all_scores = {}
    bindings = plant_store.bindings_by_id(context.partition_keys)
    with in_ledger_sessions(store, bindings.items()) as items:
        for binding_id, stored in items:
            scores = pipeline.score_blocks(stored.spec, model_artifact[binding_id], plant_history[binding_id])
            rows = pipeline.persist_scores(store, model_artifact[binding_id], scores)
            context.add_asset_metadata({
                "block_length": scores.val.h, "val_blocks": scores.val.n_blocks, "val_runs": scores.val.n_runs,
                "test_blocks": scores.test.n_blocks, "test_runs": scores.test.n_runs,
                "unique_test_steps": scores.test.n_unique_steps, "rows_written": rows,
            }, partition_key=binding_id)
            all_scores[binding_id] = scores
    yield Output(all_scores, output_name="uq_block_scores")


@binding_asset(CALIBRATION_GROUP,
               "Block-conformal UQ evidence: qhat per CV from val, coverage on test, or the fail-closed reason.",
               checks=[("uq_coverage", "UQ evidence exists and test coverage >= threshold")])
def uq_calibration(context: AssetExecutionContext, uq_block_scores: dict[str, pipeline.Scores],
                   model_artifact: dict[str, ModelArtifact], ledger: LedgerResource):
    store, settings, keys = ledger.ledger(), ledger.settings(), context.partition_keys
    calibrations, metadata, checks = {}, {}, []
    with plots.FigureQueue(len(keys)) as figures:
        with in_ledger_sessions(store, keys) as items:
            for binding_id in items:
                artifact, scores = model_artifact[binding_id], uq_block_scores[binding_id]
                calibration = pipeline.calibrate(store, artifact, scores, settings, utc_now())
                ev = calibration.evidence
                failures = pipeline.uq.gate_failures(ev, settings.uq_gate)
                title = f"{artifact.binding_id}: {ev.method or 'no UQ evidence'}, block length {ev.block_length}"
                metadata[binding_id] = {
                    "plot": scores_plot(figures, scores, ev, title),
                    "status": "passes the UQ gate" if not failures else "fails the UQ gate",
                    "gate_failures": MetadataValue.json(failures),
                    "coverage_by_cv": _table(coverage_rows(ev, artifact),
                                             [("cv", "string"), ("qhat", "float"), ("band", "float"),
                                              ("coverage", "float"), ("threshold", "float"), ("meets_threshold", "bool")]),
                    "calibration_id": calibration.calibration_id, "artifact_hash": calibration.artifact_hash,
                    "method": ev.method or "none (fail closed)",
                    "coverage": ev.coverage, "coverage_threshold": ev.coverage_threshold,
                    "coverage_lower_95": ev.coverage_lower_95, "exchangeability_p": ev.exchangeability_p,
                    "qhat": MetadataValue.json(dict(zip(ev.cv_tags, ev.qhat))) if ev.qhat else "none",
                    "reasons": MetadataValue.json(list(ev.reasons)),
                    "evidence": MetadataValue.json(ev.to_dict()),
                }
                checks.append(Check(binding_id, "uq_coverage", not failures,
                                    {"failures": MetadataValue.json(failures), "gate": settings.uq_gate}))
                calibrations[binding_id] = calibration
        add_partition_metadata(context, metadata)
    yield Output(calibrations, output_name="uq_calibration")
    record_checks(context, "uq_calibration", checks)
