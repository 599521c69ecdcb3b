"""Economic steady state (issue 17, item 2): binding costs and optional targets, the steady-state QP
against independently computed LP / QP optima, the priority rule, and a move plan steered to the
steady-state layer's target (two layers)."""

import numpy as np
import pytest
from scipy.optimize import linprog, minimize

from optimizer_pipeline.contracts import CandidateKind, ContractError, Template, binding_from_dict, utc_now
from optimizer_pipeline.economics import economic_value
from optimizer_pipeline.problem import ProblemError, compile_problem, validate_problem
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from optimizer_pipeline.solver.targets import compile_steered
from optimizer_pipeline.solver.verify import independent_cost
from test_solver_qp_support import tank_artifact

U_NOW = (3.0, 3.0)
ARTIFACT = tank_artifact()


def engineering_gain():
    """The hand-built tank's steady-state map in engineering units, y = Ge u + y0, computed from its
    state space and normalisation (not from the problem's compiled gain)."""
    A, B, _, _, C = ARTIFACT.state_space.arrays()
    G = C @ np.linalg.solve(np.eye(len(A)) - A, B)
    mean, std = np.asarray(ARTIFACT.normalisation.mean), np.asarray(ARTIFACT.normalisation.std)
    u_mean, u_std, y_mean, y_std = mean[:2], std[:2], mean[2:], std[2:]
    Ge = y_std[:, None] * G / u_std[None, :]
    return Ge, y_mean - Ge @ u_mean


def doc(template="steady_response@1", mv_costs=(-1.0, 0.5), mv_quadratic=(0.0, 0.0), y1=None, y2=7.5,
        y1_hi=10.0, horizon=20, move_weight=0.0, y1_cost=0.0):
    y1_item = {"tag": "y1", "lo": 2.0, "hi": y1_hi, "cost": y1_cost}
    if y1 is not None:
        y1_item["target"] = y1
    y2_item = {"tag": "y2", "lo": 2.0, "hi": 10.0}
    if y2 is not None:
        y2_item["target"] = y2
    return {"id": "tanks-1", "sample_period_s": 5,
            "mvs": [{"tag": f"v{i + 1}", "lo": 0.0, "hi": 6.0, "max_move": 0.5, "cost": c, "cost_quadratic": q}
                    for i, (c, q) in enumerate(zip(mv_costs, mv_quadratic))],
            "cvs": [y1_item, y2_item],
            "profile": {"id": "econ", "version": 1, "template": template, "horizon": horizon,
                        "move_weight": move_weight}}


def solve(spec, band=None):
    problem = compile_steered(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [], band)
    return problem, solve_problem(problem, SolverCache())


def nominal(result):
    return next(c for c in result.candidates if c.kind is CandidateKind.NOMINAL)


# --------------------------------------------------------------------------- binding fields


def test_costs_and_optional_targets_are_read_and_round_trip():
    spec = binding_from_dict(doc(mv_quadratic=(0.2, 0.0), y1_cost=0.3))
    assert [m.cost for m in spec.mvs] == [-1.0, 0.5] and spec.mvs[0].cost_quadratic == 0.2
    assert spec.cvs[0].target is None and spec.cvs[1].target == 7.5 and spec.cvs[0].cost == 0.3
    assert spec.has_costs
    assert binding_from_dict(spec.to_dict()) == spec


def test_a_binding_without_costs_keeps_its_canonical_form():
    # zero costs are left out of the canonical JSON: a binding stored before costs existed keeps its hash
    plain = doc(mv_costs=(0.0, 0.0), y1=7.0)
    spec = binding_from_dict(plain)
    assert not spec.has_costs
    assert "cost" not in spec.canonical_json()
    priced = binding_from_dict(doc(mv_costs=(0.0, 0.1), y1=7.0))
    assert priced.spec_hash != spec.spec_hash and '"cost":0.1' in priced.canonical_json()


