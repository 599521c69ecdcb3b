"""The stages of one binding as plain functions over the ledger: history -> model -> block scores ->
calibration -> recommendation. The Dagster assets call these, and so can tests and benchmarks.

The ledger is the one store: each stage writes its result there (`prepare_split`, `identify_model`,
`score_and_store`, `calibrate`, `recommend`), and a stage whose input was not produced earlier in
the same call chain loads it from there (`load_split`, `load_artifact`, `load_scores`,
`load_calibration`) by binding, revision and artifact hash. A missing input is a MissingInputError
that names what to run first.
"""

import logging
import os
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Callable, Sequence

import numpy as np

from optimizer_pipeline import uq
from optimizer_pipeline.contracts import (
    BindingSpec,
    Calibration,
    CandidateKind,
    Condition,
    Exclusion,
    HistorySplit,
    ModelArtifact,
    ProblemIR,
    Recommendation,
    RunSeries,
    Scores,
    SolveCandidate,
    SolveResult,
    StoredBinding,
    Template,
    iso_from_seconds,
    iso_utc,
)
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.data.ingest import validate_history_frame
from optimizer_pipeline.data.flags import SPIKE_SIGMAS
from optimizer_pipeline.deployment import WORKER_ENV
from optimizer_pipeline.ledger import Ledger, LedgerError, NewRun, RunStatus, VerdictRecord, new_id
from optimizer_pipeline.model import current_state, identify
from optimizer_pipeline.model.artifact import local_artifact, local_fitter, predicted_run
from optimizer_pipeline.model.window import held_span, held_window
from optimizer_pipeline.model.local import GLOBAL, LOCAL, LocalFitter, OperatingPoint, settle_limit, steady_procedure
from optimizer_pipeline.model.select import finite_or_none
from optimizer_pipeline.model.statespace import MAX_SETTLING_STEPS, integrating_outputs, settling_steps
from optimizer_pipeline.outcomes import model_outcome_condition
from optimizer_pipeline.problem import held_dvs, needs_steady_layer
from optimizer_pipeline.recommend import Decision, EvidenceSnapshot, decide, max_live_age_s
from optimizer_pipeline.recommendation_text import duration
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver.errors import STEADY_STAGE_INFEASIBLE, WORKER_INTERRUPTED, SolverError
from optimizer_pipeline.solver.targets import SteadyLayerError, compile_steered, steady_layer

log = logging.getLogger(__name__)

SPLIT_SEED = 0  # runs are split with a fixed seed so that a recalibration of the same data is reproducible


class MissingInputError(LedgerError):
    """A stage's input is not in the ledger for the binding's current revision (run the stage that makes it)."""


@dataclass(frozen=True)
class SolveRecord:
    run_id: str
    problem: ProblemIR
    result: SolveResult
    recommendation: Recommendation
    chosen: SolveCandidate | None
    conditions: tuple[Condition, ...]  # every condition for `verified`, holding or not
    expired_before: int  # open recommendations expired past valid_until just before this solve


def prepare_split(ledger: Ledger, stored: StoredBinding) -> HistorySplit:
    """Clean and split the binding's stored samples, and record the split in the ledger.

    Stored, not the frames: which samples (ingested up to `samples_through`), the seed and the data
    hash. Cleaning and splitting are deterministic, so `load_split` rebuilds the same runs from the
    same samples, and the hash proves it; storing the cleaned frames would copy every sample."""
    spec = stored.spec
    through = ledger.samples_through(spec.id)
    if through is None:
        raise MissingInputError(f"binding {spec.id}: no plant samples in the ledger; ingest its history first")
    split = _split_of(ledger, stored, through, SPLIT_SEED, ledger.exclusions(spec.id))
    ledger.put_split(spec.id, stored.revision, samples_through=through, seed=SPLIT_SEED, data_hash=split.data_hash,
                     runs={"train": [r.run_id for r in split.train], "val": [r.run_id for r in split.val],
                           "test": [r.run_id for r in split.test]},
                     live_run=split.live.run_id if split.live else None, report=split.report)
    return split


