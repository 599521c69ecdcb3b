"""Specification of the QP templates and solve_problem: optimality against independent solutions,
HOLD / NOMINAL / ROBUST candidates, non-solved statuses, cache reuse and warm starts."""

from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import minimize

from optimizer_pipeline.contracts import CandidateKind, Template
from optimizer_pipeline.model.statespace import rollout
from optimizer_pipeline.problem import compile_problem, robust_limits
from optimizer_pipeline.solver import errors
from optimizer_pipeline.solver.solve import TIME_LIMIT_REACHED, SolverCache, solve_problem
from optimizer_pipeline.solver.steady import STEADY_MOVE_SCALE
from test_solver_qp_support import scalar_artifact, scalar_binding, tank_problem


def normalised_controls(problem, candidate):
    return (np.asarray(candidate.controls) - np.asarray(problem.u_mean)) / np.asarray(problem.u_std)


def predict(problem, u):
    """Normalised CVs (N, ny) of the plan u (N, nu) by rollout (not the QP matrices), the disturbance
    bias folded into the model's f by hand (added to the rows C reads, the newest CV of each equation)."""
    d = np.tile(np.asarray(problem.d, float), (1, u.shape[0], 1))
    f = np.asarray(problem.model.f, float).copy()
    f[:len(problem.cv_tags)] += np.asarray(problem.bias)  # C = [I 0 ...] in the ARX realisation
    assert np.array_equal(np.asarray(problem.model.C)[:, :len(problem.cv_tags)], np.eye(len(problem.cv_tags)))
    return rollout(replace(problem.model, f=tuple(f)), np.asarray(problem.x0)[None], u[None], d)[0]


def mpc_cost(problem, u, s=None):
    """Independent cost of a plan, with explicit slacks s (N, ny) when given."""
    y = predict(problem, u)
    w, t = np.asarray(problem.y_weight), np.asarray(problem.y_target)
    du = np.diff(np.vstack([problem.u_prev, u]), axis=0)
    cost = np.sum(w * (y - t) ** 2) + problem.move_weight * np.sum(du ** 2)
    if s is not None:
        cost += problem.slack_weight * np.sum(s + s ** 2)
    return cost


def candidate(result, kind):
    return next(c for c in result.candidates if c.kind is kind)


# --------------------------------------------------------------------------- optimality


def test_unconstrained_mpc_matches_the_least_squares_solution():
    # Wide rates, bounds not reached: the optimum solves the normal equations of a least-squares problem.
    p = tank_problem(max_move=50.0, horizon=12, move_weight=1.0, x0=(0.3, -0.2, 0.1, 0.0), bias=(0.05, -0.02))
    N, nu = p.horizon, len(p.mv_tags)
    free = predict(p, np.zeros((N, nu)))
    columns = []
    for i in range(N * nu):
        e = np.zeros(N * nu)
        e[i] = 1.0
        columns.append((predict(p, e.reshape(N, nu)) - free).reshape(-1))
    Phi = np.array(columns).T
    sw = np.sqrt(np.tile(p.y_weight, N))
    D = np.eye(N * nu) - np.eye(N * nu, k=-nu)
    e0 = np.zeros(N * nu)
    e0[:nu] = p.u_prev
    lhs = np.vstack([sw[:, None] * Phi, np.sqrt(p.move_weight) * D])
    rhs = np.concatenate([sw * (np.tile(p.y_target, N) - free.reshape(-1)), np.sqrt(p.move_weight) * e0])
    u_ls = np.linalg.lstsq(lhs, rhs, rcond=None)[0].reshape(N, nu)
    assert np.all(u_ls < np.asarray(p.u_hi)) and np.all(u_ls > np.asarray(p.u_lo))

    nominal = candidate(solve_problem(p, SolverCache()), CandidateKind.NOMINAL)
    np.testing.assert_allclose(normalised_controls(p, nominal), u_ls, atol=1e-5)
    assert nominal.cost == pytest.approx(mpc_cost(p, u_ls), rel=1e-6)


