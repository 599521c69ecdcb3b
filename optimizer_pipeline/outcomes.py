"""Outcomes (docs/ARCHITECTURE.md, "Outcome verdicts"): what the plant did after a recommendation was applied, compared
with what it predicted — alignment, deltas, band hits, the verdict, and the drift rule over recent
outcomes of a binding.

Time convention (docs/ARCHITECTURE.md, "Recommendation JSON"): the plan starts at `applied_at`; `controls[k]` is
held from applied_at + k*T to applied_at + (k+1)*T and `predicted[k]` is the CV at the end of step k,
t_k = applied_at + (k+1)*T, with T the binding's sample period (s). Everything is in engineering units.

Alignment rule: the observed value of a CV at t_k is the sample nearest to t_k within half a period
(a tie goes to the earlier sample); no such finite sample -> the step is not aligned for that CV.
Nearest, not interpolation: it never invents a value, and it is what snapping history onto the sample
grid does (data.clean), so an observed step means the same as a calibration step.

Verdict rule (`linear_mpc_quadratic@1`): the band is calibrated for blocks of P steps (P = the
calibration's block length = the artifact's training horizon), so only the steps k < min(P, N) are
judged; later steps are reported but never judged (the band makes no promise there). Each aligned
(step, CV) pair is one trial, a hit when |delta| <= band. The calibration promises per trial a hit
probability of at least p0 = min(1 - alpha, measured test coverage): a block is covered when all of
its steps are inside, so every single step is inside at least as often. One-sided binomial test of
H0 "hit rate >= p0": p = P(X <= hits | trials, p0); `deviated` when p < 0.01, else `confirmed`;
`inconclusive` without a band (no UQ evidence) or with fewer than min(P, N, 5) fully aligned steps.
Steps of one trajectory are correlated, so the test is a screen, not an exact level-0.01 test; the
exact calibration event (every judged step inside: `block_covered`) is reported beside it.

Steady-state rule (`steady_response@1`, one predicted row = the settled CV): the plant is taken as
settled `settle_steps` after applied_at, from the artifact's model: its ARX lag plus the steps the
slowest mode needs to decay to 1 % (spectral radius rho: ceil(ln 0.01 / ln rho)). Every aligned grid
step from there to the end of the file is one trial against predicted[0] (same test, same p0); fewer
than 5 settled steps, an unstable model or no band -> `inconclusive`.

Drift rule (`drift_finding`), over the evaluated outcomes of a binding under its current calibration:
`deviated` in >= 2 of the last 3 conclusive verdicts, or the pooled hits of the last 10 conclusive
outcomes significantly below p0 (same one-sided binomial test at 0.01). The same rule over the
outcomes of the recommendations solved with one model, whatever its calibration, is a condition for
`verified` (`model_outcome_condition`).
"""

import dataclasses
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import (
    BindingSpec,
    Condition,
    ContractError,
    ModelArtifact,
    Outcome,
    OutcomeVerdict,
    ProblemIR,
    RecommendationStatus,
    StateSpace,
    Template,
    content_hash,
    iso_from_seconds,
    iso_utc,
    parse_iso_utc,
)
from optimizer_pipeline.data.ingest import read_history
from optimizer_pipeline.ledger import Ledger, NotFoundError, RecommendationRecord, VerdictRecord, new_id
from optimizer_pipeline.model.arx import Orders, spectral_radius
from optimizer_pipeline.model.statespace import integrating_outputs

log = logging.getLogger(__name__)

SIGNIFICANCE = 0.01  # one-sided binomial test level for `deviated` and for the drift rate rule
MIN_STEPS = 5  # fewer fully aligned judged steps than min(P, N, MIN_STEPS) -> inconclusive
SETTLE_FRACTION = 0.01  # steady template: settled when the slowest model mode has decayed to 1 %
DRIFT_RECENT = 3  # drift: look at the last 3 conclusive verdicts ...
DRIFT_DEVIATED = 2  # ... and fire when at least 2 of them are `deviated`
DRIFT_WINDOW = 10  # drift rate rule: pooled hits of the last 10 conclusive outcomes
EVALUATION_SUFFIX = "-eval"  # id of the row evaluating a pending observation: <pending id>-eval