@pytest.mark.parametrize("field, value, message", [
    ("cost", "cheap", "binding.mvs[0].cost: expected a number, got 'cheap'"),
    ("cost_quadratic", -0.1, "binding.mvs[0].cost_quadratic: must be >= 0, got -0.1"),
])
def test_bad_costs_are_refused_with_the_field(field, value, message):
    d = doc()
    d["mvs"][0][field] = value
    with pytest.raises(ContractError) as err:
        binding_from_dict(d)
    assert str(err.value) == message


def test_economic_value_in_engineering_units():
    spec = binding_from_dict(doc(mv_quadratic=(0.2, 0.0), y1_cost=0.3))
    # -1 * 2 + 0.2 * 4 + 0.5 * 3 + 0.3 * 8
    assert economic_value(spec, [2.0, 3.0], [8.0, 7.5]) == pytest.approx(-2.0 + 0.8 + 1.5 + 2.4)
    assert economic_value(binding_from_dict(doc(mv_costs=(0.0, 0.0), y1=7.0)), [2.0, 3.0], [8.0, 7.5]) is None


# --------------------------------------------------------------------------- known optima


def test_linear_costs_reach_the_lp_optimum():
    # y2 held at its target, y1 only inside [2, 10], v1 earns and v2 costs: an LP whose optimum is a
    # vertex (v1 at its upper bound), solved independently by scipy's linprog in engineering units
    spec = binding_from_dict(doc())
    problem, result = solve(spec)
    assert problem.economic and problem.target_hold == (0.0, 1.0)  # y2 held where the targets-first stage got
    Ge, y0 = engineering_gain()
    lp = linprog([-1.0, 0.5], A_ub=np.vstack([Ge[0], -Ge[0]]), b_ub=[10.0 - y0[0], y0[0] - 2.0],
                 A_eq=Ge[1:], b_eq=[7.5 - y0[1]], bounds=[(0.0, 6.0)] * 2)
    assert lp.status == 0
    best = nominal(result)
    assert best.verified, best.verify_report["reasons"]
    np.testing.assert_allclose(best.controls[0], lp.x, atol=1e-4)
    np.testing.assert_allclose(best.predicted[0], Ge @ lp.x + y0, atol=1e-4)
    assert best.predicted[0][1] == pytest.approx(7.5, abs=1e-4)  # the target is met exactly, not traded


def test_a_cv_without_target_stops_the_economics_at_its_limit():
    # y1's upper limit 9 now cuts the LP: the optimum sits on it (a CV limit, not an MV bound, is active)
    spec = binding_from_dict(doc(y1_hi=9.0))
    _, result = solve(spec)
    Ge, y0 = engineering_gain()
    lp = linprog([-1.0, 0.5], A_ub=np.vstack([Ge[0], -Ge[0]]), b_ub=[9.0 - y0[0], y0[0] - 2.0],
                 A_eq=Ge[1:], b_eq=[7.5 - y0[1]], bounds=[(0.0, 6.0)] * 2)
    best = nominal(result)
    np.testing.assert_allclose(best.controls[0], lp.x, atol=1e-4)
    assert best.predicted[0][0] == pytest.approx(9.0, abs=1e-4)
    assert best.controls[0][0] < 6.0 - 1e-3  # v1 no longer at its bound


def test_quadratic_costs_reach_the_qp_optimum():
    # quadratic MV costs give an interior optimum; compared with scipy's SLSQP on the same problem
    spec = binding_from_dict(doc(mv_costs=(-2.0, 0.5), mv_quadratic=(0.25, 0.1)))
    _, result = solve(spec)
    Ge, y0 = engineering_gain()

    def cost(u):
        return -2.0 * u[0] + 0.25 * u[0] ** 2 + 0.5 * u[1] + 0.1 * u[1] ** 2

    ref = minimize(cost, np.array(U_NOW), method="SLSQP", bounds=[(0.0, 6.0)] * 2, options={"ftol": 1e-12},
                   constraints=[{"type": "eq", "fun": lambda u: Ge[1] @ u + y0[1] - 7.5},
                                {"type": "ineq", "fun": lambda u: 10.0 - Ge[0] @ u - y0[0]},
                                {"type": "ineq", "fun": lambda u: Ge[0] @ u + y0[0] - 2.0}])
    assert ref.success
    best = nominal(result)
    assert 0.0 < ref.x[0] < 6.0 and 0.0 < ref.x[1] < 6.0  # interior: the quadratic terms decide
    np.testing.assert_allclose(best.controls[0], ref.x, atol=1e-4)
    assert best.verified and best.independent_cost == pytest.approx(best.cost, rel=1e-4)


