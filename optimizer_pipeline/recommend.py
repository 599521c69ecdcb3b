"""Choosing the candidate to publish and deciding how far it can be trusted (docs/ARCHITECTURE.md, "Recommendation
status"): evidence, coverage, freshness, input distance, age of the live state, feasibility,
cost agreement, model gates, the steady-gain uncertainty along the planned move against the band, the
band against the improvement the plan claims over holding and, with `uq.gate = strict`, the Clopper-Pearson / exchangeability tests; and how far the band is a
calibrated claim (`band_steps`).

Every condition is one `Condition`: the recommendation's `reasons` are the failing ones' texts and
the UI's conditions table shows them all, so there is one rule, not two.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

import numpy as np

from optimizer_pipeline.contracts import (
    BindingSpec,
    CandidateKind,
    Condition,
    EvidenceSnapshot,
    EvidenceSource,
    ModelArtifact,
    ProblemIR,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    SolveResult,
    Template,
    forward_columns,
    inverse_columns,
    iso_utc,
    parse_iso_utc,
)
from optimizer_pipeline.ledger import candidate_id, new_id
from optimizer_pipeline.model.statespace import integrating_outputs, rollout
from optimizer_pipeline.recommendation_text import duration, num
from optimizer_pipeline.settings import Settings


# live.max_age_s when unset: this many sample periods, and at least LIVE_AGE_FLOOR_S (a fast-sampled
# plant still gets a few minutes between its newest sample and the solve).
LIVE_AGE_PERIODS = 10
LIVE_AGE_FLOOR_S = 300.0
# Standard errors of the steady-state gain that the planned move may carry into the settled CVs before
# it must fit in the band (about a two-sided 95 % bound for a normal estimate).
GAIN_SIGMAS = 2.0
# the band against the improvement: holding's error counts as at least this fraction of every CV's
# range, so a plant near its targets is held to a precision (the band within uq.max_band_fraction of
# it), not to its own small error
RANGE_FLOOR = 0.1


def max_live_age_s(setting: float | None, sample_period_s: float) -> float:
    """The oldest the live run's last sample may be for `verified`: live.max_age_s when set, else
    max(LIVE_AGE_PERIODS x sample_period_s, LIVE_AGE_FLOOR_S)."""
    return float(setting) if setting is not None else max(LIVE_AGE_PERIODS * sample_period_s, LIVE_AGE_FLOOR_S)


@dataclass(frozen=True)
class Decision:
    recommendation: Recommendation
    chosen: SolveCandidate | None
    conditions: tuple[Condition, ...]


def choose_candidate(result: SolveResult) -> SolveCandidate | None:
    """The robust optimum when it is feasible, else the nominal one; never the hold baseline."""
    by_kind = {c.kind: c for c in result.candidates}
    for kind in (CandidateKind.ROBUST, CandidateKind.NOMINAL):
        candidate = by_kind.get(kind)
        if candidate is not None and candidate.feasible and candidate.controls:
            return candidate
    return None


def infeasible_because(result: SolveResult) -> str:
    """The nominal candidate's verification reasons (its solver status, and why, where the verifier can say:
    an integrating CV no reachable MVs balance): what a rejected recommendation's reason names."""
    nominal = next((c for c in result.candidates if c.kind is CandidateKind.NOMINAL), None)
    return "" if nominal is None or not nominal.verify_report else "; ".join(nominal.verify_report.get("reasons", ()))


def _fmt(value: float | None) -> str:
    """An engineering value in a condition: 4 significant digits."""
    return "n/a" if value is None else num(value, 4)


