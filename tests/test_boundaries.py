"""Every boundary comparison of the UQ, outcome and verifier rules and of the solver pool's limits,
pinned on both sides (issue 18, item 3).

Each test puts one value exactly on a limit, where the rule's text says which side it belongs to,
and one just past it. The expected side and the numbers come from the rule as written (module
docstrings, docs/ARCHITECTURE.md) and are worked out here by hand, never with the code's own helper.
Values are chosen exact in binary (halves, powers of two) so that "exactly on the limit" holds in
floating point too. Boundaries already pinned elsewhere are named where they are, not repeated:
test_uq_rules (8 / 9 val blocks, 1 / 2 val runs, 1 / 2 empirical blocks, 119 / 120 unique test
steps, 1 / 2 test runs, k = n / n + 1, a test score equal to qhat, exactly fresh_days old),
test_outcomes (tie to the earlier sample, step P - 1 judged and step P not, 4 aligned steps),
test_decision_matrix (input distance, freshness, coverage and the strict gate through recommend).
"""

import math
from dataclasses import replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import (
    BlockScores,
    CandidateKind,
    ModelArtifact,
    Normalisation,
    OutcomeVerdict,
    ProblemIR,
    RecommendationStatus,
    SolveCandidate,
    StateSpace,
    Template,
    parse_iso_utc,
)
from optimizer_pipeline.ledger import RecommendationRecord, VerdictRecord
from optimizer_pipeline.outcomes import (
    Observation,
    OutcomeError,
    check_applicable,
    drift_finding,
    evaluate,
    nearest_samples,
    settle_steps,
)
from optimizer_pipeline.solver.pool import SolverConfigError, SolverPool
from optimizer_pipeline.solver.verify import Tolerances, verify_candidate
from optimizer_pipeline.uq import (
    clopper_pearson_lower,
    compute_block_uq,
    exchangeability_p,
    gate_failures,
    gate_passes,
    input_distance,
)

TINY = 2.0 ** -20  # "just past" a limit that is exact in binary


def binomial_cdf(hits: int, trials: int, p: float) -> float:
    return sum(math.comb(trials, i) * p ** i * (1 - p) ** (trials - i) for i in range(hits + 1))


# ============================================================================ uq.py


def scores(values, n_runs: int, h: int = 10) -> BlockScores:
    """One CV `y`; block i belongs to run i % n_runs; every block counts h unique steps."""
    values = np.asarray(values, float).reshape(-1, 1)
    n = len(values)
    return BlockScores(cv_tags=("y",), h=h, run_ids=np.array([f"r{i % n_runs}" for i in range(n)], dtype=object),
                       starts=np.arange(n) * h, scores=values, n_unique_steps=n * h, n_runs=min(n_runs, n))


VAL = scores(np.arange(1.0, 10.0), n_runs=2)  # 9 val blocks from 2 runs: split conformal, k = 9, qhat = 9


def test_coverage_exactly_at_the_threshold_passes_the_seed_gate():
    # 2 test runs: threshold max(0.8, 0.9 - 3 sqrt(0.09 / 2)) = 0.8; 16 of 20 blocks <= qhat 9 cover 0.8
    evidence = compute_block_uq(VAL, scores([1.0] * 16 + [10.0] * 4, n_runs=2))
    assert (evidence.coverage, evidence.coverage_threshold) == (0.8, 0.8)
    assert gate_passes(evidence, "seed")


def test_coverage_one_block_below_the_threshold_fails_the_seed_gate():
    evidence = compute_block_uq(VAL, scores([1.0] * 15 + [10.0] * 5, n_runs=2))
    assert evidence.coverage == 0.75
    assert gate_failures(evidence, "seed") == ["test coverage 0.750 < threshold 0.800"]


EVIDENCE = compute_block_uq(VAL, scores(np.zeros(40), n_runs=2))  # every test block covered