def test_cv_costs_reach_the_mvs_through_the_gain():
    # no target at all; y1 priced: the cheapest point within the limits puts y1 at its lower limit
    spec = binding_from_dict(doc(mv_costs=(0.0, 0.0), y2=None, y1_cost=1.0))
    _, result = solve(spec)
    Ge, y0 = engineering_gain()
    lp = linprog(Ge[0], A_ub=np.vstack([Ge, -Ge]), b_ub=np.concatenate([10.0 - y0, y0 - 2.0]),
                 bounds=[(0.0, 6.0)] * 2)
    best = nominal(result)
    assert best.predicted[0][0] == pytest.approx(Ge[0] @ lp.x + y0[0], abs=1e-4) == pytest.approx(2.0, abs=1e-4)


# --------------------------------------------------------------------------- priorities


def test_targets_rank_above_costs_and_limits_above_targets():
    # both CVs targeted: two MVs, two targets, no freedom left -> the costs cannot move the targets
    spec = binding_from_dict(doc(y1=8.0, mv_costs=(-5.0, 5.0)))
    _, result = solve(spec)
    np.testing.assert_allclose(nominal(result).predicted[0], [8.0, 7.5], atol=1e-4)
    # y2's target 9.5 is out of reach with y1 kept under 6: the lexicographic optimum (limits, then the
    # target's distance, then the costs), computed by two linprog stages, puts y1 on its limit and
    # leaves y2 as close to its target as that allows, whatever the costs (which pull v2 down)
    tight = binding_from_dict(doc(y1_hi=6.0, y2=9.5, mv_costs=(-5.0, 5.0)))
    _, result = solve(tight)
    Ge, y0 = engineering_gain()
    limits = dict(A_ub=np.vstack([Ge[0], -Ge[0]]), b_ub=[6.0 - y0[0], y0[0] - 2.0], bounds=[(0.0, 6.0)] * 2)
    closest = linprog(-Ge[1], **limits)  # y2 below 9.5 everywhere in the box: closest = largest y2
    assert Ge[1] @ closest.x + y0[1] < 9.5 - 0.05
    best = nominal(result)
    np.testing.assert_allclose(best.controls[0], closest.x, atol=1e-4)
    assert best.predicted[0][0] == pytest.approx(6.0, abs=1e-4)
    assert best.verified, best.verify_report["reasons"]


def test_the_hold_candidate_and_the_verifier_price_the_same_objective():
    spec = binding_from_dict(doc(mv_quadratic=(0.1, 0.0)))
    problem, result = solve(spec)
    for c in result.candidates:
        u = (np.asarray(c.controls) - problem.u_mean) / problem.u_std
        y = (np.asarray(c.predicted) - problem.y_mean) / problem.y_std
        assert independent_cost(problem, u, y, np.asarray(problem.y_lo), np.asarray(problem.y_hi)) == pytest.approx(
            c.cost, rel=1e-4, abs=1e-6)


