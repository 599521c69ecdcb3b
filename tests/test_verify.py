"""Specification of the independent verifier: it accepts honest plans and catches tampered ones."""

from dataclasses import replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import CandidateKind, SolveResult
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from optimizer_pipeline.solver.verify import (
    Tolerances,
    independent_cost,
    verify_all,
    verify_candidate,
    verify_candidates,
)
from test_solver_qp_support import tank_problem


@pytest.fixture(scope="module")
def solved():
    problem = tank_problem(band=(0.2, 0.1))
    result = solve_problem(problem, SolverCache())
    nominal = next(c for c in result.candidates if c.kind is CandidateKind.NOMINAL)
    return problem, result, nominal


def with_control(candidate, k, i, value):
    controls = [list(row) for row in candidate.controls]
    controls[k][i] = value
    return replace(candidate, controls=tuple(map(tuple, controls)))


def test_honest_candidates_are_feasible_and_verified(solved):
    _, result, _ = solved
    for c in result.candidates:
        assert c.feasible and c.verified, c.verify_report["reasons"]
        assert c.independent_cost == pytest.approx(c.cost, rel=1e-6)


def test_mv_above_its_bound_is_infeasible_with_the_violation_size(solved):
    problem, _, nominal = solved
    hi = problem.u_mean[0] + problem.u_std[0] * problem.u_hi[0]  # 6.0
    tampered = with_control(nominal, 5, 0, hi + 0.05)
    checked = verify_candidate(problem, tampered)
    assert not checked.feasible and not checked.verified
    assert checked.verify_report["mv_bound_violation"][0] == pytest.approx(0.05, abs=1e-9)
    assert any("MV v1 bound violated" in r for r in checked.verify_report["reasons"])


def test_mv_bound_violation_within_tolerance_is_accepted():
    # 1e-4 of the range is allowed: a hold plan sitting 5e-5 x range above the bound is feasible.
    problem = tank_problem(u_now=(6.0 + 6.0 * 5e-5, 3.0))
    hold = solve_problem(problem, SolverCache()).candidates[0]
    assert hold.verify_report["mv_bound_violation"][0] == pytest.approx(3e-4, rel=1e-6)
    assert hold.feasible


def test_first_move_is_checked_against_the_current_mv(solved):
    problem, _, nominal = solved
    u_now = problem.u_mean[1] + problem.u_std[1] * problem.u_prev[1]  # 3.0, max_move 0.5
    tampered = with_control(nominal, 0, 1, u_now + 0.6)
    checked = verify_candidate(problem, tampered)
    assert not checked.feasible
    assert checked.verify_report["mv_rate_violation"][1] >= 0.1 - 1e-9
    assert any("MV v2 rate violated" in r for r in checked.verify_report["reasons"])


def test_cost_that_disagrees_is_feasible_but_unverified(solved):
    problem, _, nominal = solved
    checked = verify_candidate(problem, replace(nominal, cost=nominal.cost * 1.01))
    assert checked.feasible and not checked.verified
    assert any("disagrees with the independent cost" in r for r in checked.verify_report["reasons"])


def test_predictions_that_do_not_follow_the_model_are_unverified(solved):
    problem, _, nominal = solved
    predicted = np.asarray(nominal.predicted)
    predicted[-1, 0] += 0.1
    checked = verify_candidate(problem, replace(nominal, predicted=tuple(map(tuple, predicted))))
    assert not checked.verified
    assert checked.verify_report["prediction_mismatch"] == pytest.approx(0.1 / problem.y_std[0], rel=1e-3)


def test_plan_of_the_wrong_shape_is_infeasible(solved):
    problem, _, nominal = solved
    checked = verify_candidate(problem, replace(nominal, controls=nominal.controls[:-1]))
    assert not checked.feasible and "shape" in checked.verify_report["reasons"][0]


def test_plant_outside_a_cv_limit_gets_a_feasible_plan_no_worse_than_holding():
    # Both CVs start well above the high limit 8; the tanks drain slowly, so every plan violates it.
    problem = tank_problem(cv_hi=8.0, x0=(2.5, 2.5, 1.0, 1.0), horizon=10)
    result = solve_problem(problem, SolverCache())
    nominal = result.candidates[1]
    assert nominal.verify_report["cv_limit_violation"][0] > 0.5  # reported
    assert max(nominal.verify_report["cv_violation_beyond_hold"]) <= 1e-9
    assert nominal.feasible and nominal.verified


