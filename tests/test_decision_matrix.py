"""The decision matrix of a recommendation (docs/ARCHITECTURE.md, "Recommendation status"; issue 18).

`pipeline.recommend` decides every solve: `rejected` without a feasible candidate, `verified` when
every condition holds, `unverified` otherwise with the failing conditions' texts as `reasons`.

One world is built here in which every condition holds (a one-MV / one-CV binding, a model artifact
of its revision with passing gates, split-conformal evidence calibrated a day ago, a live state one
z away from the train mean, a solver that returns verified candidates). Each row of MATRIX changes
that world in one place and names the single condition it makes fail, with the exact reasons list
expected, or puts one condition exactly on its limit (one only reported: makes it appear), where the
recommendation must stay verified.
A new condition is one more row: `test_every_condition_of_verified_has_a_row` (every name the
product's source passes to `Condition`, read from the source, whatever world emits it) and
`test_every_condition_any_world_emits_has_a_row` fail until it has one.
"""

import ast
import hashlib
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
from ledger_helpers import solve as solve_once
from model_helpers import binding

from optimizer_pipeline import pipeline, uq
from optimizer_pipeline.contracts import (
    Calibration,
    CandidateKind,
    Gate,
    HistorySplit,
    Normalisation,
    RunSeries,
    SolveCandidate,
    Outcome,
    OutcomeVerdict,
    SolveResult,
    UQEvidence,
    iso_utc,
)
from optimizer_pipeline.ledger import Ledger, StoredBinding, candidate_id
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.model.artifact import steady_gain_record
from optimizer_pipeline.outcomes import model_identity
from optimizer_pipeline.recommend import decide
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver import errors
from optimizer_pipeline.solver.errors import SolverError

NOW = datetime(2027, 1, 15, 9, 0, tzinfo=timezone.utc)
SPEC = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)  # tags u0 (MV), y0 (CV); sample period 1 s
# train statistics: u0 mean 0, std 1; y0 mean 10, std 2, so a live y0 of 10 + 2 z is z away
NORMALISATION = Normalisation(("u0", "y0"), (0.0, 10.0), (1.0, 2.0))
MODEL = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), 0.5), np.full((1, 1, 1), 0.5), np.zeros((1, 1, 0)), np.zeros(1))
# y0 integrates u0 (a pole at 1): its plan's end is held to settled evidence (pipeline.settled_evidence)
INTEGRATING = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), 1.0), np.full((1, 1, 1), 0.5), np.zeros((1, 1, 0)),
                       np.zeros(1))
SEQ = {CandidateKind.HOLD: 0, CandidateKind.NOMINAL: 1, CandidateKind.ROBUST: 2}

VERIFIED, UNVERIFIED, REJECTED = "verified", "unverified", "rejected"


@dataclass(frozen=True)
class Plan:
    """One candidate the fake solver returns, as the verifier left it."""

    kind: CandidateKind
    feasible: bool = True
    verified: bool = True
    verify_reasons: tuple[str, ...] = ()
    has_controls: bool = True


HONEST = (Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL), Plan(CandidateKind.ROBUST))


@dataclass(frozen=True)
class World:
    """Everything `pipeline.recommend` decides on; the defaults make every condition hold."""

    binding_revision: int = 1  # the revision the binding is at
    artifact_revision: int = 1  # the revision the model artifact was identified for
    gates: tuple[Gate, ...] = (Gate("G1", "one-step fit R2", 0.9, 0.5, True),
                               Gate("G2", "free-run fit R2", 0.7, 0.3, True))
    y_now: float = 12.0  # the live CV's last sample: z = (12 - 10) / 2 = 1
    calibrated_before: timedelta | None = timedelta(days=1)  # None: the calibration time is unknown
    evidence: Mapping[str, Any] = field(default_factory=dict)  # UQEvidence fields that differ from EVIDENCE
    calibration_of_other_artifact: bool = False
    plans: tuple[Plan, ...] = HONEST
    solver_error: SolverError | None = None
    uq_gate: str = "seed"
    fresh_days: float = 7.0
    max_input_distance: float = 4.0
    live_age_s: float = 0.0  # how long before NOW the live run's last sample was taken
    live_max_age_s: float | None = None  # live.max_age_s; unset: max(10 x 1 s, 300 s) = 300 s
    plan_end: float = 1.0  # the plan's last MV (the live one is 1.0, MV std 1: the move in normalised units)
    gain_std: float | None = 0.125  # standard error of the steady gain (normalised); None: not recorded
    behind_newest_s: float | None = None  # live state behind the history's newest sample; None: not recorded
    missing_now: tuple[str, ...] | None = None  # MV / CV tags without a value in the newest sample; None: not recorded
    warming: tuple[int, int] | None = None  # (samples since a gap, the model's window) when fewer
    # the CVs predicted at the plan's last step (y0's target is 0, range 200, band 1): the plan's and holding's
    planned_end: float = 0.0
    held_end: float = 12.0
    # verdicts of outcomes recorded in the ledger before the solve, judging this model (its training data
    # hash names the world's own model: the module's ledger is shared by every row)
    model_outcomes: tuple[str, ...] = ()
    training_data_hash: str = ""
    flagged: Mapping[str, str] | None = None  # the newest sample's flagged values {tag: rule}; None: not recorded
    filled_in: tuple[int, ...] = ()  # live rows (-1: the newest) whose y0 value cleaning filled in
    cv_target: float | None = 0.0  # y0's target; None: none, the plan is steered by the steady-state layer
    integrating: bool = False  # the model's y0 integrates (INTEGRATING)