def test_economics_belong_to_the_steady_template():
    problem = compile_steered(binding_from_dict(doc()), ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])
    from dataclasses import replace
    mpc = replace(problem, template=compile_problem(binding_from_dict(doc(template="linear_mpc_quadratic@1", y1=7.0,
                                                                           mv_costs=(0.0, 0.0))),
                                                    ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, []).template)
    with pytest.raises(ProblemError, match=r"problem.econ_u: economics belong to steady_response@1"):
        validate_problem(mpc)
    with pytest.raises(ProblemError, match=r"problem.econ_yy: required with econ_u"):
        validate_problem(replace(problem, econ_yy=None))
    with pytest.raises(ProblemError, match=r"problem.econ_uu\[1\]: must be >= 0"):
        validate_problem(replace(problem, econ_uu=(0.0, -1.0)))
    with pytest.raises(ProblemError, match=r"problem.target_hold\[0\]: must be 0 or 1, got 0.5"):
        validate_problem(replace(problem, target_hold=(0.5, 1.0)))
    # a steady target with costs is compiled with the targets-first stage's CVs, and only it
    with pytest.raises(ProblemError, match=r"problem\[tanks-1\].held: a steady target with costs needs"):
        compile_problem(binding_from_dict(doc()), ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])
    with pytest.raises(ProblemError, match=r"problem\[tanks-1\].held:"):
        compile_problem(binding_from_dict(doc(mv_costs=(0.0, 0.0), y1=7.0)), ARTIFACT, np.zeros(4), np.zeros(2),
                        U_NOW, [], held=(7.0, 7.5))


# --------------------------------------------------------------------------- two layers


def test_a_move_plan_is_steered_to_the_steady_layers_target():
    spec = binding_from_dict(doc(template="linear_mpc_quadratic@1", horizon=80, move_weight=0.1))
    with pytest.raises(ProblemError, match="needs the steady-state layer"):
        compile_problem(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])
    problem, result = solve(spec)
    layer = solve(binding_from_dict(doc(horizon=80, move_weight=0.1)))[1]
    target = nominal(layer)
    # the plan tracks the layer's CVs and MVs (normalised in the problem)
    np.testing.assert_allclose(np.asarray(problem.y_mean) + np.asarray(problem.y_std) * problem.y_target,
                               target.predicted[0], atol=1e-9)
    np.testing.assert_allclose(np.asarray(problem.u_mean) + np.asarray(problem.u_std) * problem.u_target,
                               target.controls[0], atol=1e-9)
    plan = nominal(result)
    assert plan.verified, plan.verify_report["reasons"]
    np.testing.assert_allclose(plan.controls[-1], target.controls[0], atol=0.06)  # 1 % of the MV range
    np.testing.assert_allclose(plan.predicted[-1], target.predicted[0], atol=0.05)
    assert plan.independent_cost == pytest.approx(plan.cost, rel=1e-4)


def test_a_plain_move_plan_is_not_steered():
    spec = binding_from_dict(doc(template="linear_mpc_quadratic@1", y1=7.0, mv_costs=(0.0, 0.0)))
    problem = compile_steered(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])
    assert problem.u_target is None and problem.u_target_weight == 0.0 and not problem.economic
    assert problem == compile_problem(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])


def test_a_steered_plan_is_judged_against_the_layers_target():
    # the band-against-improvement condition of a steered plan measures its end against the targets
    # it was compiled with (the steady layer's), not the binding's (y1 has none)
    from optimizer_pipeline.recommend import improvement_conditions

    spec = binding_from_dict(doc(template="linear_mpc_quadratic@1", horizon=80, move_weight=0.1))
    problem, result = solve(spec)
    plan, hold = nominal(result), next(c for c in result.candidates if c.kind is CandidateKind.HOLD)
    target = np.asarray(problem.y_mean) + np.asarray(problem.y_std) * problem.y_target
    band = (0.1, 0.1)
    [condition] = improvement_conditions(spec, result, plan, band, 0.25, target)
    span = np.array([8.0, 8.0])
    held = np.linalg.norm((np.asarray(hold.predicted[-1]) - target) / span)
    widened = np.linalg.norm((np.abs(np.asarray(plan.predicted[-1]) - target) + band) / span)
    assert condition.value.startswith(f"{widened / held:.3g} of holding's error")
    assert condition.holds == (widened / held <= 0.25)