def _split_of(ledger: Ledger, stored: StoredBinding, through: datetime, seed: int,
              exclusions: Sequence[Exclusion]) -> HistorySplit:
    spec = stored.spec
    stored_frame = ledger.history_frame(spec.id, spec.tags, through)
    ledger.let_go()  # cleaning and splitting
    frame = validate_history_frame(stored_frame, spec, f"stored history of {spec.id}")
    return prepare_history(frame, spec, seed=seed, exclusions=exclusions)


def current_split(ledger: Ledger, stored: StoredBinding) -> HistorySplit:
    """Every stored sample of the binding cleaned and split now, recorded nowhere (what plant_history
    would record next)."""
    through = ledger.samples_through(stored.spec.id)
    if through is None:
        raise MissingInputError(f"binding {stored.spec.id}: no plant samples in the ledger; ingest its history first")
    return _split_of(ledger, stored, through, SPLIT_SEED, ledger.exclusions(stored.spec.id))


def load_split(ledger: Ledger, stored: StoredBinding) -> HistorySplit:
    """The split `plant_history` last recorded for this revision, rebuilt from the same samples and the
    exclusions it applied (revoked since or not: a revocation applies from the next split)."""
    spec = stored.spec
    record = ledger.latest_split(spec.id, stored.revision)
    if record is None:
        raise MissingInputError(f"binding {spec.id} revision {stored.revision}: no plant_history in the ledger; "
                                f"materialize plant_history (job recalibrate or refresh) first")
    applied = record.report.get("cleaning", {}).get("settings", {}).get("flags", {}).get("exclusions", [])
    split = _split_of(ledger, stored, record.samples_through, record.seed,
                      [e for e in ledger.all_exclusions(spec.id) if e.exclusion_id in applied])
    if split.data_hash != record.data_hash:
        raise MissingInputError(f"binding {spec.id}: the samples ingested up to {iso_utc(record.samples_through)} no "
                                f"longer give the split {record.id} (data hash differs); materialize plant_history "
                                f"again")
    return split


def identify_model(ledger: Ledger, stored: StoredBinding, split: HistorySplit) -> ModelArtifact:
    ledger.let_go()  # seconds of computation: the other processes need not wait for it
    artifact = identify(split, stored.spec, stored.revision)
    ledger.put_artifact(artifact)
    return artifact


def load_artifact(ledger: Ledger, stored: StoredBinding) -> ModelArtifact:
    """The newest model artifact of the binding's current revision."""
    artifact = ledger.latest_artifact(stored.spec.id, stored.revision)
    if artifact is None:
        raise MissingInputError(f"binding {stored.spec.id} revision {stored.revision}: no model artifact in the "
                                f"ledger; materialize model_artifact (job recalibrate or refresh) first")
    return artifact


def block_rule(binding: BindingSpec, artifact: ModelArtifact) -> tuple[int, str]:
    """Block length h and score of the UQ evidence (docs/ARCHITECTURE.md, UQ evidence rules), what
    the recommendation predicts: a move plan, the largest residual of P-step blocks; a steady target,
    the settled response, scored at the end of blocks as long as the model's settling horizon (a
    model that does not settle within MAX_SETTLING_STEPS gets blocks no run holds: no evidence); both
    by the local procedure when identification chose it (model/local.py)."""
    local = steady_procedure(artifact) == LOCAL
    if binding.profile.template is Template.STEADY_RESPONSE:
        settling = settling_steps(artifact.state_space)
        score = uq.SETTLED_LOCAL if local else uq.SETTLED_RESIDUAL
        return (MAX_SETTLING_STEPS + 1 if settling is None else settling), score
    return artifact.horizon, uq.MAX_RESIDUAL_LOCAL if local else uq.MAX_RESIDUAL


def held_rule(binding: BindingSpec, artifact: ModelArtifact) -> tuple[int, str]:
    """Block length and score of the settled evidence of a move plan with an integrating CV: the residual
    at the end of blocks of twice the plan's horizon (the plan, then its last move held as long: a level
    off balance drifts on, which the P-step band does not see), by the local procedure when
    identification chose it. A plan steered to the steady-state layer ends where the other CVs settle
    too: blocks as long as the model's settling horizon where that is longer (`block_rule`'s steady one)."""
    local = steady_procedure(artifact) == LOCAL
    h = held_span(binding)
    if needs_steady_layer(binding):
        h = max(h, block_rule(steady_layer(binding), artifact)[0])
    return h, uq.SETTLED_LOCAL if local else uq.SETTLED_RESIDUAL


