"""docs/ARCHITECTURE.md, "UQ evidence rules" as a rule table: one test per branch and boundary."""

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from model_helpers import binding

from optimizer_pipeline.contracts import Normalisation, canonical_json
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.uq import (EMPIRICAL_MAX, EXCHANGEABILITY_TEST, SPLIT_CONFORMAL, BlockScores, UQEvidence,
                                   UQInputError, band_engineering, clopper_pearson_lower, compute_block_uq,
                                   conformal_rank, coverage_threshold, exchangeability_p, gate_checks, gate_failures,
                                   gate_passes, input_distance, is_fresh)


def blocks(values, n_runs: int, h: int = 10, n_unique: int | None = None, tags=("y0",)) -> BlockScores:
    values = np.asarray(values, float).reshape(len(values), -1)
    n = values.shape[0]
    return BlockScores(cv_tags=tuple(tags), h=h, run_ids=np.array([f"r{i % n_runs}" for i in range(n)], dtype=object),
                       starts=np.arange(n) * h, scores=values, n_unique_steps=n * h if n_unique is None else n_unique,
                       n_runs=min(n_runs, n))


def good_test(m: int = 20) -> BlockScores:
    return blocks(np.linspace(0.0, 0.5, m), n_runs=2)


VAL9 = blocks(np.arange(1.0, 10.0), n_runs=2)


# ---------------------------------------------------------------- method choice by val blocks / runs


def test_one_val_block_gives_no_evidence():
    evidence = compute_block_uq(blocks([1.0], n_runs=1), good_test())
    assert evidence.method is None and not evidence.has_evidence
    assert any("1 val block(s)" in r for r in evidence.reasons)


def test_two_val_blocks_use_empirical_max_with_the_safety_factor():
    evidence = compute_block_uq(blocks([1.0, 2.0], n_runs=2), good_test())
    assert evidence.method == EMPIRICAL_MAX
    assert evidence.qhat == (2.5,) and evidence.safety_factor == 1.25


def test_eight_val_blocks_from_two_runs_use_empirical_max():
    evidence = compute_block_uq(blocks(np.arange(1.0, 9.0), n_runs=2), good_test())
    assert evidence.method == EMPIRICAL_MAX and evidence.qhat == (10.0,)


def test_nine_val_blocks_from_two_runs_use_split_conformal():
    evidence = compute_block_uq(VAL9, good_test())
    assert evidence.method == SPLIT_CONFORMAL and evidence.rank_k == 9 and evidence.qhat == (9.0,)
    assert evidence.safety_factor is None


def test_nine_val_blocks_from_one_run_use_empirical_max():
    evidence = compute_block_uq(blocks(np.arange(1.0, 10.0), n_runs=1), good_test())
    assert evidence.method == EMPIRICAL_MAX and evidence.qhat == (9.0 * 1.25,)


# ---------------------------------------------------------------- emit conditions on the test segment


def test_one_test_run_gives_no_evidence():
    evidence = compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=1))
    assert not evidence.has_evidence and any("1 test run(s)" in r for r in evidence.reasons)


def test_two_test_runs_give_evidence():
    assert compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=2)).has_evidence


def test_119_unique_test_steps_give_no_evidence():
    evidence = compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=2, n_unique=119))
    assert not evidence.has_evidence and any("119 unique test steps" in r for r in evidence.reasons)


def test_120_unique_test_steps_give_evidence():
    assert compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=2, n_unique=120)).has_evidence


def test_no_test_block_gives_no_evidence():
    empty = BlockScores(("y0",), 10, np.empty(0, dtype=object), np.empty(0, int), np.empty((0, 1)), 0, 0)
    evidence = compute_block_uq(VAL9, empty)
    assert not evidence.has_evidence and "no test block" in evidence.reasons


def test_non_finite_val_score_gives_no_evidence_naming_the_cv():
    values = np.ones((12, 2))
    values[3, 1] = np.inf
    evidence = compute_block_uq(blocks(values, n_runs=2, tags=("flow", "level")),
                                blocks(np.zeros((20, 2)), n_runs=2, tags=("flow", "level")))
    assert not evidence.has_evidence
    assert any("non-finite val score for CV level" in r for r in evidence.reasons)