@pytest.mark.parametrize("lower, passes", [(0.8, True), (0.8 - TINY, False)])
def test_strict_gate_coverage_lower_bound_of_exactly_0_8_passes(lower, passes):
    assert gate_passes(replace(EVIDENCE, coverage_lower_95=lower, exchangeability_p=0.5), "strict") is passes


@pytest.mark.parametrize("p, passes", [(0.01, True), (0.01 - TINY * 1e-3, False)])
def test_strict_gate_exchangeability_p_of_exactly_0_01_passes(p, passes):
    assert gate_passes(replace(EVIDENCE, coverage_lower_95=0.9, exchangeability_p=p), "strict") is passes


def test_clopper_pearson_lower_bound_with_one_success_is_the_closed_form():
    # one success in m trials: the bound p solves P(X >= 1) = 1 - (1 - p)^m = 0.05
    assert clopper_pearson_lower(1, 20) == pytest.approx(1 - 0.95 ** (1 / 20), rel=1e-9)


def test_a_test_score_equal_to_the_reference_val_score_does_not_exceed_it():
    # k = n = 9: the reference is the val max 9. Test blocks at exactly 9 do not exceed it: X = 0,
    # P(X = 0) = n / (n + m) for BetaBinomial(m, 1, n), two-sided p = 2 * 9 / 29.
    val = np.arange(1.0, 10.0)[:, None]
    assert exchangeability_p(val, np.full((20, 1), 9.0), k=9) == pytest.approx(2 * 9 / 29, rel=1e-12)


def test_test_scores_just_above_the_reference_val_score_all_exceed_it():
    # X = m = 20: P(X = 20) = B(21, 9) / B(1, 9) = 9 * 20! 8! / 29!, two-sided p = twice that
    val = np.arange(1.0, 10.0)[:, None]
    expected = 2 * 9 * math.factorial(20) * math.factorial(8) / math.factorial(29)
    assert exchangeability_p(val, np.full((20, 1), 9.0 + 1e-9), k=9) == pytest.approx(expected, rel=1e-9)


def test_a_single_test_block_is_one_test_block_not_none():
    # 1 block of 10 steps from 1 run: too few unique steps and runs, but a test block there is
    evidence = compute_block_uq(VAL, scores([0.0], n_runs=1))
    assert evidence.reasons == ("10 unique test steps; at least 120 are needed",
                                "1 test run(s) with a block; at least 2 are needed")


def artifact_with_std(std_y: float) -> ModelArtifact:
    """One MV u (mean 0, std 1), one CV y (mean 10, std `std_y`)."""
    return ModelArtifact(binding_id="b", binding_revision=1, mv_tags=("u",), cv_tags=("y",), dv_tags=(), na=1,
                         nb=1, delay=1, horizon=10, sample_period_s=1.0, coefficients={},
                         state_space=StateSpace.of([[0.5]], [[1.0]], np.zeros((1, 0)), [0.0], [[1.0]]),
                         normalisation=Normalisation(("u", "y"), (0.0, 10.0), (1.0, std_y)), gates=(), splits={},
                         training_data_hash="x")


def test_input_distance_with_a_train_std_of_exactly_1e_9_is_finite():
    # the documented floor: a std below 1e-9 gives inf; at 1e-9 the z is (10 + 3e-9 - 10) / 1e-9 ~ 3
    distance = input_distance(artifact_with_std(1e-9), [0.0], [10.0 + 3e-9])
    assert distance == pytest.approx(3.0, rel=1e-6)


def test_input_distance_with_a_train_std_just_below_1e_9_is_infinite():
    assert input_distance(artifact_with_std(1e-9 * (1 - 1e-6)), [0.0], [10.0]) == math.inf


# ============================================================================ outcomes.py

T0 = 1_800_000_000.0
PERIOD = 10.0
UQ = {"method": "split_conformal", "alpha": 0.1, "coverage": 0.95, "block_length": 10,
      "calibrated_at": "2027-01-15T08:00:00+00:00"}
CALIBRATED = parse_iso_utc(UQ["calibrated_at"])