def score_blocks(binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit, held: bool = False) -> Scores:
    """The val and test block scores by `block_rule`; `held`: those of the end of a move plan whose last move
    is held as long again (`held_rule`)."""
    h, score = held_rule(binding, artifact) if held else block_rule(binding, artifact)
    train = artifact_runs(artifact, split, "train") if score in uq.LOCAL_SCORES else ()
    return Scores(*(uq.block_scores(artifact, artifact_runs(artifact, split, segment), h, score, train)
                    for segment in ("val", "test")))


def score_and_store(ledger: Ledger, binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit) -> Scores:
    """Block scores of the val and test runs, written to the ledger in one transaction."""
    ledger.let_go()
    scores = score_blocks(binding, artifact, split)
    with ledger.session():
        for segment, s in (("val", scores.val), ("test", scores.test)):
            ledger.put_block_scores(artifact, uq.rule_key(s.score), segment, s.run_ids.tolist(), s.starts.tolist(),
                                    s.scores)
    return scores


def load_scores(ledger: Ledger, binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit) -> Scores:
    """The block scores stored for the artifact by this version's text of its score rule (uq.rule_key;
    non-overlapping blocks of h steps each) of its own val / test runs (`artifact_runs` of `split`,
    which also names the plant's run each is part of, RunSeries.plant_run): a ledger may hold scores
    of other runs, stored before scores kept to them."""
    (h, score), tags = block_rule(binding, artifact), list(artifact.cv_tags)
    frame = ledger.block_scores(artifact.artifact_hash, uq.rule_key(score))
    if frame.empty:
        raise MissingInputError(f"binding {binding.id}: no block scores of model artifact "
                                f"{artifact.artifact_hash[:12]} by this version's {score} rule in the ledger; "
                                f"materialize uq_block_scores first")

    def segment(name: str) -> uq.BlockScores:
        runs = artifact_runs(artifact, split, name)
        plant_run = {run.run_id: run.plant_run for run in runs}
        rows = frame[(frame["segment"] == name) & frame["run_id"].isin(list(plant_run))]
        # only the (run, block) pairs stored: runs hold different numbers of blocks (a pivot over every
        # pair would add blocks with NaN scores, which the rules read as non-finite scores)
        wide = rows.set_index(["run_id", "block_start", "cv_tag"])["score"].unstack("cv_tag").reindex(columns=tags)
        run_ids = np.asarray(wide.index.get_level_values(0), dtype=object)
        return uq.BlockScores(cv_tags=tuple(tags), h=h, run_ids=run_ids,
                              starts=np.asarray(wide.index.get_level_values(1), dtype=np.int64),
                              scores=wide.to_numpy(float).reshape(len(wide), len(tags)),
                              n_unique_steps=len(wide) * h, n_runs=len({plant_run[r] for r in run_ids}), score=score,
                              run_rows={run.run_id: len(run) for run in runs},
                              rows_before=uq.rows_before_blocks(artifact))

    return Scores(segment("val"), segment("test"))


def calibrate(ledger: Ledger, artifact: ModelArtifact, scores: Scores, settings: Settings,
              now: datetime) -> Calibration:
    """Compute the evidence (docs/ARCHITECTURE.md, UQ evidence rules) and record it in `uq_calibrations`."""
    evidence = uq.compute_block_uq(scores.val, scores.test, alpha=settings.uq_alpha, calibrated_at=iso_utc(now))
    cal_id = ledger.put_calibration(artifact, evidence.to_dict(), has_evidence=evidence.has_evidence,
                                    method=evidence.method, coverage=evidence.coverage,
                                    threshold=evidence.coverage_threshold, reasons=evidence.reasons,
                                    calibrated_at=now)
    return Calibration(cal_id, artifact.artifact_hash, evidence)


def load_calibration(ledger: Ledger, artifact: ModelArtifact) -> Calibration:
    """The newest calibration of the artifact."""
    record = ledger.latest_calibration(artifact.binding_id, artifact_hash=artifact.artifact_hash)
    if record is None:
        raise MissingInputError(f"binding {artifact.binding_id}: model artifact {artifact.artifact_hash[:12]} has no "
                                f"calibration in the ledger; materialize uq_calibration (job recalibrate) first")
    return Calibration(record.id, record.artifact_hash, uq.UQEvidence.from_dict(record.evidence))