def conditions(artifact: ModelArtifact, evidence: EvidenceSnapshot, candidate: SolveCandidate | None,
               max_input_distance: float, now: datetime, why_none: str = "") -> list[Condition]:
    """Every condition for `verified`, in the order a reader checks them; `why_none`: why no candidate is
    feasible (`infeasible_because`), the reason's tail when none is."""
    found = [Condition("feasible candidate", "none" if candidate is None else f"{candidate.kind.value} "
                       f"(seq {candidate.seq})", "robust, else nominal, feasible", candidate is not None,
                       "no feasible candidate" + (f": {why_none}" if why_none else ""))]
    found += [Condition(c.name, c.value, c.limit, c.holds, f"UQ gate: {c.reason}" if c.name != "UQ evidence"
                        else c.reason) for c in evidence.uq_checks]
    if evidence.has_evidence:
        if evidence.calibrated_at is None:
            when, stale = "calibration time unknown", "the calibration's time is unknown: it is not fresh"
        else:
            age = (now - parse_iso_utc(evidence.calibrated_at)).total_seconds()
            when = f"{duration(age)} old"
            stale = f"calibration is {when}, beyond uq.fresh_days ({evidence.fresh_days:g} days): recalibrate"
        found.append(Condition("calibration fresh", when, f"<= {evidence.fresh_days:g} days",
                               evidence.calibration_fresh, stale))
    distance = evidence.input_distance
    found.append(Condition(
        "input distance (max |z| of current MVs, CVs)", _fmt(distance), f"<= {max_input_distance:g}",
        distance is not None and distance <= max_input_distance,
        "input distance unknown (missing or non-finite current values)" if distance is None
        else f"input distance {distance:.3g} exceeds {max_input_distance:g}"))
    age, limit = evidence.live_age_s, evidence.live_max_age_s
    found.append(Condition(
        "live state age", "unknown" if age is None else f"{duration(age)} old",
        f"<= {_fmt(limit)} s (live.max_age_s)", age is not None and limit is not None and age <= limit,
        "live state age unknown" if age is None else
        f"live state is {duration(age)} old (last sample {evidence.live_sample_at}); "
        f"live.max_age_s allows {_fmt(limit)} s"))
    found += gate_conditions(artifact)
    if candidate is not None:
        why = candidate.verify_report.get("reasons") or ["independent check disagrees"]
        found.append(Condition("candidate verified independently", f"cost {_fmt(candidate.cost)}, independent "
                               f"{_fmt(candidate.independent_cost)}", "feasible and costs agree", candidate.verified,
                               "candidate not verified: " + "; ".join(str(r) for r in why)))
    return found


def gate_conditions(artifact: ModelArtifact) -> list[Condition]:
    """The model's quality gates G1-G4 as conditions."""
    return [Condition(f"model gate {g.name}", _fmt(g.value), g.description, g.passed,
                      f"model gate {g.name} failed: {g.description} = {_fmt(g.value)} (threshold {_fmt(g.threshold)})")
            for g in artifact.gates]