def one_column(t, values) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(t, float), np.asarray(values, float).reshape(-1, 1)


def test_a_sample_exactly_half_a_period_before_its_step_is_aligned():
    t, v = one_column([T0 + 5.0], [7.0])  # step time T0 + 10: 5 s = half a period away
    assert nearest_samples(t, v, np.array([T0 + 10.0]), PERIOD)[0, 0] == 7.0


def test_a_sample_exactly_half_a_period_after_its_step_is_aligned():
    t, v = one_column([T0 + 15.0], [7.0])
    assert nearest_samples(t, v, np.array([T0 + 10.0]), PERIOD)[0, 0] == 7.0


@pytest.mark.parametrize("offset", [-5.001, 5.001])
def test_a_sample_just_beyond_half_a_period_from_its_step_is_not_aligned(offset):
    t, v = one_column([T0 + 10.0 + offset], [7.0])
    assert math.isnan(nearest_samples(t, v, np.array([T0 + 10.0]), PERIOD)[0, 0])


def mpc_rec(n_steps=20, band=1.0, block_length=10):
    """predicted[k] = 50 + k / 2 (exact in binary), one CV y, one MV q held at 100."""
    return {"id": "rec-b", "template": "linear_mpc_quadratic@1", "mv_tags": ["q"], "cv_tags": ["y"],
            "controls": [[100.0]] * n_steps, "predicted": [[50.0 + 0.5 * k] for k in range(n_steps)],
            "band": [band], "evidence": {"uq": dict(UQ, block_length=block_length)}}


def observed_plan(offsets, n_steps=20) -> Observation:
    """A sample at applied_at (T0) and at the end of step k (T0 + (k + 1) T) for each given offset:
    the plan's prediction plus offsets[k]."""
    offsets = np.asarray(offsets, float)
    y = np.concatenate([[49.0], 50.0 + 0.5 * np.arange(len(offsets)) + offsets])
    t = T0 + PERIOD * np.arange(len(y))
    return Observation(t=t, tags=("q", "y"), values=np.column_stack([np.full(len(y), 100.0), y]),
                       run_ids=("obs",), source="test")


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_delta_exactly_equal_to_the_band_is_a_hit(sign):
    ev = evaluate(mpc_rec(), observed_plan(np.full(20, sign * 1.0)), T0, PERIOD)
    assert (ev.details["hits"], ev.details["trials"], ev.verdict.value) == (10, 10, "confirmed")
    assert ev.delta["delta"][0][0] == sign * 1.0 and ev.details["block_covered"] is True


def test_delta_just_beyond_the_band_is_a_miss():
    ev = evaluate(mpc_rec(), observed_plan(np.full(20, 1.0 + TINY)), T0, PERIOD)
    assert (ev.details["hits"], ev.details["trials"], ev.verdict.value) == (0, 10, "deviated")


@pytest.mark.parametrize("block_length, n_steps, required", [(10, 20, 5), (3, 20, 3), (10, 4, 4)])
def test_exactly_the_required_aligned_steps_give_a_verdict(block_length, n_steps, required):
    # required = min(P, N, 5)
    ev = evaluate(mpc_rec(n_steps, block_length=block_length), observed_plan(np.zeros(required)), T0, PERIOD)
    assert (ev.details["steps_aligned"], ev.details["steps_required"]) == (required, required)
    assert ev.verdict.value == "confirmed"


@pytest.mark.parametrize("block_length, n_steps, required", [(10, 20, 5), (3, 20, 3), (10, 4, 4)])
def test_one_aligned_step_fewer_than_required_is_inconclusive(block_length, n_steps, required):
    ev = evaluate(mpc_rec(n_steps, block_length=block_length), observed_plan(np.zeros(required - 1)), T0, PERIOD)
    assert (ev.details["steps_aligned"], ev.verdict.value) == (required - 1, "inconclusive")


