"""The decision matrix of a recommendation (docs/ARCHITECTURE.md, "Recommendation status"; issue 18).

`pipeline.recommend` decides every solve: `rejected` without a feasible candidate, `verified` when
every condition holds, `unverified` otherwise with the failing conditions' texts as `reasons`.

One world is built here in which every condition holds (a one-MV / one-CV binding, a model artifact
of its revision with passing gates, split-conformal evidence calibrated a day ago, a live state one
z away from the train mean, a solver that returns verified candidates). Each row of MATRIX changes
that world in one place and names the single condition it makes fail, with the exact reasons list
expected, or puts one condition exactly on its limit, where the recommendation must stay verified.
A new condition is one more row: `test_every_condition_of_verified_has_a_row` fails until it has one.
"""

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
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
    stored = StoredBinding(SPEC, world.binding_revision, SPEC.spec_hash, None)
    gain = steady_gain_record(MODEL)
    if world.gain_std is not None:
        gain["uncertainty"] = {"method": "given", "replicates": 8, "cov": [[[world.gain_std ** 2]]],
                               "std": [[world.gain_std]]}
    artifact = artifact_from_model(MODEL, SPEC, world.artifact_revision, NORMALISATION, gates=world.gates,
                                   steady_gain=gain, training_data_hash=world.training_data_hash)
    n = 20  # the live run ends live_age_s before now, one sample per period
    t = NOW.timestamp() - world.live_age_s - SPEC.sample_period_s * np.arange(n)[::-1]
    y = np.full((n, 1), 12.0)
    y[-1, 0] = world.y_now
    live = RunSeries("live", t, np.full((n, 1), 1.0), y, np.zeros((n, 0)))
    report = {} if world.behind_newest_s is None else {  # as data.prepare_history records it (period 1 s)
        "live_behind_s": world.behind_newest_s, "live_tail_dropped": world.behind_newest_s > 0.5}
    if world.missing_now is not None:
        report["live_missing"] = list(world.missing_now)
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
        replace(BASE, calibrated_before=timedelta(days=7, seconds=1)), UNVERIFIED, ("calibration is not fresh",)),
    Row("calibration time unknown", "calibration fresh", replace(BASE, calibrated_before=None),
        UNVERIFIED, ("calibration is not fresh",)),
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


def test_every_condition_of_verified_has_a_row(ledger):
    names = {c.name for c in recommend(ledger, STRICT).conditions}
    assert names <= {row.condition for row in MATRIX}, "a condition of `verified` without a row in MATRIX"


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
    assert rec.reasons == ("calibration is not fresh", "input distance 5 exceeds 4",
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