class OutcomeError(ContractError):
    """An outcome that cannot be recorded (unknown / rejected / expired recommendation, bad time)."""


# --------------------------------------------------------------------------- observation


@dataclass(frozen=True, eq=False)
class Observation:
    """Observed plant samples: t (n,) seconds since epoch, ascending; values (n, len(tags)) engineering
    units, NaN where a tag has no sample; tags = the binding's MVs, CVs, DVs; run_ids as read."""

    t: np.ndarray
    tags: tuple[str, ...]
    values: np.ndarray
    run_ids: tuple[str, ...]
    source: str

    @staticmethod
    def from_frame(frame: pd.DataFrame, binding: BindingSpec, source: str) -> "Observation":
        """From a validated history frame (data.read_history); samples of every run, ordered by time."""
        ordered = frame.sort_values("timestamp", kind="stable")
        return Observation(t=ordered["timestamp"].to_numpy(float), tags=binding.tags,
                           values=ordered[list(binding.tags)].to_numpy(float),
                           run_ids=tuple(dict.fromkeys(str(r) for r in frame["run_id"])), source=source)

    def column(self, tags: Sequence[str]) -> np.ndarray:
        index = {tag: i for i, tag in enumerate(self.tags)}
        return self.values[:, [index[tag] for tag in tags]]

    def since(self, t0: float) -> "Observation":
        keep = self.t >= t0
        return Observation(self.t[keep], self.tags, self.values[keep], self.run_ids, self.source)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (missing values as null) for `optimizer_outcomes.observed`."""
        return {"source": self.source, "run_ids": list(self.run_ids), "t": self.t.tolist(),
                "values": {tag: [None if math.isnan(v) else float(v) for v in self.values[:, i]]
                           for i, tag in enumerate(self.tags)}}

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "Observation":
        tags = tuple(doc["values"])
        values = np.array([[np.nan if v is None else v for v in doc["values"][tag]] for tag in tags], float)
        return Observation(np.asarray(doc["t"], float), tags, values.T.reshape(len(doc["t"]), len(tags)),
                           tuple(doc.get("run_ids", ())), doc.get("source", ""))


def nearest_samples(t: np.ndarray, values: np.ndarray, times: np.ndarray, period_s: float) -> np.ndarray:
    """Values (n, m) sampled at t (n,) ascending, read at `times` (k,): the nearest finite sample per
    column within period_s / 2 (tie -> the earlier one), NaN where there is none. Returns (k, m)."""
    out = np.full((len(times), values.shape[1]), np.nan)
    half = period_s / 2 * (1 + 1e-9)  # a sample exactly half a period away still counts
    for j in range(values.shape[1]):
        finite = np.isfinite(values[:, j])
        ts, vs = t[finite], values[finite, j]
        if ts.size == 0:
            continue
        right = np.clip(np.searchsorted(ts, times), 0, ts.size - 1)
        left = np.clip(right - 1, 0, ts.size - 1)
        pick = np.where(np.abs(ts[left] - times) <= np.abs(ts[right] - times), left, right)
        near = np.abs(ts[pick] - times) <= half
        out[near, j] = vs[pick[near]]
    return out


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Evaluation:
    """The verdict of one observation and the documents stored with it (`delta`, `details`)."""

    verdict: OutcomeVerdict
    delta: Mapping[str, Any]
    details: Mapping[str, Any]


def hit_rate_p_value(hits: int, trials: int, promised: float) -> float:
    """One-sided binomial p-value of H0 "hit probability >= promised": P(X <= hits), X ~ Bin(trials, promised)."""
    from scipy import stats  # here, not at the top: ~0.6 s of import every Dagster process paid at load

    return float(stats.binom.cdf(hits, trials, promised)) if trials else 1.0


def promised_rate(uq: Mapping[str, Any] | None) -> float | None:
    """p0 = min(1 - alpha, measured test coverage) of the recommendation's UQ evidence; None without evidence."""
    if not uq or uq.get("method") is None:
        return None
    coverage = uq.get("coverage")
    return float(min(1.0 - float(uq["alpha"]), 1.0 if coverage is None else float(coverage)))