def test_rate_limited_mpc_matches_scipy_slsqp():
    p = tank_problem(max_move=0.2, horizon=8, targets=(9.0, 9.5))
    N, nu = p.horizon, len(p.mv_tags)
    du_max = np.tile(p.du_max, N)
    D = np.eye(N * nu) - np.eye(N * nu, k=-nu)
    e0 = np.zeros(N * nu)
    e0[:nu] = p.u_prev
    constraints = [{"type": "ineq", "fun": lambda v: du_max - (D @ v - e0), "jac": lambda v: -D},
                   {"type": "ineq", "fun": lambda v: du_max + (D @ v - e0), "jac": lambda v: D}]
    bounds = list(zip(np.tile(p.u_lo, N), np.tile(p.u_hi, N)))
    ref = minimize(lambda v: mpc_cost(p, v.reshape(N, nu)), np.tile(p.u_prev, N), method="SLSQP",
                   bounds=bounds, constraints=constraints, options={"ftol": 1e-12, "maxiter": 500})
    assert ref.success

    nominal = candidate(solve_problem(p, SolverCache()), CandidateKind.NOMINAL)
    u = normalised_controls(p, nominal)
    assert np.max(np.abs(np.diff(np.vstack([p.u_prev, u]), axis=0)) - p.du_max) <= 1e-7  # rates are active
    np.testing.assert_allclose(u, ref.x.reshape(N, nu), atol=1e-4)
    assert nominal.cost == pytest.approx(ref.fun, rel=1e-6)


def test_soft_cv_limit_solution_matches_scipy_with_explicit_slacks():
    # y starts above its high limit and the MV can only move 0.3 per step: the limit is violated early.
    binding = scalar_binding(lo=-1.0, hi=1.0, target=0.5, max_move=0.3, horizon=5)
    p = compile_problem(binding, scalar_artifact(), [2.0], [0.0], [1.0], [])
    N = p.horizon
    def moves(v):
        return np.diff(np.concatenate([p.u_prev, v[:N]]))

    cons = [{"type": "ineq", "fun": lambda v: predict(p, v[:N, None])[:, 0] + v[N:] - p.y_lo[0]},
            {"type": "ineq", "fun": lambda v: p.y_hi[0] + v[N:] - predict(p, v[:N, None])[:, 0]},
            {"type": "ineq", "fun": lambda v: p.du_max[0] - moves(v)},
            {"type": "ineq", "fun": lambda v: p.du_max[0] + moves(v)}]
    bounds = [(p.u_lo[0], p.u_hi[0])] * N + [(0.0, None)] * N
    u_start = p.u_prev[0] - p.du_max[0] * np.arange(1, N + 1)  # down at the max rate
    s_start = np.maximum(0.0, predict(p, u_start[:, None])[:, 0] - p.y_hi[0])
    start = np.concatenate([u_start, s_start])
    ref = minimize(lambda v: mpc_cost(p, v[:N, None], v[N:]), start, method="SLSQP", bounds=bounds,
                   constraints=cons, options={"ftol": 1e-10, "maxiter": 1000})
    # SLSQP may end on "positive directional derivative" at this kinked optimum: check its point instead.
    assert np.all(moves(ref.x) <= p.du_max[0] + 1e-8) and ref.x[N] > 0.1  # the first step's limit is violated

    nominal = candidate(solve_problem(p, SolverCache()), CandidateKind.NOMINAL)
    assert nominal.constraints["slack_max"] > 0.1
    # The rate-limited steps agree exactly; the last move barely changes a cost of ~2e3 (SLSQP's ftol).
    np.testing.assert_allclose(normalised_controls(p, nominal)[:N - 1, 0], ref.x[:N - 1], atol=1e-6)
    assert nominal.cost <= ref.fun * (1 + 1e-9)
    assert nominal.cost == pytest.approx(ref.fun, rel=1e-6)


def test_steady_target_matches_scipy_slsqp_with_active_move_limit():
    p = tank_problem(template="steady_response@1", horizon=2, max_move=0.4, targets=(9.0, 9.5))
    G, c = np.asarray(p.steady_gain), np.asarray(p.steady_offset)  # the disturbance is compiled into it
    w, t = np.asarray(p.y_weight), np.asarray(p.y_target)

    def cost(v):
        return np.sum(w * (G @ v + c - t) ** 2) + STEADY_MOVE_SCALE * p.move_weight * np.sum((v - p.u_prev) ** 2)

    move = 2 * np.asarray(p.du_max)
    bounds = [(max(lo, u0 - m), min(hi, u0 + m)) for lo, hi, u0, m in zip(p.u_lo, p.u_hi, p.u_prev, move)]
    ref = minimize(cost, np.asarray(p.u_prev), method="SLSQP", bounds=bounds, options={"ftol": 1e-14})
    assert ref.success

    result = solve_problem(p, SolverCache())
    nominal = candidate(result, CandidateKind.NOMINAL)
    assert np.asarray(nominal.controls).shape == (1, 2) and np.asarray(nominal.predicted).shape == (1, 2)
    np.testing.assert_allclose(normalised_controls(p, nominal)[0], ref.x, atol=1e-5)
    assert nominal.cost == pytest.approx(ref.fun, rel=1e-6)
    assert nominal.verified