def test_plan_that_violates_a_cv_limit_more_than_holding_is_infeasible():
    problem = tank_problem(cv_hi=8.0, x0=(2.5, 2.5, 1.0, 1.0), horizon=10)
    nominal = solve_problem(problem, SolverCache()).candidates[1]
    hi = np.asarray(problem.u_mean) + np.asarray(problem.u_std) * np.asarray(problem.u_hi)
    u_prev = np.asarray(problem.u_mean) + np.asarray(problem.u_std) * np.asarray(problem.u_prev)
    step = np.asarray(problem.u_std) * np.asarray(problem.du_max)
    ramp = np.minimum(hi, u_prev + step * np.arange(1, problem.horizon + 1)[:, None])  # fill the tanks further
    checked = verify_candidate(problem, replace(nominal, controls=tuple(map(tuple, ramp))))
    assert not checked.feasible
    assert any("more than holding the current MVs" in r for r in checked.verify_report["reasons"])


def test_independent_cost_of_a_known_plan():
    # Holding u_prev with y on target costs nothing; an offset of 0.1 costs N * w * 0.1^2.
    problem = tank_problem()
    u = np.tile(problem.u_prev, (problem.horizon, 1))
    y = np.tile(problem.y_target, (problem.horizon, 1))
    assert independent_cost(problem, u, y, np.asarray(problem.y_lo), np.asarray(problem.y_hi)) == 0.0
    y_off = y + np.array([0.1, 0.0])
    expected = problem.horizon * problem.y_weight[0] * 0.1 ** 2
    assert independent_cost(problem, u, y_off, np.asarray(problem.y_lo), np.asarray(problem.y_hi)) == \
        pytest.approx(expected)


def test_independent_cost_of_a_known_economic_target():
    # a steady target with hand-set economics: every term at a known point, each with its own size
    problem = replace(tank_problem(template="steady_response@1", horizon=1),
                      econ_u=(0.3, -0.2), econ_uu=(0.05, 0.0), econ_y=(0.0, 0.7), econ_yy=(0.4, 0.0),
                      target_hold=(0.0, 1.0))
    u = np.array([[0.5, -1.0]])
    y = np.array([[0.2, np.asarray(problem.y_target)[1] - 0.3]])
    lo, hi = np.array([-5.0, -5.0]), np.array([5.0, 0.0])
    t, w = np.asarray(problem.y_target), np.asarray(problem.y_weight)
    du = u[0] - np.asarray(problem.u_prev)
    slack = max(0.0, y[0, 1] - hi[1])
    expected = (w @ (y[0] - t) ** 2 + 0.01 * problem.move_weight * du @ du
                + problem.slack_weight * (slack + slack ** 2)
                + 0.3 * 0.5 - 0.2 * -1.0 + 0.05 * 0.25 + 0.7 * y[0, 1] + 0.4 * 0.04)
    assert slack > 0  # the slack term counts too
    assert independent_cost(problem, u, y, lo, hi) == pytest.approx(expected, rel=1e-12)


def test_independent_cost_of_a_steered_plan_adds_the_mv_target_term():
    problem = tank_problem(horizon=3)
    u = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    y = np.tile(problem.y_target, (3, 1))
    lo, hi = np.asarray(problem.y_lo), np.asarray(problem.y_hi)
    plain = independent_cost(problem, u, y, lo, hi)
    steered = replace(problem, u_target=(0.5, 0.0), u_target_weight=0.1)
    extra = 0.1 * float(((u - np.array([0.5, 0.0])) ** 2).sum())
    assert extra > 0 and independent_cost(steered, u, y, lo, hi) == pytest.approx(plain + extra, rel=1e-12)


def test_looser_tolerance_accepts_what_the_default_rejects(solved):
    problem, _, nominal = solved
    tampered = replace(nominal, cost=nominal.cost * 1.01)
    assert verify_candidate(problem, tampered, Tolerances(cost_rel=0.05)).verified


def test_verify_all_replaces_every_candidate(solved):
    problem, result, nominal = solved
    raw = SolveResult(result.problem_ir_hash, True, (replace(nominal, cost=nominal.cost + 1.0),), {})
    checked = verify_all(problem, raw)
    assert len(checked.candidates) == 1 and not checked.candidates[0].verified