def settle_steps(artifact: ModelArtifact, solved_with: StateSpace | None = None) -> int | None:
    """Steps until the model has settled (see the module's steady-state rule); None when it is unstable or
    integrates (a level has no settled value: statespace.integrating_outputs).
    `solved_with`: the model the recommendation's problem held when it is not the artifact's own (a
    steady target's local refit, model/local.py; same orders)."""
    model = artifact.state_space if solved_with is None else solved_with
    rho = spectral_radius(model)
    if not rho < 1.0 or integrating_outputs(model).any():
        return None
    lag = Orders(artifact.na, artifact.nb, artifact.delay).max_lag
    return lag if rho < 1e-12 else lag + math.ceil(math.log(SETTLE_FRACTION) / math.log(rho))


def _rows(array: np.ndarray) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in array]


def evaluate(rec: Mapping[str, Any], observation: Observation, applied_at_s: float, period_s: float,
             settle: int | None = None) -> Evaluation:
    """Judge an observation of a recommendation (its recommendation JSON: template, mv_tags, cv_tags,
    controls (N, nu), predicted (N, ny), band (ny,), evidence.uq) applied at `applied_at_s` (s since
    epoch) on a grid of `period_s` seconds. `settle` (steps) is required for steady_response@1 only.
    The rules are the module docstring's."""
    cv_tags, mv_tags = list(rec["cv_tags"]), list(rec["mv_tags"])
    predicted = np.asarray(rec["predicted"], float).reshape(-1, len(cv_tags))
    controls = np.asarray(rec["controls"], float).reshape(-1, len(mv_tags))
    uq = (rec.get("evidence") or {}).get("uq")
    band_list = list(rec.get("band") or [])
    has_band = len(band_list) == len(cv_tags) and all(b is not None for b in band_list)
    band = np.asarray([b if b is not None else np.nan for b in band_list] or [np.nan] * len(cv_tags), float)
    promised = promised_rate(uq)
    steady = rec["template"] == Template.STEADY_RESPONSE.value
    y_obs = observation.column(cv_tags)
    n_plan = predicted.shape[0]

    if steady:
        last = int(np.floor((observation.t[-1] - applied_at_s) / period_s + 0.5)) if observation.t.size else -1
        first = settle if settle is not None else last + 1
        steps = np.arange(first, max(first, last + 1))
        times = applied_at_s + steps * period_s
        reference = np.repeat(predicted[:1], len(steps), axis=0)
        judged = np.ones(len(steps), bool)
        required = MIN_STEPS
    else:
        steps = np.arange(n_plan)
        times = applied_at_s + (steps + 1) * period_s
        reference = predicted
        horizon = int(uq["block_length"]) if uq else n_plan
        judged = steps < min(horizon, n_plan)
        required = min(horizon, n_plan, MIN_STEPS)

    observed = nearest_samples(observation.t, y_obs, times, period_s)
    delta = observed - reference
    aligned = np.isfinite(delta)
    inside = np.where(aligned, np.abs(delta) <= band, False) if has_band else np.zeros_like(aligned)
    trial = aligned & judged[:, None]
    trials, hits = int(trial.sum()), int((inside & trial).sum())
    steps_aligned = int((aligned.all(axis=1) & judged).sum())
    complete = bool(judged.any() and aligned[judged].all())
    missed = bool(has_band and (trial & ~inside).any())
    block_covered = None if steady or not has_band else (False if missed else (True if complete else None))

    if not has_band or promised is None:
        verdict, p_value = OutcomeVerdict.INCONCLUSIVE, None
        reason = "the recommendation has no UQ band (no calibration evidence): nothing to judge against"
    elif steady and settle is None:
        verdict, p_value = OutcomeVerdict.INCONCLUSIVE, None
        reason = "the model is not stable, so it never settles: no settled observation to compare"
    elif steps_aligned < required:
        verdict, p_value = OutcomeVerdict.INCONCLUSIVE, None
        where = f"settled steps (from step {settle})" if steady else f"steps within the first {int(judged.sum())}"
        reason = f"{steps_aligned} aligned {where}; at least {required} are needed"
    else:
        p_value = hit_rate_p_value(hits, trials, promised)
        verdict = OutcomeVerdict.DEVIATED if p_value < SIGNIFICANCE else OutcomeVerdict.CONFIRMED
        reason = (f"{hits} of {trials} judged CV steps inside the band; promised rate {promised:.3f}, "
                  f"one-sided binomial p = {p_value:.3g} ({'<' if p_value < SIGNIFICANCE else '>='} {SIGNIFICANCE})")

    # Did the operator follow the plan? u held during step k is the sample at applied_at + k*T; the
    # steady target is held from applied_at to the end of the observation.
    u_plan = controls if not steady else np.repeat(controls[:1], max(last + 1, 1), axis=0)
    u_times = applied_at_s + np.arange(u_plan.shape[0]) * period_s
    u_obs = nearest_samples(observation.t, observation.column(mv_tags), u_times, period_s)
    mv_dev = np.abs(u_obs - u_plan)

    def per_tag(tags: Sequence[str], values: np.ndarray) -> dict[str, float | None]:
        return {tag: (float(np.max(values[:, j][np.isfinite(values[:, j])]))
                      if np.isfinite(values[:, j]).any() else None) for j, tag in enumerate(tags)}

    details = {
        "template": rec["template"], "rule": "steady_settled" if steady else "mpc_within_P",
        "verdict_reason": reason, "applied_at": iso_from_seconds(applied_at_s),
        "period_s": period_s, "judged_steps": int(judged.sum()), "steps_aligned": steps_aligned,
        "steps_required": required, "trials": trials, "hits": hits,
        "inside_share": None if not trials or not has_band else hits / trials,
        "inside_share_all_steps": None if not has_band or not aligned.any() else float(inside[aligned].mean()),
        "promised_rate": promised, "alpha": None if not uq else uq.get("alpha"), "p_value": p_value,
        "significance": SIGNIFICANCE, "block_covered": block_covered, "settle_steps": settle if steady else None,
        "calibrated_at": None if not uq else uq.get("calibrated_at"),
        "band": dict(zip(cv_tags, band_list)) if has_band else None,
        "max_abs_delta": per_tag(cv_tags, np.abs(np.where(judged[:, None], delta, np.nan))),
        "mv_max_abs_deviation_from_plan": per_tag(mv_tags, mv_dev),
    }
    delta_doc = {"cv_tags": cv_tags, "steps": steps.tolist(), "t": times.tolist(),
                 "observed": _rows(observed), "predicted": _rows(reference), "delta": _rows(delta),
                 "inside": [[bool(i) if a else None for i, a in zip(ri, ra)] for ri, ra in zip(inside, aligned)],
                 "judged": judged.tolist()}
    log.info("outcome of %s: %s (%s)", rec.get("id"), verdict.value, reason)
    return Evaluation(verdict, delta_doc, details)