def test_a_hit_rate_p_value_just_below_0_01_is_deviated():
    # P = 9 judged steps, 5 inside: P(X <= 5 | 9, 0.9) = 0.00833 < 0.01
    offsets = np.array([0.0] * 5 + [2.0] * 4 + [0.0] * 11)
    ev = evaluate(mpc_rec(block_length=9), observed_plan(offsets), T0, PERIOD)
    assert ev.details["p_value"] == pytest.approx(binomial_cdf(5, 9, 0.9), rel=1e-9)
    assert 0.008 < ev.details["p_value"] < 0.01 and ev.verdict.value == "deviated"


def test_a_hit_rate_p_value_just_above_0_01_is_confirmed():
    # P = 10 judged steps, 6 inside: P(X <= 6 | 10, 0.9) = 0.0128 >= 0.01
    offsets = np.array([0.0] * 6 + [2.0] * 4 + [0.0] * 10)
    ev = evaluate(mpc_rec(), observed_plan(offsets), T0, PERIOD)
    assert ev.details["p_value"] == pytest.approx(binomial_cdf(6, 10, 0.9), rel=1e-9)
    assert 0.01 < ev.details["p_value"] < 0.013 and ev.verdict.value == "confirmed"


# A promised rate at which scipy's binomial tail P(X <= 5 | 8, p0) is exactly 0.01 in floating point (found
# by bisection and a scan of neighbouring floats); the rule says `deviated` only below 0.01.
P0_EXACT = 0.9391604086896005


def test_a_hit_rate_p_value_of_exactly_0_01_is_confirmed():
    offsets = np.array([0.0] * 5 + [2.0] * 3 + [0.0] * 12)  # P = 8 judged steps, 5 inside
    rec = mpc_rec(block_length=8)
    rec["evidence"]["uq"].update(alpha=0.05, coverage=P0_EXACT)  # p0 = min(0.95, coverage)
    ev = evaluate(rec, observed_plan(offsets), T0, PERIOD)
    assert ev.details["p_value"] == 0.01, "scipy's tail moved: find another P0_EXACT"
    assert ev.verdict.value == "confirmed"
    assert ev.details["verdict_reason"].endswith("one-sided binomial p = 0.01 (>= 0.01)")


def artifact_with_pole(rho: float) -> ModelArtifact:
    """ARX lag max(na, delay + nb - 1) = 2; one state with pole rho."""
    return replace(artifact_with_std(1.0), na=2, nb=1, delay=2,
                   state_space=StateSpace.of([[rho]], [[1.0]], np.zeros((1, 0)), [0.0], [[1.0]]))


def test_a_model_with_a_pole_exactly_on_the_unit_circle_never_settles():
    assert settle_steps(artifact_with_pole(1.0)) is None


def test_a_model_with_a_pole_just_inside_the_unit_circle_settles():
    # 0.5 ** 7 = 0.0078 < 1 % <= 0.5 ** 6: lag 2 + 7 steps
    assert settle_steps(artifact_with_pole(0.5)) == 2 + 7


def test_a_pole_of_exactly_1e_12_still_takes_its_decay_step():
    # ceil(ln 0.01 / ln 1e-12) = ceil(0.1667) = 1 step beyond the lag; only below 1e-12 is it ignored
    assert settle_steps(artifact_with_pole(1e-12)) == 2 + 1
    assert settle_steps(artifact_with_pole(1e-13)) == 2


def rec_row(status="verified", expired_at=None) -> RecommendationRecord:
    return RecommendationRecord(
        id="rec-1", run_id="or-1", binding_id="b", binding_revision=1, candidate_id=None,
        template="linear_mpc_quadratic@1", problem_ir_hash="p" * 64, model_artifact_hash="m" * 64,
        evidence_source="simulation", uq_evidence=UQ, status=RecommendationStatus(status), status_label=status,
        reasons=[], payload={}, created_at=parse_iso_utc("2027-01-15T09:00:00+00:00"),
        valid_until=parse_iso_utc("2027-01-15T10:00:00+00:00"),
        expired_at=None if expired_at is None else parse_iso_utc(expired_at), expired_reason="superseded")