def test_every_failed_rule_is_listed():
    evidence = compute_block_uq(blocks([1.0], n_runs=1), blocks([0.0], n_runs=1))
    assert len(evidence.reasons) == 3  # val blocks, unique test steps, test runs


# ---------------------------------------------------------------- conformal rank, exact arithmetic


@pytest.mark.parametrize("n, k", [(9, 9), (19, 18), (29, 27)])
def test_rank_is_exact_when_n_plus_1_times_1_minus_alpha_is_an_integer(n, k):
    scores = np.random.default_rng(n).permutation(np.arange(1.0, n + 1))
    evidence = compute_block_uq(blocks(scores, n_runs=3), good_test())
    assert evidence.rank_k == k and evidence.qhat == (float(k),)


def test_rank_uses_the_decimal_alpha_not_its_binary_float():
    # (9 + 1) * (1 - 0.3) is 7.000000000000001 in floats: a float ceil would give 8
    assert conformal_rank(9, 0.3) == 7


def test_rank_beyond_n_gives_no_evidence_instead_of_capping_at_the_max():
    evidence = compute_block_uq(VAL9, good_test(), alpha=0.05)  # k = ceil(10 * 0.95) = 10 > 9
    assert not evidence.has_evidence and evidence.qhat is None and evidence.rank_k == 10
    assert any("exceeds the 9 val blocks" in r for r in evidence.reasons)


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.05])
def test_qhat_equals_the_numpy_lower_quantile_at_k_over_n(alpha):
    rng = np.random.default_rng(int(alpha * 100))
    for n in range(max(9, math.ceil(1 / alpha)), 200, 7):
        scores = rng.exponential(size=(n, 2))
        k = math.ceil(round((n + 1) * (1 - alpha), 9))  # independent of the Fraction implementation
        expected = np.quantile(scores, k / n, axis=0, method="lower")
        evidence = compute_block_uq(blocks(scores, n_runs=3, tags=("a", "b")),
                                    blocks(np.zeros((20, 2)), n_runs=2, tags=("a", "b")), alpha=alpha)
        np.testing.assert_array_equal(evidence.qhat, expected)


@pytest.mark.parametrize("alpha", [0, 1, -0.1, "ten percent"])
def test_alpha_outside_0_1_is_rejected(alpha):
    with pytest.raises(UQInputError, match="alpha"):
        compute_block_uq(VAL9, good_test(), alpha=alpha)


# ---------------------------------------------------------------- coverage and thresholds


def test_coverage_is_the_minimum_over_cvs_of_the_covered_fraction():
    val = blocks(np.tile(np.arange(1.0, 10.0)[:, None], (1, 2)), n_runs=2, tags=("a", "b"))
    test_scores = np.zeros((20, 2))
    test_scores[:5, 1] = 100.0  # CV b: 15 of 20 covered
    evidence = compute_block_uq(val, blocks(test_scores, n_runs=2, tags=("a", "b")))
    assert evidence.coverage_per_cv == (1.0, 0.75) and evidence.coverage == 0.75


def test_a_score_equal_to_qhat_is_covered():
    evidence = compute_block_uq(VAL9, blocks(np.full(20, 9.0), n_runs=2))
    assert evidence.coverage == 1.0


@pytest.mark.parametrize("n_test_runs, expected", [(1, 0.8), (2, 0.8), (81, 0.8), (100, 0.81)])
def test_split_conformal_threshold(n_test_runs, expected):
    assert coverage_threshold(SPLIT_CONFORMAL, n_test_runs) == pytest.approx(expected, abs=1e-12)


def test_empirical_max_threshold_is_one():
    assert coverage_threshold(EMPIRICAL_MAX, 5) == 1.0


def test_threshold_of_an_unknown_method_is_rejected():
    with pytest.raises(UQInputError, match="unknown method"):
        coverage_threshold("bootstrap", 5)


def test_evidence_records_the_threshold_of_its_method():
    evidence = compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=4))
    assert evidence.coverage_threshold == coverage_threshold(SPLIT_CONFORMAL, 4)


# ---------------------------------------------------------------- beyond the spec: CP bound, exchangeability


def test_clopper_pearson_lower_bound_with_every_block_covered_is_alpha_to_the_1_over_m():
    assert clopper_pearson_lower(20, 20) == pytest.approx(0.05 ** (1 / 20), rel=1e-9)