def gain_conditions(artifact: ModelArtifact, problem: ProblemIR, evidence: EvidenceSnapshot,
                    candidate: SolveCandidate | None, steady_gain: Mapping[str, Any] | None = None) -> list[Condition]:
    """The planned move against the steady-gain uncertainty: per CV, GAIN_SIGMAS standard errors of
    the gain along the move from the current MVs to the plan's last MVs, sqrt(du' cov_i du), must fit
    inside the band (qhat_i), or the settled value may be off by more than the evidence says. cov is
    the estimate's own uncertainty, the jackknife over the train runs (`jackknife_cov`; `cov` of a
    record from before the parts were kept, which was the jackknife alone): the spread of the gain
    over the operating range, which the record adds to it, is in the band already (calibrated on the
    settled errors of the held-out runs across that range), and counting it again unverified plans
    that met every goal (BENCHMARKS.md, "Steady-gain uncertainty"). No condition without a candidate
    or without evidence (no band to compare with; that fails anyway). steady_gain: the gain record of
    the model the plan was solved with, when not the artifact's. A transformed CV's spread (in the
    model's units) is carried to engineering units through its transform from the plan's end, both
    ways, the larger kept: its band is in engineering units."""
    if candidate is None or not evidence.has_evidence:
        return []
    name, limit = "steady-gain uncertainty along the planned move", f"<= band ({GAIN_SIGMAS:g} standard errors)"
    uncertainty = (artifact.steady_gain if steady_gain is None else steady_gain).get("uncertainty")
    if not uncertainty:
        return [Condition(name, "unknown", limit, False,
                          "steady-gain uncertainty unknown (the model records none: fewer than 2 train runs)")]
    u_mean, u_std = artifact.normalisation.of(artifact.mv_tags)
    move = (np.asarray(candidate.controls[-1], float) - u_mean) / u_std - np.asarray(problem.u_prev, float)
    cov = np.asarray(uncertainty.get("jackknife_cov", uncertainty["cov"]), float)
    spread = GAIN_SIGMAS * np.sqrt(np.einsum("a,iab,b->i", move, cov, move))
    _, y_std = artifact.normalisation.of(artifact.cv_tags)
    transforms = artifact.normalisation.transforms_of(artifact.cv_tags)
    if any(transforms):  # the band is in engineering units (x std): the spread too, mapped from the plan's end
        end = np.asarray(candidate.predicted[-1], float)
        z_end = forward_columns(transforms, end)
        spread = np.maximum(*(np.abs(inverse_columns(transforms, z_end + sign * spread * y_std) - end)
                              for sign in (1, -1))) / y_std
    ramps = integrating_outputs(problem.model)  # their gain is a rate per sample: held a horizon, a drift
    spread = np.where(ramps, problem.horizon * spread, spread)
    qhat = np.asarray(evidence.uq["qhat"], float)
    worst = int(np.argmax(spread / np.maximum(qhat, 1e-300)))
    tag, error, band = artifact.cv_tags[worst], spread[worst] * y_std[worst], qhat[worst] * y_std[worst]
    settled = (f"a drift of {tag} of up to {error:.3g} over the plan's {problem.horizon} samples held after it "
               f"(its rate, {GAIN_SIGMAS:g} standard errors of its gain)" if ramps[worst] else
               f"a settled {tag} error of up to {error:.3g} ({GAIN_SIGMAS:g} standard errors of the gain)")
    return [Condition(name, f"{tag}: {error:.4g} against band {band:.4g}", limit, bool(np.all(spread <= qhat)),
                      f"steady-gain uncertainty: along the planned move {settled} exceeds the band {band:.3g}; "
                      + undetermined_direction(tag, cov[worst], u_std, artifact.mv_tags))]


def undetermined_direction(cv_tag: str, cov: np.ndarray, u_std: np.ndarray, mv_tags: Sequence[str]) -> str:
    """Which moves leave the steady gain of `cv_tag` least determined and what test data would determine
    it: the direction of the largest variance of its gain row (cov (nu, nu), normalised MV units; its
    top eigenvector) as a proportion of MV moves in engineering units, and how much larger its standard
    error is there than along the best-determined direction."""
    if len(mv_tags) == 1:
        return f"step tests with more or larger steps of {mv_tags[0]} would determine the gain of {cv_tag}"
    variances, vectors = np.linalg.eigh(np.asarray(cov, float))
    move = vectors[:, -1] * np.asarray(u_std, float)  # the weakest direction, engineering units
    move = move / move[np.argmax(np.abs(move))]
    proportion = " : ".join(f"{m:+.2f}" for m in np.where(np.abs(move) < 0.005, 0.0, move))
    ratio = f"; its standard error there {np.sqrt(variances[-1] / variances[0]):.3g} x the best-determined " \
            "direction's" if variances[0] > 0 else ""
    return (f"the gain of {cv_tag} is least determined for moves of {', '.join(mv_tags)} in the proportion "
            f"{proportion} (engineering units{ratio}): step tests moving them together that way would determine it")