def test_applied_exactly_when_created_is_a_valid_target():
    check_applicable(rec_row(), parse_iso_utc("2027-01-15T09:00:00+00:00"))


def test_applied_a_microsecond_before_creation_is_refused():
    with pytest.raises(OutcomeError, match="before it was created"):
        check_applicable(rec_row(), parse_iso_utc("2027-01-15T08:59:59.999999+00:00"))


def test_applied_exactly_at_valid_until_is_a_valid_target():
    check_applicable(rec_row(), parse_iso_utc("2027-01-15T10:00:00+00:00"))


def test_applied_a_microsecond_after_valid_until_is_refused():
    with pytest.raises(OutcomeError, match="after its valid_until"):
        check_applicable(rec_row(), parse_iso_utc("2027-01-15T10:00:00.000001+00:00"))


def test_applied_exactly_when_it_expired_is_a_valid_target():
    check_applicable(rec_row("expired", "2027-01-15T09:30:00+00:00"), parse_iso_utc("2027-01-15T09:30:00+00:00"))


def test_applied_a_microsecond_after_it_expired_is_refused():
    with pytest.raises(OutcomeError, match="expired at"):
        check_applicable(rec_row("expired", "2027-01-15T09:30:00+00:00"),
                         parse_iso_utc("2027-01-15T09:30:00.000001+00:00"))


def test_an_observation_since_t0_keeps_the_sample_exactly_at_t0():
    obs = observed_plan(np.zeros(3))
    assert obs.since(T0 + PERIOD).t.tolist() == [T0 + PERIOD, T0 + 2 * PERIOD, T0 + 3 * PERIOD]


def outcome(i: int, verdict: str, hits: int = 10, trials: int = 10) -> VerdictRecord:
    applied = parse_iso_utc(f"2027-01-15T09:{i:02d}:00+00:00")
    return VerdictRecord(id=f"out-{i}", recommendation_id="rec-1", binding_id="b", applied_at=applied,
                         verdict=OutcomeVerdict(verdict), details={"hits": hits, "trials": trials, "promised_rate": 0.9,
                                                   "calibrated_at": UQ["calibrated_at"]},
                         created_at=applied)


def verdicts(*names: str) -> list[VerdictRecord]:
    """Conclusive outcomes, oldest first, each with every step inside the band (the rate rule stays quiet)."""
    return [outcome(i, {"D": "deviated", "C": "confirmed"}[n]) for i, n in enumerate(names)]


def test_two_deviated_within_the_last_three_verdicts_are_drift():
    assert drift_finding("b", verdicts("C", "C", "C", "D", "C", "D"), CALIBRATED).outcome_id == "out-5"


def test_two_deviated_spread_over_the_last_four_verdicts_are_no_drift():
    # the drift window is the last 3 conclusive verdicts: only one of them deviated
    assert drift_finding("b", verdicts("C", "C", "D", "C", "C", "D"), CALIBRATED) is None


def test_the_rate_rule_pools_exactly_the_last_ten_conclusive_outcomes():
    # the oldest outcome missed 50 of 50 steps; 9 newer ones hit 10 of 10 each: 90 / 140, p << 0.01
    bad = outcome(0, "deviated", hits=0, trials=50)
    good = [outcome(i, "confirmed") for i in range(1, 10)]
    finding = drift_finding("b", [bad, *good], CALIBRATED)
    assert finding is not None and "90/140 over the last 10 outcomes" in finding.reason


def test_the_rate_rule_forgets_the_eleventh_newest_outcome():
    bad = outcome(0, "deviated", hits=0, trials=50)
    good = [outcome(i, "confirmed") for i in range(1, 11)]  # 10 newer outcomes: 100 / 100
    assert drift_finding("b", [bad, *good], CALIBRATED) is None


def test_a_pooled_p_value_just_below_0_01_is_drift():
    # 28 of 37 at 0.9: P(X <= 28) = 0.00926
    assert binomial_cdf(28, 37, 0.9) < 0.01
    assert drift_finding("b", [outcome(0, "confirmed", 28, 37)], CALIBRATED) is not None