EVIDENCE = dict(method="split_conformal", alpha=0.1, block_length=10, cv_tags=("y0",), qhat=(0.5,), rank_k=9,
                safety_factor=None, n_val_blocks=9, n_val_runs=2, n_test_blocks=20, n_test_runs=2,
                n_unique_test_steps=200, coverage=0.9, coverage_per_cv=(0.9,), coverage_threshold=0.8,
                coverage_lower_95=0.85, exchangeability_p=0.5, exchangeability_test="beta-binomial", reasons=(),
                score=uq.MAX_RESIDUAL, score_rule=uq.SCORE_RULES[uq.MAX_RESIDUAL])
NO_EVIDENCE = dict(method=None, qhat=None, rank_k=None, coverage=None, coverage_per_cv=None, coverage_threshold=None,
                   coverage_lower_95=None, exchangeability_p=None, reasons=("1 val block(s); at least 2 are needed",))


def candidate(plan: Plan, horizon: int, plan_end: float = 1.0, planned_end: float = 0.0,
              held_end: float = 12.0) -> SolveCandidate:
    controls = ((1.0,),) * (horizon - 1) + ((plan_end,),) if plan.has_controls else ()
    end = held_end if plan.kind is CandidateKind.HOLD else planned_end
    predicted = ((12.0,),) * (horizon - 1) + ((end,),) if plan.has_controls else ()
    return SolveCandidate(seq=SEQ[plan.kind], kind=plan.kind, solver_status="solved", controls=controls,
                          predicted=predicted, cost=1.0, constraints={}, feasible=plan.feasible,
                          verified=plan.verified, independent_cost=1.0,
                          verify_report={"reasons": list(plan.verify_reasons)})


def inputs(world: World):
    """(stored binding, artifact, split, calibration, solve, settings) of the world."""
    spec = SPEC if world.cv_target == SPEC.cvs[0].target else replace(
        SPEC, cvs=(replace(SPEC.cvs[0], target=world.cv_target),))
    model = INTEGRATING if world.integrating else MODEL
    stored = StoredBinding(spec, world.binding_revision, spec.spec_hash, None)
    gain = steady_gain_record(model)
    if world.gain_std is not None:
        gain["uncertainty"] = {"method": "given", "replicates": 8, "cov": [[[world.gain_std ** 2]]],
                               "std": [[world.gain_std]]}
    artifact = artifact_from_model(model, spec, world.artifact_revision, NORMALISATION, gates=world.gates,
                                   steady_gain=gain, training_data_hash=world.training_data_hash)
    n = 20  # the live run ends live_age_s before now, one sample per period
    t = NOW.timestamp() - world.live_age_s - SPEC.sample_period_s * np.arange(n)[::-1]
    y = np.full((n, 1), 12.0)
    y[-1, 0] = world.y_now
    filled_in = np.isin(np.arange(n) - n, world.filled_in)[:, None]
    live = RunSeries("live", t, np.full((n, 1), 1.0), y, np.zeros((n, 0)),
                     unmeasured=filled_in if filled_in.any() else None)
    report = {} if world.behind_newest_s is None else {  # as data.prepare_history records it (period 1 s)
        "live_behind_s": world.behind_newest_s, "live_tail_dropped": world.behind_newest_s > 0.5}
    if world.missing_now is not None:
        report["live_missing"] = list(world.missing_now)
    if world.flagged is not None:
        report["live_flagged"] = dict(world.flagged)
    if world.warming is not None:
        report["live_warming_up"] = {"samples": world.warming[0], "needed": world.warming[1],
                                     "since": NOW.timestamp() - world.warming[0]}
    split = HistorySplit((), (), (), live, NORMALISATION, report, "data-hash")
    calibrated_at = None if world.calibrated_before is None else iso_utc(NOW - world.calibrated_before)
    evidence = UQEvidence(**{**EVIDENCE, **world.evidence, "calibrated_at": calibrated_at})
    calibration = Calibration("cal-test", "f" * 64 if world.calibration_of_other_artifact else artifact.artifact_hash,
                              evidence)

    def solve(problem):
        if world.solver_error is not None:
            raise world.solver_error
        return SolveResult(problem.hash, True, tuple(candidate(p, problem.horizon, world.plan_end, world.planned_end,
                                                               world.held_end) for p in world.plans), {})

    settings = Settings(uq_fresh_days=world.fresh_days, uq_max_input_distance=world.max_input_distance,
                        uq_gate=world.uq_gate, live_max_age_s=world.live_max_age_s)
    return stored, artifact, split, calibration, solve, settings


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    return Ledger(tmp_path_factory.mktemp("matrix") / "ledger.duckdb")


