"""Specification of problem compilation: units, steady-state fields, validation, robust limits, hash."""

import math
from dataclasses import replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import ContractError, Template
from optimizer_pipeline.model.statespace import steady_state
from optimizer_pipeline.problem import (
    ProblemError,
    _check_fields,
    _plainly_valid,
    compile_problem,
    problem_from_dict,
    robust_limits,
    validate_problem,
)
from test_solver_qp_support import tank_artifact, tank_binding, tank_problem


def test_mv_bounds_and_max_move_are_scaled_by_the_mv_std():
    p = tank_problem(u_now=(4.5, 1.8))
    # artifact: v1 mean 3.0 std 1.5, v2 mean 3.0 std 1.2; binding: lo 0, hi 6, max_move 0.5
    assert p.u_lo == pytest.approx(((0 - 3.0) / 1.5, (0 - 3.0) / 1.2))
    assert p.u_hi == pytest.approx(((6 - 3.0) / 1.5, (6 - 3.0) / 1.2))
    assert p.du_max == pytest.approx((0.5 / 1.5, 0.5 / 1.2))
    assert p.u_prev == pytest.approx(((4.5 - 3.0) / 1.5, (1.8 - 3.0) / 1.2))


def test_cv_limits_targets_and_weights_are_normalised_from_the_binding():
    p = tank_problem()
    # y1 mean 6.0 std 2.0, y2 mean 6.5 std 1.8; limits 2..10, targets 7 / 7.5, weights 1 / 2
    assert p.y_lo == pytest.approx(((2 - 6.0) / 2.0, (2 - 6.5) / 1.8))
    assert p.y_hi == pytest.approx(((10 - 6.0) / 2.0, (10 - 6.5) / 1.8))
    assert p.y_target == pytest.approx(((7 - 6.0) / 2.0, (7.5 - 6.5) / 1.8))
    assert p.y_weight == (1.0, 2.0)
    assert (p.horizon, p.move_weight, p.template) == (20, 0.1, Template.LINEAR_MPC)


def test_disturbances_are_normalised_with_their_own_statistics():
    p = tank_problem(with_dv=True)
    assert p.dv_tags == ("f1",)
    assert p.d == pytest.approx(((1.4 - 1.0) / 0.5,))


def test_steady_template_carries_the_model_steady_state_map():
    p = tank_problem(template="steady_response@1", horizon=1)
    G, Gd, y0 = steady_state(tank_artifact().state_space)
    np.testing.assert_allclose(np.asarray(p.steady_gain), G)
    assert np.asarray(p.steady_dv_gain).size == 0
    np.testing.assert_allclose(np.asarray(p.steady_offset), y0)


def test_steady_template_compiles_the_held_disturbance_into_the_offset():
    """steady_offset = y0 + C (I - A)^-1 C' bias: the disturbance held in every state update, settled."""
    bias = np.array([0.25, -0.5])
    p = tank_problem(template="steady_response@1", horizon=1, bias=tuple(bias))
    A, _, _, _, C = tank_artifact().state_space.arrays()
    settled = C @ np.linalg.solve(np.eye(len(A)) - A, C.T @ bias)
    np.testing.assert_allclose(np.asarray(p.steady_offset), steady_state(tank_artifact().state_space)[2] + settled)


def test_mpc_template_has_no_steady_fields():
    p = tank_problem()
    assert p.steady_gain is None and p.steady_offset is None


def test_compiling_twice_gives_the_same_hash():
    assert tank_problem(band=(0.1, 0.2)).hash == tank_problem(band=(0.1, 0.2)).hash


def test_changing_one_number_changes_the_hash():
    assert tank_problem(u_now=(3.0, 3.0)).hash != tank_problem(u_now=(3.0, 3.000001)).hash


def test_json_round_trip_keeps_the_hash():
    p = tank_problem(band=(0.1, 0.2), template="steady_response@1", horizon=3)
    assert problem_from_dict(p.to_dict()).hash == p.hash


@pytest.mark.parametrize("field, kwargs", [
    ("x0", {"x0": (0.0, 0.0, 0.0)}),
    ("bias", {"bias": (0.0,)}),
    ("u_now", {"u_now": (3.0,)}),
    ("band", {"band": (0.1, 0.1, 0.1)}),
])
def test_wrong_length_input_names_the_field(field, kwargs):
    with pytest.raises(ProblemError, match=rf"\.{field}: expected length"):
        tank_problem(**kwargs)


def test_non_finite_input_names_the_field_and_index():
    with pytest.raises(ProblemError, match=r"\.u_now\[1\]: expected a finite number"):
        tank_problem(u_now=(3.0, math.nan))


def test_negative_band_is_rejected():
    with pytest.raises(ProblemError, match=r"band\[0\]: a half-width must be >= 0"):
        tank_problem(band=(-0.1, 0.1))


def test_artifact_for_other_tags_is_rejected_naming_the_tags():
    artifact = replace(tank_artifact(), mv_tags=("v2", "v1"))
    with pytest.raises(ProblemError, match=r"mv_tags: artifact has \['v2', 'v1'\]"):
        compile_problem(tank_binding(), artifact, np.zeros(4), np.zeros(2), [3.0, 3.0], [])


def test_problem_error_is_a_contract_error():
    assert issubclass(ProblemError, ContractError)