def test_a_pooled_p_value_of_exactly_0_01_is_no_drift():
    row = replace(outcome(0, "confirmed", 5, 8), details={"hits": 5, "trials": 8, "promised_rate": P0_EXACT,
                                                           "calibrated_at": UQ["calibrated_at"]})
    assert drift_finding("b", [row], CALIBRATED) is None


def test_a_pooled_p_value_just_above_0_01_is_no_drift():
    # 29 of 38 at 0.9: P(X <= 29) = 0.01107
    assert binomial_cdf(29, 38, 0.9) > 0.01
    assert drift_finding("b", [outcome(0, "confirmed", 29, 38)], CALIBRATED) is None


# ============================================================================ solver/verify.py
#
# One MV u, one CV y, N = 2, normalised = engineering units (mean 0, std 1). Model x' = x / 2 + u,
# y = x, from x0 = 0: the re-simulated CVs of a plan (u0, u1) are y1 = u0, y2 = u0 / 2 + u1.
# Cost (target 0, weight 1, move weight 1/4): y1^2 + y2^2 + (u0 - u_prev)^2 / 4 + (u1 - u0)^2 / 4,
# plus slack_weight (s + s^2) per step beyond the CV limits.

SLACK_WEIGHT = 1000.0


def problem(u_prev=0.0, u_lim=2.0, du_max=0.5, y_lim=4.0) -> ProblemIR:
    return ProblemIR(template=Template.LINEAR_MPC, binding_id="b", binding_revision=1, profile_id="p",
                     profile_version=1, model_artifact_hash="0" * 64, horizon=2, mv_tags=("u",), cv_tags=("y",),
                     dv_tags=(), model=StateSpace(A=((0.5,),), B=((1.0,),), E=((),), f=(0.0,), C=((1.0,),)),
                     x0=(0.0,), u_prev=(u_prev,), d=(), bias=(0.0,), u_lo=(-u_lim,), u_hi=(u_lim,), du_max=(du_max,),
                     y_lo=(-y_lim,), y_hi=(y_lim,), y_target=(0.0,), y_weight=(1.0,), move_weight=0.25,
                     slack_weight=SLACK_WEIGHT, band=None, u_mean=(0.0,), u_std=(1.0,), y_mean=(0.0,), y_std=(1.0,))


def plan(u0: float, u1: float, u_prev: float = 0.0, y_lim: float = 4.0, *, predicted_offset: float = 0.0,
         cost_offset: float = 0.0) -> SolveCandidate:
    """A nominal candidate with honest predictions and cost (worked out by hand), unless offset."""
    y1, y2 = u0, u0 / 2 + u1
    slack = sum(max(0.0, abs(y) - y_lim) for y in (y1, y2))
    slack_sq = sum(max(0.0, abs(y) - y_lim) ** 2 for y in (y1, y2))
    cost = y1 ** 2 + y2 ** 2 + ((u0 - u_prev) ** 2 + (u1 - u0) ** 2) / 4 + SLACK_WEIGHT * (slack + slack_sq)
    return SolveCandidate(seq=1, kind=CandidateKind.NOMINAL, solver_status="solved", controls=((u0,), (u1,)),
                          predicted=((y1 + predicted_offset,), (y2,)), cost=cost + cost_offset, constraints={})


MV_TOL = Tolerances(mv_rel=2.0 ** -10)  # MV range 4: 2^-8 of violation allowed


def test_an_mv_exactly_the_allowed_amount_beyond_its_bound_is_feasible():
    u = 2.0 + 2.0 ** -8
    checked = verify_candidate(problem(u_prev=2.0), plan(u, u, u_prev=2.0), MV_TOL)
    assert checked.verify_report["mv_bound_violation"] == [2.0 ** -8]
    assert checked.feasible and checked.verified, checked.verify_report["reasons"]


