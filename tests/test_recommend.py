"""recommend.py called directly (no ledger, no solver): the candidate chosen, every condition's value /
limit / holds / reason text, the steady-gain condition on a two-MV / two-CV binding, band_steps and
the recommendation's fields. test_decision_matrix.py checks the same rules end to end through
pipeline.recommend and the ledger; this file is what `make mutation MUTATION_MODULES=recommend` runs
(milliseconds per mutant instead of a DuckDB ledger per test). Every expected value is worked out by
hand in the comments.
"""

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from model_helpers import binding

from optimizer_pipeline.contracts import (
    CandidateKind,
    CVTransform,
    Condition,
    EvidenceSnapshot,
    Gate,
    Normalisation,
    RecommendationStatus,
    SolveCandidate,
    SolveResult,
    Template,
    iso_utc,
)
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.model.artifact import steady_gain_record
from optimizer_pipeline.problem import compile_problem
from optimizer_pipeline.recommend import (
    band_steps,
    choose_candidate,
    conditions,
    decide,
    gain_conditions,
    max_live_age_s,
)
from optimizer_pipeline.recommendation_text import duration

NOW = datetime(2027, 3, 1, 12, 0, tzinfo=timezone.utc)
SPEC = binding(n_mv=2, n_cv=2, na=1, nb=1, delay=1, horizon=4)  # u0, u1 / y0, y1; 1 s; valid for 3600 s
STEADY = replace(SPEC, profile=replace(SPEC.profile, template=Template.STEADY_RESPONSE))
# MV means (1, -2), stds (2, 4); CV stds 2 (y0) and 3 (y1)
NORMALISATION = Normalisation(("u0", "u1", "y0", "y1"), (1.0, -2.0, 10.0, 0.0), (2.0, 4.0, 2.0, 3.0))
MODEL = ArxModel(Orders(1, 1, 1), np.zeros((1, 2, 2)), np.full((1, 2, 2), 0.5), np.zeros((1, 2, 0)), np.zeros(2))
# gain covariance per CV (normalised): y0 only along u0, y1 only along u1
COV = [[[1 / 64, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1 / 16]]]
GATES = (Gate("G1", "one-step fit R2", 0.9, 0.5, True), Gate("G2", "free-run fit R2", 0.123456, 0.3, False))
U_NOW = (3.0, 2.0)  # normalised: ((3 - 1) / 2, (2 + 2) / 4) = (1, 1)
# the plan's last MVs (7, 10): normalised ((7 - 1) / 2, (10 + 2) / 4) = (3, 3), a move of (2, 2)
CONTROLS = ((5.0, 6.0), (6.0, 8.0), (7.0, 9.0), (7.0, 10.0))
PREDICTED = ((11.0, 1.0),) * 4


def artifact(cov=COV, gates=GATES, jackknife_cov=None):
    gain = steady_gain_record(MODEL)
    gain["uncertainty"] = None if cov is None else {"method": "given", "replicates": 8, "cov": cov}
    if jackknife_cov is not None:
        gain["uncertainty"]["jackknife_cov"] = jackknife_cov
    return artifact_from_model(MODEL, SPEC, 3, NORMALISATION, gates=gates, steady_gain=gain)


ARTIFACT = artifact()
PROBLEM = compile_problem(SPEC, ARTIFACT, np.zeros(2), np.zeros(2), np.array(U_NOW), np.zeros(0), np.ones(2))


def cand(kind: CandidateKind, seq: int, feasible: bool = True, verified: bool = True, controls=CONTROLS,
         report=None, cost: float = 1.5, independent: float = 1.25, predicted=PREDICTED) -> SolveCandidate:
    return SolveCandidate(seq=seq, kind=kind, solver_status="solved", controls=controls,
                          predicted=predicted if controls else (), cost=cost, constraints={}, feasible=feasible,
                          verified=verified, independent_cost=independent,
                          verify_report={"reasons": []} if report is None else report)


# holding ends far from the targets (0, 0): the plans' improvement over it is beyond their band
HOLD, NOMINAL, ROBUST = (cand(CandidateKind.HOLD, 0, predicted=PREDICTED[:-1] + ((100.0, 50.0),)),
                         cand(CandidateKind.NOMINAL, 1, cost=2.0),
                         cand(CandidateKind.ROBUST, 2))


def result(*candidates: SolveCandidate, ok: bool = True, code=None, message=None) -> SolveResult:
    return SolveResult(PROBLEM.hash, ok, candidates or (HOLD, NOMINAL, ROBUST), {}, code, message)


UQ = {"method": "split_conformal", "qhat": [1.0, 1.0], "block_length": 10, "coverage_threshold": 0.8}


def snapshot(**changes) -> EvidenceSnapshot:
    """Evidence in which every condition holds: calibrated 1.5 days ago (fresh for 7.5), input distance
    1, live sample 30 s old against a 300 s limit."""
    base = dict(source="real", has_evidence=True, uq=UQ, uq_checks=(), calibrated_at=iso_utc(NOW - timedelta(days=1.5)),
                calibration_fresh=True, fresh_days=7.5, input_distance=1.0,
                live_sample_at=iso_utc(NOW - timedelta(seconds=30)), live_age_s=30.0, live_max_age_s=300.0)
    return EvidenceSnapshot(**{**base, **changes})


def by_name(found: list[Condition]) -> dict[str, Condition]:
    return {c.name: c for c in found}