def test_clopper_pearson_lower_bound_with_no_block_covered_is_zero():
    assert clopper_pearson_lower(0, 20) == 0.0


def test_exchangeability_p_matches_the_beta_binomial_closed_form():
    # k = n: X = test blocks above the val max ~ BetaBinomial(m, 1, n), P(X = 0) = n / (n + m)
    val = np.arange(1.0, 10.0)[:, None]
    assert exchangeability_p(val, np.zeros((20, 1)), k=9) == pytest.approx(2 * 9 / 29, rel=1e-9)


def test_exchangeability_p_is_bonferroni_adjusted_over_cvs():
    val = np.tile(np.arange(1.0, 10.0)[:, None], (1, 2))
    assert exchangeability_p(val, np.zeros((20, 2)), k=9) == pytest.approx(min(1.0, 2 * 2 * 9 / 29), rel=1e-9)


def test_seed_gate_passes_where_strict_fails_on_the_coverage_lower_bound():
    evidence = compute_block_uq(VAL9, blocks(np.zeros(12), n_runs=2))  # 12 / 12 covered: CP bound 0.779
    assert gate_passes(evidence, "seed")
    assert not gate_passes(evidence, "strict")
    assert any("lower bound" in f for f in gate_failures(evidence, "strict"))


def test_strict_gate_fails_when_val_and_test_are_not_exchangeable():
    rng = np.random.default_rng(0)
    val = blocks(rng.uniform(size=99), n_runs=5)
    evidence = compute_block_uq(val, blocks(np.zeros(100), n_runs=5))  # test far below every val score
    assert gate_passes(evidence, "seed") and evidence.coverage_lower_95 >= 0.8
    assert evidence.exchangeability_p < 0.01 and not gate_passes(evidence, "strict")


def test_gate_fails_without_evidence_and_says_why():
    evidence = compute_block_uq(blocks([1.0], n_runs=1), good_test())
    assert not gate_passes(evidence) and gate_failures(evidence)[0].startswith("no UQ evidence")


def test_gate_fails_when_coverage_is_below_threshold():
    evidence = compute_block_uq(VAL9, blocks(np.full(20, 100.0), n_runs=2))
    assert evidence.coverage == 0.0 and not gate_passes(evidence, "seed")


def test_unknown_gate_setting_is_rejected():
    with pytest.raises(UQInputError, match="unknown setting 'lenient'"):
        gate_passes(compute_block_uq(VAL9, good_test()), "lenient")


def test_val_and_test_with_different_cvs_are_rejected():
    with pytest.raises(UQInputError, match="differ"):
        compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=2, tags=("other",)))


def test_evidence_is_canonical_json_and_round_trips():
    evidence = compute_block_uq(VAL9, good_test(), calibrated_at="2026-01-01T00:00:00Z")
    assert UQEvidence.from_dict(evidence.to_dict()) == evidence
    canonical_json(compute_block_uq(blocks([1.0], n_runs=1), good_test()))  # no-evidence form too


# ---------------------------------------------------------------- band, input distance, freshness


def artifact_with(std_u=(2.0,), std_y=(0.5,)):
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    model = ArxModel(Orders(1, 1, 1), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 0)), np.zeros(1))
    return artifact_from_model(model, spec, 1, Normalisation(("u0", "y0"), (1.0, 10.0), (*std_u, *std_y)))


def test_band_in_engineering_units_is_qhat_times_train_std():
    evidence = compute_block_uq(VAL9, good_test())
    assert band_engineering(evidence, artifact_with()) == (9.0 * 0.5,)


def test_band_is_none_without_evidence():
    assert band_engineering(compute_block_uq(blocks([1.0], n_runs=1), good_test()), artifact_with()) == (None,)


def test_input_distance_is_the_largest_absolute_z():
    assert input_distance(artifact_with(), [5.0], [9.0]) == pytest.approx(2.0)  # MV z = 2, CV z = -2


def test_input_distance_with_a_near_zero_sigma_is_infinite():
    assert input_distance(artifact_with(std_y=(1e-12,)), [1.0], [10.0]) == math.inf