def improvement_conditions(binding: BindingSpec, result: SolveResult, candidate: SolveCandidate | None,
                           band_engineering: Sequence[float | None], max_fraction: float,
                           target: Sequence[float] | None = None, problem: ProblemIR | None = None,
                           end_step: int | None = None) -> list[Condition]:
    """A move plan's band against the improvement it claims over holding the current MVs. With each
    CV's error divided by its range (hi - lo) and the norm taken over CVs: the plan's predicted error
    at its last step, widened by the band, ||(|planned - target| + band) / range||, must be at most
    `max_fraction` (uq.max_band_fraction) of the error holding is predicted to leave at the same
    step, ||(held - target) / range|| (the HOLD candidate's prediction), that error counted as at
    least RANGE_FLOOR of every CV's range (a plant near its targets is held to a precision, not to
    its own small error). The band is calibrated on the first P steps only, so this is how the
    plan's end is held to it: a band as wide as a good part of the way the plan moves claims an
    improvement the evidence does not back (e.g. one linear model on a curved plant). decide passes
    the wider of it and the settled response's band where there is one (a steered plan, a local
    refit's). Where that band is the settled evidence of the plan's end held to `end_step` (an
    integrating CV's, pipeline.held_rule), holding is judged at the same step (`held_end`: the current
    MVs held that long), as a level off balance drifts on. No condition for a steady target (its band
    is calibrated on the settled value it predicts), without a candidate or without a band; no HOLD
    prediction fails."""
    if (binding.profile.template is Template.STEADY_RESPONSE or candidate is None or not candidate.predicted
            or not band_engineering or None in band_engineering):
        return []
    name, limit = "band against the improvement over holding", f"<= {max_fraction:g} (uq.max_band_fraction)"
    hold = next((c for c in result.candidates if c.kind is CandidateKind.HOLD and c.predicted), None)
    if hold is None:
        return [Condition(name, "unknown", limit, False, "no hold prediction to compare the plan's improvement with")]
    # the CV targets the plan tracks: the binding's, or those of the steady-state layer a steered plan
    # was compiled with (decide passes the problem's)
    target = np.array([c.target for c in binding.cvs] if target is None else target, float)
    span = np.array([c.hi - c.lo for c in binding.cvs], float)
    band = np.asarray(band_engineering, float)
    held_at = np.asarray(hold.predicted[-1], float)
    if problem is not None and end_step is not None and end_step > len(hold.predicted):
        held_at = held_end(problem, end_step)
    held = float(np.linalg.norm((held_at - target) / span))
    widened = float(np.linalg.norm((np.abs(np.asarray(candidate.predicted[-1], float) - target) + band) / span))
    floor = RANGE_FLOOR * float(np.sqrt(len(span)))
    of = "holding's error" if held >= floor else f"{RANGE_FLOOR:g} of the CV ranges (holding's error is less)"
    fraction = widened / max(held, floor)
    return [Condition(name, f"{fraction:.3g} of {of}", limit, fraction <= max_fraction,
                      f"band against the improvement: the plan's predicted end widened by the band is {fraction:.3g} "
                      f"of {of}; uq.max_band_fraction allows {max_fraction:g}")]


def held_end(problem: ProblemIR, step: int) -> np.ndarray:
    """Holding's predicted CVs (engineering) at `step`: the current MVs held from the problem's state, the
    DVs and disturbance held as the plan holds them (statespace.rollout, as the verifier re-simulates a
    plan), past the plan's horizon where `step` is beyond it. Not clipped to a CV's limits: a level that
    holding would run past them counts the whole way."""
    u = np.tile(np.asarray(problem.u_prev, float), (1, step, 1))
    d = np.tile(np.asarray(problem.d, float), (1, step, 1))
    y = rollout(problem.model, np.asarray(problem.x0, float)[None], u, d, disturbance=np.asarray(problem.bias, float))
    return problem.cv_engineering(y[0, -1])


def band_steps(binding: BindingSpec, evidence: EvidenceSnapshot, candidate: SolveCandidate | None) -> int | None:
    """The plan steps (from step 0) for which the band is a calibrated claim: a move plan's first
    min(P, N) steps (the block length the scores covered), a steady target's one settled row; None
    without evidence or without a plan."""
    if candidate is None or not evidence.has_evidence:
        return None
    if binding.profile.template is Template.STEADY_RESPONSE:
        return 1
    return min(int(evidence.uq["block_length"]), len(candidate.controls))


