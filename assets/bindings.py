"""The binding assets: plant_history -> model_artifact -> uq_block_scores -> uq_calibration ->
recommendation, one dynamic partition per binding, computed by one step per run.

One `multi_asset` holds the five: a job selects the stages it runs (recalibrate: the calibration
group; solve: plant_history + recommendation; refresh: all), and the step takes each binding of the
run through the selected stages in order. Values live in the ledger: a stage uses what an earlier
stage of the same step produced, else what the ledger holds (assets.batch.BindingInputs).

Each binding gets one check evaluation per run, `conditions`, on the last stage the run selected:
it carries every condition the run judged (model gates G1-G4, UQ coverage, and on the recommendation
every condition for `verified`, so it passes exactly when the recommendation is verified) and WARNs
naming the ones that fail. One evaluation instead of one per condition: each event costs the step
~10-15 ms of SQLite writes (BENCHMARKS.md).

A binding that fails at a stage (bad data, identification, calibration, solve) gets the failure
recorded in the ledger (`binding_failures`) and its `conditions` check failed with ERROR on that
stage's asset; that stage and the later ones are not materialized for it, nothing of the failed
stage is written, and the other bindings go on. The step fails at the end, naming the failed
bindings, after every other binding's materializations and checks are logged.
"""

import warnings
from typing import TypeVar

from dagster import (
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    BackfillPolicy,
    Config,
    Failure,
    MetadataValue,
    PreviewWarning,
    multi_asset,
)
from pydantic import Field

from optimizer_pipeline import plots, whatif
from optimizer_pipeline.assets import calibration, recommendation
from optimizer_pipeline.assets.batch import (
    CONDITIONS_CHECK,
    BindingInputs,
    Check,
    StageEnv,
    StageResult,
    StepReport,
    conditions_check,
    in_ledger_sessions,
    shown,
)
from optimizer_pipeline.assets.partitions import BINDINGS, CALIBRATION_GROUP, RECOMMENDATION_GROUP
from optimizer_pipeline.contracts import Condition, ContractError, SolveResult, StoredBinding
from optimizer_pipeline.ledger import BindingFailure, Ledger, LedgerError, NotFoundError
from optimizer_pipeline.resources.ledger import LedgerResource, SettingsResource
from optimizer_pipeline.resources.solver import SolverResource

T = TypeVar("T")

# (asset, group, description), in data-flow order; run_binding runs them in this order
STAGES: tuple[tuple[str, str, str], ...] = (
    ("plant_history", CALIBRATION_GROUP,
     "Stored plant history of the binding, cleaned, aligned to its sample grid and split by run (the split is "
     "recorded in the ledger)."),
    ("model_artifact", CALIBRATION_GROUP,
     "ARX model identified on the train runs, with its state-space realisation and gates G1-G4."),
    ("uq_block_scores", CALIBRATION_GROUP,
     "Block scores (max |h-step rollout residual| per block and CV, normalised) on val and test runs."),
    ("uq_calibration", CALIBRATION_GROUP,
     "Block-conformal UQ evidence: qhat per CV from val, coverage on test, or the fail-closed reason."),
    ("recommendation", RECOMMENDATION_GROUP,
     "Move plan (or steady-state targets) with status verified / unverified / rejected and its evidence."),
)
STAGE_NAMES = tuple(stage[0] for stage in STAGES)


def _specs() -> tuple[list[AssetSpec], list[AssetCheckSpec]]:
    assets, checks = [], []
    with warnings.catch_warnings():  # partitioned check specs are "preview" in 1.13; measured to work (tests)
        warnings.simplefilter("ignore", PreviewWarning)
        for i, (name, group, description) in enumerate(STAGES):
            assets.append(AssetSpec(name, group_name=group, description=description, partitions_def=BINDINGS,
                                    deps=[STAGE_NAMES[i - 1]] if i else [], skippable=True))
            checks.append(AssetCheckSpec(CONDITIONS_CHECK, asset=name, partitions_def=BINDINGS, description=(
                "Evaluated on the last stage a run selects: every condition the run judged holds (model gates "
                "G1-G4, UQ coverage; on the recommendation every condition for verified), a table of them in "
                "the metadata; WARN naming those that fail. ERROR on the stage that failed, with the reason "
                "(recorded in the ledger).")))
    return assets, checks


ASSET_SPECS, CHECK_SPECS = _specs()
WHATIF_STAGES = ("plant_history", "recommendation")  # what the solve job selects


class StagesConfig(Config):
    """Run config of the binding stages (the launchpad's `ops: binding_stages: config:`); empty for
    the normal runs that sensors, schedules and the CLI launch."""

    whatif: list[str] = Field(
        default=[],
        description="What-if solve (job solve, one binding partition): overrides PATH=VALUE such as "
                    "'cvs.y1.hi=9.8', 'mvs.v1.max_move=0.3', 'cvs.y1.target=none', 'profile.move_weight=0.5'. "
                    "The binding is solved with them in memory and recorded as a what-if run beside its "
                    "recommendation (see the recommendation asset's observations); no new binding revision, "
                    "the open recommendation is neither superseded nor expired.")


@multi_asset(name="binding_stages", specs=ASSET_SPECS, check_specs=CHECK_SPECS, can_subset=True,
             backfill_policy=BackfillPolicy.single_run())
