"""Integrating CVs (a level, an inventory): a binding declares them (`integrating: true`), identification
fixes their pole at 1, the steady state reads their settled rate, a move plan ends balanced and the
verifier checks that it does, the steady-gain condition counts their drift over the plan's horizon, and
the step-response view shows their gain as a rate. Known answers: the plant below, a level whose rate
follows a first-order lag, r[t] = 0.5 r[t-1] - 0.1 u[t-1] + 0.1 d[t-1], so a held unit of u ramps the
level at -0.1 / (1 - 0.5) = -0.2 per sample and a held unit of d at +0.2."""

import copy
from dataclasses import replace

import numpy as np
import pytest
from model_helpers import binding, excitation, run_series, split_of

from optimizer_pipeline.contracts import (CandidateKind, ContractError, EvidenceSnapshot, Normalisation,
                                          binding_from_dict)
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model, identify
from optimizer_pipeline.model.arx import spectral_radius, stack_runs
from optimizer_pipeline.model.fit import RidgeProblem, Structure
from optimizer_pipeline.model.statespace import (disturbance_gain, integrating_outputs, integrators, rollout,
                                                 settling_steps, steady_state)
from optimizer_pipeline.model.step_response import step_response_table
from optimizer_pipeline.problem import compile_problem
from optimizer_pipeline.recommend import gain_conditions
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from optimizer_pipeline.solver.verify import verify_candidate

# y[t] = 1.5 y[t-1] - 0.5 y[t-2] - 0.1 u[t-1] + 0.1 d[t-1]: AR coefficients summing to 1, sum_l l a_l = 0.5
LEVEL = ArxModel(Orders(2, 1, 1), np.array([[[1.5]], [[-0.5]]]), np.full((1, 1, 1), -0.1), np.full((1, 1, 1), 0.1),
                 np.zeros(1))