# --------------------------------------------------------------------------- recording


def refuse_rejected(rec_row: RecommendationRecord) -> None:
    """A rejected recommendation has no plan: no outcome can be recorded for it."""
    if rec_row.status == RecommendationStatus.REJECTED:
        raise OutcomeError(f"recommendation {rec_row.id} was rejected (no feasible plan); there is nothing to apply")


def check_applicable(rec_row: RecommendationRecord, applied_at: datetime) -> None:
    """Refuse an outcome for a recommendation that could not be acted on at `applied_at`.

    Rejected: never (no plan). Otherwise the plan was actionable from created_at until its end of
    validity = min(valid_until, expired_at): a recommendation that expired (superseded, binding
    changed, valid_until passed) AFTER it was applied is still a valid outcome target.
    """
    rec_id = rec_row.id
    refuse_rejected(rec_row)
    created = rec_row.created_at
    if applied_at < created:
        raise OutcomeError(f"recommendation {rec_id}: applied_at {iso_utc(applied_at)} is before it was created "
                           f"({iso_utc(created)})")
    valid_until = rec_row.valid_until
    if applied_at > valid_until:
        raise OutcomeError(f"recommendation {rec_id}: applied_at {iso_utc(applied_at)} is after its valid_until "
                           f"{iso_utc(valid_until)}; an out-of-date plan is not evaluated")
    expired_at = rec_row.expired_at
    if rec_row.status == RecommendationStatus.EXPIRED and expired_at is not None:
        if applied_at > expired_at:
            raise OutcomeError(f"recommendation {rec_id} expired at {iso_utc(expired_at)} "
                               f"({rec_row.expired_reason or 'no reason recorded'}), before applied_at "
                               f"{iso_utc(applied_at)}; do not act on expired plans")


