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
from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import HistorySplit, ModelArtifact, utc_now
from optimizer_pipeline.data import prepare_history, validate_history_frame
from optimizer_pipeline.model import identify
from resources.ledger import LedgerResource
from resources.plant_store import PlantStoreResource

GATE_CHECKS = ("G1", "G2", "G3", "G4")


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> MetadataValue:
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in columns])
    return MetadataValue.table([TableRecord({k: r.get(k) for k, _ in columns}) for r in rows], schema=schema)


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
        "artifact_hash": artifact.artifact_hash, "binding_revision": artifact.binding_revision,
        "orders": f"na={artifact.na} nb={artifact.nb} delay={artifact.delay} P={artifact.horizon}",
        "orders_chosen_from_data": MetadataValue.json(dict(artifact.selection)) if artifact.selection else "given",
        **{f"{g.name}_value": float(g.value) for g in artifact.gates},
        "gates": _table([{"gate": g.name, "description": g.description, "value": float(g.value),
                          "threshold": float(g.threshold), "passed": g.passed} for g in artifact.gates],
                        [("gate", "string"), ("description", "string"), ("value", "float"), ("threshold", "float"),
                         ("passed", "bool")]),
    })
    for name in GATE_CHECKS:
        gate = gates.get(name)
        yield AssetCheckResult(
            check_name=f"gate_{name}", passed=bool(gate and gate.passed), severity=AssetCheckSeverity.WARN,
            metadata={} if gate is None else {"value": float(gate.value), "threshold": float(gate.threshold),
                                              "description": gate.description})


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
    yield Output(calibration, metadata={
        "calibration_id": calibration.calibration_id, "method": ev.method or "none (fail closed)",
        "coverage": ev.coverage, "coverage_threshold": ev.coverage_threshold,
        "coverage_lower_95": ev.coverage_lower_95, "exchangeability_p": ev.exchangeability_p,
        "qhat": MetadataValue.json(dict(zip(ev.cv_tags, ev.qhat))) if ev.qhat else "none",
        "reasons": MetadataValue.json(list(ev.reasons)),
        "evidence": MetadataValue.json(ev.to_dict()),
    })
    yield AssetCheckResult(check_name="uq_coverage", passed=not failures, severity=AssetCheckSeverity.WARN,
                           metadata={"failures": MetadataValue.json(failures), "gate": settings.uq_gate})