# ---------------------------------------------------------------------------- live age and its text


def test_the_default_live_age_limit_is_ten_periods_and_at_least_300_s():
    assert max_live_age_s(None, 29.5) == 300.0  # 295 s -> the floor
    assert max_live_age_s(None, 30.5) == 305.0
    assert max_live_age_s(12, 600) == 12.0 and isinstance(max_live_age_s(12, 600), float)


@pytest.mark.parametrize("seconds, text", [
    (0.0, "0 s"), (7199.5, "7199.5 s"), (-7199.0, "-7199 s"),
    # seconds to a tenth: a calibration of the same run (~10 ms before) reads "0 s", never "1.14e-07 days"
    (0.00985, "0 s"), (-0.04, "0 s"), (12.34, "12.3 s"), (12.36, "12.4 s"), (300.5, "300.5 s"),
    (7200.0, "2 h"), (9000.0, "2.5 h"), (-7200.0, "-2 h"), (172799.0, "48 h"), (-172799.0, "-48 h"),
    (172800.0, "2 days"), (302400.0, "3.5 days"), (-172800.0, "-2 days"),
    # just past a rounding edge: 148536 s = 41.26 h -> 41.3; 8683286.4 s = 100.501 days -> 101
    (148536.0, "41.3 h"), (8683286.4, "101 days"),
    # whole days from 100 on, never "1.23e+03 days"
    (99.5 * 86400, "99.5 days"), (1234.4 * 86400, "1234 days"),
])
def test_a_duration_is_seconds_below_2_h_hours_below_2_days_then_days(seconds, text):
    assert duration(seconds) == text


# ---------------------------------------------------------------------------- the candidate


def test_the_robust_candidate_first_then_the_nominal_one_never_the_hold():
    assert choose_candidate(result(HOLD, NOMINAL, ROBUST)) is ROBUST
    assert choose_candidate(result(ROBUST, NOMINAL, HOLD)) is ROBUST  # by kind, not by position
    infeasible = replace(ROBUST, feasible=False)
    assert choose_candidate(result(HOLD, NOMINAL, infeasible)) is NOMINAL
    assert choose_candidate(result(HOLD, NOMINAL, replace(ROBUST, controls=()))) is NOMINAL
    assert choose_candidate(result(HOLD, replace(NOMINAL, feasible=False), infeasible)) is None
    assert choose_candidate(result(HOLD, replace(NOMINAL, controls=()), replace(ROBUST, controls=()))) is None
    assert choose_candidate(result(HOLD)) is None
    # feasible without a plan, or with a plan but infeasible: neither is published
    assert choose_candidate(result(HOLD, replace(NOMINAL, controls=()), infeasible)) is None


# ---------------------------------------------------------------------------- conditions


def test_every_condition_holds_with_its_value_and_limit():
    found = conditions(ARTIFACT, snapshot(), ROBUST, 4.0, NOW)
    assert [(c.name, c.value, c.limit, c.holds) for c in found] == [
        ("feasible candidate", "robust (seq 2)", "robust, else nominal, feasible", True),
        ("calibration fresh", "36 h old", "<= 7.5 days", True),
        ("input distance (max |z| of current MVs, CVs)", "1", "<= 4", True),
        ("live state age", "30 s old", "<= 300 s (live.max_age_s)", True),
        ("model gate G1", "0.9", "one-step fit R2", True),
        ("model gate G2", "0.1235", "free-run fit R2", False),  # 0.123456 to 4 significant digits
        ("candidate verified independently", "cost 1.5, independent 1.25", "feasible and costs agree", True)]
    assert [c.reason for c in found if not c.holds] == [
        "model gate G2 failed: free-run fit R2 = 0.1235 (threshold 0.3)"]


def test_without_a_candidate_the_first_condition_fails_and_there_is_no_verifier_condition():
    found = conditions(ARTIFACT, snapshot(), None, 4.0, NOW)
    first = found[0]
    assert (first.name, first.value, first.holds, first.reason) == (
        "feasible candidate", "none", False, "no feasible candidate")
    assert found[-1].name == "model gate G2"


def test_the_uq_checks_keep_their_texts_and_gate_failures_are_prefixed():
    checks = (Condition("UQ evidence", "none", "split_conformal or empirical_max", False, "no UQ evidence: few blocks"),
              Condition("test coverage (worst CV)", "0.7", ">= 0.8", False, "coverage 0.7 < 0.8"),
              Condition("coverage 95% lower bound", "0.9", ">= 0.8", True, "unused"))
    found = conditions(ARTIFACT, snapshot(uq_checks=checks), ROBUST, 4.0, NOW)
    assert [(c.name, c.value, c.limit, c.holds) for c in found[1:4]] == [
        (c.name, c.value, c.limit, c.holds) for c in checks]
    assert [c.reason for c in found[1:4]] == [
        "no UQ evidence: few blocks", "UQ gate: coverage 0.7 < 0.8", "UQ gate: unused"]


