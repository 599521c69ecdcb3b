"""validation.py: each check's boundary on both sides, and messages that name the field, what was
expected and what came."""

import math
import re

import numpy as np
import pytest

from optimizer_pipeline.validation import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    SHOWN_MAX,
    ContractError,
    Interval,
    Rule,
    check_choice,
    check_integer,
    check_keys,
    check_list,
    check_mapping,
    check_match,
    check_matrix,
    check_number,
    check_ordered,
    check_rule,
    check_text,
    check_vector,
    choice_rule,
    closest,
    get_field,
    number_rule,
    read_number,
)


class OwnError(ContractError):
    pass


def refused(check, *args, **kwargs) -> str:
    """The one-line message `check` refuses with."""
    with pytest.raises(ContractError) as caught:
        check(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- intervals


@pytest.mark.parametrize("interval, inside, outside, text", [
    (POSITIVE, [5e-324, 1e300], [0, -0.0, -1], "> 0"),
    (NON_NEGATIVE, [0, 0.0, 2], [-5e-324, -1], ">= 0"),
    (AT_LEAST_ONE, [1, 2], [0, 0.999], ">= 1"),
    (OPEN_UNIT, [5e-324, 0.5, 1 - 1e-16], [0, 1, -0.1, 1.5], "in (0, 1)"),
    (Interval(1, 4), [1, 4, 2.5], [0.999, 4.001], "from 1 to 4"),
    (Interval(0, 1, "left"), [0, 0.999], [1, -0.001], "in [0, 1)"),
    (Interval(0, 1, "right"), [1, 0.001], [0, 1.001], "in (0, 1]"),
    (Interval(high=3), [3, -1e300], [3.0001], "<= 3"),
    (Interval(high=3, closed="neither"), [2.999], [3], "< 3"),
    (Interval(2.0, 10.0), [2.0, 10.0], [1.9, 10.1], "from 2 to 10"),
])
def test_interval_holds_its_ends_as_closed_says_and_reads_as_its_text(interval, inside, outside, text):
    assert all(x in interval for x in inside)
    assert not any(x in interval for x in outside)
    assert not math.nan in interval
    assert str(interval) == text


# --------------------------------------------------------------------------- numbers


def test_check_number_accepts_finite_ints_and_floats_as_float():
    assert check_number(3, "doc.x") == 3.0 and type(check_number(3, "doc.x")) is float
    assert check_number(np.float64(0.5), "doc.x") == 0.5


@pytest.mark.parametrize("value, shown", [("six", "'six'"), (True, "True"), (None, "None"), ([1.0], "[1.0]")])
def test_check_number_refuses_what_is_not_a_number_naming_field_expectation_and_value(value, shown):
    assert refused(check_number, value, "binding.mvs[0].hi") == f"binding.mvs[0].hi: expected a number, got {shown}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10 ** 400])
def test_check_number_refuses_a_non_finite_number(value):
    message = refused(check_number, value, "binding.sample_period_s", POSITIVE)
    assert message.startswith("binding.sample_period_s: expected a finite number > 0, got ")


def test_check_number_boundaries_of_positive_and_non_negative():
    assert check_number(5e-324, "b.max_move", POSITIVE) == 5e-324
    assert refused(check_number, 0, "b.max_move", POSITIVE) == "b.max_move: must be > 0, got 0"
    assert refused(check_number, -0.5, "b.max_move", POSITIVE) == "b.max_move: must be > 0, got -0.5"
    assert check_number(0, "b.weight", NON_NEGATIVE) == 0.0
    assert refused(check_number, -1e-300, "b.weight", NON_NEGATIVE) == "b.weight: must be >= 0, got -1e-300"
    assert refused(check_number, "fast", "b.period", POSITIVE) == "b.period: expected a number > 0, got 'fast'"


def test_check_number_within_limits_names_both_limits():
    limits = Interval(2.0, 10.0)
    assert check_number(2.0, "b.cvs[0].target", limits) == 2.0 and check_number(10, "b.cvs[0].target", limits) == 10.0
    assert refused(check_number, 11.0, "b.cvs[0].target", limits) == "b.cvs[0].target: must be from 2 to 10, got 11.0"
    assert refused(check_number, 1.999, "b.cvs[0].target", limits) == "b.cvs[0].target: must be from 2 to 10, got 1.999"


def test_check_integer_boundaries_and_forms():
    assert check_integer(1, "b.model.horizon", AT_LEAST_ONE) == 1
    assert refused(check_integer, 0, "b.model.horizon", AT_LEAST_ONE) == "b.model.horizon: must be >= 1, got 0"
    assert refused(check_integer, 1.0, "b.model.na", AT_LEAST_ONE) == "b.model.na: expected an integer >= 1, got 1.0"
    assert refused(check_integer, True, "b.model.na") == "b.model.na: expected an integer, got True"
    assert check_integer(4, "pool size", Interval(1, 4)) == 4
    assert refused(check_integer, 5, "pool size", Interval(1, 4)) == "pool size: must be from 1 to 4, got 5"


def test_a_named_argument_reads_as_a_sentence():
    assert refused(check_integer, 0, "block scores", AT_LEAST_ONE, name="block length h") == \
        "block scores: block length h must be >= 1, got 0"
    assert refused(check_integer, "x", "block scores", AT_LEAST_ONE, name="block length h") == \
        "block scores: block length h must be an integer >= 1, got 'x'"
    assert refused(check_number, math.inf, "solver pool", POSITIVE, name="timeout_ms") == \
        "solver pool: timeout_ms must be a finite number > 0, got inf"


def test_the_callers_error_class_is_raised():
    with pytest.raises(OwnError, match=r"^p\.horizon: must be >= 1, got 0$"):
        check_integer(0, "p.horizon", AT_LEAST_ONE, error=OwnError)


# --------------------------------------------------------------------------- fields of a document


def test_get_field_present_defaulted_and_missing():
    doc = {"lo": 1.0, "hi": None}
    assert get_field(doc, "lo", "b.mvs[0]") == 1.0
    assert get_field(doc, "hi", "b.mvs[0]", 5.0) == 5.0 and get_field(doc, "unit", "b", "") == ""
    assert get_field(doc, "na", "b.model", None) is None
    assert refused(get_field, doc, "hi", "b.mvs[0]") == "b.mvs[0].hi: required field is missing"
    assert refused(get_field, doc, "tag", "b.mvs[0]") == "b.mvs[0].tag: required field is missing"


def test_check_mapping_and_check_list():
    assert check_mapping({}, "b.model") == {} and check_list([], "b.mvs") == []
    assert refused(check_mapping, [1, 2], "b.model") == "b.model: expected a mapping, got [1, 2]"
    assert refused(check_mapping, "t_in", "b.dvs[0]", what="a mapping like {tag: ...}") == \
        "b.dvs[0]: expected a mapping like {tag: ...}, got 't_in'"
    assert refused(check_list, "q", "b.mvs") == "b.mvs: expected a list, got 'q'"
    assert refused(check_list, (1,), "b.mvs") == "b.mvs: expected a list, got (1,)"


def test_check_text_empty_or_not():
    assert check_text("", "b.unit") == "" and check_text("x", "b.tag", empty=False) == "x"
    assert refused(check_text, 5, "b.unit") == "b.unit: expected text, got 5"
    assert refused(check_text, "  ", "b.mvs[0].tag", what="a non-empty tag name", empty=False) == \
        "b.mvs[0].tag: expected a non-empty tag name, got '  '"


def test_check_match_at_the_length_limit():
    pattern = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
    assert check_match("a" * 63, pattern, "b.id") == "a" * 63
    assert refused(check_match, "a" * 64, pattern, "b.id").endswith(r"does not match [a-z0-9][a-z0-9_-]{0,62}")
    assert refused(check_match, 7, pattern, "b.id") == r"b.id: 7 does not match [a-z0-9][a-z0-9_-]{0,62}"


def test_check_choice_lists_the_known_values():
    assert check_choice("seed", ("seed", "strict"), "uq gate", what="setting") == "seed"
    assert refused(check_choice, "lenient", ("seed", "strict"), "uq gate", what="setting") == \
        "uq gate: unknown setting 'lenient' (known: seed, strict)"


def test_closest_prefers_a_case_difference_then_the_most_similar_and_else_nothing():
    assert closest("TARGET", ("targets", "target")) == "target"  # case first, though "targets" is similar too
    assert closest("targte", ("lo", "hi", "target", "weight")) == "target"
    assert closest("dv", ("mvs", "cvs", "dvs")) == "dvs"
    assert closest("upper", ("lo", "hi")) is None
    assert closest(3, ("lo", "hi")) is None  # a YAML key that is not text


def test_check_keys_refuses_the_first_unknown_key_by_its_path_with_the_closest_known_one():
    known, required = ("tag", "lo", "hi", "target"), ("tag", "lo", "hi")
    check_keys({"tag": "y", "lo": 0, "hi": 1}, known, "b.cvs[0]", required=required)
    assert refused(check_keys, {"tag": "y", "lo": 0, "hi": 1, "targte": 5}, known, "b.cvs[0]", required=required) == \
        "b.cvs[0].targte: unknown key; did you mean 'target'?"
    # the closest key is required and absent: said so (the misspelling is why it is missing)
    assert refused(check_keys, {"tag": "y", "lo": 0, "hii": 1}, known, "b.cvs[0]", required=required) == \
        "b.cvs[0].hii: unknown key; did you mean 'hi' (required, missing)?"
    assert refused(check_keys, {"tag": "y", "lo": 0, "hi": 1, "hii": 1}, known, "b.cvs[0]", required=required) == \
        "b.cvs[0].hii: unknown key; did you mean 'hi'?"
    assert refused(check_keys, {"zz": 1}, known, "b.cvs[0]", required=required) == \
        "b.cvs[0].zz: unknown key (known: tag, lo, hi, target)"


def test_check_choice_suggests_the_closest_known_value():
    assert refused(check_choice, "strickt", ("seed", "strict"), "uq gate", what="setting") == \
        "uq gate: unknown setting 'strickt'; did you mean 'strict'? (known: seed, strict)"


def test_check_ordered_strict_and_not():
    check_ordered(5.0, 6.0, "b.mvs[1]", strict=True)
    assert refused(check_ordered, 6.0, 6.0, "b.mvs[1]", strict=True) == "b.mvs[1]: lo (6) must be < hi (6)"
    check_ordered((0.0, 1.0), (0.0, 2.0), "problem", names=("u_lo", "u_hi"))
    assert refused(check_ordered, (0.0, 1.0), (0.0, 0.5), "problem", names=("u_lo", "u_hi")) == \
        "problem: u_lo[1] (1) must be <= u_hi[1] (0.5)"


# --------------------------------------------------------------------------- vectors and matrices


def test_check_vector_length_and_form():
    assert check_vector((1.0, 2.0), "p.x0", 2).tolist() == [1.0, 2.0]
    assert refused(check_vector, (1.0,), "p.x0", 2) == "p.x0: expected length 2, got 1"
    assert refused(check_vector, (1.0, 2.0, 3.0), "p.x0", 2) == "p.x0: expected length 2, got 3"
    assert refused(check_vector, [[1.0], [2.0]], "p.x0", 2) == "p.x0: expected a 1-D vector, got shape (2, 1)"
    assert refused(check_vector, ["a"], "p.y_target", 1) == "p.y_target: expected a vector of numbers, got ['a']"
    assert refused(check_vector, (1.0, math.nan), "p.u_now", 2) == "p.u_now[1]: expected a finite number, got nan"


def test_check_vector_elements_within_bounds_name_the_element():
    assert check_vector((5e-324, 1.0), "p.du_max", 2, POSITIVE).tolist() == [5e-324, 1.0]
    assert refused(check_vector, (0.3, 0.0), "p.du_max", 2, POSITIVE) == "p.du_max[1]: must be > 0, got 0.0"
    assert check_vector((0.0,), "p.band", 1, NON_NEGATIVE, name="a half-width").tolist() == [0.0]
    assert refused(check_vector, (-0.1, 0.1), "p.band", 2, NON_NEGATIVE, name="a half-width") == \
        "p.band[0]: a half-width must be >= 0, got -0.1"


def test_check_matrix_rows_and_columns():
    check_matrix(((1.0, 0.0), (0.0, 1.0)), "p.model.A", 2, 2)
    assert refused(check_matrix, ((1.0, 0.0),), "p.model.A", 2, 2) == "p.model.A: expected 2 rows, got 1"
    assert refused(check_matrix, ((1.0, 0.0), (1.0,)), "p.model.A", 2, 2) == "p.model.A[1]: expected length 2, got 1"
    assert refused(check_matrix, None, "p.model.A", 2, 2) == "p.model.A: expected rows of numbers, got None"


# --------------------------------------------------------------------------- values written as text


@pytest.mark.parametrize("raw, kind, value", [("3", int, 3), (" 4 ", int, 4), (3.0, int, 3), (2, float, 2.0),
                                              ("2.5", float, 2.5), ("1e3", float, 1000.0)])
def test_read_number_reads_text_and_numbers(raw, kind, value):
    assert read_number(raw, kind) == value and type(read_number(raw, kind)) is kind


@pytest.mark.parametrize("raw, kind", [("2.5", int), (2.5, int), (True, int), (False, float), ("nan", float),
                                       ("inf", float), (math.inf, int), ("x", float), (10 ** 400, float)])
def test_read_number_refuses_what_is_not_a_finite_number_of_its_kind(raw, kind):
    with pytest.raises(ValueError):
        read_number(raw, kind)


def test_number_rule_boundaries_and_the_setting_message():
    rule = number_rule(int, Interval(1, 4))
    assert rule.text == "an integer from 1 to 4"
    assert check_rule("1", rule, "env X", "solver.pool_size") == 1 and check_rule(4, rule, "env X", "solver.pool_size") == 4
    for raw in ("0", "5", "2.5", None):
        assert refused(check_rule, raw, rule, "environment variable X", "solver.pool_size") == \
            f"environment variable X: solver.pool_size must be an integer from 1 to 4, got {raw!r}"
    alpha = number_rule(float, OPEN_UNIT)
    assert alpha.text == "a number in (0, 1)" and check_rule("0.1", alpha, "f", "uq.alpha") == 0.1
    assert refused(check_rule, "1", alpha, "f", "uq.alpha") == "f: uq.alpha must be a number in (0, 1), got '1'"


def test_choice_rule_and_a_rule_of_ones_own():
    gate = choice_rule(("seed", "strict"))
    assert gate.text == "'seed' or 'strict'" and check_rule("strict", gate, "f", "uq.gate") == "strict"
    assert refused(check_rule, "loose", gate, "f", "uq.gate") == "f: uq.gate must be 'seed' or 'strict', got 'loose'"
    assert choice_rule(("a", "b", "c")).text == "'a', 'b' or 'c'"
    upper = Rule(str.upper, "text")  # TypeError on anything but a str
    assert check_rule("x", upper, "f", "k") == "X"
    assert refused(check_rule, 5, upper, "f", "k") == "f: k must be text, got 5"


def test_a_long_value_is_shown_cut_to_one_short_line():
    message = refused(check_vector, [[0.0] * 1000] * 2, "p.x0", 2)
    assert message == "p.x0: expected a 1-D vector, got shape (2, 1000)"
    message = refused(check_list, "x" * 1000, "b.mvs")
    shown = message.split(", got ", 1)[1]
    assert len(shown) == SHOWN_MAX and shown.startswith("'xxx") and shown.endswith("...")
