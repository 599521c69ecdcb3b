"""Binding validation, canonical JSON and ProblemIR hashing (issue 2, "Contracts")."""

import json
import math
import sys

import numpy as np
import pytest

from optimizer_pipeline.contracts import (
    CandidateKind,
    ContractError,
    ProblemIR,
    RecommendationStatus,
    SolveCandidate,
    SolveResult,
    StateSpace,
    Template,
    _canonical,
    binding_from_dict,
    canonical_json,
    fast_json,
    load_binding_file,
)


def test_valid_binding_parses_with_tags_in_order(binding_doc):
    spec = binding_from_dict(binding_doc)
    assert spec.id == "tanks-1"
    assert spec.mv_tags == ("v1", "v2") and spec.cv_tags == ("y1", "y2") and spec.dv_tags == ()
    assert spec.profile.template is Template.LINEAR_MPC
    assert spec.model.delay == 1 and spec.model.horizon == 10


def test_binding_round_trips_through_its_dict(binding_doc):
    spec = binding_from_dict(binding_doc)
    assert binding_from_dict(spec.to_dict()) == spec
    assert binding_from_dict(spec.to_dict()).spec_hash == spec.spec_hash


@pytest.mark.parametrize("bad_id", ["Tanks", "-tanks", "", "a" * 64, "tanks 1", 7])
def test_binding_id_must_match_pattern(binding_doc, bad_id):
    binding_doc["id"] = bad_id
    with pytest.raises(ContractError, match=r"binding\.id"):
        binding_from_dict(binding_doc)


def test_binding_id_of_63_characters_is_accepted(binding_doc):
    binding_doc["id"] = "a" * 63
    assert binding_from_dict(binding_doc).id == "a" * 63


def test_duplicate_tag_is_named(binding_doc):
    binding_doc["cvs"][1]["tag"] = "v1"
    with pytest.raises(ContractError, match=r"cvs\[1\]\.tag: 'v1' is already used by mvs\[0\]"):
        binding_from_dict(binding_doc)


def test_lo_must_be_below_hi(binding_doc):
    binding_doc["mvs"][1]["lo"] = 6.0
    with pytest.raises(ContractError, match=r"mvs\[1\]: lo \(6\) must be < hi \(6\)"):
        binding_from_dict(binding_doc)


def test_target_outside_limits_is_refused(binding_doc):
    binding_doc["cvs"][0]["target"] = 11.0
    with pytest.raises(ContractError, match=r"cvs\[0\]\.target: must be from 2 to 10, got 11\.0$"):
        binding_from_dict(binding_doc)


@pytest.mark.parametrize("max_move", [0, -0.5])
def test_max_move_must_be_positive(binding_doc, max_move):
    binding_doc["mvs"][0]["max_move"] = max_move
    with pytest.raises(ContractError, match=r"mvs\[0\]\.max_move: must be > 0"):
        binding_from_dict(binding_doc)


def test_unknown_template_lists_the_known_ones(binding_doc):
    binding_doc["profile"]["template"] = "nonlinear_mpc@9"
    with pytest.raises(ContractError, match=r"profile\.template: unknown template 'nonlinear_mpc@9' \(known: "
                                            r"linear_mpc_quadratic@1, steady_response@1\)"):
        binding_from_dict(binding_doc)


@pytest.mark.parametrize("where, key", [("profile", "horizon"), ("model", "horizon")])
def test_horizons_must_be_positive(binding_doc, where, key):
    binding_doc[where][key] = 0
    with pytest.raises(ContractError, match=rf"{where}\.{key}: must be >= 1, got 0"):
        binding_from_dict(binding_doc)


@pytest.mark.parametrize("period", [0, -5, "fast", float("nan")])
def test_sample_period_must_be_a_positive_number(binding_doc, period):
    binding_doc["sample_period_s"] = period
    with pytest.raises(ContractError, match=r"binding\.sample_period_s"):
        binding_from_dict(binding_doc)


def test_missing_required_field_is_named(binding_doc):
    del binding_doc["cvs"][0]["lo"]
    with pytest.raises(ContractError, match=r"cvs\[0\]\.lo: required field is missing"):
        binding_from_dict(binding_doc)


def test_non_numeric_limit_is_named(binding_doc):
    binding_doc["mvs"][0]["hi"] = "six"
    with pytest.raises(ContractError, match=r"mvs\[0\]\.hi: expected a number, got 'six'"):
        binding_from_dict(binding_doc)


def test_unset_orders_stay_unset(binding_doc):
    binding_doc["model"] = {"horizon": 12}
    spec = binding_from_dict(binding_doc)
    assert (spec.model.na, spec.model.nb, spec.model.delay, spec.model.horizon) == (None, None, None, 12)