@pytest.mark.parametrize("before, age", [
    (timedelta(days=100.501), "101 days"),  # 8 683 286.4 s to 3 significant digits
    (timedelta(milliseconds=9.85), "0 s"),  # calibrated in the same run
    (timedelta(seconds=12.34), "12.3 s"), (timedelta(hours=3.2), "3.2 h"), (timedelta(days=2.1), "2.1 days"),
])
def test_the_calibration_age_reads_as_a_duration(before, age):
    at = iso_utc(NOW - before)
    c = by_name(conditions(ARTIFACT, snapshot(calibrated_at=at, calibration_fresh=False), ROBUST, 4.0,
                           NOW))["calibration fresh"]
    assert c.value == f"{age} old"


def test_calibration_freshness_is_judged_only_with_evidence():
    assert "calibration fresh" not in by_name(conditions(ARTIFACT, snapshot(has_evidence=False), ROBUST, 4.0, NOW))
    stale = by_name(conditions(ARTIFACT, snapshot(calibration_fresh=False), ROBUST, 4.0, NOW))["calibration fresh"]
    assert (stale.holds, stale.reason) == (False, f"calibration is {stale.value}, beyond uq.fresh_days (7.5 days): "
                                                  f"recalibrate")
    unknown = by_name(conditions(ARTIFACT, snapshot(calibrated_at=None, calibration_fresh=False), ROBUST, 4.0, NOW))
    assert (unknown["calibration fresh"].value, unknown["calibration fresh"].holds) == (
        "calibration time unknown", False)
    assert unknown["calibration fresh"].reason == "the calibration's time is unknown: it is not fresh"


@pytest.mark.parametrize("distance, holds, value, reason", [
    (4.0, True, "4", None),  # exactly the maximum
    (4.5, False, "4.5", "input distance 4.5 exceeds 4"),
    (4.123456, False, "4.123", "input distance 4.12 exceeds 4"),  # value 4 digits, reason 3
    (None, False, "n/a", "input distance unknown (missing or non-finite current values)"),
])
def test_input_distance(distance, holds, value, reason):
    found = by_name(conditions(ARTIFACT, snapshot(input_distance=distance), ROBUST, 4.0, NOW))
    c = found["input distance (max |z| of current MVs, CVs)"]
    assert (c.value, c.limit, c.holds) == (value, "<= 4", holds)
    if reason is not None:
        assert c.reason == reason


def test_input_distance_limit_text_keeps_its_fraction():
    found = by_name(conditions(ARTIFACT, snapshot(input_distance=3.0), ROBUST, 2.5, NOW))
    c = found["input distance (max |z| of current MVs, CVs)"]
    assert (c.limit, c.holds, c.reason) == ("<= 2.5", False, "input distance 3 exceeds 2.5")


@pytest.mark.parametrize("age, limit, holds", [(300.0, 300.0, True), (300.5, 300.0, False), (0.0, None, False)])
def test_live_state_age_against_its_limit(age, limit, holds):
    sample = iso_utc(NOW - timedelta(seconds=age))
    c = by_name(conditions(ARTIFACT, snapshot(live_age_s=age, live_max_age_s=limit, live_sample_at=sample), ROBUST,
                           4.0, NOW))["live state age"]
    assert c.holds is holds
    if not holds:
        allowed = "300" if limit is not None else "n/a"
        assert c.reason == (f"live state is {age:g} s old (last sample {sample}); live.max_age_s allows {allowed} s")


def test_live_state_age_in_hours_and_unknown():
    sample = iso_utc(NOW - timedelta(hours=3))
    c = by_name(conditions(ARTIFACT, snapshot(live_age_s=10800.0, live_max_age_s=60.5, live_sample_at=sample),
                           ROBUST, 4.0, NOW))["live state age"]
    assert (c.value, c.limit, c.holds) == ("3 h old", "<= 60.5 s (live.max_age_s)", False)
    assert c.reason == f"live state is 3 h old (last sample {sample}); live.max_age_s allows 60.5 s"
    c = by_name(conditions(ARTIFACT, snapshot(live_age_s=None, live_sample_at=None), ROBUST, 4.0,
                           NOW))["live state age"]
    assert (c.value, c.holds, c.reason) == ("unknown", False, "live state age unknown")


def test_a_gate_without_a_value_fails_with_n_a():
    gates = (Gate("G3", "step response sign", None, 1.0, False),)
    c = by_name(conditions(artifact(gates=gates), snapshot(), ROBUST, 4.0, NOW))["model gate G3"]
    assert (c.value, c.limit, c.holds, c.reason) == (
        "n/a", "step response sign", False, "model gate G3 failed: step response sign = n/a (threshold 1)")


def test_the_verifier_condition_lists_its_reasons_or_says_it_disagrees():
    def verifier(candidate):
        return by_name(conditions(ARTIFACT, snapshot(), candidate, 4.0, NOW))["candidate verified independently"]

    c = verifier(replace(ROBUST, verified=False, verify_report={"reasons": ["cost off", 3]}))
    assert (c.holds, c.reason) == (False, "candidate not verified: cost off; 3")
    c = verifier(replace(ROBUST, verified=False, verify_report={}))
    assert (c.holds, c.reason) == (False, "candidate not verified: independent check disagrees")
    c = verifier(replace(ROBUST, cost=None, independent_cost=None))
    assert (c.value, c.holds) == ("cost n/a, independent n/a", True)


# ---------------------------------------------------------------------------- steady-gain uncertainty

GAIN = "steady-gain uncertainty along the planned move"


def gain(qhat, candidate=ROBUST, art=ARTIFACT, **changes):
    return gain_conditions(art, PROBLEM, snapshot(uq={**UQ, "qhat": qhat}, **changes), candidate)