def _wider(band: Sequence[float | None], other: Sequence[float | None] | None) -> tuple[float | None, ...]:
    """Per CV the wider of two bands (None where either has none); `band` itself without `other`."""
    if other is None:
        return tuple(band)
    return tuple(None if a is None or b is None else max(a, b) for a, b in zip(band, other))


def decide(binding: BindingSpec, binding_revision: int, artifact: ModelArtifact, problem: ProblemIR,
           result: SolveResult, evidence: EvidenceSnapshot, band_engineering: Sequence[float | None],
           max_input_distance: float, run_id: str, now: datetime,
           extra_conditions: Sequence[Condition] = (),
           max_band_fraction: float = Settings.uq_max_band_fraction,
           steady_gain: Mapping[str, Any] | None = None,
           end_band: Sequence[float | None] | None = None, end_step: int | None = None) -> Decision:
    """Build the recommendation of one solve: `rejected` without a feasible candidate, `verified`
    when every condition holds, `unverified` otherwise (with every failed condition listed).
    `steady_gain`: the gain record of the model the problem was compiled with when that is not the
    artifact's own (a local refit, model/local.py); `end_band`: the band of the settled response the
    plan ends on, when there is one (pipeline.settled_evidence): the band against the improvement
    holds the plan's end to the wider of it and the P-step band, per CV; `end_step`: the step that band
    speaks of when it is an integrating CV's held end (pipeline.held_rule), holding's error judged there."""
    candidate = choose_candidate(result) if result.ok else None
    checked = (conditions(artifact, evidence, candidate, max_input_distance, now,
                          "" if candidate is not None else infeasible_because(result))
               + gain_conditions(artifact, problem, evidence, candidate, steady_gain)
               + improvement_conditions(binding, result, candidate, _wider(band_engineering, end_band),
                                        max_band_fraction, problem.cv_engineering(problem.y_target), problem,
                                        end_step)
               + list(extra_conditions))
    if not result.ok:
        checked.insert(0, Condition("solver", str(result.error_code), "a result", False,
                                    f"solver error {result.error_code}: {result.error_message}"))
    reasons = [c.reason for c in checked if not c.holds]
    if candidate is None:
        status = RecommendationStatus.REJECTED
    elif reasons:
        status = RecommendationStatus.UNVERIFIED
    else:
        status = RecommendationStatus.VERIFIED
    rec = Recommendation(
        id=new_id("rec"), binding_id=binding.id, binding_revision=binding_revision, run_id=run_id,
        candidate_id=None if candidate is None else candidate_id(run_id, candidate.seq),
        template=binding.profile.template, status=status, reasons=tuple(reasons), created_at=iso_utc(now),
        valid_until=iso_utc(now + timedelta(seconds=binding.profile.valid_for_s)),
        mv_tags=binding.mv_tags, cv_tags=binding.cv_tags,
        controls=() if candidate is None else candidate.controls,
        predicted=() if candidate is None else candidate.predicted,
        band=tuple(band_engineering), band_steps=band_steps(binding, evidence, candidate),
        cost=None if candidate is None else candidate.cost,
        independent_cost=None if candidate is None else candidate.independent_cost,
        problem_ir_hash=problem.hash, model_artifact_hash=artifact.artifact_hash,
        evidence={"source": evidence.source if evidence.has_evidence else EvidenceSource.UNASSESSED.value, "uq": evidence.uq,
                  "input_distance": evidence.input_distance, "calibration_fresh": evidence.calibration_fresh,
                  "coverage_threshold": None if evidence.uq is None else evidence.uq.get("coverage_threshold"),
                  "live_state": {"last_sample_at": evidence.live_sample_at, "age_s": evidence.live_age_s,
                                 "max_age_s": evidence.live_max_age_s,
                                 **({} if evidence.live_values is None else evidence.live_values)}},
    )
    return Decision(rec, candidate, tuple(checked))