def test_binding_file_yaml_and_json_give_the_same_spec(tmp_path, binding_doc):
    import yaml

    (tmp_path / "b.yaml").write_text(yaml.safe_dump(binding_doc))
    (tmp_path / "b.json").write_text(json.dumps(binding_doc))
    assert load_binding_file(tmp_path / "b.yaml") == load_binding_file(tmp_path / "b.json")


def test_binding_file_errors_name_the_file(tmp_path):
    with pytest.raises(ContractError, match=r"nope\.yaml: binding file not found"):
        load_binding_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: [unclosed\n")
    with pytest.raises(ContractError, match=r"bad\.yaml: not valid YAML"):
        load_binding_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ContractError, match=r"empty\.yaml: binding file is empty"):
        load_binding_file(empty)


def test_canonical_json_sorts_keys_and_rejects_non_finite():
    assert canonical_json({"b": 1, "a": [0.1, -0.0, np.float32(0.5)]}) == '{"a":[0.1,0.0,0.5],"b":1}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ContractError, match="non-finite"):
            canonical_json({"x": [1.0, bad]})


def _problem(**overrides):
    ss = StateSpace.of([[0.9, 0.0], [0.1, 0.8]], [[0.1], [0.0]], np.zeros((2, 0)), [0.0, 0.0], [[0.0, 1.0]])
    base = dict(template=Template.LINEAR_MPC, binding_id="b", binding_revision=1, profile_id="p",
                profile_version=1, model_artifact_hash="h" * 64, horizon=5, mv_tags=("u",), cv_tags=("y",),
                dv_tags=(), model=ss, x0=(0.1, 0.2), u_prev=(0.0,), d=(), bias=(0.01,), u_lo=(-1.0,), u_hi=(1.0,),
                du_max=(0.2,), y_lo=(-2.0,), y_hi=(2.0,), y_target=(0.5,), y_weight=(1.0,), move_weight=0.1,
                slack_weight=1e4, band=None, u_mean=(3.0,), u_std=(1.5,), y_mean=(6.0,), y_std=(2.0,))
    base.update(overrides)
    return ProblemIR(**base)


def test_problem_hash_is_stable_across_builds_and_round_trips():
    first, second = _problem(), _problem()
    assert first.hash == second.hash and len(first.hash) == 64
    assert ProblemIR.from_dict(json.loads(first.canonical_json())).hash == first.hash


@pytest.mark.parametrize("change", [{"x0": (0.1, 0.2000000001)}, {"move_weight": 0.1000001}, {"band": (0.3,)},
                                   {"y_target": (0.5 + 1e-12,)}, {"horizon": 6}])
def test_any_change_to_a_number_changes_the_problem_hash(change):
    assert _problem(**change).hash != _problem().hash


def test_problem_with_nan_cannot_be_hashed():
    with pytest.raises(ContractError, match=r"non-finite number nan at \.x0\[1\]"):
        _ = _problem(x0=(0.1, float("nan"))).hash


# ------------------------------------------------ canonical_json's fast text path vs the plain definition

SPECIAL_FLOATS = (0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1e16, 1e15,
                  9999999999999998.0, 1e-7, 1e-5, 1e-4, 0.0001, 1e22, 1e23, float(2 ** 53 + 2), float(2 ** 63),
                  -float(10 ** 20), 123456789012345678.0, 1.7976931348623157e308, 0.1, 1 / 3, -2.5)
NON_FINITE = (math.nan, math.inf, -math.inf)


def reference_json(value):
    """canonical JSON as first defined: normalise the tree, json.dumps it."""
    return json.dumps(_canonical(value, ""), sort_keys=True, separators=(",", ":"), allow_nan=False)


def outcome(encode, value):
    """The text, or the ContractError message."""
    try:
        return encode(value)
    except ContractError as exc:
        return f"ContractError: {exc}"