def test_gain_uncertainty_exactly_on_the_band_holds():
    # move (2, 2): y0 2 * sqrt(4 / 64) = 0.5, y1 2 * sqrt(4 / 16) = 1.0; against qhat (1, 1) the worst
    # ratio is y1's 1.0, engineering 1.0 x 3 = 3 against band 1 x 3 = 3
    [c] = gain([1.0, 1.0])
    assert (c.name, c.value, c.limit, c.holds) == (GAIN, "y1: 3 against band 3", "<= band (2 standard errors)", True)


def test_gain_uncertainty_beyond_the_band_fails_on_the_worst_cv():
    [c] = gain([1.0, 0.8])  # y1: 1.0 > 0.8; band 0.8 x 3 = 2.4
    assert (c.value, c.holds) == ("y1: 3 against band 2.4", False)
    # y1's gain is uncertain in u1's coefficient alone (cov diag(0, 1/16)): moves of u1 would determine it
    assert c.reason == ("steady-gain uncertainty: along the planned move a settled y1 error of up to 3 "
                        "(2 standard errors of the gain) exceeds the band 2.4; the gain of y1 is least determined "
                        "for moves of u0, u1 in the proportion +0.00 : +1.00 (engineering units): step tests moving "
                        "them together that way would determine it")


def test_the_worst_cv_is_the_one_with_the_largest_spread_over_band_not_the_largest_spread():
    # ratios y0 0.5 / 0.25 = 2, y1 1.0 / 4 = 0.25: y0 is worst, engineering 0.5 x 2 = 1 against 0.25 x 2 = 0.5
    [c] = gain([0.25, 4.0])
    assert (c.value, c.holds) == ("y0: 1 against band 0.5", False)
    # a zero band: any spread is infinitely worse (y0), even beside a larger ratio-1 spread (y1)
    [c] = gain([0.0, 1.0])
    assert (c.value, c.holds) == ("y0: 1 against band 0", False)


def test_gain_uncertainty_of_a_move_along_one_mv_only():
    # plan end (7, 2): move (2, 0): y0 spread 0.5, y1 0; qhat (0.5, 0.5): y0 exactly on the band
    end = CONTROLS[:-1] + ((7.0, 2.0),)
    [c] = gain([0.5, 0.5], candidate=replace(ROBUST, controls=end))
    assert (c.value, c.holds) == ("y0: 1 against band 1", True)
    # plan end (1, 10): move (-1, 2): y0 2 * sqrt(1 / 64) = 0.25, y1 1.0
    end = CONTROLS[:-1] + ((1.0, 10.0),)
    [c] = gain([0.25, 2.0], candidate=replace(ROBUST, controls=end))
    assert (c.value, c.holds) == ("y0: 0.5 against band 0.5", True)


def test_the_gain_spread_of_a_transformed_cv_is_carried_to_engineering_units_from_the_plan_end():
    # y1 saturates toward +-2 (a logit, z = 2 atanh(y / 2)): the plan ends at y1 = 1, z = 2 atanh(0.5); its
    # spread 1.0 (normalised, std 3) is +-3 in z, which reaches y1 = 2 tanh((z + 3) / 2) = 1.934 and
    # 2 tanh((z - 3) / 2) = -1.480: the larger, 2.480 from the end, counts (computed here by hand)
    z = 2 * math.atanh(0.5)
    reach = max(abs(2 * math.tanh((z + 3) / 2) - 1), abs(2 * math.tanh((z - 3) / 2) - 1))
    assert f"{reach:.4g}" == "2.48"
    norm = replace(NORMALISATION, transforms={"y1": CVTransform("logit", -2.0, 2.0)})
    transformed = artifact_from_model(MODEL, SPEC, 3, norm, gates=GATES, steady_gain=ARTIFACT.steady_gain)
    [c] = gain([1.0, 0.85], art=transformed)  # band 2.55: holds (untransformed, 3 > 2.55 would not)
    assert (c.value, c.holds) == ("y1: 2.48 against band 2.55", True)
    [c] = gain([1.0, 0.8], art=transformed)  # band 2.4 (dy/dz at the end, 0.75 x 3 = 2.25, would pass it)
    assert (c.value, c.holds) == ("y1: 2.48 against band 2.4", False)


def test_no_gain_condition_without_a_candidate_or_without_evidence():
    assert gain([1.0, 1.0], candidate=None) == []
    assert gain([1.0, 1.0], has_evidence=False) == []


def test_unknown_gain_uncertainty_fails():
    [c] = gain([1.0, 1.0], art=artifact(cov=None))
    assert (c.name, c.value, c.limit, c.holds, c.reason) == (
        GAIN, "unknown", "<= band (2 standard errors)", False,
        "steady-gain uncertainty unknown (the model records none: fewer than 2 train runs)")


def test_the_gain_condition_judges_the_jackknife_part_of_a_record_that_keeps_its_parts():
    """A record with its parts (model/artifact.py): the total cov adds the operating-range spread,
    which the band already covers; the condition judges `jackknife_cov`. A record without the parts
    (cov was the jackknife) is judged by its cov."""
    evidence = snapshot(uq={**UQ, "qhat": [1.0, 1.0]})
    parts = artifact(cov=(4 * np.asarray(COV)).tolist(), jackknife_cov=COV)
    [c] = gain_conditions(parts, PROBLEM, evidence, ROBUST)
    assert (c.value, c.holds) == ("y1: 3 against band 3", True)  # the jackknife's: 4 x cov would give 6
    [old] = gain_conditions(artifact(cov=(4 * np.asarray(COV)).tolist()), PROBLEM, evidence, ROBUST)
    assert (old.value, old.holds) == ("y1: 6 against band 3", False)