def evidence_snapshot(calibration: Calibration, artifact: ModelArtifact, u_now: np.ndarray, y_now: np.ndarray,
                      source: str, settings: Settings, now: datetime, live_t: float | None = None) -> EvidenceSnapshot:
    """What the decision is judged on: the calibration's evidence and the live state (current values
    u_now / y_now, engineering units; live_t its time in seconds since the epoch, None = unknown)."""
    evidence = calibration.evidence
    known = live_t is not None and np.isfinite(live_t)
    return EvidenceSnapshot(
        source=source, has_evidence=evidence.has_evidence, uq=evidence.to_dict(),
        uq_checks=tuple(uq.gate_checks(evidence, settings.uq_gate)), calibrated_at=evidence.calibrated_at,
        calibration_fresh=uq.is_fresh(evidence.calibrated_at, now, settings.uq_fresh_days),
        fresh_days=settings.uq_fresh_days, input_distance=uq.input_distance(artifact, u_now, y_now),
        live_sample_at=iso_from_seconds(live_t) if known else None,
        live_age_s=now.timestamp() - float(live_t) if known else None,
        live_max_age_s=max_live_age_s(settings.live_max_age_s, artifact.sample_period_s),
        live_values={"mvs": _by_tag(artifact.mv_tags, u_now), "cvs": _by_tag(artifact.cv_tags, y_now)})


def _by_tag(tags: Sequence[str], values: np.ndarray) -> dict[str, float | None]:
    """{tag: value} as plain JSON numbers (None for a value that is not finite)."""
    return {tag: finite_or_none(v) for tag, v in zip(tags, np.asarray(values, float))}


def live_run(artifact: ModelArtifact, run: RunSeries, allowed: int) -> tuple[RunSeries, int]:
    """The live state's run and how many of its newest rows had CV values missing: cleaning holds them in
    place (RunSeries.newest_unmeasured); up to `allowed` (the setting live.predict_missing) are replaced
    by the model's prediction (model.predicted_run), as commercial APC rides through a few bad reads;
    more are cut, and the state is the newest measured one (`newest_sample` fails, naming them)."""
    count = run.newest_unmeasured
    if count == 0:
        return run, 0
    if count <= allowed:
        return predicted_run(artifact, run), count
    return run.first(len(run) - count), count


def live_window(artifact: ModelArtifact, live: RunSeries, predicted: int) -> list[Condition]:
    """Reported, never refused: the CV values the live state's disturbance fit left out (model.arx.state_and_bias)
    among the rows it reads (the held disturbance's window and the state's lags), filled in by cleaning
    across a short gap of missing or flagged samples; the newest, predicted ones are `newest_sample`'s."""
    if live.unmeasured is None:
        return []
    rows = uq.rows_before_blocks(artifact) + 1  # the state's lags and the held disturbance's window, then now
    window = live.unmeasured[max(len(live) - predicted - rows, 0):len(live) - predicted]
    counts = [f"{tag}: {int(n)}" for tag, n in zip(artifact.cv_tags, window.sum(axis=0)) if n]
    return [Condition("live window's CV samples measured", f"{', '.join(counts)} of {len(window)} filled in",
                      "a value filled in is left out of the disturbance fit", True)] if counts else []