def recommend(ledger: Ledger, world: World) -> pipeline.SolveRecord:
    stored, artifact, split, calibration, solve, settings = inputs(world)
    model = model_identity(artifact)
    recorded = {o.id for o in ledger.list_outcomes(SPEC.id)}
    applied = None if not world.model_outcomes else solve_once(ledger, binding_id=SPEC.id)[1]  # what they judged
    for i, verdict in enumerate(world.model_outcomes):  # as outcomes.evaluate_row records them
        if f"out-{world.training_data_hash}-{i}" not in recorded:
            ledger.insert_outcome(Outcome(
                id=f"out-{world.training_data_hash}-{i}", recommendation_id=applied, binding_id=SPEC.id,
                applied_at=iso_utc(NOW - timedelta(minutes=30 - i)), observed={}, delta={},
                verdict=OutcomeVerdict(verdict),
                details={"hits": 10 if verdict == "confirmed" else 7, "trials": 10, "promised_rate": 0.9,
                         "model": model}))
    return pipeline.recommend(stored, artifact, split, calibration, solve, ledger, settings, "simulation", NOW)


@dataclass(frozen=True)
class Row:
    name: str
    condition: str  # the name of the one condition this row is about
    world: World
    status: str
    reasons: tuple[str, ...] = ()


BASE = World()
STRICT = World(uq_gate="strict")