def test_the_gain_uncertainty_of_the_model_the_plan_was_solved_with_is_judged():
    """A local refit's gain record (decide's `steady_gain`) replaces the artifact's: the artifact's
    covariance fits the band, a refit's four times as large does not (spread x 2), and decide passes it on."""
    refit = artifact(cov=(4 * np.asarray(COV)).tolist()).steady_gain  # 4 x the artifact's covariance
    evidence = snapshot(uq={**UQ, "qhat": [1.0, 1.0]})
    [own] = gain_conditions(ARTIFACT, PROBLEM, evidence, ROBUST)
    [solved] = gain_conditions(ARTIFACT, PROBLEM, evidence, ROBUST, refit)
    assert (own.value, own.holds) == ("y1: 3 against band 3", True)
    assert (solved.value, solved.holds) == ("y1: 6 against band 3", False)
    decided = decide(SPEC, 7, ARTIFACT, PROBLEM, result(), evidence, (3.0, 3.0), 4.0, "or-abc123", NOW,
                     steady_gain=refit)
    assert by_name(list(decided.conditions))[GAIN] == solved
    assert solved.reason in decided.recommendation.reasons


# ---------------------------------------------------------------------------- band_steps


def test_band_steps():
    assert band_steps(SPEC, snapshot(), ROBUST) == 4  # min(block length 10, 4 plan steps)
    assert band_steps(SPEC, snapshot(uq={**UQ, "block_length": 3}), ROBUST) == 3
    assert band_steps(STEADY, snapshot(), ROBUST) == 1
    assert band_steps(SPEC, snapshot(), None) is None
    assert band_steps(SPEC, snapshot(has_evidence=False), ROBUST) is None
    assert band_steps(STEADY, snapshot(has_evidence=False), ROBUST) is None


# ---------------------------------------------------------------------------- decide


def run_decide(res=None, evidence=None, extra=(), spec=SPEC, band=(3.0, 3.0)):
    return decide(spec, 7, ARTIFACT, PROBLEM, res or result(), evidence or snapshot(), band, 4.0, "or-abc123", NOW,
                  extra)


def test_a_verified_recommendation_and_its_fields():
    evidence = snapshot(input_distance=0.5, live_age_s=12.0, live_max_age_s=60.0, live_sample_at="2027-03-01T11:59:48Z")
    art = artifact(gates=GATES[:1])  # G1 only: every condition holds
    decision = decide(SPEC, 7, art, PROBLEM, result(), evidence, (3.0, None), 4.0, "or-abc123", NOW,
                      (Condition("extra", "x", "y", True, "never"),))
    rec = decision.recommendation
    assert decision.chosen is ROBUST
    assert [c.name for c in decision.conditions][-2:] == [GAIN, "extra"]
    assert (rec.status, rec.reasons) == (RecommendationStatus.VERIFIED, ())
    assert rec.id.startswith("rec-") and len(rec.id) == 20
    assert (rec.binding_id, rec.binding_revision, rec.run_id, rec.candidate_id) == ("arx-test", 7, "or-abc123",
                                                                                  "oc-abc123-2")
    assert rec.template is Template.LINEAR_MPC
    assert (rec.created_at, rec.valid_until) == (iso_utc(NOW), iso_utc(NOW + timedelta(hours=1)))
    assert (rec.mv_tags, rec.cv_tags) == (("u0", "u1"), ("y0", "y1"))
    assert (rec.controls, rec.predicted, rec.band, rec.band_steps) == (CONTROLS, PREDICTED, (3.0, None), 4)
    assert (rec.cost, rec.independent_cost) == (1.5, 1.25)
    assert (rec.problem_ir_hash, rec.model_artifact_hash) == (PROBLEM.hash, art.artifact_hash)
    assert rec.evidence == {"source": "real", "uq": UQ, "input_distance": 0.5, "calibration_fresh": True,
                            "coverage_threshold": 0.8,
                            "live_state": {"last_sample_at": "2027-03-01T11:59:48Z", "age_s": 12.0, "max_age_s": 60.0}}


def test_an_unverified_recommendation_lists_every_failing_condition_in_order():
    evidence = snapshot(calibration_fresh=False, input_distance=5.0)
    decision = run_decide(evidence=evidence, extra=(Condition("extra", "x", "y", False, "the extra one"),))
    rec = decision.recommendation
    assert rec.status == RecommendationStatus.UNVERIFIED and rec.reasons[0].endswith(
        " old, beyond uq.fresh_days (7.5 days): recalibrate")
    assert rec.reasons[1:] == ("input distance 5 exceeds 4",
                               "model gate G2 failed: free-run fit R2 = 0.1235 (threshold 0.3)", "the extra one")
    assert rec.candidate_id == "oc-abc123-2"


def test_a_nominal_candidate_is_published_with_its_own_cost():
    rec = run_decide(res=result(HOLD, NOMINAL, replace(ROBUST, feasible=False))).recommendation
    assert (rec.candidate_id, rec.cost) == ("oc-abc123-1", 2.0)