def newest_sample(split: HistorySplit, predicted: int = 0, allowed: int = 0) -> list[Condition]:
    """The live state is the history's newest sample: when cleaning dropped the newest samples (e.g.
    the edge of a fast transient flagged by the outlier filter), the plan would start from an older
    state and an older MV, and its first move could break the rate limit from the MV the plant holds
    now (data.prepare_history's live_tail_dropped). And the newest sample has a value of every MV and
    CV (live_missing; one rule for a value missing from a file or refused by its source as bad: never
    plan from a state not measured), or its missing CVs were predicted: `predicted` newest rows had CV
    values missing, `allowed` of them may be predicted (`live_run`). Not judged for a split without
    those records."""
    missing = split.report.get("live_missing")
    cvs_only = bool(missing) and predicted > 0  # cleaning holds a newest row only where every MV and DV is there
    rode = cvs_only and predicted <= allowed
    rule = f"live.predict_missing allows {allowed} newest sample(s) predicted"
    value = "all there" if not missing else f"no value of {', '.join(missing)}" + \
        (f", predicted by the model ({predicted} of {allowed} allowed)" if rode else "")
    found = [] if missing is None else [Condition(
        "newest sample has every MV and CV", value, f"a value of every MV and CV ({rule})", not missing or rode,
        f"the newest sample has no value of {', '.join(missing or ())} (missing, or refused as bad by its source"
        + (f"; {predicted} newest sample(s) of a CV missing, {rule}" if cvs_only else "")
        + "): the plan would start from a state not measured")]
    found += flagged_newest(split.report.get("live_flagged"))
    if "live_tail_dropped" not in split.report:
        return found
    behind, warming = split.report["live_behind_s"], split.report.get("live_warming_up")
    if warming:  # the newest samples since a gap are fewer than the model's window
        return found + [Condition(
            "live state is the newest sample", f"warming up: {warming['samples']} of {warming['needed']} samples",
            "within half a sample period", False,
            f"warming up: {warming['samples']} of {warming['needed']} samples since "
            f"{iso_from_seconds(warming['since'])} (after a gap, a live state needs the model's window; until then "
            f"it is the one before the gap, {duration(behind)} older than the newest sample)")]
    return found + [Condition("live state is the newest sample", f"{duration(behind)} behind the newest sample",
                              "within half a sample period", not split.report["live_tail_dropped"],
                              f"the live state is {duration(behind)} older than the history's newest sample (the "
                              f"newest samples were dropped in cleaning)")]


def flagged_newest(flagged: dict[str, str] | None) -> list[Condition]:
    """The newest sample's MV and CV values are data (the split's live_flagged, data/clean.py): one a rule
    flags, or a CV's off its trend (a spike or a step), makes the recommendation unverified at once,
    naming the tag and the rule; the next samples judge it again. Not judged for a split without that
    record."""
    if flagged is None:
        return []
    text = ", ".join(f"{tag}: {rule}" for tag, rule in flagged.items())
    return [Condition("newest sample not flagged", text or "none", "no newest MV or CV value flagged (data/flags.py)",
                      not flagged, f"the newest sample's value of {text} is flagged (a jump: more than "
                      f"{SPIKE_SIGMAS:g} noise sigmas off the CV's trend, a spike or a step the next samples tell "
                      f"apart): the plan would start from a value that may be a glitch" if flagged else "")]


def score_rule_condition(evidence: uq.UQEvidence) -> list[Condition]:
    """The calibration was scored by this version's rule for its score (uq.SCORE_RULES): evidence from
    an older rule (e.g. stored before an upgrade changed what a block score measures) does not claim
    what the band now means. Not judged without evidence (its own condition fails)."""
    if not evidence.has_evidence:
        return []
    score = evidence.score or uq.MAX_RESIDUAL  # unnamed scores predate the named rules
    recorded = evidence.score_rule if evidence.score is not None else None
    current = uq.rule_text(score) if score in uq.SCORE_RULES else None
    return [Condition("calibration scored by this version's rule", f"{score}, rule {uq.rule_digest(recorded)}",
                      f"{score}, rule {uq.rule_digest(current)}", recorded is not None and recorded == current,
                      f"the calibration was scored by an older {score} rule than this version's: run the "
                      f"recalibrate job")]


def _planned_end(result: SolveResult, steps: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The MVs and CVs (engineering units) of the first solve's nominal plan at step `steps` (or its last,
    when shorter: a steady target's single row, its MVs and settled CVs); None when it has none (the
    solve failed: that result is decided as it is)."""
    nominal = [c for c in result.candidates if c.kind is CandidateKind.NOMINAL and c.controls]
    if not result.ok or not nominal:
        return None
    row = min(steps, len(nominal[0].controls)) - 1
    return np.asarray(nominal[0].controls[row], float), np.asarray(nominal[0].predicted[row], float)


def _local_model(binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit,
                 end: tuple[np.ndarray, np.ndarray],
                 fitter: LocalFitter | None) -> tuple[ModelArtifact, OperatingPoint, dict]:
    """The artifact refitted (model/local.py) at the region of the point midway between the live state
    and the first solve's plan at its P-th step (a steady target: the target) on the artifact's own
    train runs (`fitter`: their regression, when the caller made it already: it keeps its regions'
    refits), or the artifact itself when the refit is refused as the evidence's blocks fall back; the
    region's centre; and what the run records of it."""
    live, norm = split.live, artifact.normalisation
    mvs, cvs = artifact.mv_tags, artifact.cv_tags
    fitter = local_fitter(artifact, artifact_runs(artifact, split, "train")) if fitter is None else fitter
    point = fitter.region(OperatingPoint.of_move(norm.normalise(mvs, live.u[-1]), norm.normalise(cvs, live.y[-1]),
                                                 norm.normalise(mvs, end[0]), norm.normalise(cvs, end[1])))
    local, record = local_artifact(artifact, binding, fitter, point, settle_limit(artifact.state_space))
    return (artifact if local is None else local), point, {**record, "first_target": end[0].tolist(),
                                                           "first_settled": end[1].tolist()}