def test_unconstrained_steady_target_reaches_the_cv_targets():
    p = tank_problem(template="steady_response@1", horizon=1, max_move=50.0, move_weight=0.0, targets=(6.5, 7.0))
    nominal = candidate(solve_problem(p, SolverCache()), CandidateKind.NOMINAL)
    np.testing.assert_allclose(nominal.predicted[0], (6.5, 7.0), atol=1e-5)


# --------------------------------------------------------------------------- candidates


def test_hold_candidate_holds_the_current_mvs_and_predicts_them_with_the_model():
    p = tank_problem(u_now=(3.3, 2.7), x0=(0.2, 0.1, 0.0, -0.1), bias=(0.1, 0.0))
    hold = candidate(solve_problem(p, SolverCache()), CandidateKind.HOLD)
    assert hold.seq == 0 and hold.solver_status == "hold"
    np.testing.assert_allclose(hold.controls, np.tile((3.3, 2.7), (p.horizon, 1)))
    u = normalised_controls(p, hold)
    y_eng = np.asarray(p.y_mean) + np.asarray(p.y_std) * predict(p, u)
    np.testing.assert_allclose(hold.predicted, y_eng, atol=1e-9)
    assert hold.cost == pytest.approx(mpc_cost(p, u), rel=1e-9)


def test_nominal_candidate_costs_less_than_holding():
    result = solve_problem(tank_problem(), SolverCache())
    hold, nominal = candidate(result, CandidateKind.HOLD), candidate(result, CandidateKind.NOMINAL)
    assert nominal.seq == 1 and nominal.verified
    assert nominal.cost < 0.5 * hold.cost


def test_robust_candidate_keeps_cvs_further_from_the_limits():
    # y1 target on its high limit (8): the nominal plan goes there, the robust one stays band below.
    p = tank_problem(band=(0.3, 0.1), cv_hi=8.0, targets=(8.0, 7.5), horizon=30)
    result = solve_problem(p, SolverCache())
    nominal, robust = candidate(result, CandidateKind.NOMINAL), candidate(result, CandidateKind.ROBUST)
    assert robust.seq == 2 and robust.verified
    y1_nominal, y1_robust = np.asarray(nominal.predicted)[:, 0], np.asarray(robust.predicted)[:, 0]
    assert y1_nominal[-1] == pytest.approx(8.0, abs=0.02)
    assert y1_robust.max() <= 8.0 - 0.3 * 2.0 + 1e-4  # band 0.3 normalised x std 2.0
    assert y1_robust.max() < y1_nominal.max() - 0.5


def test_robust_candidate_reuses_a_nominal_plan_that_meets_the_tightened_limits():
    # Limits far from the plan: tightening them by a small band changes nothing, so the robust optimum is
    # the nominal one (shared, no second QP) and equals an independent solve with the tightened limits.
    p = tank_problem(band=(0.05, 0.05))
    result = solve_problem(p, SolverCache())
    nominal, robust = candidate(result, CandidateKind.NOMINAL), candidate(result, CandidateKind.ROBUST)
    assert robust.constraints.get("shared_with_nominal") is True and robust.verified
    assert robust.controls == nominal.controls and robust.cost == pytest.approx(nominal.cost, rel=1e-12)
    r_lo, r_hi = robust_limits(p)
    tightened = replace(p, y_lo=tuple(r_lo), y_hi=tuple(r_hi), band=None)
    direct = candidate(solve_problem(tightened, SolverCache()), CandidateKind.NOMINAL)
    np.testing.assert_allclose(np.asarray(robust.controls), np.asarray(direct.controls), atol=1e-4)


def test_robust_candidate_is_solved_when_the_band_binds():
    p = tank_problem(band=(0.3, 0.1), cv_hi=8.0, targets=(8.0, 7.5), horizon=30)
    robust = candidate(solve_problem(p, SolverCache()), CandidateKind.ROBUST)
    assert "shared_with_nominal" not in robust.constraints


def test_without_band_there_is_no_robust_candidate():
    result = solve_problem(tank_problem(), SolverCache())
    assert [c.kind for c in result.candidates] == [CandidateKind.HOLD, CandidateKind.NOMINAL]