def test_without_a_feasible_candidate_the_recommendation_is_rejected_and_empty():
    infeasible = tuple(replace(c, feasible=False) for c in (HOLD, NOMINAL, ROBUST))
    decision = run_decide(res=result(*infeasible))
    rec = decision.recommendation
    assert decision.chosen is None
    assert (rec.status, rec.reasons) == (RecommendationStatus.REJECTED, (
        "no feasible candidate", "model gate G2 failed: free-run fit R2 = 0.1235 (threshold 0.3)"))
    assert (rec.candidate_id, rec.controls, rec.predicted, rec.cost, rec.independent_cost, rec.band_steps) == (
        None, (), (), None, None, None)


def test_a_failed_solve_is_rejected_even_with_candidates_and_names_the_error_first():
    decision = run_decide(res=result(HOLD, NOMINAL, ROBUST, ok=False, code="SOLVE_TIMEOUT", message="late"))
    rec = decision.recommendation
    assert decision.chosen is None and rec.status is RecommendationStatus.REJECTED
    first = decision.conditions[0]
    assert (first.name, first.value, first.limit, first.holds) == ("solver", "SOLVE_TIMEOUT", "a result", False)
    assert rec.reasons[:2] == ("solver error SOLVE_TIMEOUT: late", "no feasible candidate")


def test_without_evidence_the_source_is_unassessed():
    rec = run_decide(evidence=snapshot(has_evidence=False, uq=None), band=(None, None)).recommendation
    assert (rec.evidence["source"], rec.evidence["coverage_threshold"], rec.band_steps) == ("unassessed", None, None)
    rec = run_decide(evidence=snapshot(uq={**UQ, "coverage_threshold": 1.0})).recommendation
    assert (rec.evidence["source"], rec.evidence["coverage_threshold"]) == ("real", 1.0)


def test_the_band_against_the_improvement_is_the_norm_over_cvs_of_range_scaled_errors():
    """improvement_conditions on 2 CVs (targets 0, ranges 200): the plan ends at (6, 0), holding at
    (30, 40); band (3, 4): (|6| + 3, 0 + 4) / 200 against (30, 40) / 200, norms sqrt(97) and 50."""
    from optimizer_pipeline.recommend import improvement_conditions

    plan = cand(CandidateKind.ROBUST, 2, predicted=PREDICTED[:-1] + ((6.0, 0.0),))
    hold = cand(CandidateKind.HOLD, 0, predicted=PREDICTED[:-1] + ((30.0, 40.0),))
    [ok] = improvement_conditions(SPEC, result(hold, plan), plan, (3.0, 4.0), 0.25)
    assert ok.holds and ok.value == f"{np.sqrt(97) / 50:.3g} of holding's error"
    [tight] = improvement_conditions(SPEC, result(hold, plan), plan, (3.0, 4.0), 0.19)
    assert not tight.holds and "is 0.197 of holding's error" in tight.reason and "allows 0.19" in tight.reason
    # near the targets: holding's error (25, 0) / 200 counts as 0.1 x sqrt(2) of the ranges
    near = cand(CandidateKind.HOLD, 0, predicted=PREDICTED[:-1] + ((25.0, 0.0),))
    [floored] = improvement_conditions(SPEC, result(near, plan), plan, (3.0, 4.0), 0.25)
    assert not floored.holds and floored.value == f"{np.sqrt(97) / 200 / (0.1 * np.sqrt(2)):.3g} of 0.1 of the CV " \
        "ranges (holding's error is less)"
    # a steady target's band is calibrated on the settled value itself: no such condition
    steady_plan = cand(CandidateKind.ROBUST, 2, controls=((7.0, 10.0),), predicted=((6.0, 0.0),))
    steady_hold = cand(CandidateKind.HOLD, 0, controls=((1.0, -2.0),), predicted=((30.0, 40.0),))
    assert improvement_conditions(STEADY, result(steady_hold, steady_plan), steady_plan, (30.0, 40.0), 0.25) == []
    # no band, or no candidate: no condition (the evidence condition fails on its own)
    assert improvement_conditions(SPEC, result(hold, plan), plan, (3.0, None), 0.25) == []
    assert improvement_conditions(SPEC, result(hold, plan), None, (3.0, 4.0), 0.25) == []