def artifact_runs(artifact: ModelArtifact, split: HistorySplit, segment: str) -> tuple[RunSeries, ...]:
    """The artifact's own `segment` runs ("train", "val" or "test": the split it was identified on),
    from a later split of the same history. A run that has ended never changes, but the split of the
    runs may, when a new run arrives: a refit trains on the model's train runs, and a model's evidence
    is scored on the runs its fit held out, never on one it was fitted on. The later split's own runs
    for an artifact that records no split (a benchmark's reference fit). MissingInputError when one
    is gone (the binding's history was replaced): identify again."""
    if not any(artifact.splits.get(name) for name in ("train", "val", "test")):
        return tuple(getattr(split, segment))
    wanted = tuple(artifact.splits.get(segment, ()))
    runs = {run.run_id: run for run in (*split.train, *split.val, *split.test)}
    missing = [run_id for run_id in wanted if run_id not in runs]
    if missing:
        raise MissingInputError(f"binding {artifact.binding_id}: the model's {segment} run(s) {', '.join(missing)} "
                                f"are not in the history; materialize model_artifact (job refresh) again")
    return tuple(runs[run_id] for run_id in wanted)


@dataclass(frozen=True)
class Solved:
    """One solve of a binding spec from the live state, decided but not yet recorded: the run row to
    write, the compiled problem, the solver's result and the decision (recommendation + conditions)."""

    run: NewRun
    problem: ProblemIR
    result: SolveResult
    decision: Decision


def settled_evidence(binding: BindingSpec, artifact: ModelArtifact, split: HistorySplit, settings: Settings,
                     now: datetime) -> tuple[uq.UQEvidence | None, list[Condition]]:
    """The evidence of the settled response a move plan ends on, and its condition, for a steered plan
    (its steady-state layer, solver/targets.py) and for a plan solved with a local refit (model/local.py).

    The layer is a steady target: its robust CV limits need the band of the settled response (the
    steady template's evidence, `block_rule`), not the plan's P-step band, which says nothing about
    where the plant settles after P. A refit's P-step band says as little of where its plan settles:
    the refit is centred on each block's own path, so the band against the improvement holds the
    plan's end to the wider of the two (recommend.decide); this one is the local procedure's settled
    error (its refits centred on each settled block's end, the live plan's on its P-th step), not a
    calibration of that exact plan. A plan with an integrating CV (a level) ends balanced (solver/mpc.py),
    but a balance the model gets wrong leaves the level drifting: its settled evidence scores the end of
    blocks of the plan and as long again (`held_rule`). Scored here on the split's
    val / test runs and gated like any evidence; not recorded as a calibration of its own. Without it
    (too few settled blocks, or a failed gate) the layer falls back on the plan's band and the
    condition fails, naming why: the recommendation is not `verified`. Nothing for a steady target or
    a plan of the identified model that is not steered."""
    steered, ramps = needs_steady_layer(binding), bool(integrating_outputs(artifact.state_space).any())
    if binding.profile.template is Template.STEADY_RESPONSE or not (steered or ramps or
                                                                     steady_procedure(artifact) == LOCAL):
        return None, []
    scores = score_blocks(binding, artifact, split, held=True) if ramps else \
        score_blocks(steady_layer(binding), artifact, split)
    evidence = uq.compute_block_uq(scores.val, scores.test, alpha=settings.uq_alpha, calibrated_at=iso_utc(now))
    failures = uq.gate_failures(evidence, settings.uq_gate)
    name = "settled evidence of the steady-state target" if steered else "settled evidence of the plan's end"
    limit = "UQ gate on the settled response"
    if failures:
        what = ("the steady-state target the plan steers to" if steered else
                f"the end of the plan, its last move held {binding.profile.horizon} samples (an integrating CV's)"
                if ramps else "the end of the plan (a local refit's)")
        return None, [Condition(name, "none" if not evidence.has_evidence else f"coverage {evidence.coverage:.3g}",
                                limit, False, f"{what} has no settled evidence: " + "; ".join(failures))]
    return evidence, [Condition(name, f"coverage {evidence.coverage:.3g}", limit, True)]