@pytest.mark.parametrize("u, y", [([1.0, 2.0], [10.0]), ([1.0], []), ([[1.0]], [10.0])])
def test_input_distance_with_a_length_mismatch_is_none(u, y):
    assert input_distance(artifact_with(), u, y) is None


@pytest.mark.parametrize("u, y", [([float("nan")], [10.0]), ([1.0], [float("inf")]), (["x"], [10.0])])
def test_input_distance_with_a_non_finite_value_is_none(u, y):
    assert input_distance(artifact_with(), u, y) is None


def test_calibration_exactly_fresh_days_old_is_fresh():
    now = datetime(2026, 3, 8, tzinfo=timezone.utc)
    assert is_fresh(now - timedelta(days=7), now)


def test_calibration_older_than_fresh_days_is_stale():
    now = datetime(2026, 3, 8, tzinfo=timezone.utc)
    assert not is_fresh(now - timedelta(days=7, seconds=1), now)
    assert not is_fresh("2026-03-01T00:00:00Z", now, fresh_days=6.9)


def test_naive_timestamps_are_utc_and_missing_calibration_is_stale():
    assert is_fresh("2026-03-01T00:00:00", "2026-03-02T00:00:00+00:00", fresh_days=1)
    assert not is_fresh(None, "2026-03-02T00:00:00Z")


def test_unparseable_timestamp_is_rejected():
    with pytest.raises(UQInputError, match="calibrated_at"):
        is_fresh("last tuesday", "2026-03-02T00:00:00Z")


# ---------------------------------------------------------------- what the scores measure


def test_evidence_names_the_score_rule_it_was_calibrated_on():
    from dataclasses import replace

    from optimizer_pipeline.uq import MAX_RESIDUAL, SCORE_RULES, SETTLED_RESIDUAL

    evidence = compute_block_uq(VAL9, good_test())
    assert (evidence.score, evidence.score_rule) == (MAX_RESIDUAL, SCORE_RULES[MAX_RESIDUAL])
    settled = compute_block_uq(replace(VAL9, score=SETTLED_RESIDUAL), replace(good_test(), score=SETTLED_RESIDUAL))
    assert settled.score == SETTLED_RESIDUAL and "settling horizon" in settled.score_rule
    assert UQEvidence.from_dict(settled.to_dict()) == settled


def test_val_and_test_scored_by_different_rules_are_refused():
    from dataclasses import replace

    from optimizer_pipeline.uq import SETTLED_RESIDUAL

    with pytest.raises(UQInputError, match="not scored alike"):
        compute_block_uq(VAL9, replace(good_test(), score=SETTLED_RESIDUAL))
    with pytest.raises(UQInputError, match="not scored alike"):
        compute_block_uq(VAL9, blocks(np.linspace(0.0, 0.5, 20), n_runs=2, h=12))


def test_no_val_block_of_the_settling_horizon_is_no_evidence_naming_the_block_length():
    none = BlockScores(cv_tags=("y0",), h=400, run_ids=np.empty(0, dtype=object), starts=np.empty(0, np.int64),
                       scores=np.empty((0, 1)), n_unique_steps=0, n_runs=0)
    evidence = compute_block_uq(none, none)
    assert evidence.method is None
    assert "0 val block(s) of 400 steps; at least 2 are needed" in evidence.reasons[0]


def test_runs_too_short_for_a_block_are_named_with_their_rows_and_what_a_block_needs():
    """A slow model (pole 0.95: its held disturbance is fitted over two settling horizons) scored on runs
    one row short of its first block and exactly long enough: the reason for no evidence names the
    rows a block needs and each run's rows, and that count is the one block scoring uses."""
    from model_helpers import binding, unit_normalisation

    from optimizer_pipeline.contracts import RunSeries
    from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
    from optimizer_pipeline.uq import block_scores, rows_before_blocks

    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=5)
    model = ArxModel(Orders(1, 1, 1), np.array([[[0.95]]]), np.array([[[0.05]]]), np.zeros((1, 1, 0)), np.zeros(1))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec))
    need = rows_before_blocks(artifact) + 1 + 5
    assert need > 50  # two settling horizons of the slow pole

    def run(run_id: str, n: int) -> RunSeries:
        rng = np.random.default_rng(n)
        return RunSeries(run_id, np.arange(float(n)), rng.normal(size=(n, 1)), rng.normal(size=(n, 1)),
                         np.empty((n, 0)))

    short = block_scores(artifact, [run("a", need - 1), run("b", need - 3)])
    assert short.n_blocks == 0 and short.run_rows == {"a": need - 1, "b": need - 3}
    evidence = compute_block_uq(short, short)
    assert evidence.method is None
    assert (f"0 val block(s) of 5 steps; at least 2 are needed (9 from >= 2 runs for split conformal): a run needs "
            f"{need} rows for its first block") in evidence.reasons[0]
    assert f"the runs have a ({need - 1}), b ({need - 3}) rows" in evidence.reasons[0]
    assert block_scores(artifact, [run("a", need), run("b", need - 3)]).n_blocks == 1
    assert block_scores(artifact, [run("a", need + 5)]).n_blocks == 2  # and one more per h rows