def test_validate_problem_names_a_bad_rate_limit():
    p = replace(tank_problem(), du_max=(0.3, 0.0))
    with pytest.raises(ProblemError, match=r"problem\.du_max\[1\]: must be > 0"):
        validate_problem(p)


def test_problem_from_dict_names_a_missing_field():
    doc = tank_problem().to_dict()
    del doc["y_target"]
    with pytest.raises(ProblemError, match=r"problem\.y_target: required field is missing"):
        problem_from_dict(doc)


def test_robust_limits_are_nominal_limits_tightened_by_the_band():
    p = tank_problem(band=(0.25, 0.5))
    lo, hi = robust_limits(p)
    np.testing.assert_allclose(lo, np.asarray(p.y_lo) + (0.25, 0.5))
    np.testing.assert_allclose(hi, np.asarray(p.y_hi) - (0.25, 0.5))


def test_robust_limits_collapse_to_the_midpoint_when_the_band_is_wider_than_the_interval():
    p = tank_problem(band=(10.0, 0.5))
    lo, hi = robust_limits(p)
    mid = 0.5 * (p.y_lo[0] + p.y_hi[0])
    assert lo[0] == pytest.approx(mid) and hi[0] == pytest.approx(mid)
    assert hi[1] - lo[1] == pytest.approx(p.y_hi[1] - p.y_lo[1] - 1.0)


def test_robust_limits_without_band_are_the_nominal_limits():
    p = tank_problem()
    lo, hi = robust_limits(p)
    assert tuple(lo) == p.y_lo and tuple(hi) == p.y_hi


# --------------------------------------------- validate_problem's one-pass acceptance vs the field checks

def _outcome(check, problem):
    """What a check says: None (valid) or the error text."""
    try:
        check(problem)
    except (ProblemError, TypeError, ValueError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _defective_variants(problem, rng):
    """The problem with one field broken (or only re-typed) in many ways."""
    vector_names = ("x0", "u_prev", "d", "bias", "u_lo", "u_hi", "du_max", "y_lo", "y_hi", "y_target", "y_weight",
                    "u_mean", "u_std", "y_mean", "y_std", "band", "steady_offset")
    for name in vector_names:
        value = getattr(problem, name)
        if value is None:
            yield replace(problem, **{name: (0.1,) * len(problem.cv_tags)})
            continue
        for bad in (math.nan, math.inf, -1.0, 0.0, -0.0, 1e300, 5, True, "1.5", None, np.float64(0.2), (1.0,), 10 ** 400):
            if value:
                i = int(rng.integers(len(value)))
                yield replace(problem, **{name: value[:i] + (bad,) + value[i + 1:]})
        yield replace(problem, **{name: value[:-1]})
        yield replace(problem, **{name: value + (1.0,)})
        yield replace(problem, **{name: list(value)})
        yield replace(problem, **{name: np.asarray(value, float)})
        yield replace(problem, **{name: None})
    yield replace(problem, u_lo=problem.u_hi, u_hi=problem.u_lo)
    yield replace(problem, y_lo=problem.y_hi, y_hi=problem.y_lo)
    for name in ("move_weight", "slack_weight"):
        for bad in (math.nan, math.inf, -1.0, 0.0, 1, True, "1", None):
            yield replace(problem, **{name: bad})
    for bad in (0, -1, 1.0, True, "3", 2):
        yield replace(problem, horizon=bad)
    yield replace(problem, template="linear_mpc_quadratic@1")
    yield replace(problem, mv_tags=())
    m = problem.model
    for name in ("A", "B", "E", "C"):
        rows = getattr(m, name)
        yield replace(problem, model=replace(m, **{name: rows[:-1]}))
        yield replace(problem, model=replace(m, **{name: rows[:1] + (rows[0] + (1.0,),) + rows[2:]}))
        if rows[0]:
            yield replace(problem, model=replace(m, **{name: ((math.nan,) + rows[0][1:],) + rows[1:]}))
            yield replace(problem, model=replace(m, **{name: (tuple(map(int, rows[0])),) + rows[1:]}))
        yield replace(problem, model=replace(m, **{name: [list(r) for r in rows]}))
    for name in ("steady_gain", "steady_dv_gain"):
        yield replace(problem, **{name: None})
        if getattr(problem, name) is not None and getattr(problem, name)[0]:
            rows = getattr(problem, name)
            yield replace(problem, **{name: ((math.inf,) + rows[0][1:],) + rows[1:]})


@pytest.mark.parametrize("template", ["linear_mpc_quadratic@1", "steady_response@1"])
@pytest.mark.parametrize("with_dv", [False, True])
def test_one_pass_acceptance_never_passes_what_the_field_checks_refuse(template, with_dv):
    problem = tank_problem(band=[0.1, 0.2], template=template, with_dv=with_dv)
    rng = np.random.default_rng(1)
    assert _plainly_valid(problem) and _outcome(_check_fields, problem) is None  # the common case: one pass
    refused = 0
    for variant in _defective_variants(problem, rng):
        verdict = _outcome(_check_fields, variant)
        refused += verdict is not None
        if _plainly_valid(variant):
            assert verdict is None, verdict
        assert _outcome(validate_problem, variant) == verdict
    assert refused > 100