def _tampered(candidates):
    """Every candidate plus broken copies: moved, short, non-finite, off cost, no cost."""
    out = list(candidates)
    for c in candidates:
        if not c.controls:
            continue
        moved = np.asarray(c.controls) * 1.01 + 0.02
        bad = moved.copy()
        bad[0, 0] = np.nan
        out += [replace(c, controls=tuple(map(tuple, moved.tolist()))), replace(c, controls=c.controls[:-1]),
                replace(c, predicted=c.predicted[:-1]), replace(c, controls=tuple(map(tuple, bad.tolist()))),
                replace(c, cost=c.cost * 1.001 if c.cost else 1.0), replace(c, cost=None),
                replace(c, controls=(), predicted=())]
    return out


@pytest.mark.parametrize("kw", [{}, {"template": "steady_response@1", "horizon": 5}, {"with_dv": True},
                                {"cv_lo": 6.9, "cv_hi": 7.6, "targets": (7.0, 7.5)}])
def test_batch_verification_equals_verifying_each_candidate_alone(kw):
    rng = np.random.default_rng(4)
    for band in (None, (0.2, 0.1), (3.0, 3.0)):
        problem = tank_problem(band=band, x0=tuple(rng.normal(0, 1, 4)), u_now=tuple(rng.uniform(1, 5, 2)), **kw)
        candidates = _tampered(solve_problem(problem, SolverCache()).candidates)
        for tolerances in (Tolerances(), Tolerances(mv_rel=1e-2, cost_rel=0.05)):
            batch = verify_candidates(problem, candidates, tolerances)
            alone = tuple(verify_candidate(problem, c, tolerances) for c in candidates)
            assert repr(batch) == repr(alone)  # repr: bit-exact floats, -0.0 included
            assert sum(c.verified for c in batch) >= 2 and sum(not c.feasible for c in batch) >= 3


# --------------------------------------------------------------------------- pinned by mutation testing (TESTING.md)
#
# One MV u, one CV y, one DV d, normalised = engineering units: x' = x / 2 + u + d / 2 + 1/4 + bias, y = x
# (the disturbance bias 1/8 held in every state update), d = 1, x0 = 0. MPC plan (1, 0):
# x1 = 1 + 1/2 + 3/8 = 1.875, x2 = 0.9375 + 1/2 + 3/8 = 1.8125, so y = (1.875, 1.8125).
# Steady target u = 1: y = (u + d / 2 + 1/4 + bias) / (1 - 1/2) = 3.75.

from dataclasses import asdict

from optimizer_pipeline.contracts import ProblemIR, SolveCandidate, StateSpace, Template
from test_boundaries import MV_TOL, plan
from test_boundaries import problem as dyadic_problem

LOOSE_COST = Tolerances(cost_abs=1e9)  # these tests are about the re-simulation, not the cost


def driven_problem(template=Template.LINEAR_MPC) -> ProblemIR:
    return ProblemIR(template=template, binding_id="b", binding_revision=1, profile_id="p", profile_version=1,
                     model_artifact_hash="0" * 64, horizon=2, mv_tags=("u",), cv_tags=("y",), dv_tags=("d",),
                     model=StateSpace(A=((0.5,),), B=((1.0,),), E=((0.5,),), f=(0.25,), C=((1.0,),)),
                     x0=(0.0,), u_prev=(1.0,), d=(1.0,), bias=(0.125,), u_lo=(-4.0,), u_hi=(4.0,), du_max=(2.0,),
                     y_lo=(-8.0,), y_hi=(8.0,), y_target=(0.0,), y_weight=(1.0,), move_weight=0.25, slack_weight=1000.0,
                     band=None, u_mean=(0.0,), u_std=(1.0,), y_mean=(0.0,), y_std=(1.0,))


def candidate_of(controls, predicted) -> SolveCandidate:
    return SolveCandidate(seq=1, kind=CandidateKind.NOMINAL, solver_status="solved", controls=controls,
                          predicted=predicted, cost=0.0, constraints={})


def test_the_re_simulation_adds_the_dvs_the_offset_and_the_held_disturbance():
    checked = verify_candidate(driven_problem(), candidate_of(((1.0,), (0.0,)), ((1.875,), (1.8125,))), LOOSE_COST)
    assert checked.verify_report["prediction_mismatch"] == 0.0 and checked.verified