def test_disturbance_enters_the_plan_and_its_verification():
    result = solve_problem(tank_problem(with_dv=True), SolverCache())
    assert all(c.verified for c in result.candidates), [c.verify_report["reasons"] for c in result.candidates]


# --------------------------------------------------------------------------- statuses


def test_infeasible_hard_problem_gives_no_plan_and_a_clear_status():
    # MV far above its bound and allowed to move only 0.01 per step: bounds and rates cannot both hold.
    binding = scalar_binding(u_lo=-1.0, u_hi=1.0, max_move=0.01, horizon=5)
    p = compile_problem(binding, scalar_artifact(), [0.0], [0.0], [20.0], [])
    result = solve_problem(p, SolverCache())
    nominal = candidate(result, CandidateKind.NOMINAL)
    assert result.ok
    assert nominal.solver_status == "primal infeasible"
    assert nominal.controls == () and nominal.predicted == () and nominal.cost is None
    assert not nominal.feasible and "no plan" in nominal.verify_report["reasons"][0]
    assert not candidate(result, CandidateKind.HOLD).feasible  # holding 20 breaks the bound too


def test_expired_deadline_gives_no_plan():
    result = solve_problem(tank_problem(band=(0.1, 0.1)), SolverCache(), time_limit_s=0.0)
    for kind in (CandidateKind.NOMINAL, CandidateKind.ROBUST):
        c = candidate(result, kind)
        assert c.solver_status == TIME_LIMIT_REACHED and c.controls == () and not c.feasible


def test_cancel_stops_before_solving():
    result = solve_problem(tank_problem(), SolverCache(), should_cancel=lambda: True)
    assert not result.ok and result.error_code == errors.CANCELLED and result.candidates == ()


def test_invalid_problem_is_an_error_result_naming_the_field():
    p = replace(tank_problem(), x0=(0.0, 0.0))
    result = solve_problem(p, SolverCache())
    assert not result.ok and result.error_code == errors.BAD_REQUEST and "problem.x0" in result.error_message


# --------------------------------------------------------------------------- cache and warm start


def test_warm_re_solve_reuses_the_cached_solver_with_fewer_iterations_and_the_same_answer():
    cache = SolverCache()
    p = tank_problem()
    first = solve_problem(p, cache)
    second = solve_problem(p, cache)
    assert cache.setups == 1 and second.diagnostics["cache_hit"]
    assert second.diagnostics["qp"]["nominal"]["iterations"] < first.diagnostics["qp"]["nominal"]["iterations"]
    np.testing.assert_allclose(candidate(second, CandidateKind.NOMINAL).controls,
                               candidate(first, CandidateKind.NOMINAL).controls, atol=1e-7)


def test_receding_horizon_re_solve_matches_a_fresh_solver():
    cache = SolverCache()
    solve_problem(tank_problem(x0=(0.0, 0.0, 0.0, 0.0)), cache)
    moved = tank_problem(x0=(0.2, 0.1, 0.05, 0.0), u_now=(3.5, 3.4), bias=(0.02, -0.01))
    warm = solve_problem(moved, cache)
    cold = solve_problem(moved, SolverCache())
    assert cache.setups == 1
    np.testing.assert_allclose(candidate(warm, CandidateKind.NOMINAL).controls,
                               candidate(cold, CandidateKind.NOMINAL).controls, atol=1e-6)


def test_new_structure_gets_its_own_solver():
    cache = SolverCache()
    solve_problem(tank_problem(move_weight=0.1), cache)
    result = solve_problem(tank_problem(move_weight=0.2), cache)
    assert cache.setups == 2 and len(cache) == 2 and not result.diagnostics["cache_hit"]


def test_cache_drops_the_least_recently_used_structure():
    cache = SolverCache(max_entries=1)
    solve_problem(tank_problem(horizon=10), cache)
    solve_problem(tank_problem(horizon=11), cache)
    solve_problem(tank_problem(horizon=10), cache)
    assert len(cache) == 1 and cache.setups == 3


def test_steady_and_mpc_problems_share_a_cache_without_collision():
    cache = SolverCache()
    mpc = solve_problem(tank_problem(horizon=1), cache)
    steady = solve_problem(tank_problem(template="steady_response@1", horizon=1), cache)
    assert cache.setups == 2
    assert mpc.diagnostics["template"] == Template.LINEAR_MPC.value
    assert steady.diagnostics["template"] == Template.STEADY_RESPONSE.value