# ---------------------------------------------------------------- pinned by mutation testing (TESTING.md)


def test_a_threshold_for_no_test_run_is_refused_naming_the_rule_and_the_count():
    with pytest.raises(UQInputError, match=r"^coverage threshold: nTestRuns must be >= 1, got 0$"):
        coverage_threshold(SPLIT_CONFORMAL, 0)


def test_an_unknown_threshold_method_is_refused_naming_the_rule():
    with pytest.raises(UQInputError, match=r"^coverage threshold: unknown method 'bootstrap'"):
        coverage_threshold("bootstrap", 5)


@pytest.mark.parametrize("kw, message", [({"h": 0}, "block scores: block length h must be >= 1, got 0"),
                                         ({"score": "median"}, "block scores: unknown score 'median'")])
def test_a_bad_block_scores_request_is_refused_naming_the_rule(kw, message):
    from optimizer_pipeline.uq import block_scores

    with pytest.raises(UQInputError, match="^" + message):
        block_scores(artifact_with(), [], **kw)


def test_block_scores_without_blocks_keep_their_cvs_and_have_no_run_ids():
    from optimizer_pipeline.uq import block_scores

    scores = block_scores(artifact_with(), [])
    assert scores.cv_tags == ("y0",) and scores.run_ids.shape == (0,) and scores.run_ids.dtype == object


# ---------------------------------------------------------------- the texts and fields a reader sees (mutation kills)


def test_the_seed_gate_as_conditions_with_values_limits_and_reasons():
    evidence = replace(compute_block_uq(VAL9, good_test()), coverage=0.123456, coverage_threshold=0.8)
    table = [(c.name, c.value, c.limit, c.holds, c.reason) for c in gate_checks(evidence)]  # default gate: seed
    assert table == [
        ("UQ evidence", "split_conformal", "split_conformal or empirical_max", True, ""),
        ("test coverage (worst CV)", "0.1235", ">= 0.8", False, "test coverage 0.123 < threshold 0.800")]


def test_the_strict_gate_adds_the_lower_bound_and_the_exchangeability_conditions():
    evidence = replace(compute_block_uq(VAL9, good_test()), coverage=0.85, coverage_threshold=0.8,
                       coverage_lower_95=0.79, exchangeability_p=0.0099)
    table = [(c.name, c.value, c.limit, c.holds, c.reason) for c in gate_checks(evidence, "strict")]
    assert table == [
        ("UQ evidence", "split_conformal", "split_conformal or empirical_max", True, ""),
        ("test coverage (worst CV)", "0.85", ">= 0.8", True, "test coverage 0.850 < threshold 0.800"),
        ("coverage 95% lower bound", "0.79", ">= 0.8", False, "coverage 95% lower bound 0.790 < 0.8"),
        ("val/test exchangeability p", "0.0099", ">= 0.01", False, "val/test exchangeability p = 0.0099 < 0.01")]


def test_without_evidence_the_gate_is_one_failed_condition_listing_every_reason():
    evidence = compute_block_uq(blocks([1.0], n_runs=1), blocks(np.zeros(20), n_runs=1))
    why = ("1 val block(s) of 10 steps; at least 2 are needed (9 from >= 2 runs for split conformal); "
           "1 test run(s) with a block; at least 2 are needed")
    for gate in ("seed", "strict"):
        assert [(c.name, c.value, c.limit, c.holds, c.reason) for c in gate_checks(evidence, gate)] == [
            ("UQ evidence", "none: " + why, "split_conformal or empirical_max", False, "no UQ evidence: " + why)]