def test_the_steady_re_simulation_adds_the_dvs_the_offset_and_the_held_disturbance():
    problem = driven_problem(Template.STEADY_RESPONSE)
    checked = verify_candidate(problem, candidate_of(((1.0,),), ((3.75,),)), LOOSE_COST)
    assert checked.verify_report["prediction_mismatch"] == 0.0 and checked.verified


def test_a_caller_s_re_simulation_is_what_the_plan_is_checked_against():
    # dyadic problem of test_boundaries: plan (1, 0) from x0 = 0 gives y = (1, 1/2); holding u = 0 gives 0
    problem, honest = dyadic_problem(du_max=2.0), plan(1.0, 0.0)
    y_plan, y_hold = np.array([[1.0], [0.5]]), np.zeros((2, 1))
    alone = verify_candidate(problem, honest, MV_TOL)
    given = verify_candidate(problem, honest, MV_TOL, simulated=(y_plan, y_hold))
    assert repr(given) == repr(alone) and given.verify_report["tolerances"] == asdict(MV_TOL)
    off = verify_candidate(problem, honest, MV_TOL, simulated=(y_plan + 0.5, y_hold))
    assert off.verify_report["prediction_mismatch"] == 0.5 and not off.verified


def test_a_caller_s_hold_simulation_sets_what_a_cv_may_violate():
    # y1 = 4.25 is 1/4 over the limit 4; against a hold simulation as far over it the plan is no worse than holding
    problem = dyadic_problem(u_lim=8.0, du_max=8.0)
    candidate = plan(4.25, 0.0)
    y_plan = np.array([[4.25], [2.125]])
    assert not verify_candidate(problem, candidate, simulated=(y_plan, np.zeros((2, 1)))).feasible
    assert verify_candidate(problem, candidate, simulated=(y_plan, np.full((2, 1), 4.25))).feasible


def test_the_report_carries_the_tolerances_it_was_checked_with():
    assert verify_candidate(dyadic_problem(du_max=2.0), plan(1.0, 0.0), MV_TOL).verify_report["tolerances"] == \
        asdict(MV_TOL)


def test_ragged_controls_are_reported_and_do_not_stop_the_other_candidates():
    problem = dyadic_problem(du_max=2.0)
    ragged = replace(plan(1.0, 0.0), controls=((1.0, 2.0), (0.0,)))
    checked = verify_candidates(problem, [ragged, plan(1.0, 0.0), ragged, plan(0.5, 0.0)])
    assert checked[0].verify_report["reasons"] == ["controls / predicted are not rectangular tables of numbers"]
    assert not checked[0].feasible and not checked[2].feasible
    assert checked[1].verified and checked[3].verified


def test_verify_all_checks_with_the_given_tolerances(solved):
    problem, result, nominal = solved
    raw = SolveResult(result.problem_ir_hash, True, (replace(nominal, cost=nominal.cost * 1.01),), {})
    assert verify_all(problem, raw, Tolerances(cost_rel=0.05)).candidates[0].verified


# The dyadic problem of test_boundaries (MV range 4, CV limits +-4, y = (u0, u0 / 2 + u1), move weight 1/4,
# slack weight 1000) with tolerances that are powers of two, so every number of a report is exact.
EXACT = Tolerances(mv_rel=2.0 ** -10, cv_rel=2.0 ** -10, cost_abs=2.0 ** -10, cost_rel=2.0 ** -8)


def test_the_report_carries_what_each_mv_and_cv_is_allowed():
    report = verify_candidate(dyadic_problem(du_max=2.0), plan(1.0, 0.0), EXACT).verify_report
    # MV: 2^-10 of the range 4; max move 2 (u std 1); CV: 2^-10 of the range 8
    assert (report["mv_allowed"], report["max_move"], report["cv_allowed"]) == ([2.0 ** -8], [2.0], [2.0 ** -7])
    assert report["cost_limits"] == "nominal" and report["reasons"] == []


def test_values_of_a_report_are_none_where_not_finite():
    from optimizer_pipeline.solver.verify import _rows_values, _values

    assert _values(np.array([1.5, np.inf, np.nan, -np.inf])) == [1.5, None, None, None]
    assert _rows_values(np.array([[1.5, np.inf], [np.nan, -2.0]])) == [[1.5, None], [None, -2.0]]