def test_a_problem_without_economics_keeps_its_json_and_an_economic_one_round_trips():
    from optimizer_pipeline.contracts.problem import OPTIONAL_FIELDS
    from optimizer_pipeline.problem import problem_from_dict

    plain = compile_problem(binding_from_dict(doc(mv_costs=(0.0, 0.0), y1=7.0)), ARTIFACT, np.zeros(4), np.zeros(2),
                            U_NOW, [])
    assert not OPTIONAL_FIELDS & set(plain.to_dict())  # the JSON (and hash) it had before economics existed
    assert problem_from_dict(plain.to_dict()) == plain
    for spec in (binding_from_dict(doc()), binding_from_dict(doc(template="linear_mpc_quadratic@1"))):
        problem, _ = solve(spec)
        assert OPTIONAL_FIELDS & set(problem.to_dict())
        again = problem_from_dict(problem.to_dict())
        assert again == problem and again.hash == problem.hash


# --------------------------------------------------------------------------- the steered layer's evidence


@pytest.fixture(scope="module")
def steered_tank():
    """The quadruple tank (demo plant) run for the cheapest pumping as a move plan: y2 has no target."""
    from optimizer_pipeline.data.prepare import prepare_history
    from optimizer_pipeline.data.ingest import validate_history_frame
    from optimizer_pipeline.model import identify
    from optimizer_pipeline.plants import QuadrupleTank

    doc = QuadrupleTank().binding_doc()
    doc["mvs"][0]["cost"], doc["mvs"][1]["cost"] = 1.0, 1.4
    doc["cvs"][1] = {"tag": "y2", "lo": 5.5, "hi": 9.5}
    spec = binding_from_dict(doc)
    split = prepare_history(validate_history_frame(QuadrupleTank().history(1).frame, spec, "test"), spec)
    return spec, split, identify(split, spec, 1)


def test_a_steered_plans_layer_is_tightened_by_the_settled_band(steered_tank):
    from dataclasses import replace

    from optimizer_pipeline import uq
    from optimizer_pipeline.model.statespace import settling_steps
    from optimizer_pipeline.pipeline import score_blocks, settled_evidence
    from optimizer_pipeline.settings import Settings

    spec, split, artifact = steered_tank
    evidence, [condition] = settled_evidence(spec, artifact, split, Settings(), utc_now())
    # independently: the steady template's settled-response scores of the same runs, calibrated
    layer = replace(spec, profile=replace(spec.profile, template=Template.STEADY_RESPONSE))
    scores = score_blocks(layer, artifact, split)
    assert scores.val.h == settling_steps(artifact.state_space) > artifact.horizon
    expected = uq.compute_block_uq(scores.val, scores.test, alpha=Settings().uq_alpha)
    assert condition.holds and evidence is not None and condition.name == "settled evidence of the steady-state target"
    np.testing.assert_array_equal(evidence.qhat, expected.qhat)
    # too few settled blocks (val / test runs cut shorter than the settling horizon): no band, not verified
    short = replace(split, val=tuple(replace(r, t=r.t[:40], u=r.u[:40], y=r.y[:40], d=r.d[:40]) for r in split.val),
                    test=tuple(replace(r, t=r.t[:40], u=r.u[:40], y=r.y[:40], d=r.d[:40]) for r in split.test))
    evidence, [condition] = settled_evidence(spec, artifact, short, Settings(), utc_now())
    assert evidence is None and not condition.holds
    assert condition.reason.startswith("the steady-state target the plan steers to has no settled evidence: no UQ "
                                       "evidence")