def evaluate_row(ledger: Ledger, rec_row: RecommendationRecord, observation: Observation,
                 applied_at: datetime) -> Evaluation:
    """`evaluate` for a ledger recommendation: the period from the binding revision it was solved
    for, the settling steps from its model artifact (steady template only); the details also name
    the model (`model`: `model_identity`, which `model_outcome_condition` matches; its artifact
    hash alone when the artifact is not in the ledger). The CLI and the asset both judge through here."""
    stored = ledger.get_binding(rec_row.binding_id, rec_row.binding_revision)
    rec = dict(rec_row.payload, id=rec_row.id)
    try:
        artifact = ledger.get_artifact(rec_row.model_artifact_hash)
    except NotFoundError:
        artifact = None
    settle = None
    if rec["template"] == Template.STEADY_RESPONSE.value:
        if artifact is None:
            raise NotFoundError(f"model artifact {rec_row.model_artifact_hash} is not in the ledger")
        settle = settle_steps(artifact, _solved_model(ledger, rec_row.run_id))
    evaluation = evaluate(rec, observation, applied_at.timestamp(), stored.spec.sample_period_s, settle)
    model = {"artifact_hash": rec_row.model_artifact_hash} if artifact is None else model_identity(artifact)
    return dataclasses.replace(evaluation, details=dict(evaluation.details, model=model))


def _solved_model(ledger: Ledger, run_id: str) -> StateSpace | None:
    """The model the run's problem held; None when the run or its problem is not in the ledger."""
    try:
        problem = ledger.get_run(run_id).problem
    except NotFoundError:
        return None
    return None if not problem else ProblemIR.from_dict(problem).model


def record_outcome(ledger: Ledger, rec_id: str, observed_file: str | Path, applied_at: str | None = None) -> Outcome:
    """Validate, judge and append one outcome (the `outcome` command). applied_at: ISO 8601 (naive =
    UTC); default = the observed file's first timestamp (the file starts when the first move was made).
    Every refusal raises before anything is written."""
    rec_row = ledger.get_recommendation(rec_id)
    refuse_rejected(rec_row)  # before reading the file: its verdict could not matter
    stored = ledger.get_binding(rec_row.binding_id, rec_row.binding_revision)
    frame = read_history(observed_file, stored.spec, transform_limits=False)  # the plant may show anything
    observation = Observation.from_frame(frame, stored.spec, Path(observed_file).name)
    if applied_at is None:
        moment = datetime.fromtimestamp(float(observation.t[0]), tz=timezone.utc)
    else:
        try:
            moment = parse_iso_utc(applied_at)
        except ValueError:
            raise OutcomeError(f"--applied-at: {applied_at!r} is not an ISO 8601 timestamp") from None
    check_applicable(rec_row, moment)
    # Keep what the judgement reads: from the sample that may stand for applied_at onwards.
    kept = observation.since(moment.timestamp() - stored.spec.sample_period_s / 2)
    evaluation = evaluate_row(ledger, rec_row, kept, moment)
    outcome = Outcome(id=new_id("out"), recommendation_id=rec_id, binding_id=rec_row.binding_id,
                      applied_at=iso_utc(moment), observed=kept.to_dict(), delta=evaluation.delta,
                      verdict=evaluation.verdict, details=evaluation.details)
    ledger.insert_outcome(outcome)
    return outcome