def random_floats(rng, n, non_finite=False):
    """n doubles: random bit patterns (every exponent, subnormals included) and special values mixed."""
    bits = rng.integers(0, 2 ** 64, n, dtype=np.uint64, endpoint=False).view(np.float64)
    values = [float(v) for v in bits if math.isfinite(v)]
    values += [float(v) for v in rng.standard_normal(n) * 10.0 ** rng.integers(-12, 20, n)]
    values += list(rng.choice(SPECIAL_FLOATS, n // 2))
    if non_finite:
        values[int(rng.integers(len(values)))] = NON_FINITE[int(rng.integers(3))]
    order = rng.permutation(len(values))
    return [float(values[i]) for i in order[:n]]


def test_canonical_json_text_of_float_tables_is_the_reference_text():
    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        flat = random_floats(rng, n, non_finite=trial % 7 == 0)
        rows = [random_floats(rng, n, non_finite=trial % 11 == 0) for _ in range(int(rng.integers(1, 6)))]
        for value in (flat, tuple(flat), rows, tuple(map(tuple, rows)), {"k": tuple(flat), "m": rows},
                      [float(v) for v in flat[:3]] + [int(rng.integers(-5, 5)), np.float64(1.5)]):
            assert outcome(canonical_json, value) == outcome(reference_json, value)


def test_canonical_json_refuses_non_finite_numbers_naming_the_place_as_before():
    for bad in NON_FINITE:
        for value in ((1.0, bad), [[1.0, 2.0], [3.0, bad]], ((0.5,), (bad, 1.0)), bad, {"a": [bad]}):
            text = outcome(canonical_json, value)
            assert text.startswith("ContractError: canonical JSON: non-finite number") and text == outcome(
                reference_json, value)
    assert outcome(canonical_json, _problem(y_lo=(math.inf,), x0=(0.1, math.nan))) == \
        "ContractError: canonical JSON: non-finite number nan at .x0[1]"  # first field in declaration order


def test_canonical_json_memo_keeps_ints_negative_zero_and_float_subclasses_apart():
    for first, second in (((1.0, 2.0), (1, 2)), ((0.0, 3.0), (-0.0, 3.0)), ((-0.0,), (0.0,)), ((2.0,), (True,)),
                          (((1.0,), (2.0,)), ((1,), (2.0,))), ((1.5,), (np.float64(1.5),))):
        for value in (first, second, first):
            assert canonical_json(value) == reference_json(value)
    assert canonical_json((-0.0, 1.0)) == "[0.0,1.0]" and canonical_json((1, 2)) == "[1,2]"


def test_canonical_json_text_of_problems_and_results_is_the_reference_text():
    rng = np.random.default_rng(5)
    for trial in range(60):
        nx = int(rng.integers(1, 6))
        matrix = lambda r, c: tuple(tuple(random_floats(rng, c)) for _ in range(r)) if c else ((),) * r  # noqa: E731
        ss = StateSpace(matrix(nx, nx), matrix(nx, 2), matrix(nx, trial % 2), tuple(random_floats(rng, nx)),
                        matrix(1, nx))
        problem = _problem(model=ss, x0=tuple(random_floats(rng, nx)), y_target=(float(rng.choice(SPECIAL_FLOATS)),),
                           mv_tags=("u", "v\u00e9"), u_prev=(0.5, -0.0), band=None if trial % 3 else (0.2,),
                           steady_gain=None if trial % 2 else ((1.0, 2.0),))
        candidate = SolveCandidate(1, CandidateKind.NOMINAL, "solved", (tuple(random_floats(rng, 2)),), ((1.0,),),
                                   float(rng.standard_normal()), {"slack": [0.0, -0.0], "z": {"b": 1, "a": None}},
                                   verify_report={"reasons": ["x"], "n": np.int64(3), "ok": np.bool_(True)})
        result = SolveResult(problem.hash, True, (candidate, candidate), {"qp": {"iterations": 25}})
        for value in (problem, candidate, result, [problem.model, Template.LINEAR_MPC], {"p": problem}):
            assert outcome(canonical_json, value) == outcome(reference_json, value)
        bad = _problem(model=StateSpace(ss.A, ss.B, ss.E, ss.f[:-1] + (math.inf,), ss.C))
        assert outcome(canonical_json, bad) == outcome(reference_json, bad)


def test_every_status_has_a_human_label():
    labels = {s: s.label for s in RecommendationStatus}
    assert set(labels) == {RecommendationStatus(v) for v in ("verified", "unverified", "rejected", "expired")}
    assert all(label and label.split(":")[0].lower() == s.value for s, label in labels.items())


def test_contracts_and_ledger_do_not_import_dagster():
    import subprocess

    code = ("import sys, optimizer_pipeline.contracts, optimizer_pipeline.ledger, optimizer_pipeline.settings; "
            "print('dagster' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fast_json_writes_the_values_of_canonical_json():
    value = {"b": [1.0, -0.0, 1e-7, 2.5e300], "a": (1, "x", None, True), "n": np.float64(0.1), "big": 2**70}
    assert json.loads(fast_json(value)) == json.loads(canonical_json(value))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), np.float64("-inf")])
def test_fast_json_refuses_a_non_finite_number_naming_where_it_is(bad):
    with pytest.raises(ContractError) as caught:
        fast_json({"plan": [[1.0, 2.0], [3.0, bad]]})
    with pytest.raises(ContractError) as reference:
        canonical_json({"plan": [[1.0, 2.0], [3.0, bad]]})
    assert str(caught.value) == str(reference.value) and "[1][1]" in str(caught.value)