Settled = tuple[uq.UQEvidence | None, list[Condition]]


def solve_and_decide(binding: BindingSpec, stored: StoredBinding, artifact: ModelArtifact, split: HistorySplit,
                     calibration: Calibration, solve: Callable[[ProblemIR], SolveResult], settings: Settings,
                     source: str, now: datetime, *, outcomes: Sequence[VerdictRecord],
                     settled: Settled | None = None, fitter: LocalFitter | None = None) -> Solved:
    """Compile `binding` (the stored spec, or a what-if's overridden copy of it) from the live state
    with the revision's model and calibration, solve it, verify and decide; writes nothing.
    `outcomes`: the binding's judged outcomes (Ledger.list_verdicts), whose verdicts on this model the
    decision's outcome condition judges (outcomes.model_outcome_condition). `settled`: what
    `settled_evidence` gives for this binding, model, split and settings, when the caller computed it
    already (the live service, once per calibration: it scores the val / test runs, which new live
    samples do not change); `fitter`, likewise, the local refit's regression on the artifact's train
    runs (model.artifact.local_fitter), for an artifact whose steady procedure is local."""
    if split.live is None:
        raise ValueError(f"binding {binding.id}: no live run in the history, so there is no current state")
    live, predicted = live_run(artifact, split.live, settings.live_predict_missing)
    split = replace(split, live=live)
    evidence = calibration.evidence
    band = np.asarray(evidence.qhat) if evidence.has_evidence else None
    settled, settled_conditions = settled_evidence(binding, artifact, split, settings, now) if settled is None \
        else settled
    layer_band = np.asarray(settled.qhat) if settled is not None and needs_steady_layer(binding) else None
    ramping = bool(integrating_outputs(artifact.state_space).any())
    run_id = new_id("or")
    d_held = held_dvs(live.d, held_window(artifact))  # the DVs' current level, not one noisy sample

    def compile_and_solve(model: ModelArtifact, x0: np.ndarray, bias: np.ndarray) -> tuple[ProblemIR, SolveResult]:
        """A problem names the identified artifact, also when a local refit of it is its model."""
        try:
            problem = compile_steered(binding, model, x0, bias, live.u[-1], d_held, band, layer_band,
                                      artifact.artifact_hash)
        except SteadyLayerError as exc:  # recorded like a failed solve: the stage's problem, a rejected recommendation
            log.warning("binding %s: %s", binding.id, exc)
            stage = exc.problem
            return stage, SolveResult(stage.hash, ok=False, candidates=exc.result.candidates,
                                      diagnostics=exc.result.diagnostics, error_code=STEADY_STAGE_INFEASIBLE,
                                      error_message=str(exc))
        try:
            return problem, solve(problem)
        except SolverError as exc:  # recorded as a failed run with a rejected recommendation, not lost
            log.warning("binding %s: solve failed: %s", binding.id, exc)
            return problem, SolveResult(problem.hash, ok=False, candidates=(), diagnostics={}, error_code=exc.code,
                                        error_message=exc.message)

    problem, result = compile_and_solve(artifact, *current_state(artifact, live))
    decided_with, local = artifact, None
    agrees = model_outcome_condition(artifact, outcomes)
    if steady_procedure(artifact) == LOCAL:
        end = _planned_end(result, artifact.horizon)  # a move plan's P-th step: where its band's claim ends
        if end is not None and not agrees.holds:  # a refit weighs the train rows of a plant that has changed
            local = {"procedure": GLOBAL, "refused": agrees.reason}
        elif end is not None:  # solved again, with the model refitted midway to it (model/local.py)
            decided_with, point, local = _local_model(binding, artifact, split, end, fitter)
            if decided_with is not artifact:  # else the refit was refused: the first solve stands
                problem, result = compile_and_solve(decided_with,
                                                    *current_state(decided_with, live, (artifact, point)))
    snapshot = evidence_snapshot(calibration, artifact, live.u[-1], live.y[-1], source, settings, now, float(live.t[-1]))
    consistency = [
        Condition("model from the binding's revision", f"r{artifact.binding_revision}", f"r{stored.revision}",
                  artifact.binding_revision == stored.revision,
                  f"model artifact is from binding revision {artifact.binding_revision}, "
                  f"the binding is at revision {stored.revision}"),
        Condition("calibration of this model", calibration.artifact_hash[:12], artifact.artifact_hash[:12],
                  calibration.artifact_hash == artifact.artifact_hash, "calibration belongs to another model artifact"),
        *score_rule_condition(evidence), *newest_sample(split, predicted, settings.live_predict_missing),
        *live_window(artifact, live, predicted), *settled_conditions, agrees]
    decision = decide(binding, stored.revision, artifact, problem, result, snapshot,
                      uq.band_engineering(evidence, artifact), settings.uq_max_input_distance, run_id, now,
                      extra_conditions=consistency, max_band_fraction=settings.uq_max_band_fraction,
                      steady_gain=decided_with.steady_gain,
                      end_band=None if settled is None else uq.band_engineering(settled, artifact),
                      end_step=settled.block_length if settled is not None and ramping else None)
    run = NewRun(binding.id, stored.revision, binding.profile.id, binding.profile.version, problem.hash,
                 {"live_run": live.run_id, "live_t": float(live.t[-1]), "calibration_id": calibration.calibration_id,
                  "model_artifact_hash": artifact.artifact_hash, "evidence_source": source,
                  "worker": os.environ.get(WORKER_ENV, "local"),
                  **({"steady_model": local} if local is not None else {})},
                 problem, id=run_id, started_at=now)
    return Solved(run, problem, result, decision)