def test_an_unsteered_plan_has_settled_evidence_only_when_solved_with_a_local_refit(steered_tank):
    """A plan of the identified model that is not steered: none. One solved with a local refit: the
    settled evidence of its end, by the local procedure (its P-step band says nothing of where the
    refit's plan settles: recommend.improvement_conditions holds the end to this band)."""
    from dataclasses import replace

    from optimizer_pipeline.model.local import GLOBAL, LOCAL
    from optimizer_pipeline.pipeline import settled_evidence
    from optimizer_pipeline.plants import QuadrupleTank
    from optimizer_pipeline.settings import Settings

    _, split, artifact = steered_tank
    spec = QuadrupleTank().spec
    choice = artifact.selection["steady_model"]
    identified = replace(artifact, selection={**artifact.selection, "steady_model": {**choice, "procedure": GLOBAL}})
    assert settled_evidence(spec, identified, split, Settings(), utc_now()) == (None, [])
    refitted = replace(artifact, selection={**artifact.selection, "steady_model": {**choice, "procedure": LOCAL}})
    evidence, [condition] = settled_evidence(spec, refitted, split, Settings(), utc_now())
    assert condition.name == "settled evidence of the plan's end" and condition.holds
    assert evidence.score == "settled_residual_local" and evidence.block_length > refitted.horizon
    # too few settled blocks: no band, not verified, and the reason names the plan's end
    short = replace(split, val=tuple(replace(r, t=r.t[:40], u=r.u[:40], y=r.y[:40], d=r.d[:40]) for r in split.val),
                    test=tuple(replace(r, t=r.t[:40], u=r.u[:40], y=r.y[:40], d=r.d[:40]) for r in split.test))
    evidence, [condition] = settled_evidence(spec, refitted, short, Settings(), utc_now())
    assert evidence is None and not condition.holds and condition.value == "none"
    assert condition.reason.startswith("the end of the plan (a local refit's) has no settled evidence: no UQ evidence")


# --------------------------------------------------------------------------- ill-conditioned gains, failures


def ill_conditioned_artifact(ratio: float = 1.0125):
    """Two first-order channels sharing a gain matrix [[1, 1], [1, ratio]] (condition ~320 at 1.0125):
    x+ = 0.8 x + 0.2 G u, y = x, so the steady-state gain is G; normalisation mean 0, std 1."""
    from optimizer_pipeline.contracts import ModelArtifact, Normalisation, StateSpace

    G = np.array([[1.0, 1.0], [1.0, ratio]])
    ss = StateSpace.of(0.8 * np.eye(2), 0.2 * G, np.zeros((2, 0)), np.zeros(2), np.eye(2))
    return G, ModelArtifact(
        binding_id="tanks-1", binding_revision=1, mv_tags=("v1", "v2"), cv_tags=("y1", "y2"), dv_tags=(), na=1, nb=1,
        delay=1, horizon=10, sample_period_s=5.0, coefficients={}, state_space=ss,
        normalisation=Normalisation(("v1", "v2", "y1", "y2"), (0.0,) * 4, (1.0,) * 4), gates=(), splits={},
        training_data_hash="2" * 64)


def ill_doc(y1=None, y2=None, costs=(0.1, 0.2)):
    d = doc(mv_costs=costs, y1=y1, y2=y2, horizon=400)
    for m in d["mvs"]:
        m["lo"], m["hi"] = -3.0, 3.0
    for c in d["cvs"]:
        c["lo"], c["hi"] = -4.0, 4.0
    return d


@pytest.mark.parametrize("targets", [(1.0, 1.02), (1.5, None)])
def test_an_ill_conditioned_plant_keeps_its_targets_and_reaches_the_lp_optimum(targets):
    # both targets (no freedom left: the costs must not move them) or one (the costs choose along the
    # weak direction): the lexicographic optimum by linprog, targets as equalities
    G, artifact = ill_conditioned_artifact()
    assert np.linalg.cond(G) > 300
    spec = binding_from_dict(ill_doc(*targets))
    problem = compile_steered(spec, artifact, np.zeros(2), np.zeros(2), (0.0, 0.0), [])
    best = nominal(solve_problem(problem, SolverCache()))
    assert best.solver_status == "solved" and best.verified, best.verify_report["reasons"]
    held = [j for j, t in enumerate(targets) if t is not None]
    lp = linprog([0.1, 0.2], A_eq=G[held], b_eq=[targets[j] for j in held], A_ub=np.vstack([G, -G]),
                 b_ub=np.full(4, 4.0), bounds=[(-3.0, 3.0)] * 2)
    assert lp.status == 0
    # the MVs to 1e-3: along the weak direction (singular value ~3e-3) OSQP's 1e-7 leaves ~7e-4 of u
    np.testing.assert_allclose(best.controls[0], lp.x, atol=1e-3)
    np.testing.assert_allclose([best.predicted[0][j] for j in held], [targets[j] for j in held], atol=1e-5)