def test_an_unknown_gate_setting_is_refused_naming_the_setting_and_the_known_ones():
    with pytest.raises(UQInputError) as refused:
        gate_checks(compute_block_uq(VAL9, good_test()), "lenient")
    assert str(refused.value) == "uq gate: unknown setting 'lenient' (known: seed, strict)"


@pytest.mark.parametrize("alpha, message", [
    ("ten percent", "uq: alpha must be a number in (0, 1), got 'ten percent'"),
    (1.5, "uq: alpha must be in (0, 1), got 1.5"),
])
def test_a_bad_alpha_is_refused_with_the_rule(alpha, message):
    with pytest.raises(UQInputError) as refused:
        conformal_rank(9, alpha)
    assert str(refused.value) == message


def test_an_exact_fraction_alpha_is_taken_as_it_is():
    from fractions import Fraction

    assert conformal_rank(9, Fraction(3, 10)) == 7 and conformal_rank(19, Fraction(1, 20)) == 19


def test_evidence_without_a_method_records_what_it_was_computed_from_and_why_not():
    evidence = compute_block_uq(blocks([1.0], n_runs=1), good_test(), alpha=0.2, calibrated_at="2026-12-01T00:00:00Z")
    doc = evidence.to_dict()
    assert {k: doc[k] for k in ("method", "rank_k", "alpha", "block_length", "cv_tags", "n_val_blocks", "n_val_runs",
                                "n_test_blocks", "n_test_runs", "n_unique_test_steps", "calibrated_at")} == {
        "method": None, "rank_k": None, "alpha": 0.2, "block_length": 10, "cv_tags": ["y0"], "n_val_blocks": 1,
        "n_val_runs": 1, "n_test_blocks": 20, "n_test_runs": 2, "n_unique_test_steps": 200,
        "calibrated_at": "2026-12-01T00:00:00Z"}
    assert doc["exchangeability_test"] == EXCHANGEABILITY_TEST
    assert evidence.reasons == ("1 val block(s) of 10 steps; at least 2 are needed (9 from >= 2 runs for split "
                                "conformal)",)


def test_evidence_with_a_method_records_what_it_was_computed_from():
    evidence = compute_block_uq(blocks(np.arange(1.0, 4.0), n_runs=2, h=12), blocks(np.zeros(15), n_runs=3, h=12),
                                alpha=0.25, calibrated_at="2026-11-30T12:00:00Z")
    assert (evidence.method, evidence.rank_k, evidence.alpha, evidence.block_length, evidence.cv_tags) == (
        EMPIRICAL_MAX, None, 0.25, 12, ("y0",))
    assert (evidence.n_val_blocks, evidence.n_val_runs, evidence.n_test_blocks, evidence.n_test_runs,
            evidence.n_unique_test_steps) == (3, 2, 15, 3, 180)
    assert (evidence.calibrated_at, evidence.reasons, evidence.exchangeability_test) == (
        "2026-11-30T12:00:00Z", (), EXCHANGEABILITY_TEST)


def test_non_finite_val_scores_of_two_cvs_are_both_named():
    values = np.ones((12, 3))
    values[0, 0], values[5, 2] = np.nan, -np.inf
    tags = ("flow", "level", "temp")
    evidence = compute_block_uq(blocks(values, n_runs=2, tags=tags), blocks(np.zeros((20, 3)), n_runs=2, tags=tags))
    assert evidence.reasons == ("non-finite val score for CV flow, temp",)


def test_no_evidence_is_logged_with_every_reason(caplog):
    with caplog.at_level("INFO", logger="optimizer_pipeline.uq"):
        compute_block_uq(VAL9, blocks(np.zeros(20), n_runs=1, n_unique=100))
    assert caplog.messages == ["no UQ evidence: 100 unique test steps; at least 120 are needed; "
                               "1 test run(s) with a block; at least 2 are needed"]