def test_with_an_integrating_cv_holding_is_judged_where_the_end_band_speaks():
    """y0 integrates (y0[k] = y0[k-1] + 0.5 (u0 + u1)[k-1], normalised, from 0): holding the current MVs
    (1, 1) raises it by 1.0 normalised = 2.0 (its std) per step from its mean 10; y1 = 0.5 (u0 + u1) = 1.0
    normalised = 3.0. The plan's end band held to step 14 (the plan's 4 steps and 10 more,
    pipeline.held_rule) is judged against holding's error there, (38, 3), not at step 4, (18, 3); from
    y0 = 50 (state 20), MVs (-1, -1) drive it down toward its target 0: (22, -3) at step 14 against
    (42, -3) at step 4. Holding's error counts as at least 0.1 of each CV's range (200)."""
    from optimizer_pipeline.recommend import held_end, improvement_conditions

    ramp = artifact_from_model(ArxModel(Orders(1, 1, 1), np.array([[[1.0, 0.0], [0.0, 0.0]]]),
                                        np.full((1, 2, 2), 0.5), np.zeros((1, 2, 0)), np.zeros(2)),
                               SPEC, 3, NORMALISATION)
    plan = cand(CandidateKind.ROBUST, 2, predicted=PREDICTED[:-1] + ((6.0, 0.0),))
    for x0, u_now, at_4, at_14 in (((0.0, 0.0), (3.0, 2.0), (18.0, 3.0), (38.0, 3.0)),
                                   ((20.0, 0.0), (-1.0, -6.0), (42.0, -3.0), (22.0, -3.0))):
        problem = compile_problem(SPEC, ramp, np.array(x0), np.zeros(2), np.array(u_now), np.zeros(0))
        np.testing.assert_allclose([held_end(problem, 4), held_end(problem, 14)], [at_4, at_14], atol=1e-9)
        hold = cand(CandidateKind.HOLD, 0, predicted=PREDICTED[:-1] + (at_4,))
        for end_step, held in ((14, at_14), (4, at_4), (None, at_4)):
            [found] = improvement_conditions(SPEC, result(hold, plan), plan, (3.0, 4.0), 0.25, problem=problem,
                                             end_step=end_step)
            error = max(np.hypot(*held), 0.1 * np.sqrt(2) * 200)  # RANGE_FLOOR of the ranges (200)
            assert found.value.startswith(f"{np.sqrt(97) / error:.3g} of "), (end_step, found.value)


# ---------------------------------------------------------------------------- the band against the improvement

IMPROVEMENT = "band against the improvement over holding"
# targets (10, -20), ranges 256: every error below is a multiple of (3, 4) / 256, so every norm is exact
TARGETED = replace(SPEC, cvs=tuple(replace(cv, lo=-128.0, hi=128.0, target=t) for cv, t in zip(SPEC.cvs, (10.0, -20.0))))


def ends(plan_end, hold_end, **kw):
    plan = cand(CandidateKind.ROBUST, 2, predicted=PREDICTED[:-1] + (plan_end,), **kw)
    return plan, cand(CandidateKind.HOLD, 0, predicted=PREDICTED[:-1] + (hold_end,))


def test_the_plans_widened_end_error_against_holdings_exactly_on_the_limit():
    # holding ends (96, 128) from the targets: 160 / 256 = 0.625; the plan (9, 12) from them, widened by the
    # band (3, 4): (12, 16), 20 / 256 = 0.078125; 0.078125 / 0.625 = 0.125
    from optimizer_pipeline.recommend import improvement_conditions

    plan, hold = ends((19.0, -32.0), (106.0, 108.0))
    [c] = improvement_conditions(TARGETED, result(hold, plan), plan, (3.0, 4.0), 0.125)
    assert (c.name, c.value, c.limit, c.holds) == (IMPROVEMENT, "0.125 of holding's error",
                                                   "<= 0.125 (uq.max_band_fraction)", True)
    [c] = improvement_conditions(TARGETED, result(hold, plan), plan, (3.0, 4.0), 0.1)
    assert (c.holds, c.reason) == (False, "band against the improvement: the plan's predicted end widened by the band "
                                          "is 0.125 of holding's error; uq.max_band_fraction allows 0.1")


def test_near_the_targets_holdings_error_counts_as_a_tenth_of_the_ranges():
    # holding ends (12, 16) from the targets: 20 / 256, less than 0.1 x sqrt(2); the plan ends on them, widened
    # by the band (3, 4): 5 / 256, so 5 / 256 / (0.1 x sqrt(2)) = 0.138
    from optimizer_pipeline.recommend import improvement_conditions

    plan, hold = ends((10.0, -20.0), (22.0, -4.0))
    fraction = 5 / 256 / (0.1 * np.sqrt(2))
    [c] = improvement_conditions(TARGETED, result(hold, plan), plan, (3.0, 4.0), 0.25)
    assert (c.name, c.value, c.limit, c.holds) == (
        IMPROVEMENT, f"{fraction:.3g} of 0.1 of the CV ranges (holding's error is less)",
        "<= 0.25 (uq.max_band_fraction)", True)
    [c] = improvement_conditions(TARGETED, result(hold, plan), plan, (3.0, 4.0), 0.13)
    assert (c.holds, c.reason) == (False, f"band against the improvement: the plan's predicted end widened by the "
                                          f"band is {fraction:.3g} of 0.1 of the CV ranges (holding's error is less); "
                                          f"uq.max_band_fraction allows 0.13")