def evaluate_pending(ledger: Ledger, binding_id: str) -> list[Outcome]:
    """Judge the binding's observations stored without a verdict (pending) that no row evaluates yet,
    appending one evaluation row each (id `<pending id>-eval`, details.evaluates = pending id; the
    insert is skipped when that id exists, so nothing is written twice). Returns the rows written."""
    rows = ledger.list_outcomes(binding_id)
    evaluated = {(r.details or {}).get("evaluates") for r in rows}
    written = []
    for row in rows:
        if row.verdict is not None or row.id in evaluated:
            continue
        rec_row = ledger.get_recommendation(row.recommendation_id)
        moment = row.applied_at
        evaluation = evaluate_row(ledger, rec_row, Observation.from_dict(row.observed), moment)
        outcome = Outcome(id=row.id + EVALUATION_SUFFIX, recommendation_id=row.recommendation_id,
                          binding_id=binding_id, applied_at=iso_utc(moment), observed=row.observed,
                          delta=evaluation.delta, verdict=evaluation.verdict,
                          details=dict(evaluation.details, evaluates=row.id))
        if ledger.insert_outcome_if_absent(outcome):
            written.append(outcome)
    return written


def summary(outcome: Outcome) -> dict[str, Any]:
    """The JSON the `outcome` command prints."""
    d = outcome.details
    return {"outcome_id": outcome.id, "recommendation_id": outcome.recommendation_id,
            "binding_id": outcome.binding_id, "applied_at": outcome.applied_at,
            "verdict": None if outcome.verdict is None else outcome.verdict.value, **{k: d.get(k) for k in (
                "verdict_reason", "rule", "judged_steps", "steps_aligned", "steps_required", "trials", "hits",
                "inside_share", "inside_share_all_steps", "promised_rate", "p_value", "block_covered", "band",
                "max_abs_delta", "mv_max_abs_deviation_from_plan")}}


# --------------------------------------------------------------------------- drift


@dataclass(frozen=True)
class DriftFinding:
    """Why the recent outcomes of a binding call for recalibration; `outcome_id` is the newest one."""

    binding_id: str
    outcome_id: str
    reason: str


def model_identity(artifact: ModelArtifact) -> dict[str, Any]:
    """What an outcome records of the model it judged (`details.model`, `of_model`)."""
    return {"artifact_hash": artifact.artifact_hash, "binding_revision": artifact.binding_revision,
            "training_data_hash": artifact.training_data_hash, "coefficients_hash": content_hash(artifact.coefficients)}


def of_model(row: VerdictRecord, identity: Mapping[str, Any]) -> bool:
    """Whether an outcome judged a recommendation solved with the model of `identity`
    (`model_identity` of an artifact): the same artifact, or one with the same coefficients
    identified from the same training data (a recalibration identifies again on the same runs, and
    so may a new binding revision that kept the model's settings: the same model, though another
    artifact). An outcome recorded before its details named the model counts for none."""
    model = (row.details or {}).get("model") or {}
    return model.get("artifact_hash") == identity["artifact_hash"] or (
        model.get("training_data_hash") == identity["training_data_hash"]
        and model.get("coefficients_hash") == identity["coefficients_hash"])