def test_exchangeability_p_takes_each_cvs_own_reference_and_count():
    # CV a: val 101..109, k = n = 9: reference 109; 60 test blocks at 50: X = 0, P(X <= 0) = n / (n + m) = 9 / 69
    # CV b: val 1..9: reference 9; one of 60 test blocks above it: X = 1, P(X = 1) = m n / ((n + m)(n + m - 1)),
    #   P(X <= 1) = 9 / 69 + 540 / 4692 = 1152 / 4692; P(X >= 1) = 60 / 69
    # p = (2 x 9 / 69, 2 x 1152 / 4692); Bonferroni: 2 x min = 36 / 69
    val = np.column_stack([np.arange(101.0, 110.0), np.arange(1.0, 10.0)])
    test = np.column_stack([np.full(60, 50.0), np.r_[np.zeros(59), 10.0]])
    assert exchangeability_p(val, test, k=9) == pytest.approx(36 / 69, rel=1e-9)


def test_input_distance_of_a_non_numeric_cv_value_is_none():
    artifact = artifact_with()
    assert input_distance(artifact, [0.0], ["high"]) is None
    assert input_distance(artifact, ["high"], [0.0]) is None


def test_naive_datetimes_are_utc_and_aware_ones_keep_their_offset():
    utc_plus_2 = timezone(timedelta(hours=2))
    assert is_fresh(datetime(2026, 3, 1), datetime(2026, 3, 2, tzinfo=timezone.utc), fresh_days=1)
    assert is_fresh(datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 3, 2), fresh_days=1)
    # 00:00 at +02:00 is 22:00 UTC the day before: 25 h before 23:00 UTC
    assert not is_fresh(datetime(2026, 3, 1, tzinfo=utc_plus_2), datetime(2026, 3, 1, 23, tzinfo=timezone.utc),
                        fresh_days=1)
    assert is_fresh(datetime(2026, 3, 1, 1, tzinfo=utc_plus_2), datetime(2026, 3, 1, 23, tzinfo=timezone.utc),
                    fresh_days=1)


@pytest.mark.parametrize("calibrated_at, now, message", [
    ("last tuesday", "2026-03-02T00:00:00Z", "calibrated_at: expected an ISO 8601 timestamp, got 'last tuesday'"),
    ("2026-03-01T00:00:00Z", "soon", "now: expected an ISO 8601 timestamp, got 'soon'"),
    (5, "2026-03-02T00:00:00Z", "calibrated_at: expected a datetime or ISO 8601 text, got 5"),
    ("2026-03-01T00:00:00Z", 1.5, "now: expected a datetime or ISO 8601 text, got 1.5"),
])
def test_a_bad_timestamp_is_refused_naming_the_field(calibrated_at, now, message):
    with pytest.raises(UQInputError) as refused:
        is_fresh(calibrated_at, now)
    assert str(refused.value) == message


def test_a_local_rules_text_and_key_carry_its_base_rule(monkeypatch):
    """max_residual_local says "as max_residual, but ...": an edit of max_residual alone is a new local
    rule too (its evidence fails the score-rule condition, its stored scores are not read)."""
    from optimizer_pipeline import uq

    before = {score: (uq.rule_text(score), uq.rule_key(score)) for score in uq.SCORE_RULES}
    assert uq.SCORE_RULES[uq.MAX_RESIDUAL] in before[uq.MAX_RESIDUAL_LOCAL][0]
    monkeypatch.setitem(uq.SCORE_RULES, uq.MAX_RESIDUAL, "an edited max_residual")
    after = {score: (uq.rule_text(score), uq.rule_key(score)) for score in uq.SCORE_RULES}
    changed = {score for score in uq.SCORE_RULES if after[score] != before[score]}
    assert changed == {uq.MAX_RESIDUAL, uq.MAX_RESIDUAL_LOCAL}
    assert all(after[s][1] != before[s][1] for s in changed)


def test_a_rules_digest_is_the_first_8_hex_digits_of_its_sha256_and_its_key_names_it():
    import hashlib

    from optimizer_pipeline import uq

    text = uq.rule_text(uq.SETTLED_RESIDUAL)
    assert uq.rule_digest(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    assert uq.rule_digest(None) == "unrecorded"  # evidence stored before rules were named
    assert uq.rule_key(uq.SETTLED_RESIDUAL) == f"settled_residual:{uq.rule_digest(text)}"