def test_decide_holds_the_plans_end_to_the_settled_band_when_there_is_one():
    """end_band (pipeline.settled_evidence: a steered plan's or a local refit's settled band): the band
    against the improvement takes the wider of it and the P-step band per CV (a narrower settled band
    never loosens it); the published band stays the P-step one."""
    from optimizer_pipeline.recommend import improvement_conditions

    target = np.asarray(PROBLEM.y_mean) + np.asarray(PROBLEM.y_std) * PROBLEM.y_target
    plain = decide(SPEC, 7, ARTIFACT, PROBLEM, result(), snapshot(), (3.0, 3.0), 4.0, "or-abc123", NOW)
    wide = decide(SPEC, 7, ARTIFACT, PROBLEM, result(), snapshot(), (3.0, 3.0), 4.0, "or-abc123", NOW,
                  end_band=(60.0, 60.0))
    before, after = by_name(list(plain.conditions))[IMPROVEMENT], by_name(list(wide.conditions))[IMPROVEMENT]
    assert before.holds and not after.holds
    assert after == improvement_conditions(SPEC, result(), ROBUST, (60.0, 60.0), 0.25, target)[0]
    assert before == improvement_conditions(SPEC, result(), ROBUST, (3.0, 3.0), 0.25, target)[0]
    assert wide.recommendation.band == (3.0, 3.0) and wide.recommendation.status is RecommendationStatus.UNVERIFIED
    assert after.reason in wide.recommendation.reasons
    mixed = decide(SPEC, 7, ARTIFACT, PROBLEM, result(), snapshot(), (3.0, 50.0), 4.0, "or-abc123", NOW,
                   end_band=(60.0, 0.5))
    assert by_name(list(mixed.conditions))[IMPROVEMENT] == improvement_conditions(SPEC, result(), ROBUST, (60.0, 50.0),
                                                                                  0.25, target)[0]
    # no band for a CV on either side: no such condition (the evidence condition fails on its own)
    for band, end in (((3.0, None), (60.0, 60.0)), ((3.0, 3.0), (60.0, None))):
        none = decide(SPEC, 7, ARTIFACT, PROBLEM, result(), snapshot(), band, 4.0, "or-abc123", NOW, end_band=end)
        assert IMPROVEMENT not in by_name(list(none.conditions))


def test_the_improvement_is_judged_against_the_hold_candidate_only():
    from optimizer_pipeline.recommend import improvement_conditions

    plan, hold = ends((19.0, -32.0), (106.0, 108.0))
    nominal = cand(CandidateKind.NOMINAL, 1, predicted=PREDICTED[:-1] + ((10.0, -20.0),))  # listed first
    [c] = improvement_conditions(TARGETED, result(nominal, hold, plan), plan, (3.0, 4.0), 0.125)
    assert (c.value, c.holds) == ("0.125 of holding's error", True)
    no_prediction = cand(CandidateKind.HOLD, 0, controls=())
    for candidates in ((no_prediction, plan), (nominal, plan)):
        [c] = improvement_conditions(TARGETED, result(*candidates), plan, (3.0, 4.0), 0.125)
        assert (c.name, c.value, c.limit, c.holds, c.reason) == (
            IMPROVEMENT, "unknown", "<= 0.125 (uq.max_band_fraction)", False,
            "no hold prediction to compare the plan's improvement with")
    # a candidate without predictions: no condition (it is not a plan)
    assert improvement_conditions(TARGETED, result(hold, plan), replace(plan, predicted=()), (3.0, 4.0), 0.125) == []


def test_decide_judges_the_chosen_candidate_against_the_band_it_publishes():
    decision = run_decide(band=(3.0, 3.0))
    assert [c.name for c in decision.conditions].count(IMPROVEMENT) == 1


def test_holdings_error_exactly_on_the_range_floor_is_holdings_error():
    # one CV, range 200, target 0: holding ends 20 away, 20 / 200 = 0.1 = RANGE_FLOOR x sqrt(1 CV) exactly;
    # the plan ends 1 away, widened by the band 1: 2 / 200 = 0.01, a tenth of it
    from optimizer_pipeline.recommend import improvement_conditions

    one_cv = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=4)
    plan = cand(CandidateKind.ROBUST, 2, predicted=((1.0,),) * 4)
    hold = cand(CandidateKind.HOLD, 0, predicted=((20.0,),) * 4)
    [c] = improvement_conditions(one_cv, result(hold, plan), plan, (1.0,), 0.25)
    assert (c.value, c.holds) == ("0.1 of holding's error", True)


def test_the_improvement_is_measured_against_the_targets_given():
    # a steered plan's targets are the steady-state layer's, passed in: (10, -20) given to SPEC (whose own
    # targets differ) gives TARGETED's exact 0.125
    from optimizer_pipeline.recommend import improvement_conditions

    plan, hold = ends((19.0, -32.0), (106.0, 108.0))
    ranged = replace(SPEC, cvs=tuple(replace(cv, lo=-128.0, hi=128.0) for cv in SPEC.cvs))
    assert [cv.target for cv in ranged.cvs] != [10.0, -20.0]
    [c] = improvement_conditions(ranged, result(hold, plan), plan, (3.0, 4.0), 0.125, (10.0, -20.0))
    assert (c.value, c.holds) == ("0.125 of holding's error", True)


def test_decide_measures_the_improvement_against_the_problems_targets():
    # the problem's compiled targets (normalised (48, 36): engineering (10 + 2 * 48, 0 + 3 * 36) = (106, 108),
    # where holding ends), not the binding's (10, -20): holding's error is 0, so the floor counts
    plan, hold = ends((19.0, -32.0), (106.0, 108.0))
    problem = replace(PROBLEM, y_target=(48.0, 36.0))
    decision = decide(TARGETED, 7, ARTIFACT, problem, result(hold, plan), snapshot(), (3.0, 4.0), 4.0, "or-abc123",
                      NOW)
    [c] = [c for c in decision.conditions if c.name == IMPROVEMENT]
    widened = np.hypot(abs(19.0 - 106.0) + 3.0, abs(-32.0 - 108.0) + 4.0) / 256
    assert c.value == f"{widened / (0.1 * np.sqrt(2)):.3g} of 0.1 of the CV ranges (holding's error is less)"