RATE_U, RATE_D = -0.2, 0.2  # settled rates per sample per unit held
IDENTITY = Normalisation(("u0", "y0", "d0"), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def level_binding(**cv):
    return binding_from_dict({
        "id": "surge", "sample_period_s": 1,
        "mvs": [{"tag": "u0", "lo": -10, "hi": 10, "max_move": 1.0}],
        "cvs": [{"tag": "y0", "lo": -5, "hi": 5, "target": 1.0, "weight": 1.0, "integrating": True, **cv}],
        "dvs": [{"tag": "d0"}], "model": {"na": 2, "nb": 1, "delay": 1, "horizon": 8},
        "profile": {"id": "surge", "template": "linear_mpc_quadratic@1", "horizon": 30, "move_weight": 0.1}})


def level_runs(seed: int, runs: int = 8, n: int = 300, noise: float = 0.01):
    """Runs of LEVEL with steps of u and d that keep the level inside a few units (u follows d), its noise an
    equation error (what an ARX fit assumes)."""
    rng = np.random.default_rng(seed)
    d = excitation(rng, runs, n, 1)
    u = d + 0.3 * excitation(rng, runs, n, 1)  # roughly balanced, so the level wanders but does not run off
    y = np.zeros((runs, n, 1))
    shocks = noise * rng.normal(size=y.shape)
    for t in range(2, n):
        y[:, t] = 1.5 * y[:, t - 1] - 0.5 * y[:, t - 2] - 0.1 * u[:, t - 1] + 0.1 * d[:, t - 1] + shocks[:, t]
    return run_series("r", u, y, d)


# --------------------------------------------------------------------------- identification


def test_an_integrating_cv_is_fitted_as_its_increments_with_its_pole_at_one():
    """The constrained fit is the least squares of y[t] - y[t-1] on y[t-1] - y[t-2], u[t-1], d[t-1] and 1,
    mapped back (a_1 = 1 + beta_1, a_2 = -beta_1): computed here with numpy on the same rows."""
    runs = level_runs(1)
    stacked = stack_runs(runs, IDENTITY, ("u0",), ("y0",), ("d0",))
    structure = Structure(2, 1, ((1, 1),), integrating=(True,))
    problem = RidgeProblem(stacked, 2, 1)
    theta = problem.fit(structure, 0.0).theta()[:, 0]  # [a1, a2, b, bd, c]
    z, target = [], []
    for run in runs:
        y, u, d = run.y[:, 0], run.u[:, 0], run.d[:, 0]
        for t in range(2, len(y)):
            z.append([y[t - 1] - y[t - 2], u[t - 1], d[t - 1], 1.0])
            target.append(y[t] - y[t - 1])
    beta = np.linalg.lstsq(np.array(z), np.array(target), rcond=None)[0]
    np.testing.assert_allclose(theta, [1 + beta[0], -beta[0], beta[1], beta[2], beta[3]], atol=1e-8)
    assert theta[0] + theta[1] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(theta[:4], [1.5, -0.5, -0.1, 0.1], atol=0.02)
    # one AR coefficient fewer to pin down than the free fit of the same orders
    free = Structure(2, 1, ((1, 1),))
    assert problem.effective_params(structure, 0.0) == pytest.approx(problem.effective_params(free, 0.0) - 1, abs=1e-6)
    assert structure.n_params() == free.n_params() - 1


def test_no_other_cv_reads_an_integrating_cvs_past():
    """A settling CV beside the level, y1[t] = 0.8 y1[t-1] + 0.2 u[t-1]: its equation reads its own past
    only (a coupling to the level, however small the fit made it, would make it ramp too), so the model
    integrates in the level alone."""
    rng = np.random.default_rng(6)
    runs = level_runs(6)
    for run in runs:
        y1 = np.zeros(len(run.t))
        for t in range(1, len(y1)):
            y1[t] = 0.8 * y1[t - 1] + 0.2 * run.u[t - 1, 0] + 0.01 * rng.normal()
        object.__setattr__(run, "y", np.column_stack([run.y[:, 0], y1]))
    norm = Normalisation(("u0", "y0", "y1", "d0"), (0.0,) * 4, (1.0,) * 4)
    stacked = stack_runs(runs, norm, ("u0",), ("y0", "y1"), ("d0",))
    structure = Structure(2, 1, ((1, 1), (1, 1)), integrating=(True, False))
    assert structure.past_read(0) == [0] and structure.past_read(1) == [1]
    model = RidgeProblem(stacked, 2, 1).fit(structure, 1e-6)
    assert np.all(model.A[:, 1, 0] == 0.0) and np.all(model.A[:, 0, 1] == 0.0)  # neither reads the other
    assert integrating_outputs(model.realise()).tolist() == [True, False]
    assert steady_state(model.realise())[0][:, 0] == pytest.approx([RATE_U, 1.0], abs=0.05)


def test_identify_keeps_the_pole_at_one_and_counts_the_model_stable():
    spec = level_binding()
    spec = replace(spec, model=replace(spec.model, na=None, nb=None, delay=None))
    artifact = identify(split_of(spec, level_runs(2), 5, 2, 1), spec, 1)
    assert artifact.selection["structure"]["integrating"] == [True]
    assert artifact.selection["final"]["spectral_radius"] < 1.0 and artifact.selection["stable"]
    assert integrating_outputs(artifact.state_space).tolist() == [True]
    # the recorded gain is the level's settled rate per sample, normalised: x u_std / y_std of the split
    assert "integrating_cvs" in artifact.step_response and "per sample" in step_response_table(artifact.step_response)
    pair = next(p for p in artifact.step_response["pairs"] if p["input"] == "u0")
    assert pair["gain"] == pytest.approx(RATE_U, rel=0.1) and pair["settling_steps"] is not None


# --------------------------------------------------------------------------- steady state


def test_the_steady_state_of_an_integrator_is_its_settled_rate():
    ss = LEVEL.realise()
    W, V = integrators(ss)
    assert W.shape == (1, len(ss.A)) and np.allclose(W @ V, np.eye(1))
    G, Gd, y0 = steady_state(ss)
    np.testing.assert_allclose(np.hstack([G, Gd, y0[:, None]]), [[RATE_U, RATE_D, 0.0]], atol=1e-12)
    np.testing.assert_allclose(disturbance_gain(ss), [[2.0]])  # a held unit disturbance: 1 / 0.5 per sample
    # against the simulation: the last step's change under u = 1 and d = 0.5 held
    y = rollout(ss, np.zeros((1, len(ss.A))), np.ones((1, 200, 1)), np.full((1, 200, 1), 0.5))[0, :, 0]
    assert y[-1] - y[-2] == pytest.approx(RATE_U + 0.5 * RATE_D, abs=1e-12)
    assert settling_steps(ss) == int(np.ceil(np.log(0.05) / np.log(0.5)))  # its rate settles as 0.5^H
    assert spectral_radius(ss) == pytest.approx(0.5)  # the integrator is no instability
    # a double integrator (a defective pole at 1) is none: unstable, as any other pole on the unit circle
    double = ArxModel(Orders(2, 1, 1), np.array([[[2.0]], [[-1.0]]]), np.full((1, 1, 1), 0.1), np.zeros((1, 1, 0)),
                      np.zeros(1)).realise()
    assert integrators(double)[0].shape[0] == 0 and spectral_radius(double) == pytest.approx(1.0)


def test_a_model_with_a_level_and_a_settling_cv_reads_a_rate_and_a_gain():
    """Two CVs: the level above and y1[t] = 0.8 y1[t-1] + 0.2 u[t-1] (gain 1), each reading its own past."""
    A = np.array([[[1.5, 0.0], [0.0, 0.8]], [[-0.5, 0.0], [0.0, 0.0]]])
    model = ArxModel(Orders(2, 1, 1), A, np.array([[[-0.1], [0.2]]]), np.zeros((1, 2, 0)), np.zeros(2))
    ss = model.realise()
    G, _, _ = steady_state(ss)
    assert integrating_outputs(ss).tolist() == [True, False]
    assert G[:, 0] == pytest.approx([RATE_U, 1.0])
    y = rollout(ss, np.zeros((1, len(ss.A))), np.ones((1, 300, 1)))[0]
    assert y[-1, 0] - y[-2, 0] == pytest.approx(RATE_U) and y[-1, 1] == pytest.approx(1.0)


# --------------------------------------------------------------------------- planning and verification


@pytest.fixture(scope="module")
def planned():
    spec = level_binding()
    artifact = artifact_from_model(LEVEL, spec, 1, IDENTITY)
    # the level at 0 and balanced (u = d = 0.4); the target 1: up, then balanced again
    x0 = np.zeros(2)  # [y t, y t-1]: the realisation of nb = 1, delay 1 keeps no input lags
    problem = compile_problem(spec, artifact, x0, np.zeros(1), np.array([0.4]), np.array([0.4]), band=np.array([0.05]))
    return spec, artifact, problem, solve_problem(problem, SolverCache())


def test_a_move_plan_ends_balanced_and_on_target(planned):
    """Each plan's last move, held 500 samples more (simulated here, not by the QP), leaves the level where
    the plan ends: the MVs balance the feed (u = d), and the level is at its target."""
    _, _, problem, result = planned
    for kind in (CandidateKind.NOMINAL, CandidateKind.ROBUST):
        plan = next(c for c in result.candidates if c.kind is kind)
        assert plan.verified, plan.verify_report["reasons"]
        u = np.asarray(plan.controls)
        held = np.vstack([u, np.repeat(u[-1:], 500, axis=0)])
        y = rollout(problem.model, np.asarray(problem.x0)[None], held[None],
                    np.full((1, len(held), 1), 0.4))[0, :, 0]
        assert u[-1, 0] == pytest.approx(0.4, abs=1e-5)  # balanced
        assert abs(y[-1] - y[len(u) - 1]) < 1e-4 and y[-1] == pytest.approx(1.0, abs=0.02)
        assert plan.verify_report["balance_drift"]["y0"] < 1e-4


def test_the_verifier_refuses_a_plan_that_does_not_end_balanced(planned):
    _, _, problem, result = planned
    plan = next(c for c in result.candidates if c.kind is CandidateKind.NOMINAL)
    controls = [list(row) for row in plan.controls]
    controls[-1][0] += 0.01  # 0.01 more outflow: -0.002 per sample, 0.06 over the 30-sample horizon
    tampered = verify_candidate(problem, replace(plan, controls=tuple(map(tuple, controls))))
    assert not tampered.feasible and not tampered.verified
    assert tampered.verify_report["balance_drift"]["y0"] == pytest.approx(0.06, rel=1e-3)
    assert any(r.startswith("the plan does not end balanced: its last MVs held 30 samples, y0 drifts 0.06")
               for r in tampered.verify_report["reasons"])
    hold = next(c for c in result.candidates if c.kind is CandidateKind.HOLD)
    assert "balance_drift" not in hold.verify_report  # holding is the baseline, not a plan


def test_a_feed_beyond_what_the_mv_can_take_away_is_named_when_no_plan_is_feasible():
    """No plan can end balanced when the feed d = 12 needs u = 12 and u0 stops at 10: the rate -0.2 u + 0.2 d
    reachable from u = 0.4 (moves of 1 over 30 samples, limits -10..10) stays within 2.4 -+ 2.0, and the
    recommendation's reason says so (recommend.infeasible_because); a feed u0 can balance is planned."""
    from optimizer_pipeline.recommend import infeasible_because

    spec = level_binding()
    artifact = artifact_from_model(LEVEL, spec, 1, IDENTITY)
    for feed, feasible in ((9.5, True), (12.0, False)):
        problem = compile_problem(spec, artifact, np.zeros(2), np.zeros(1), np.array([0.4]), np.array([feed]),
                                  band=np.array([0.05]))
        result = solve_problem(problem, SolverCache())
        nominal = next(c for c in result.candidates if c.kind is CandidateKind.NOMINAL)
        assert nominal.feasible is feasible
        low, high = RATE_D * feed + RATE_U * 10.0, RATE_D * feed + RATE_U * -10.0
        named = (f"y0 cannot end balanced: with the MVs within their limits and the moves of 30 samples, its rate "
                 f"stays between {low:.3g} and {high:.3g} per sample")
        assert (named in infeasible_because(result)) is not feasible, infeasible_because(result)


def test_the_gain_uncertainty_of_a_level_is_its_drift_over_the_plan(planned):
    """A level's gain is a rate: 2 standard errors of it along the planned move, held for the plan's horizon,
    must fit in the band. The plan ends balanced where it started (u back at 0.4): no move, no drift. Ending
    at u = 1.0 instead, a move of 0.6 with a rate s.e. of 0.001 drifts 2 x 0.001 x 0.6 x 30 = 0.036 within
    the band 0.05; with an s.e. of 0.002, 0.072 beyond it."""
    spec, artifact, problem, result = planned
    plan = next(c for c in result.candidates if c.kind is CandidateKind.ROBUST)
    moved = replace(plan, controls=plan.controls[:-1] + ((1.0,),))

    def condition(se: float, candidate):
        gain = {**artifact.steady_gain, "uncertainty": {"method": "given", "replicates": 8, "cov": [[[se ** 2]]]}}
        evidence = EvidenceSnapshot(source="simulation", has_evidence=True, uq={"qhat": [0.05]}, uq_checks=(),
                                    calibrated_at=None, calibration_fresh=True, fresh_days=7.0, input_distance=0.0)
        return gain_conditions(replace(artifact, steady_gain=gain), problem, evidence, candidate)[0]

    assert condition(0.001, plan).holds
    held = condition(0.001, moved)
    assert held.holds and held.value == "y0: 0.036 against band 0.05"
    drifting = condition(0.002, moved)
    assert not drifting.holds and drifting.reason.startswith(
        "steady-gain uncertainty: along the planned move a drift of y0 of up to 0.072 over the plan's 30 samples "
        "held after it (its rate, 2 standard errors of its gain) exceeds the band 0.05; step tests with more or "
        "larger steps of u0 would determine the gain of y0")


# --------------------------------------------------------------------------- the steady-state layer

# two outflows on the level: y[t] = 1.5 y[t-1] - 0.5 y[t-2] - 0.1 u0[t-1] - 0.1 u1[t-1] + 0.1 d[t-1]; balanced
# where u0 + u1 = d
TWO_OUTFLOWS = ArxModel(Orders(2, 1, 1), LEVEL.A, np.full((1, 1, 2), -0.1), LEVEL.D, np.zeros(1))


def two_outflows(**doc):
    return binding_from_dict({
        "id": "surge2", "sample_period_s": 1,
        "mvs": [{"tag": "u0", "lo": 0, "hi": 10, "max_move": 1.0, "cost": 1.0},
                {"tag": "u1", "lo": 0, "hi": 10, "max_move": 1.0}],
        "cvs": [{"tag": "y0", "lo": -5, "hi": 5, "target": 1.0, "weight": 1.0, "integrating": True}],
        "dvs": [{"tag": "d0"}], "model": {"na": 2, "nb": 1, "delay": 1, "horizon": 8},
        "profile": {"id": "surge", "template": "linear_mpc_quadratic@1", "horizon": 30, "move_weight": 0.1},
        **doc})


def steered_inputs(spec):
    norm = Normalisation(("u0", "u1", "y0", "d0"), (0.0,) * 4, (1.0,) * 4)
    artifact = artifact_from_model(TWO_OUTFLOWS, spec, 1, norm)
    # the level at 0 and balanced, the feed 0.4 shared by both outflows
    return artifact, (np.zeros(2), np.zeros(1), np.array([0.2, 0.2]), np.array([0.4]))


def test_the_layer_holds_a_level_as_a_balance_row_not_a_gain():
    """In the steady-state layer the level's row is its drift over the plan's 30 samples (-0.2 per sample per
    unit of each outflow: -6), held at 0 by limits 0, with no target and no band."""
    from optimizer_pipeline.solver.targets import compile_steady, steady_layer

    spec = two_outflows()
    artifact, state = steered_inputs(spec)
    layer = compile_steady(steady_layer(spec), artifact, *state, band=np.array([0.05]))
    assert np.asarray(layer.steady_gain) == pytest.approx(np.array([[30 * RATE_U, 30 * RATE_U]]))
    assert np.asarray(layer.steady_dv_gain) == pytest.approx(np.array([[30 * RATE_D]]))
    assert (layer.y_lo, layer.y_hi, layer.y_weight, layer.band) == ((0.0,), (0.0,), (0.0,), (0.0,))
    result = solve_problem(layer, SolverCache())
    plan = next(c for c in result.candidates if c.kind is CandidateKind.ROBUST)
    assert plan.verified and plan.controls[0] == pytest.approx((0.0, 0.4), abs=1e-5)
    # an unbalanced steady target: 0.1 too little outflow drifts the level 0.1 x 0.2 x 30 = 0.6
    tampered = verify_candidate(layer, replace(plan, controls=((0.0, 0.3),), predicted=((0.6,),)))
    assert not tampered.feasible
    assert tampered.verify_report["reasons"][0] == (
        "CV y0 is not balanced: it drifts 0.6 over the 30 samples, 0.6 more than holding the current MVs "
        "(allowed 0.001)")


def test_a_plan_with_costs_and_a_level_balances_the_flows_on_the_cheapest_outflow():
    """Known answer: the balance needs u0 + u1 = 0.4; u0 costs, u1 does not, so the layer puts u0 at its low
    limit and u1 at 0.4. The move plan steers there, ends balanced and the level on its own target 1."""
    from optimizer_pipeline.solver.targets import compile_steered

    spec = two_outflows()
    artifact, state = steered_inputs(spec)
    problem = compile_steered(spec, artifact, *state, band=np.array([0.05]))
    assert problem.u_target == pytest.approx((0.0, 0.4), abs=1e-6)
    assert (problem.y_target, problem.y_weight) == ((1.0,), (1.0,))  # its own target, not the layer's row
    result = solve_problem(problem, SolverCache())
    for kind in (CandidateKind.NOMINAL, CandidateKind.ROBUST):
        plan = next(c for c in result.candidates if c.kind is kind)
        assert plan.verified, plan.verify_report["reasons"]
        u = np.asarray(plan.controls)
        held = np.vstack([u, np.repeat(u[-1:], 500, axis=0)])
        y = rollout(problem.model, np.asarray(problem.x0)[None], held[None], np.full((1, len(held), 1), 0.4))[0]
        assert u[-1] == pytest.approx([0.0, 0.4], abs=1e-3) and u[-1].sum() == pytest.approx(0.4, abs=1e-5)
        assert y[-1, 0] == pytest.approx(1.0, abs=0.02) and abs(y[-1, 0] - y[len(u) - 1, 0]) < 1e-4


def test_a_level_without_a_target_is_kept_in_its_limits_and_balanced():
    """No target on the level: the plan is steered (the layer picks the outflows), tracks no level, and still
    ends balanced."""
    from optimizer_pipeline.solver.targets import compile_steered

    doc = two_outflows().to_dict()
    doc["cvs"][0].pop("target")
    spec = binding_from_dict(doc)
    artifact, state = steered_inputs(spec)
    problem = compile_steered(spec, artifact, *state)
    assert problem.y_weight == (0.0,)
    plan = next(c for c in solve_problem(problem, SolverCache()).candidates if c.kind is CandidateKind.NOMINAL)
    assert plan.verified and plan.verify_report["balance_drift"]["y0"] < 1e-4
    assert plan.controls[-1] == pytest.approx((0.0, 0.4), abs=1e-3)


@pytest.mark.parametrize("horizon, h", [(30, 60), (2, 5)])
def test_a_steered_plan_with_a_level_is_judged_where_every_cv_has_settled(horizon, h):
    """Its settled evidence scores blocks of twice the plan's horizon, or of the model's settling horizon
    (5 samples here) where that is longer."""
    from optimizer_pipeline.pipeline import held_rule

    spec = two_outflows()
    spec = replace(spec, profile=replace(spec.profile, horizon=horizon))
    assert held_rule(spec, steered_inputs(spec)[0])[0] == h
    plain = level_binding()
    plain = replace(plain, profile=replace(plain.profile, horizon=horizon))
    assert held_rule(plain, artifact_from_model(LEVEL, plain, 1, IDENTITY))[0] == 2 * horizon  # not steered


# --------------------------------------------------------------------------- the binding


def test_a_binding_declares_an_integrating_cv_and_its_hash_is_unchanged_without_one():
    spec = level_binding()
    assert spec.cvs[0].integrating
    plain = level_binding(integrating=False)
    assert not plain.cvs[0].integrating and "integrating" not in plain.canonical_json()
    assert spec.spec_hash != plain.spec_hash


@pytest.mark.parametrize("change, message", [
    (lambda d: d["profile"].update(template="steady_response@1"),
     "binding.cvs[0].integrating: an integrating CV has no steady state, only a balance; plan it with "
     "linear_mpc_quadratic@1"),
    (lambda d: d["cvs"][0].update(cost=1.0),
     "binding.cvs[0].integrating: an integrating CV takes no cost (it settles at no steady value to price; its "
     "balance is held, its target tracked)"),
    (lambda d: d["cvs"][0].update(transform={"kind": "logit", "lo": -6, "hi": 6}),
     "binding.cvs[0].integrating: an integrating CV takes no transform (its balance is a rate in its own units)"),
    (lambda d: d["cvs"][0].update(integrating="sometimes"),
     "binding.cvs[0]: integrating must be true or false, got 'sometimes'"),
])
def test_what_an_integrating_cv_cannot_be_planned_with_is_refused_naming_the_field(change, message):
    doc = copy.deepcopy(level_binding().to_dict())
    change(doc)
    with pytest.raises(ContractError) as refused:
        binding_from_dict(doc)
    assert str(refused.value) == message


def test_a_binding_without_integrating_cvs_fits_as_before():
    """No integrating CV: the structure records none and the fit is the unconstrained one."""
    spec = binding(n_mv=1, n_cv=1, n_dv=1, na=2, nb=1, delay=1, horizon=8)
    artifact = identify(split_of(spec, level_runs(3), 5, 2, 1), spec, 1)
    assert "integrating" not in artifact.selection["structure"]
    assert not integrating_outputs(artifact.state_space).any()


# --------------------------------------------------------------------------- evidence


@pytest.mark.parametrize("n, has_evidence", [(400, True), (65, False)])
def test_a_plan_with_an_integrating_cv_is_judged_at_its_end_held_as_long_again(n, has_evidence):
    """Its settled evidence scores the residual at the end of blocks of twice the plan's horizon (the plan,
    then its last move held), on the val / test runs; runs too short for them give none, and the condition
    says which end it misses."""
    from datetime import datetime, timezone

    from optimizer_pipeline import uq
    from optimizer_pipeline.pipeline import held_rule, settled_evidence
    from optimizer_pipeline.settings import Settings

    spec = level_binding()
    split = split_of(spec, level_runs(4, runs=12, n=n), 6, 3, 3)
    artifact = identify(split, spec, 1)
    h, score = held_rule(spec, artifact)
    assert h == 2 * spec.profile.horizon and score in (uq.SETTLED_RESIDUAL, uq.SETTLED_LOCAL)
    evidence, (condition,) = settled_evidence(spec, artifact, split, Settings(), datetime.now(timezone.utc))
    assert condition.name == "settled evidence of the plan's end"
    if has_evidence and condition.holds:
        assert evidence.block_length == h and evidence.score == score
    elif has_evidence:  # blocks of the plan's end were scored; whether val's qhat covers test is the data's say
        assert "test coverage" in condition.reason and "no UQ evidence" not in condition.reason
    else:
        assert evidence is None and not condition.holds
        assert condition.reason.startswith("the end of the plan, its last move held 30 samples (an integrating "
                                           "CV's) has no settled evidence: no UQ evidence: ")


def test_a_level_not_declared_integrating_is_flagged_with_its_fitted_pole():
    """Identified as a settling CV, the level above fits a pole near 1: the artifact names it (a hint, the
    model is not changed); declared, or a plainly settling CV, nothing is flagged."""
    runs = level_runs(5)
    undeclared = level_binding(integrating=False)
    hint = identify(split_of(undeclared, runs, 5, 2, 1), undeclared, 1).selection["integrating_hint"]
    assert set(hint) == {"y0"} and 0.98 < hint["y0"] < 1.0
    declared = level_binding()
    assert identify(split_of(declared, runs, 5, 2, 1), declared, 1).selection["integrating_hint"] == {}


def test_the_hint_reads_which_output_the_slow_mode_belongs_to():
    from optimizer_pipeline.model.artifact import integrating_hint

    A = np.array([[[0.997, 0.0], [0.0, 0.8]]])  # y0 nearly integrates, y1 settles
    model = ArxModel(Orders(1, 1, 1), A, np.full((1, 2, 1), 0.1), np.zeros((1, 2, 0)), np.zeros(2))
    assert integrating_hint(model.realise(), ("y0", "y1")) == {"y0": pytest.approx(0.997)}
    assert integrating_hint(LEVEL.realise(), ("y0",)) == {}  # an integrator's pole is exactly 1: declared


# --------------------------------------------------------------------------- a level read through a noisy transmitter


def measured_level_runs(seed: int, runs: int = 12, n: int = 400, noise: float = 0.05, dv_noise: float = 0.05):
    """Runs of a pure integrator y[t] = y[t-1] - 0.1 u[t-1] + 0.1 d[t-1] (balanced where u = d), read through
    a transmitter with white noise, and its DV measured with noise: no equation error. Returns the runs
    and the true DV of each run's last sample."""
    rng = np.random.default_rng(seed)
    d = excitation(rng, runs, n, 1)
    u = d + 0.3 * excitation(rng, runs, n, 1)
    y = np.zeros((runs, n, 1))
    for t in range(1, n):
        y[:, t] = y[:, t - 1] - 0.1 * u[:, t - 1] + 0.1 * d[:, t - 1]
    u[-1, -150:] = d[-1, -150:] = d[-1, -150]  # the live run ends balanced and at rest
    y[-1, -150:] = y[-1, -150]
    measured_y = y + noise * rng.normal(size=y.shape)
    measured_d = d + dv_noise * rng.normal(size=d.shape)
    return run_series("r", u, measured_y, measured_d), d[-1, -1, 0]


@pytest.fixture(scope="module")
def noisy_level():
    spec = level_binding()
    runs, d_true = measured_level_runs(5)
    split = split_of(spec, runs, 6, 3, 2)
    return spec, split, identify(split, spec, 1), d_true


def test_a_noisy_levels_rate_is_fitted_over_the_plan_and_its_hold(noisy_level):
    """Its held disturbance is a rate: fitted over the span the plan's end is judged over (twice the plan's
    horizon) where that predicts the val runs' span ends closer than the model's rule, and the artifact
    records it for the live state and the evidence."""
    from optimizer_pipeline.model.arx import disturbance_window
    from optimizer_pipeline.model.window import held_end_error, held_span, held_window

    spec, split, artifact, _ = noisy_level
    ss, orders = artifact.state_space, Orders(artifact.na, artifact.nb, artifact.delay)
    span, base = held_span(spec), disturbance_window(artifact.state_space, artifact.horizon)
    assert span == 2 * spec.profile.horizon and base < span
    val = stack_runs(split.val, artifact.normalisation, artifact.mv_tags, artifact.cv_tags, artifact.dv_tags)
    assert held_end_error(ss, orders, val, span, span) < held_end_error(ss, orders, val, span, base)
    assert artifact.disturbance_rows == held_window(artifact) == span
    assert artifact.selection["disturbance_window"]["reason"].startswith("an integrating CV")


def test_a_model_with_an_integrating_cv_keeps_the_identified_model_for_its_plans(noisy_level):
    from optimizer_pipeline.model.artifact import INTEGRATING_GLOBAL
    from optimizer_pipeline.model.local import GLOBAL

    record = noisy_level[2].selection["steady_model"]
    assert record["procedure"] == GLOBAL and record["note"] == INTEGRATING_GLOBAL


def test_holding_is_judged_at_the_step_the_plans_end_band_speaks_of(noisy_level):
    """The band against the improvement holds the plan's end band (the plan and its last move held as long,
    pipeline.held_rule) to holding's error at that same step: with the MV off the feed's balance on the
    newest sample, holding drifts the level on past the plan's last step (recommend.held_end), and the
    recorded condition reads that error, not the one at the plan's last step."""
    from optimizer_pipeline import pipeline, uq
    from optimizer_pipeline.contracts import Calibration, utc_now
    from optimizer_pipeline.ledger import StoredBinding
    from optimizer_pipeline.recommend import improvement_conditions
    from optimizer_pipeline.settings import Settings

    spec, split, artifact, _ = noisy_level
    scores = pipeline.score_blocks(spec, artifact, split)
    calibration = Calibration("cal-level", artifact.artifact_hash, uq.compute_block_uq(scores.val, scores.test))
    u = split.live.u.copy()
    u[-1] += 0.05
    split = replace(split, live=replace(split.live, u=u))
    cache = SolverCache()
    solved = pipeline.solve_and_decide(spec, StoredBinding(spec, 1, spec.spec_hash, None), artifact, split,
                                       calibration, lambda p: solve_problem(p, cache), Settings(), "simulation",
                                       utc_now(), outcomes=())
    conditions = {c.name: c for c in solved.decision.conditions}
    assert conditions["settled evidence of the plan's end"].holds
    settled, _ = pipeline.settled_evidence(spec, artifact, split, Settings(), utc_now())
    wider = np.maximum(uq.band_engineering(calibration.evidence, artifact), uq.band_engineering(settled, artifact))
    args = (spec, solved.result, solved.decision.chosen, wider.tolist(), Settings().uq_max_band_fraction,
            solved.problem.cv_engineering(solved.problem.y_target))
    [at_end] = improvement_conditions(*args, problem=solved.problem, end_step=pipeline.held_rule(spec, artifact)[0])
    [at_last_step] = improvement_conditions(*args)
    assert conditions["band against the improvement over holding"] == at_end
    assert at_end.value != at_last_step.value


def test_a_plan_balances_the_true_feed_not_one_noisy_sample_of_it():
    """The plan ends at the MV that balances the feed the plant gets (u = d): the rate is held fitted over the
    artifact's window and the DV at its level (problem.held_dvs), so the balance misses by far less than one
    DV sample's noise (0.05), and than the same plan from the model's rule W and the newest DV sample."""
    from optimizer_pipeline.model.arx import disturbance_window, state_and_bias
    from optimizer_pipeline.model.artifact import stack_for
    from optimizer_pipeline.model.window import held_window
    from optimizer_pipeline.problem import held_dvs

    spec, cache = level_binding(), SolverCache()
    now, before = [], []
    for seed in range(1, 7):
        runs, d_true = measured_level_runs(seed)
        split = split_of(spec, runs, 6, 3, 2)
        artifact, live = identify(split, spec, 1), split.live
        orders = Orders(artifact.na, artifact.nb, artifact.delay)
        for window, d, misses in ((held_window(artifact), held_dvs(live.d, held_window(artifact)), now),
                                  (disturbance_window(artifact.state_space, artifact.horizon), live.d[-1], before)):
            x0, bias = state_and_bias(artifact.state_space, orders, stack_for(artifact, [live]), artifact.horizon,
                                      window)
            problem = compile_problem(spec, artifact, x0, bias, live.u[-1], d)
            plan = next(c for c in solve_problem(problem, cache).candidates if c.kind is CandidateKind.NOMINAL)
            misses.append(abs(float(np.asarray(plan.controls)[-1, 0]) - d_true))
    assert max(now) < 0.025 and np.mean(now) < np.mean(before) / 4, (now, before)