def recommend(stored: StoredBinding, artifact: ModelArtifact, split: HistorySplit, calibration: Calibration,
              solve: Callable[[ProblemIR], SolveResult], ledger: Ledger, settings: Settings, source: str,
              now: datetime) -> SolveRecord:
    """Compile the problem from the live state, solve it, decide the status and write run +
    candidates + recommendation in one ledger transaction (superseding the open one)."""
    binding = stored.spec
    expired, reconciled = ledger.housekeeping(stale_after_s=settings.solver_request_timeout_ms / 1000, now=now)
    if reconciled:
        log.warning("closed %d run(s) left running by a writer that died as interrupted", reconciled)
    verdicts = ledger.list_verdicts(binding.id)
    ledger.let_go()  # the solve (and the verifier) need no ledger
    solved = solve_and_decide(binding, stored, artifact, split, calibration, solve, settings, source, now,
                              outcomes=verdicts)
    ledger.record_solve(**solve_record(solved, artifact))
    rec = solved.decision.recommendation
    log.info("binding %s: recommendation %s is %s", binding.id, rec.id, rec.status.value)
    return SolveRecord(solved.run.id, solved.problem, solved.result, rec, solved.decision.chosen,
                       solved.decision.conditions, expired)


def solve_record(solved: Solved, artifact: ModelArtifact) -> dict:
    """What the ledger records of a solve (the arguments of Ledger.record_solve): the run, its
    candidates and the recommendation, the run's end status and the chosen candidate's cost."""
    result, rec, chosen = solved.result, solved.decision.recommendation, solved.decision.chosen
    return {"run": solved.run, "candidates": result.candidates, "model_id": artifact.artifact_hash,
            "recommendation": rec, "run_status": run_status(result),
            "independent_cost": None if chosen is None else chosen.independent_cost,
            "diagnostics": dict(result.diagnostics, error_code=result.error_code, error_message=result.error_message),
            "evidence_source": rec.evidence["source"]}


def run_status(result: SolveResult) -> str:
    """A solve whose worker died is `interrupted` (never replayed); other errors `failed`."""
    if result.ok:
        return RunStatus.SUCCEEDED.value
    return (RunStatus.INTERRUPTED if result.error_code == WORKER_INTERRUPTED else RunStatus.FAILED).value