@dataclass(frozen=True)
class RecentOutcomes:
    """What the drift rule reads of a binding's conclusive outcomes, oldest first."""

    conclusive: tuple[VerdictRecord, ...]

    @property
    def recent(self) -> list[OutcomeVerdict]:
        return [r.verdict for r in self.conclusive[-DRIFT_RECENT:]]

    @property
    def deviated(self) -> int:
        return self.recent.count(OutcomeVerdict.DEVIATED)

    @property
    def window(self) -> list[Mapping[str, Any]]:
        return [r.details for r in self.conclusive[-DRIFT_WINDOW:]]

    def hit_rate(self) -> tuple[int, int, float, float]:
        """(hits, trials, promised rate, one-sided p) pooled over `window`."""
        window = self.window
        hits, trials = sum(int(d["hits"]) for d in window), sum(int(d["trials"]) for d in window)
        promised = min(float(d["promised_rate"]) for d in window)
        return hits, trials, promised, hit_rate_p_value(hits, trials, promised)

    def finding(self, binding_id: str) -> DriftFinding | None:
        """The drift rule (module docstring) over these outcomes; None when there is no deviation."""
        if not self.conclusive:
            return None
        newest = self.conclusive[-1].id
        if self.deviated >= DRIFT_DEVIATED:
            return DriftFinding(binding_id, newest, f"{self.deviated} of the last {len(self.recent)} outcomes of "
                                                    f"{binding_id} deviated from the prediction (newest {newest})")
        hits, trials, promised, p_value = self.hit_rate()
        if p_value < SIGNIFICANCE:
            return DriftFinding(binding_id, newest, f"band hit rate {hits}/{trials} over the last {len(self.window)} "
                                                    f"outcomes of {binding_id} is below the promised {promised:.3f} "
                                                    f"(one-sided binomial p = {p_value:.3g})")
        return None

    @staticmethod
    def of(rows: Sequence[VerdictRecord], calibrated_at: datetime | None) -> "RecentOutcomes":
        """The evaluated, conclusive outcomes of recommendations solved under the calibration at
        `calibrated_at` (None: under any)."""

        def current(row: VerdictRecord) -> bool:
            stamp = (row.details or {}).get("calibrated_at")
            return calibrated_at is None or (stamp is not None and parse_iso_utc(stamp) >= calibrated_at)

        judged = (OutcomeVerdict.CONFIRMED, OutcomeVerdict.DEVIATED)
        return RecentOutcomes(tuple(sorted((r for r in rows if r.verdict in judged and current(r)),
                                           key=lambda r: (r.applied_at, r.created_at, r.id))))


def model_outcome_condition(artifact: ModelArtifact, rows: Sequence[VerdictRecord]) -> Condition:
    """The condition for `verified` that the model's own outcomes in the plant agree with its
    evidence: the drift rule over those of the binding's outcomes `rows` (their verdicts, e.g.
    Ledger.list_verdicts) that judged this model (`of_model`) under any of its calibrations (a
    recalibration scores the same val / test runs again: it rebuilds the same evidence and cannot
    clear what the plant showed; a model identified from new data starts afresh). Holds without a
    conclusive outcome."""
    identity = model_identity(artifact)
    seen = RecentOutcomes.of([r for r in rows if of_model(r, identity)], None)
    value = "no conclusive outcome yet"
    if seen.conclusive:
        hits, trials, _, _ = seen.hit_rate()
        value = (f"{seen.deviated} of the last {len(seen.recent)} conclusive deviated; band hits {hits}/{trials} "
                 f"over the last {len(seen.window)}")
    finding = seen.finding(artifact.binding_id)
    return Condition("outcomes of this model in the plant", value,
                     f"no drift: deviated in < {DRIFT_DEVIATED} of the last {DRIFT_RECENT} conclusive, the band hits "
                     f"of the last {DRIFT_WINDOW} not significantly below the promised rate",
                     finding is None, "" if finding is None else f"the plant disagrees with this model: {finding.reason}")


def drift_finding(binding_id: str, rows: Sequence[VerdictRecord],
                  calibrated_at: datetime | None) -> DriftFinding | None:
    """The drift rule (module docstring) over ledger outcomes of one binding. Only evaluated,
    conclusive outcomes of recommendations solved under the calibration at `calibrated_at` count
    (older ones already led to that calibration; None: every one); None when there is no deviation."""
    return RecentOutcomes.of(rows, calibrated_at).finding(binding_id)