def binding_stages(context: AssetExecutionContext, config: StagesConfig, ledger: LedgerResource,
                   settings: SettingsResource, solver: SolverResource):
    selected = [name for name in STAGE_NAMES if AssetKey(name) in context.selected_asset_keys]
    store = ledger.ledger()
    if config.whatif:
        whatif_step(context, config.whatif, selected, store, settings, solver)
        return
    report, failures = StepReport(), []
    solve = (lambda problem: SolveResult.from_dict(solver.solve(problem))) if "recommendation" in selected else None
    with plots.FigureQueue(len(context.partition_keys)) as figures:
        env = StageEnv(store, settings.get(), figures, solve, context.run.run_id)
        stored = {b.spec.id: b for b in store.list_bindings()}
        with in_ledger_sessions(store, context.partition_keys) as keys:
            for binding_id in keys:
                failure = run_binding(env, stored.get(binding_id), binding_id, selected, report)
                if failure is not None:
                    context.log.error(f"binding {binding_id}: {failure.stage} failed: {failure.message}")
                    failures.append(failure)
        report.log_to(context)
    if "recommendation" in selected:
        context.log.info(f"solver: {solver.stats()}")
    if failures:
        raise Failure(description=failure_summary(failures, len(context.partition_keys)),
                      metadata={"failed_bindings": MetadataValue.json(
                          {f.binding_id: f"{f.stage}: {f.message}" for f in failures})})
    return
    yield  # a generator that yields nothing: the materializations are logged per binding (assets.batch)


def whatif_step(context: AssetExecutionContext, texts: list[str], selected: list[str], store: Ledger,
                settings: SettingsResource, solver: SolverResource) -> None:
    """A what-if run of the solve job: one binding, the overrides checked against its stored spec
    before anything is read or solved (a bad one fails the run with its one-line reason, nothing
    written), then `recommendation.whatif_solve`, logged as an observation of the recommendation
    asset (its materialization, the published recommendation, is left as it is). plant_history is
    not re-run: the what-if starts from the live state the open recommendation was solved from."""
    if "recommendation" not in selected or not set(selected) <= set(WHATIF_STAGES):
        raise Failure(description=f"config whatif is for the solve job; this run selects {', '.join(selected)}")
    keys = context.partition_keys
    if len(keys) != 1:
        raise Failure(description=f"a what-if solves one binding: launch it for one partition (this run covers "
                                  f"{len(keys)})")
    binding_id = keys[0]
    try:
        stored = store.get_binding(binding_id)
        overrides, _ = whatif.whatif_spec(stored.spec, texts)
        with plots.FigureQueue(1) as figures:  # one figure: drawn inline
            env = StageEnv(store, settings.get(), figures,
                           lambda problem: SolveResult.from_dict(solver.solve(problem)), context.run.run_id)
            result = recommendation.whatif_solve(env, BindingInputs(store, stored), overrides)
            metadata = shown(result.metadata)
    except (ContractError, LedgerError, ValueError) as exc:
        raise Failure(description=f"what-if of {binding_id}: {_one_line(exc)}") from None
    context.log_event(AssetObservation(asset_key="recommendation", partition=binding_id, metadata=metadata))
    context.log.info(f"binding {binding_id}: what-if {result.value.run_id} is {result.value.result['status']} "
                     f"({', '.join(repr(t) for t in texts)}); solver: {solver.stats()}")


def run_binding(env: StageEnv, stored: StoredBinding | None, binding_id: str, selected: list[str],
                report: StepReport) -> BindingFailure | None:
    """Take one binding through the selected stages, in data-flow order, each value kept in `inputs`
    for the stages after it. On the first failure: record it in the ledger, report a failed ERROR
    check on that stage, stop this binding; return the failure."""
    if stored is None:
        return _fail(env, report, binding_id, None, selected[0],
                     NotFoundError(f"binding {binding_id!r} is not in the ledger {env.ledger.path}"))
    inputs = BindingInputs(env.ledger, stored)
    judged: list[Condition] = []
    last: StageResult | None = None

    def done(stage: str, result: StageResult[T]) -> T:
        nonlocal judged, last
        report.materialize(stage, binding_id, result.metadata)
        again = {c.name for c in result.conditions}  # the recommendation judges the gates and coverage again
        judged, last = [c for c in judged if c.name not in again] + list(result.conditions), result
        return result.value

    try:
        if (stage := "plant_history") in selected:
            inputs.history = done(stage, calibration.plant_history(env, inputs))
        if (stage := "model_artifact") in selected:
            inputs.model = done(stage, calibration.model_artifact(env, inputs))
        if (stage := "uq_block_scores") in selected:
            inputs.block_scores = done(stage, calibration.uq_block_scores(env, inputs))
        if (stage := "uq_calibration") in selected:
            inputs.evidence = done(stage, calibration.uq_calibration(env, inputs))
        if (stage := "recommendation") in selected:
            done(stage, recommendation.recommendation(env, inputs))
    except Exception as exc:  # noqa: BLE001 - any failure of one binding is recorded and isolated
        return _fail(env, report, binding_id, stored.revision, stage, exc)
    assert last is not None, selected  # a step selects at least one stage
    report.check(conditions_check(selected[-1], binding_id, judged, {
        **last.check_metadata, "stages": MetadataValue.json(selected), "binding_revision": stored.revision}))
    return None


def _fail(env: StageEnv, report: StepReport, binding_id: str, revision: int | None, stage: str,
          exc: Exception) -> BindingFailure:
    message = _one_line(exc)
    failure = env.ledger.record_failure(binding_id, revision, stage, type(exc).__name__, message, env.run_id)
    report.check(Check(stage, binding_id, CONDITIONS_CHECK, False,
                       {"error": type(exc).__name__, "message": message, "failure_id": failure.id},
                       severity=AssetCheckSeverity.ERROR))
    return failure


def _one_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def failure_summary(failures: list[BindingFailure], total: int) -> str:
    """One line: how many bindings failed and, for each, the stage and the reason."""
    return (f"{len(failures)} of {total} binding(s) failed: "
            + "; ".join(f"{f.binding_id} at {f.stage}: {f.message}" for f in failures))