def test_a_cv_violation_is_reported_per_cv_as_its_largest_over_the_steps():
    # plan (4.25, 0): y = (4.25, 2.125): 1/4 over the limit 4 at step 1, inside it at step 2
    checked = verify_candidate(dyadic_problem(u_lim=8.0, du_max=8.0), plan(4.25, 0.0), EXACT)
    assert checked.verify_report["cv_limit_violation"] == [0.25]
    assert checked.verify_report["cv_violation_beyond_hold"] == [0.25]
    assert checked.verify_report["reasons"] == [
        "CV y limit violated by 0.25, 0.25 more than holding the current MVs (allowed 0.00781)"]


def test_a_candidate_without_a_usable_plan_loses_whatever_verdict_it_came_with():
    claimed = replace(plan(1.0, 0.0), feasible=True, verified=True, independent_cost=5.0)
    for broken, reason in ((replace(claimed, controls=(), predicted=()), "no plan (solver status 'solved')"),
                           (replace(claimed, controls=((np.nan,), (0.0,))),
                            "controls / predicted contain non-finite values"),
                           (replace(claimed, predicted=((1.0,), (np.inf,))),
                            "controls / predicted contain non-finite values")):
        checked = verify_candidate(dyadic_problem(du_max=2.0), broken, EXACT)
        assert (checked.feasible, checked.verified, checked.independent_cost) == (False, False, None)
        assert checked.verify_report["reasons"] == [reason]


def test_a_plan_whose_re_simulation_overflows_is_infeasible():
    # x' = 1e300 x + u from x0 = 1e10 overflows to inf at the first step
    problem = replace(dyadic_problem(du_max=2.0), x0=(1e10,),
                      model=StateSpace(A=((1e300,),), B=((1.0,),), E=((),), f=(0.0,), C=((1.0,),)))
    with np.errstate(over="ignore"):
        checked = verify_candidate(problem, replace(plan(1.0, 0.0), verified=True), EXACT)
    assert (checked.feasible, checked.verified, checked.independent_cost) == (False, False, None)
    assert checked.verify_report["reasons"] == ["re-simulated CVs are not finite (unstable model?)"]


def test_a_robust_candidate_s_cost_is_recomputed_against_the_robust_limits():
    # band 1: robust limits +-3. Plan (3.5, 0): y = (3.5, 1.75), inside the nominal limits 4, 1/2 over the
    # robust 3 at step 1: cost 3.5^2 + 1.75^2 + (3.5^2 + 3.5^2) / 4 + 1000 (1/2 + 1/4) = 771.4375;
    # against the nominal limits 21.4375
    problem = replace(dyadic_problem(u_lim=4.0, du_max=4.0), band=(1.0,))
    robust = replace(plan(3.5, 0.0, y_lim=3.0), kind=CandidateKind.ROBUST, seq=2)
    checked = verify_candidate(problem, robust, EXACT)
    assert (checked.independent_cost, checked.verify_report["cost_limits"]) == (771.4375, "robust")
    assert checked.feasible and checked.verified, checked.verify_report["reasons"]
    nominal = verify_candidate(problem, plan(3.5, 0.0), EXACT)
    assert (nominal.independent_cost, nominal.verify_report["cost_limits"], nominal.verified) == (
        21.4375, "nominal", True)


def test_a_candidate_without_a_cost_is_feasible_but_unverified():
    checked = verify_candidate(dyadic_problem(du_max=2.0), replace(plan(1.0, 0.0), cost=None), EXACT)
    assert (checked.feasible, checked.verified, checked.independent_cost) == (True, False, 1.75)
    assert checked.verify_report["reasons"] == ["solver reported no cost"]


def test_the_report_gives_the_cost_difference_and_what_was_allowed():
    # honest cost of plan (1, 0): 1 + 1/4 + (1 + 1) / 4 = 1.75; claimed 2.25;
    # allowed 2^-10 + 2^-8 x 2.25 = 0.009765625
    checked = verify_candidate(dyadic_problem(du_max=2.0), plan(1.0, 0.0, cost_offset=0.5), EXACT)
    report = checked.verify_report
    assert (report["cost_abs_diff"], report["cost_allowed"]) == (0.5, 0.009765625)
    assert report["reasons"] == ["solver cost 2.25 disagrees with the independent cost 1.75 (|diff| 0.5 > 0.00977)"]
    assert checked.feasible and not checked.verified