MATRIX = [
    # ---- no feasible candidate: rejected, whatever else holds
    Row("every candidate infeasible", "feasible candidate",
        replace(BASE, plans=tuple(replace(p, feasible=False, verified=False) for p in HONEST)),
        REJECTED, ("no feasible candidate",)),
    Row("only the hold baseline feasible", "feasible candidate",
        replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL, feasible=False),
                             Plan(CandidateKind.ROBUST, feasible=False))),
        REJECTED, ("no feasible candidate",)),
    Row("feasible candidates without a plan", "feasible candidate",
        replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL, has_controls=False),
                             Plan(CandidateKind.ROBUST, has_controls=False))),
        REJECTED, ("no feasible candidate",)),
    Row("every plan infeasible, the verifier saying why", "feasible candidate",
        replace(BASE, plans=(Plan(CandidateKind.HOLD),
                             *(Plan(kind, feasible=False, verified=False, has_controls=False,
                                    verify_reasons=("no plan (solver status 'primal infeasible')",
                                                    "y0 cannot end balanced"))
                               for kind in (CandidateKind.NOMINAL, CandidateKind.ROBUST)))),
        REJECTED, ("no feasible candidate: no plan (solver status 'primal infeasible'); y0 cannot end balanced",)),
    Row("the solver failed", "solver",
        replace(BASE, solver_error=SolverError(errors.SOLVE_TIMEOUT, "no answer within 10000 ms")),
        REJECTED, ("solver error SOLVE_TIMEOUT: no answer within 10000 ms", "no feasible candidate")),
    # ---- UQ evidence and the seed gate
    Row("no UQ evidence", "UQ evidence", replace(BASE, evidence=NO_EVIDENCE),
        UNVERIFIED, ("no UQ evidence: 1 val block(s); at least 2 are needed",)),
    Row("coverage below the threshold", "test coverage (worst CV)", replace(BASE, evidence={"coverage": 0.79}),
        UNVERIFIED, ("UQ gate: test coverage 0.790 < threshold 0.800",)),
    Row("coverage exactly at the threshold", "test coverage (worst CV)", replace(BASE, evidence={"coverage": 0.8}),
        VERIFIED),
    Row("empirical_max coverage exactly at its threshold 1", "test coverage (worst CV)",
        replace(BASE, evidence={"method": "empirical_max", "coverage": 1.0, "coverage_threshold": 1.0}), VERIFIED),
    # ---- the strict gate's extra conditions
    Row("strict: coverage lower bound below 0.8", "coverage 95% lower bound",
        replace(STRICT, evidence={"coverage_lower_95": 0.79}),
        UNVERIFIED, ("UQ gate: coverage 95% lower bound 0.790 < 0.8",)),
    Row("strict: coverage lower bound exactly 0.8", "coverage 95% lower bound",
        replace(STRICT, evidence={"coverage_lower_95": 0.8}), VERIFIED),
    Row("strict: exchangeability p below 0.01", "val/test exchangeability p",
        replace(STRICT, evidence={"exchangeability_p": 0.0099}),
        UNVERIFIED, ("UQ gate: val/test exchangeability p = 0.0099 < 0.01",)),
    Row("strict: exchangeability p exactly 0.01", "val/test exchangeability p",
        replace(STRICT, evidence={"exchangeability_p": 0.01}), VERIFIED),
    # ---- freshness of the calibration
    Row("calibrated a second more than fresh_days ago", "calibration fresh",
        replace(BASE, calibrated_before=timedelta(days=7, seconds=1)), UNVERIFIED,
        ("calibration is 7 days old, beyond uq.fresh_days (7 days): recalibrate",)),
    Row("calibration time unknown", "calibration fresh", replace(BASE, calibrated_before=None),
        UNVERIFIED, ("the calibration's time is unknown: it is not fresh",)),
    Row("calibrated exactly fresh_days ago", "calibration fresh",
        replace(BASE, calibrated_before=timedelta(days=7)), VERIFIED),
    # ---- input distance of the live state (z of y0 = (y - 10) / 2; u0 sits at z = 1)
    Row("input distance beyond the maximum", "input distance (max |z| of current MVs, CVs)",
        replace(BASE, y_now=19.0), UNVERIFIED, ("input distance 4.5 exceeds 4",)),
    Row("input distance exactly the maximum", "input distance (max |z| of current MVs, CVs)",
        replace(BASE, y_now=18.0), VERIFIED),
    Row("input distance exactly the maximum, below the mean", "input distance (max |z| of current MVs, CVs)",
        replace(BASE, y_now=2.0), VERIFIED),
    # ---- age of the live state (sample period 1 s, so live.max_age_s defaults to 300 s)
    Row("live state older than the default maximum age", "live state age", replace(BASE, live_age_s=300.5),
        UNVERIFIED, ("live state is 300.5 s old (last sample 2027-01-15T08:54:59.500000+00:00); "
                     "live.max_age_s allows 300 s",)),
    Row("live state exactly the default maximum age", "live state age", replace(BASE, live_age_s=300.0), VERIFIED),
    Row("live run ended 11 months ago", "live state age", replace(BASE, live_age_s=335 * 86400.0),
        UNVERIFIED, ("live state is 335 days old (last sample 2026-02-14T09:00:00+00:00); live.max_age_s allows 300 s",)),
    Row("live.max_age_s set: a second over it", "live state age", replace(BASE, live_age_s=61.0, live_max_age_s=60.0),
        UNVERIFIED, ("live state is 61 s old (last sample 2027-01-15T08:58:59+00:00); live.max_age_s allows 60 s",)),
    Row("live.max_age_s set: exactly it", "live state age", replace(BASE, live_age_s=60.0, live_max_age_s=60.0),
        VERIFIED),
    # ---- steady-gain uncertainty along the planned move (2 x 0.125 x move against qhat 0.5; y0 std 2)
    Row("gain uncertainty along the move beyond the band", "steady-gain uncertainty along the planned move",
        replace(BASE, plan_end=3.5), UNVERIFIED,
        ("steady-gain uncertainty: along the planned move a settled y0 error of up to 1.25 (2 standard errors of "
         "the gain) exceeds the band 1; step tests with more or larger steps of u0 would determine the gain of y0",)),
    Row("gain uncertainty along the move exactly the band", "steady-gain uncertainty along the planned move",
        replace(BASE, plan_end=3.0), VERIFIED),
    Row("no gain uncertainty recorded", "steady-gain uncertainty along the planned move",
        replace(BASE, gain_std=None), UNVERIFIED,
        ("steady-gain uncertainty unknown (the model records none: fewer than 2 train runs)",)),
    # the age in the reason: seconds below 2 h, hours below 2 days, days from there
    Row("live state a second under 2 h old", "live state age", replace(BASE, live_age_s=7199.0, live_max_age_s=60.0),
        UNVERIFIED, ("live state is 7199 s old (last sample 2027-01-15T07:00:01+00:00); live.max_age_s allows 60 s",)),
    Row("live state exactly 2 h old", "live state age", replace(BASE, live_age_s=7200.0, live_max_age_s=60.0),
        UNVERIFIED, ("live state is 2 h old (last sample 2027-01-15T07:00:00+00:00); live.max_age_s allows 60 s",)),
    Row("live state a second under 2 days old", "live state age",
        replace(BASE, live_age_s=172799.0, live_max_age_s=60.0),
        UNVERIFIED, ("live state is 48 h old (last sample 2027-01-13T09:00:01+00:00); live.max_age_s allows 60 s",)),
    Row("live state exactly 2 days old", "live state age", replace(BASE, live_age_s=172800.0, live_max_age_s=60.0),
        UNVERIFIED, ("live state is 2 days old (last sample 2027-01-13T09:00:00+00:00); live.max_age_s allows 60 s",)),
    # ---- the live state is the newest sample (cleaning dropped none of the newest samples)
    Row("the newest samples dropped in cleaning", "live state is the newest sample",
        replace(BASE, behind_newest_s=10.0), UNVERIFIED,
        ("the live state is 10 s older than the history's newest sample (the newest samples were dropped in "
         "cleaning)",)),
    Row("the newest sample snapped onto the grid", "live state is the newest sample",
        replace(BASE, behind_newest_s=0.5), VERIFIED),
    Row("the newest samples since a gap fewer than the model's window", "live state is the newest sample",
        replace(BASE, behind_newest_s=40.0, warming=(7, 25)), UNVERIFIED,
        ("warming up: 7 of 25 samples since 2027-01-15T08:59:53+00:00 (after a gap, a live state needs the "
         "model's window; until then it is the one before the gap, 40 s older than the newest sample)",)),
    # ---- the newest sample has every MV and CV (a missing one, or one its source refused as bad)
    Row("the newest sample without its CV", "newest sample has every MV and CV", replace(BASE, missing_now=("y0",)),
        UNVERIFIED, ("the newest sample has no value of y0 (missing, or refused as bad by its source): the plan "
                     "would start from a state not measured",)),
    Row("the newest sample without its MV and CV", "newest sample has every MV and CV",
        replace(BASE, missing_now=("u0", "y0")), UNVERIFIED,
        ("the newest sample has no value of u0, y0 (missing, or refused as bad by its source): the plan would "
         "start from a state not measured",)),
    Row("the newest sample complete", "newest sample has every MV and CV", replace(BASE, missing_now=()), VERIFIED),
    # ---- the newest sample's values flagged by a cleaning rule or off the CV's trend (data/flags.py)
    Row("the newest CV value flagged as a jump", "newest sample not flagged", replace(BASE, flagged={"y0": "jump"}),
        UNVERIFIED, ("the newest sample's value of y0: jump is flagged (a jump: more than 4 noise sigmas off the "
                     "CV's trend, a spike or a step the next samples tell apart): the plan would start from a value "
                     "that may be a glitch",)),
    Row("the newest sample with no value flagged", "newest sample not flagged", replace(BASE, flagged={}), VERIFIED),
    # ---- reported, never refused: a CV value cleaning filled in among the rows the live state reads
    Row("a CV value filled in inside the live window", "live window's CV samples measured",
        replace(BASE, filled_in=(-3,)), VERIFIED),
    # ---- settled evidence (pipeline.settled_evidence), none in this world: no val / test runs to score
    Row("a CV without a target: the steady-state target without settled evidence",
        "settled evidence of the steady-state target", replace(BASE, cv_target=None, planned_end=12.0), UNVERIFIED,
        ("the steady-state target the plan steers to has no settled evidence: no UQ evidence: 0 val block(s) of 5 "
         "steps; at least 2 are needed (9 from >= 2 runs for split conformal); 0 unique test steps; at least 120 are "
         "needed; 0 test run(s) with a block; at least 2 are needed; no test block",)),
    Row("an integrating CV: the plan's end without settled evidence", "settled evidence of the plan's end",
        replace(BASE, integrating=True), UNVERIFIED,
        ("the end of the plan, its last move held 30 samples (an integrating CV's) has no settled evidence: no UQ "
         "evidence: 0 val block(s) of 60 steps; at least 2 are needed (9 from >= 2 runs for split conformal); 0 "
         "unique test steps; at least 120 are needed; 0 test run(s) with a block; at least 2 are needed; no test "
         "block",)),
    # ---- model gates
    Row("a model gate failed", "model gate G2",
        replace(BASE, gates=(BASE.gates[0], Gate("G2", "free-run fit R2", 0.21, 0.3, False))),
        UNVERIFIED, ("model gate G2 failed: free-run fit R2 = 0.21 (threshold 0.3)",)),
    Row("a model gate not measurable", "model gate G1",
        replace(BASE, gates=(Gate("G1", "one-step fit R2", None, 0.5, False), BASE.gates[1])),
        UNVERIFIED, ("model gate G1 failed: one-step fit R2 = n/a (threshold 0.5)",)),
    # ---- the independent verifier
    Row("the chosen candidate not verified", "candidate verified independently",
        replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL),
                             Plan(CandidateKind.ROBUST, verified=False,
                                  verify_reasons=("solver reported no cost", "cost off")))),
        UNVERIFIED, ("candidate not verified: solver reported no cost; cost off",)),
    Row("the chosen candidate not verified, no reason given", "candidate verified independently",
        replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL),
                             Plan(CandidateKind.ROBUST, verified=False))),
        UNVERIFIED, ("candidate not verified: independent check disagrees",)),
    # ---- the band against the improvement over holding: (|planned end - 0| + band 1) / max(|held end - 0|,
    # 0.1 x range 200 = 20) (y0's range 200 divides both), at most uq.max_band_fraction = 0.25
    Row("band too wide for the improvement the plan claims", "band against the improvement over holding",
        replace(BASE, planned_end=10.0, held_end=40.0), UNVERIFIED,
        ("band against the improvement: the plan's predicted end widened by the band is 0.275 of holding's error; "
         "uq.max_band_fraction allows 0.25",)),
    Row("band against the improvement exactly the maximum", "band against the improvement over holding",
        replace(BASE, planned_end=9.0, held_end=-40.0), VERIFIED),
    Row("near the targets: the band too wide for a tenth of the range", "band against the improvement over holding",
        replace(BASE, planned_end=5.0, held_end=4.0), UNVERIFIED,
        ("band against the improvement: the plan's predicted end widened by the band is 0.3 of 0.1 of the CV "
         "ranges (holding's error is less); uq.max_band_fraction allows 0.25",)),
    Row("near the targets: exactly the maximum of a tenth of the range", "band against the improvement over holding",
        replace(BASE, planned_end=-4.0, held_end=4.0), VERIFIED),
    Row("no hold prediction", "band against the improvement over holding",
        replace(BASE, plans=(Plan(CandidateKind.HOLD, has_controls=False), Plan(CandidateKind.NOMINAL),
                             Plan(CandidateKind.ROBUST))), UNVERIFIED,
        ("no hold prediction to compare the plan's improvement with",)),
    # ---- consistency of the inputs (built by pipeline.recommend)
    Row("model from an older binding revision", "model from the binding's revision",
        replace(BASE, binding_revision=2, artifact_revision=1),
        UNVERIFIED, ("model artifact is from binding revision 1, the binding is at revision 2",)),
    Row("calibration of another model artifact", "calibration of this model",
        replace(BASE, calibration_of_other_artifact=True),
        UNVERIFIED, ("calibration belongs to another model artifact",)),
    Row("calibration scored by an older rule", "calibration scored by this version's rule",
        replace(BASE, evidence={"score_rule": "per CV: the largest |measured - predicted| (an older text)"}),
        UNVERIFIED, ("the calibration was scored by an older max_residual rule than this version's: run the "
                     "recalibrate job",)),
    Row("calibration stored before scores were named", "calibration scored by this version's rule",
        replace(BASE, evidence={"score": None, "score_rule": None}),
        UNVERIFIED, ("the calibration was scored by an older max_residual rule than this version's: run the "
                     "recalibrate job",)),
    # ---- the model's own outcomes in the plant (outcomes.model_outcome_condition)
    Row("two of the model's last three outcomes deviated", "outcomes of this model in the plant",
        replace(BASE, model_outcomes=("deviated", "confirmed", "deviated"), training_data_hash="drifted"),
        UNVERIFIED, (f"the plant disagrees with this model: 2 of the last 3 outcomes of {SPEC.id} deviated from "
                     "the prediction (newest out-drifted-2)",)),
    Row("one of the model's last three outcomes deviated", "outcomes of this model in the plant",
        replace(BASE, model_outcomes=("deviated", "confirmed", "confirmed"), training_data_hash="one-off"),
        VERIFIED),
]