def test_a_steady_stage_without_a_feasible_point_is_an_error_with_its_problem():
    from optimizer_pipeline.solver.targets import SteadyLayerError

    # the MVs now at 3 and bounded at [0, 1] with a move reach of 0.05: no MV setting is admissible
    d = doc(template="linear_mpc_quadratic@1", horizon=1)
    for m in d["mvs"]:
        m["lo"], m["hi"], m["max_move"] = 0.0, 1.0, 0.05
    spec = binding_from_dict(d)
    with pytest.raises(SteadyLayerError, match=r"problem\[tanks-1\]: the targets-first stage found no feasible "
                                               r"steady state \(hold hold, nominal primal infeasible") as caught:
        compile_steered(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [])
    assert caught.value.problem.template is Template.STEADY_RESPONSE and not caught.value.problem.economic
    assert not caught.value.result.candidates[1].controls


def test_the_steering_layer_keeps_its_limits_by_the_band_it_is_given():
    # y1 has no target and the costs push it to its upper limit 9: the layer stops a band under it,
    # the plan's band (0.1 std) when no layer band is given, the layer band (0.5 std) when it is
    spec = binding_from_dict(doc(template="linear_mpc_quadratic@1", horizon=80, move_weight=0.1, y1_hi=9.0))
    y_std = np.asarray(ARTIFACT.normalisation.std)[2:]
    for layer_band, expected in ((None, 9.0 - 0.1 * y_std[0]), (np.array([0.5, 0.5]), 9.0 - 0.5 * y_std[0])):
        problem = compile_steered(spec, ARTIFACT, np.zeros(4), np.zeros(2), U_NOW, [], band=np.array([0.1, 0.1]),
                                  layer_band=layer_band)
        steered = np.asarray(problem.y_mean) + np.asarray(problem.y_std) * problem.y_target
        assert steered[0] == pytest.approx(expected, abs=1e-4)


def test_a_failed_steady_stage_is_decided_as_a_rejected_solve_of_that_stage(steered_tank):
    # the live MVs are ~3 V; bounds [0.5, 1] with a reach of 50 x 0.01: the steering layer has no
    # admissible point. The solve is still decided (and would be recorded): rejected, naming the stage
    from dataclasses import replace

    from optimizer_pipeline import pipeline, uq
    from optimizer_pipeline.contracts import Calibration, RecommendationStatus, StoredBinding
    from optimizer_pipeline.settings import Settings
    from optimizer_pipeline.solver import errors

    spec, split, artifact = steered_tank
    bad = replace(spec, mvs=tuple(replace(m, lo=0.5, hi=1.0, max_move=0.01) for m in spec.mvs))
    scores = pipeline.score_blocks(bad, artifact, split)
    calibration = Calibration("cal-test", artifact.artifact_hash, uq.compute_block_uq(scores.val, scores.test))
    solved = pipeline.solve_and_decide(bad, StoredBinding(bad, 1, bad.spec_hash, utc_now()), artifact, split,
                                       calibration, lambda p: solve_problem(p, SolverCache()), Settings(),
                                       "simulation", utc_now(), outcomes=())
    rec = solved.decision.recommendation
    assert rec.status is RecommendationStatus.REJECTED and rec.controls == ()
    assert (solved.result.ok, solved.result.error_code) == (False, errors.STEADY_STAGE_INFEASIBLE)
    assert any(r.startswith("solver error STEADY_STAGE_INFEASIBLE: problem[tanks-1]: the targets-first stage found "
                            "no feasible steady state") for r in rec.reasons), rec.reasons
    # the run records the failed stage's problem (the layer's targets-first stage: a steady target)
    assert solved.problem.template is Template.STEADY_RESPONSE and solved.run.problem_ir_hash == solved.problem.hash