def test_an_mv_just_more_than_the_allowed_amount_beyond_its_bound_is_infeasible():
    u = 2.0 + 2.0 ** -8 + TINY
    checked = verify_candidate(problem(u_prev=2.0), plan(u, u, u_prev=2.0), MV_TOL)
    assert not checked.feasible
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == ["MV u bound violated"]


def test_a_move_exactly_the_allowed_amount_beyond_max_move_is_feasible():
    u = 0.5 + 2.0 ** -8  # max move 0.5 from u_prev 0
    checked = verify_candidate(problem(), plan(u, u), MV_TOL)
    assert checked.verify_report["mv_rate_violation"] == [2.0 ** -8]
    assert checked.feasible and checked.verified, checked.verify_report["reasons"]


def test_a_move_just_more_than_the_allowed_amount_beyond_max_move_is_infeasible():
    u = 0.5 + 2.0 ** -8 + TINY
    checked = verify_candidate(problem(), plan(u, u), MV_TOL)
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == ["MV u rate violated"]


def test_a_bound_violation_exactly_at_its_allowance_is_not_reported_beside_a_rate_violation():
    u, u_prev = 2.0 + 2.0 ** -8, 1.5 - 2.0 ** -6  # bound: exactly allowed; first move: 2^-6 more than allowed
    checked = verify_candidate(problem(u_prev=u_prev), plan(u, u, u_prev=u_prev), MV_TOL)
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == ["MV u rate violated"]


CV_TOL = Tolerances(cv_rel=2.0 ** -6)  # CV range 8: 1/8 of violation beyond holding allowed


def test_a_cv_exactly_the_allowed_amount_beyond_its_limit_is_feasible():
    # holding u_prev 0 keeps y at 0; y1 = 4.125 is 1/8 over the limit 4
    checked = verify_candidate(problem(u_lim=8.0, du_max=8.0), plan(4.125, 0.0), CV_TOL)
    assert checked.verify_report["cv_violation_beyond_hold"] == [0.125]
    assert checked.feasible and checked.verified, checked.verify_report["reasons"]


def test_a_cv_just_more_than_the_allowed_amount_beyond_its_limit_is_infeasible():
    checked = verify_candidate(problem(u_lim=8.0, du_max=8.0), plan(4.125 + 2.0 ** -10, 0.0), CV_TOL)
    assert not checked.feasible
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == ["CV y limit violated"]


def test_a_cv_exactly_at_its_allowance_is_not_reported_beside_an_mv_violation():
    # u0 = 4.125 is 1/8 over the MV bound 4 (far beyond its allowance) and puts y1 exactly 1/8 over the CV limit
    checked = verify_candidate(problem(u_lim=4.0, du_max=8.0), plan(4.125, 0.0), CV_TOL)
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == ["MV u bound violated"]


PREDICTION_TOL = Tolerances(prediction_abs=2.0 ** -10)


def test_predictions_off_by_exactly_the_tolerance_are_verified():
    checked = verify_candidate(problem(du_max=2.0), plan(1.0, 0.0, predicted_offset=2.0 ** -10), PREDICTION_TOL)
    assert checked.verify_report["prediction_mismatch"] == 2.0 ** -10
    assert checked.verified, checked.verify_report["reasons"]


def test_predictions_off_by_just_more_than_the_tolerance_are_not_verified():
    checked = verify_candidate(problem(du_max=2.0), plan(1.0, 0.0, predicted_offset=2.0 ** -10 + TINY), PREDICTION_TOL)
    assert checked.feasible and not checked.verified
    assert [r.split(" by ")[0] for r in checked.verify_report["reasons"]] == [
        "predicted CVs differ from the re-simulation"]


# plan (1, 0): y = (1, 1/2), moves (1, -1): cost 1 + 1/4 + 2/4 = 1.75
def test_the_honest_cost_of_the_reference_plan_is_worked_out_by_hand():
    assert verify_candidate(problem(du_max=2.0), plan(1.0, 0.0)).independent_cost == 1.75