def test_every_condition_holds_in_the_base_world(ledger):
    for world in (BASE, STRICT):
        record = recommend(ledger, world)
        assert [c.name for c in record.conditions if not c.holds] == []
        assert (record.recommendation.status.value, record.recommendation.reasons) == (VERIFIED, ())


PRODUCT = Path(pipeline.__file__).resolve().parent
# `Condition(c.name, ...)` in recommend.conditions words again the UQ gate's conditions (uq.gate_checks): no new name
PASSED_ON = {"recommend.py: c.name"}


def _texts(node: ast.expr, assigned: Mapping[str, list[ast.expr]]) -> tuple[set[str], set[str], set[str]]:
    """(strings, f-string patterns, expressions not read) that `node` can be: a literal, each branch of
    a conditional, a variable through its assignments in the function (`assigned`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}, set(), set()
    if isinstance(node, ast.JoinedStr):  # its literal parts, anything in place of each {...}
        return set(), {"".join(re.escape(part.value) if isinstance(part, ast.Constant) else ".+"
                               for part in node.values)}, set()
    branches = [node.body, node.orelse] if isinstance(node, ast.IfExp) else \
        assigned.get(node.id, []) if isinstance(node, ast.Name) else []
    found = [_texts(branch, {}) for branch in branches] or [(set(), set(), {ast.unparse(node)})]
    return tuple(set().union(*parts) for parts in zip(*found))  # type: ignore[return-value]


def _scopes(tree: ast.Module):
    """Each function of a module (and the module) with the nodes of its own body, not of functions in it."""
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        own, todo = [], list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            own.append(node)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.extend(ast.iter_child_nodes(node))
        yield own


def condition_names_in_the_code() -> tuple[set[str], set[str], set[str]]:
    """Every condition name the product's source can give `Condition` (contracts.Condition, the first
    argument or `name=`), whichever world, template or setting reaches the call: (names, patterns of
    f-string names, "module: expression" of names not read from the source)."""
    names, patterns, unread = set(), set(), set()
    for path in sorted(PRODUCT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("optimizer_pipeline.contracts")
                   and "Condition" in {a.name for a in n.names} for n in ast.walk(tree)):
            continue  # another Condition (threading's in solver/pool.py)
        for own in _scopes(tree):
            assigned: dict[str, list[ast.expr]] = {}
            for node in own:
                for target in node.targets if isinstance(node, ast.Assign) else ():
                    pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(
                        node.value, ast.Tuple) else [(target, node.value)]
                    for name, value in pairs:
                        if isinstance(name, ast.Name):
                            assigned.setdefault(name.id, []).append(value)
            for call in own:
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Condition":
                    arg = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "name")
                    found = _texts(arg, assigned)
                    names |= found[0]
                    patterns |= found[1]
                    unread |= {f"{path.name}: {text}" for text in found[2]}
    return names, patterns, unread


def test_every_condition_of_verified_has_a_row():
    names, patterns, unread = condition_names_in_the_code()
    # the reading finds them: a name in a function of its own, a variable's, an f-string's
    assert {"newest sample not flagged", "settled evidence of the plan's end"} <= names
    assert any(re.fullmatch(p, "model gate G4") for p in patterns)
    assert unread == PASSED_ON, "a condition name the source does not spell out: read it here"
    rows = {row.condition for row in MATRIX}
    assert sorted(names - rows) == [], "a condition the code can emit without a row in MATRIX"
    assert sorted(p for p in patterns if not any(re.fullmatch(p, row) for row in rows)) == []
    stale = [row for row in rows if row not in names and not any(re.fullmatch(p, row) for p in patterns)]
    assert stale == [], "a row about a condition the code no longer emits"


def test_every_condition_any_world_emits_has_a_row(ledger):
    emitted = {c.name for world in (BASE, STRICT, *(row.world for row in MATRIX))
               for c in recommend(ledger, world).conditions}
    assert sorted(emitted - {row.condition for row in MATRIX}) == [], "a condition emitted without a row in MATRIX"


@pytest.mark.parametrize("row", MATRIX, ids=[row.name for row in MATRIX])
def test_one_condition_decides_the_status_and_the_reasons(ledger, row):
    record = recommend(ledger, row.world)
    rec = record.recommendation
    assert (rec.status.value, rec.reasons) == (row.status, row.reasons)
    failing = [] if row.status == VERIFIED else [row.condition]
    if row.status == REJECTED and row.condition != "feasible candidate":
        failing.append("feasible candidate")  # a failed solve has no candidate either
    assert [c.name for c in record.conditions if not c.holds] == failing
    stored = ledger.get_recommendation(rec.id)  # the ledger holds the same decision
    assert (stored.status, tuple(stored.reasons)) == (row.status, row.reasons)


def test_every_failing_condition_is_listed_in_reading_order(ledger):
    world = replace(BASE, calibrated_before=timedelta(days=8), y_now=20.0,
                    gates=(Gate("G1", "one-step fit R2", 0.1, 0.5, False), BASE.gates[1]),
                    calibration_of_other_artifact=True)
    rec = recommend(ledger, world).recommendation
    assert rec.status.value == UNVERIFIED
    assert rec.reasons == ("calibration is 8 days old, beyond uq.fresh_days (7 days): recalibrate",
                           "input distance 5 exceeds 4",
                           "model gate G1 failed: one-step fit R2 = 0.1 (threshold 0.5)",
                           "calibration belongs to another model artifact")


# ---------------------------------------------------------------------------- the evidence source


def test_recommendation_with_evidence_names_the_source_of_its_calibration_data(ledger):
    rec = recommend(ledger, BASE).recommendation
    assert rec.evidence["source"] == "simulation"
    assert ledger.get_recommendation(rec.id).evidence_source == "simulation"


def test_recommendation_without_evidence_is_unassessed(ledger):
    rec = recommend(ledger, replace(BASE, evidence=NO_EVIDENCE)).recommendation
    assert rec.evidence["source"] == "unassessed"
    assert ledger.get_recommendation(rec.id).evidence_source == "unassessed"
    assert rec.band == (None,) and rec.evidence["coverage_threshold"] is None


def test_stale_calibration_is_not_a_condition_without_evidence(ledger):
    record = recommend(ledger, replace(BASE, evidence=NO_EVIDENCE, calibrated_before=timedelta(days=30)))
    assert "calibration fresh" not in {c.name for c in record.conditions}
    assert record.recommendation.reasons == ("no UQ evidence: 1 val block(s); at least 2 are needed",)


# ---------------------------------------------------------------------------- which candidate is published


def test_the_robust_candidate_is_published_when_it_is_feasible(ledger):
    record = recommend(ledger, BASE)
    assert record.chosen.kind is CandidateKind.ROBUST
    assert record.recommendation.candidate_id == candidate_id(record.run_id, 2)


def test_the_nominal_candidate_is_published_when_the_robust_one_is_infeasible(ledger):
    world = replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL),
                                 Plan(CandidateKind.ROBUST, feasible=False)))
    record = recommend(ledger, world)
    assert record.chosen.kind is CandidateKind.NOMINAL
    assert (record.recommendation.status.value, record.recommendation.candidate_id) == (
        VERIFIED, candidate_id(record.run_id, 1))


def test_a_feasible_robust_candidate_is_published_even_when_only_the_nominal_one_is_verified(ledger):
    world = replace(BASE, plans=(Plan(CandidateKind.HOLD), Plan(CandidateKind.NOMINAL),
                                 Plan(CandidateKind.ROBUST, verified=False, verify_reasons=("cost off",))))
    record = recommend(ledger, world)
    assert record.chosen.kind is CandidateKind.ROBUST
    assert record.recommendation.reasons == ("candidate not verified: cost off",)


def test_a_rejected_recommendation_has_no_plan(ledger):
    rec = recommend(ledger, MATRIX[0].world).recommendation
    assert (rec.candidate_id, rec.controls, rec.predicted, rec.cost) == (None, (), (), None)


def test_a_verified_recommendation_is_valid_for_the_profiles_period(ledger):
    rec = recommend(ledger, BASE).recommendation
    assert rec.created_at == iso_utc(NOW)
    assert rec.valid_until == iso_utc(NOW + timedelta(seconds=SPEC.profile.valid_for_s))


# ---------------------------------------------------------------------------- decide, below pipeline.recommend


def test_unknown_input_distance_is_its_own_reason(ledger):
    # recommend cannot get here (compile_problem refuses a non-finite live value first), so the
    # snapshot is built with a missing current CV and decide is called directly
    record = recommend(ledger, BASE)
    stored, artifact, split, calibration, _, settings = inputs(BASE)
    snapshot = pipeline.evidence_snapshot(calibration, artifact, [1.0], [float("nan")], "simulation", settings, NOW,
                                          split.live.t[-1])
    assert snapshot.input_distance is None
    result = SolveResult(record.problem.hash, True, tuple(candidate(p, record.problem.horizon) for p in HONEST), {})
    decision = decide(SPEC, 1, artifact, record.problem, result, snapshot, (1.0,), 4.0, "or-test", NOW)
    assert decision.recommendation.status.value == UNVERIFIED
    assert decision.recommendation.reasons == ("input distance unknown (missing or non-finite current values)",)


# ---------------------------------------------------------------------------- the conditions table (UI)


def test_the_conditions_table_shows_what_each_condition_was_judged_on_and_its_limit(ledger):
    record = recommend(ledger, BASE)
    h = record.recommendation.model_artifact_hash[:12]
    rule = hashlib.sha256(uq.SCORE_RULES[uq.MAX_RESIDUAL].encode()).hexdigest()[:8]
    assert [(c.name, c.value, c.limit) for c in record.conditions] == [
        ("feasible candidate", "robust (seq 2)", "robust, else nominal, feasible"),
        ("UQ evidence", "split_conformal", "split_conformal or empirical_max"),
        ("test coverage (worst CV)", "0.9", ">= 0.8"),
        ("calibration fresh", "24 h old", "<= 7 days"),
        ("input distance (max |z| of current MVs, CVs)", "1", "<= 4"),
        ("live state age", "0 s old", "<= 300 s (live.max_age_s)"),
        ("model gate G1", "0.9", "one-step fit R2"),
        ("model gate G2", "0.7", "free-run fit R2"),
        ("candidate verified independently", "cost 1, independent 1", "feasible and costs agree"),
        ("steady-gain uncertainty along the planned move", "y0: 0 against band 1", "<= band (2 standard errors)"),
        ("band against the improvement over holding", "0.05 of 0.1 of the CV ranges (holding's error is less)",
         "<= 0.25 (uq.max_band_fraction)"),
        ("model from the binding's revision", "r1", "r1"),
        ("calibration of this model", h, h),
        ("calibration scored by this version's rule", f"max_residual, rule {rule}", f"max_residual, rule {rule}"),
        ("outcomes of this model in the plant", "no conclusive outcome yet",
         "no drift: deviated in < 2 of the last 3 conclusive, the band hits of the last 10 not significantly below "
         "the promised rate")]


def test_the_conditions_table_of_a_rejected_solve_and_an_unknown_calibration_time(ledger):
    world = replace(MATRIX[0].world, calibrated_before=None)
    table = {c.name: c.value for c in recommend(ledger, world).conditions}
    assert (table["feasible candidate"], table["calibration fresh"]) == ("none", "calibration time unknown")


def test_the_gain_condition_judges_the_gain_of_the_model_the_plan_was_solved_with(ledger):
    """A steady target solved with a local refit (model/local.py) carries that refit's gain record:
    its uncertainty, not the identified artifact's, decides the steady-gain condition."""
    world = replace(BASE, plan_end=2.0)  # a move of one normalised unit: 2 x 0.125 <= band 0.5
    record = recommend(ledger, world)
    _, artifact, split, calibration, _, settings = inputs(world)
    snapshot = pipeline.evidence_snapshot(calibration, artifact, [1.0], [12.0], "simulation", settings, NOW,
                                          split.live.t[-1])
    result = SolveResult(record.problem.hash, True,
                         tuple(candidate(p, record.problem.horizon, plan_end=2.0) for p in HONEST), {})
    wide = {**artifact.steady_gain, "uncertainty": {**artifact.steady_gain["uncertainty"], "cov": [[[1.0]]],
                                                    "jackknife_cov": [[[1.0]]], "std": [[1.0]]}}

    def failing(steady_gain):
        decision = decide(SPEC, 1, artifact, record.problem, result, snapshot, (1.0,), 4.0, "or-test", NOW,
                          steady_gain=steady_gain)
        return [c.name for c in decision.conditions if not c.holds]

    assert "steady-gain uncertainty along the planned move" not in failing(None)
    assert "steady-gain uncertainty along the planned move" in failing(wide)  # 2 x 1.0 > band 0.5


def test_the_least_determined_gain_direction_is_named_as_a_proportion_of_mv_moves():
    """Two MVs: the gain row's variance is largest along the normalised direction (1, 1) (4 against 0.25
    across it); u1 moves twice as far per normalised unit, so in engineering units the moves that leave
    the gain least determined are u0 : u1 = 0.5 : 1, with a standard error sqrt(4 / 0.25) = 4 times the
    best-determined direction's."""
    from optimizer_pipeline.recommend import undetermined_direction

    turn = np.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2.0)
    cov = turn @ np.diag([4.0, 0.25]) @ turn.T
    text = undetermined_direction("y0", cov, np.array([1.0, 2.0]), ("u0", "u1"))
    assert "moves of u0, u1 in the proportion +0.50 : +1.00" in text and "there 4 x the best-determined" in text
    across = undetermined_direction("y0", turn @ np.diag([0.25, 4.0]) @ turn.T, np.array([1.0, 2.0]), ("u0", "u1"))
    assert "proportion -0.50 : +1.00" in across  # the largest move reads +1
