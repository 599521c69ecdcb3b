"""The solver protocol's wire codec (orjson): NaN / inf refused exactly, values read back bit for bit."""

import struct
from dataclasses import replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import ContractError, ProblemIR, SolveResult, Template, canonical_json
from optimizer_pipeline.solver import codec
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from test_pool import _problem

NAN, INF = float("nan"), float("inf")


def _bits(values) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


@pytest.mark.parametrize("value, where", [
    ({"a": [1.0, NAN]}, ".a[1]"),
    ({"rows": ((1.0, 2.0), (3.0, -INF))}, ".rows[1][1]"),
    ([{"ok": 1.0}, {"cost": INF}], "[1].cost"),
    ({"x": np.array([[0.0, 1.0], [NAN, 2.0]])}, ".x[1][0]"),
    ({"x": np.float32("inf")}, ".x"),
    (replace(_problem(), x0=(0.1, NAN)), ".x0[1]"),
])
def test_encode_refuses_a_non_finite_number_naming_where_it_is(value, where):
    with pytest.raises(ContractError, match="non-finite number") as caught:
        codec.encode(value)
    assert str(caught.value).endswith(f" at {where}")


def test_finite_numbers_whose_sum_overflows_are_encoded():
    # the cheap check sums a sequence; an overflowing sum must fall back to the exact per-item walk
    values = [1e308, 1e308, -1e308, (1.7e308, 1.7e308)]
    assert codec.decode(codec.encode(values)) == [1e308, 1e308, -1e308, [1.7e308, 1.7e308]]


def test_floats_read_back_bit_for_bit():
    values = [1 / 3, -0.0, 5e-324, 1.7976931348623157e308, 0.1 + 0.2, -2.5e-17, 123456789.12345679]
    assert _bits(codec.decode(codec.encode(values))) == _bits(values)


def test_problem_read_back_by_the_worker_equals_the_original_and_hashes_alike():
    problem = replace(_problem(x0=(1 / 3, -0.0)), bias=(5e-324, 0.1 + 0.2))
    again = ProblemIR.from_dict(codec.decode(codec.encode(problem)))
    assert again == problem and again.hash == problem.hash
    assert _bits(again.x0 + again.bias) == _bits(problem.x0 + problem.bias)


def test_a_problem_whose_hash_was_read_is_sent_as_before():
    """The hash is kept on the instance once computed, under a private name the frame leaves out."""
    problem = _problem()
    before = codec.encode(problem)
    assert problem.hash == problem.hash
    sent = codec.encode(problem)
    assert sent == before and b'"_hash"' not in sent and b'"hash"' not in sent


def test_an_economic_and_a_steered_problem_read_back_equal_and_hash_alike():
    steady = replace(_problem(), template=Template.STEADY_RESPONSE, steady_gain=((0.5, 0.25), (0.1, 1 / 3)),
                     steady_dv_gain=((), ()), steady_offset=(0.0, 0.2), econ_u=(-1 / 3, 0.5), econ_uu=(0.0, 0.1),
                     econ_y=(0.0, 0.7), econ_yy=(0.05, 0.0), target_hold=(1.0, 0.0))
    steered = replace(_problem(), u_target=(0.1 + 0.2, -1.0), u_target_weight=0.1)
    for problem in (steady, steered):
        again = ProblemIR.from_dict(codec.decode(codec.encode(problem)))
        assert again == problem and again.hash == problem.hash


def test_solve_result_read_back_equals_its_canonical_json_form():
    result = solve_problem(_problem(x0=(0.3, -0.2)), SolverCache())
    assert codec.decode(codec.encode(result)) == codec.decode(canonical_json(result))
    assert SolveResult.from_dict(codec.decode(codec.encode(result))) == result


def test_pool_refuses_a_problem_holding_nan_before_sending_it():
    pool = SolverPool(size=1)  # never started: the refusal happens before any worker is needed
    with pytest.raises(ContractError, match=r"non-finite number nan at \.x0\[0\]"):
        pool.solve(replace(_problem(), x0=(NAN, 0.0)))


def _untimed(result: dict) -> dict:
    """The result without wall-clock figures (elapsed_s, solve_time_s), which differ run to run."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("elapsed_s", "solve_time_s")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(result)


def test_first_solve_in_a_fresh_worker_equals_the_first_in_process_solve_exactly():
    problems = [_problem(x0=(0.3, -0.2)), _problem(x0=(0.31, -0.19))]  # a cold solve, then a warm start
    cache = SolverCache()
    local = [_untimed(codec.decode(canonical_json(solve_problem(p, cache)))) for p in problems]
    with SolverPool(size=1) as pool:
        remote = [_untimed(pool.solve(p)) for p in problems]
    assert remote[1]["diagnostics"]["cache_hit"] and remote == local