@pytest.mark.parametrize("offset, verified", [(2.0 ** -4, True), (2.0 ** -4 + TINY, False),
                                              (-(2.0 ** -4), True), (-(2.0 ** -4) - TINY, False)])
def test_a_cost_off_by_exactly_the_absolute_tolerance_is_verified(offset, verified):
    checked = verify_candidate(problem(du_max=2.0), plan(1.0, 0.0, cost_offset=offset),
                               Tolerances(cost_abs=2.0 ** -4, cost_rel=0.0))
    assert checked.verified is verified, checked.verify_report["reasons"]


@pytest.mark.parametrize("offset, verified", [(-(2.0 ** -4) * 1.75, True), (-(2.0 ** -4) * 1.75 - TINY, False)])
def test_a_cost_off_by_exactly_the_relative_tolerance_of_the_larger_cost_is_verified(offset, verified):
    # solver cost below the independent 1.75: the allowance is 2^-4 x max(|cost|, |independent|) = 2^-4 x 1.75
    checked = verify_candidate(problem(du_max=2.0), plan(1.0, 0.0, cost_offset=offset),
                               Tolerances(cost_abs=0.0, cost_rel=2.0 ** -4))
    assert checked.verified is verified, checked.verify_report["reasons"]


# ============================================================================ solver/pool.py limits


@pytest.mark.parametrize("setting", [{"size": 1}, {"size": 4}, {"threads": 1}, {"threads": 16},
                                     {"backoff_s": (0.0,)}, {"backoff_s": (0, 0.5, 2)}])
def test_a_pool_setting_on_the_edge_of_its_range_is_accepted(setting):
    pool = SolverPool(**setting)  # not started: no worker process
    for name, value in setting.items():
        assert getattr(pool, name) == (tuple(float(v) for v in value) if name == "backoff_s" else value)


@pytest.mark.parametrize("setting", [{"size": 0}, {"size": 5}, {"threads": 0}, {"threads": 17},
                                     {"backoff_s": (-0.001,)}, {"backoff_s": (1.0, -1.0)}])
def test_a_pool_setting_just_outside_its_range_is_a_config_error(setting):
    with pytest.raises(SolverConfigError, match=next(iter(setting))):
        SolverPool(**setting)


def failing_pool(monkeypatch, backoff_s=(1.0, 2.0, 4.0)) -> tuple[SolverPool, list[float]]:
    """A pool in its running state with no workers, whose restarts are recorded instead of spawned:
    the failure accounting alone (the real crash path is test_pool's three-crash test)."""
    pool = SolverPool(size=1, backoff_s=backoff_s)
    pool._state = "running"
    restarts: list[float] = []
    monkeypatch.setattr(pool, "_schedule_restart", lambda slot, delay_s: restarts.append(delay_s))
    return pool, restarts


def fail_once(pool: SolverPool) -> dict:
    with pool._lock:
        pool._fail(pool._slots[0], None, "worker crashed")
    return pool.stats()


def test_two_consecutive_failures_leave_the_pool_available(monkeypatch):
    pool, _ = failing_pool(monkeypatch)
    fail_once(pool)
    assert fail_once(pool)["degraded"] is False


def test_the_third_consecutive_failure_degrades_the_pool(monkeypatch):
    pool, _ = failing_pool(monkeypatch)
    for _ in range(2):
        fail_once(pool)
    stats = fail_once(pool)
    assert (stats["degraded"], stats["consecutive_failures"]) == (True, 3)


def test_the_nth_failure_restarts_after_the_nth_back_off_and_past_the_schedule_never(monkeypatch):
    pool, restarts = failing_pool(monkeypatch, backoff_s=(0.5, 1.5, 3.5))
    for _ in range(5):
        fail_once(pool)
    assert restarts == [0.5, 1.5, 3.5]


def test_a_schedule_of_one_back_off_restarts_once(monkeypatch):
    pool, restarts = failing_pool(monkeypatch, backoff_s=(0.25,))
    for _ in range(2):
        fail_once(pool)
    assert restarts == [0.25]
