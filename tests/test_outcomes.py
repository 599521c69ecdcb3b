"""Outcome rules without Dagster (issue 6): alignment, the binomial verdict, the steady-state rule,
when an outcome may be recorded, and the drift rule."""

import math
import types
from datetime import timedelta

import numpy as np
import pytest

from optimizer_pipeline.contracts import OutcomeVerdict, RecommendationStatus, content_hash, parse_iso_utc
from optimizer_pipeline.ledger import RecommendationRecord, VerdictRecord
from optimizer_pipeline.model.arx import spectral_radius
from optimizer_pipeline.outcomes import (
    MIN_STEPS,
    Observation,
    OutcomeError,
    check_applicable,
    drift_finding,
    model_identity,
    model_outcome_condition,
    evaluate,
    hit_rate_p_value,
    nearest_samples,
    promised_rate,
    settle_steps,
)

T0 = 1_800_000_000.0
PERIOD = 10.0
UQ = {"method": "split_conformal", "alpha": 0.1, "coverage": 0.95, "block_length": 10,
      "calibrated_at": "2027-01-15T08:00:00+00:00"}
CALIBRATED = parse_iso_utc(UQ["calibrated_at"])


def mpc_rec(n_steps=20, band=(1.0,), uq=UQ):
    predicted = [[50.0 + 0.5 * k] for k in range(n_steps)]
    return {"id": "rec-test", "template": "linear_mpc_quadratic@1", "mv_tags": ["q"], "cv_tags": ["y"],
            "controls": [[100.0]] * n_steps, "predicted": predicted, "band": list(band), "evidence": {"uq": uq}}


def observation(values_by_step, start_step=0, u=100.0):
    """Samples at T0 + k * PERIOD for k = start_step, start_step + 1, ...; values (n,) of CV y."""
    y = np.asarray(values_by_step, float)
    t = T0 + (start_step + np.arange(len(y))) * PERIOD
    return Observation(t=t, tags=("q", "y"), values=np.column_stack([np.full(len(y), u), y]), run_ids=("obs",),
                       source="test")


def plan_observation(offset_by_step, n_steps=20):
    """The plan's own prediction at the end of each step plus an offset; row 0 is the start (applied_at)."""
    rec = mpc_rec(n_steps)
    y_end = np.array([p[0] for p in rec["predicted"]]) + np.asarray(offset_by_step, float)
    return observation(np.concatenate([[49.0], y_end]))


# --------------------------------------------------------------------------- alignment


def test_nearest_sample_within_half_a_period_ties_to_the_earlier_one():
    t = np.array([0.0, 9.0, 21.0, 30.0])
    values = np.array([[1.0], [2.0], [3.0], [4.0]])
    got = nearest_samples(t, values, np.array([10.0, 20.0, 25.5, 40.0]), PERIOD)
    np.testing.assert_array_equal(got[:3, 0], [2.0, 3.0, 3.0])
    assert math.isnan(got[3, 0])  # 10 s from the nearest sample: more than half a period


def test_nearest_sample_skips_missing_values_of_that_tag_only():
    t = np.array([0.0, 9.0, 21.0, 30.0])
    values = np.array([[1.0, 1.0], [2.0, 2.0], [np.nan, 3.0], [4.0, 4.0]])
    got = nearest_samples(t, values, np.array([20.0]), PERIOD)
    assert math.isnan(got[0, 0]) and got[0, 1] == 3.0


def test_observation_round_trips_through_its_json_with_missing_values():
    obs = Observation(t=np.array([1.0, 2.0]), tags=("a", "b"), values=np.array([[1.0, np.nan], [3.0, 4.0]]),
                      run_ids=("r",), source="f.csv")
    back = Observation.from_dict(obs.to_dict())
    np.testing.assert_array_equal(back.t, obs.t)
    np.testing.assert_array_equal(back.values, obs.values)
    assert back.tags == obs.tags and back.run_ids == ("r",)


# --------------------------------------------------------------------------- verdict statistics


@pytest.mark.parametrize("hits, trials, p0", [(7, 12, 0.9), (15, 15, 0.9), (0, 5, 0.85), (20, 24, 0.95)])
def test_hit_rate_p_value_is_the_lower_binomial_tail(hits, trials, p0):
    tail = sum(math.comb(trials, i) * p0 ** i * (1 - p0) ** (trials - i) for i in range(hits + 1))
    assert hit_rate_p_value(hits, trials, p0) == pytest.approx(tail, rel=1e-10)


def test_promised_rate_is_the_smaller_of_one_minus_alpha_and_test_coverage():
    assert promised_rate(UQ) == pytest.approx(0.9)
    assert promised_rate(dict(UQ, coverage=0.86)) == pytest.approx(0.86)
    assert promised_rate(None) is None and promised_rate(dict(UQ, method=None)) is None


# --------------------------------------------------------------------------- MPC rule


def test_plan_followed_within_the_band_is_confirmed_and_only_steps_within_p_are_judged():
    ev = evaluate(mpc_rec(), plan_observation(np.full(20, 0.3)), T0, PERIOD)
    assert ev.verdict.value == "confirmed"
    assert (ev.details["hits"], ev.details["trials"], ev.details["judged_steps"]) == (10, 10, 10)
    assert ev.details["block_covered"] is True
    assert ev.delta["delta"][0][0] == pytest.approx(0.3) and ev.delta["judged"][:11] == [True] * 10 + [False]


def test_deviation_beyond_p_is_reported_but_not_judged():
    offsets = np.concatenate([np.zeros(10), np.full(10, 5.0)])
    ev = evaluate(mpc_rec(), plan_observation(offsets), T0, PERIOD)
    assert ev.verdict.value == "confirmed"
    assert ev.details["inside_share_all_steps"] == pytest.approx(0.5)


def test_steps_outside_the_band_within_p_are_deviated():
    offsets = np.concatenate([np.zeros(4), np.full(16, 2.0)])  # 6 of the 10 judged steps outside
    ev = evaluate(mpc_rec(), plan_observation(offsets), T0, PERIOD)
    assert ev.verdict.value == "deviated"
    assert (ev.details["hits"], ev.details["trials"]) == (4, 10)
    assert ev.details["p_value"] == pytest.approx(hit_rate_p_value(4, 10, 0.9))
    assert ev.details["block_covered"] is False


def test_one_step_outside_the_band_is_within_binomial_tolerance():
    offsets = np.zeros(20)
    offsets[3] = 2.0
    ev = evaluate(mpc_rec(), plan_observation(offsets), T0, PERIOD)
    assert ev.verdict.value == "confirmed" and ev.details["hits"] == 9
    assert ev.details["block_covered"] is False  # the calibration's exact event still failed


def test_fewer_aligned_steps_than_required_is_inconclusive():
    obs = observation([49.0, 50.0, 50.5, 51.0, 51.5])  # start + 4 step ends
    ev = evaluate(mpc_rec(), obs, T0, PERIOD)
    assert ev.verdict.value == "inconclusive"
    assert (ev.details["steps_aligned"], ev.details["steps_required"]) == (MIN_STEPS - 1, MIN_STEPS)


def test_no_band_is_inconclusive_however_long_the_observation():
    ev = evaluate(mpc_rec(band=(None,), uq=None), plan_observation(np.zeros(20)), T0, PERIOD)
    assert ev.verdict.value == "inconclusive" and "no UQ band" in ev.details["verdict_reason"]


def test_applied_at_shifts_the_alignment_by_whole_steps():
    obs = plan_observation(np.zeros(20))
    late = evaluate(mpc_rec(), obs, T0 - PERIOD, PERIOD)  # claims the plan started one step earlier
    assert late.delta["observed"][1][0] == pytest.approx(mpc_rec()["predicted"][0][0])


def test_operator_deviation_from_the_plan_is_reported_per_mv():
    obs = plan_observation(np.zeros(20))
    obs.values[5, 0] = 103.0
    ev = evaluate(mpc_rec(), obs, T0, PERIOD)
    assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": pytest.approx(3.0)}


# --------------------------------------------------------------------------- steady-state rule


def steady_rec():
    return {"id": "rec-steady", "template": "steady_response@1", "mv_tags": ["q"], "cv_tags": ["y"],
            "controls": [[100.0]], "predicted": [[60.0]], "band": [0.5], "evidence": {"uq": dict(UQ, block_length=1)}}


def test_steady_outcome_judges_only_the_settled_samples():
    transient = [40.0, 45.0, 50.0, 55.0, 58.0]  # steps 0..4, before the plant settles
    settled = [60.2] * 8
    ev = evaluate(steady_rec(), observation(transient + settled), T0, PERIOD, settle=5)
    assert ev.verdict.value == "confirmed" and (ev.details["hits"], ev.details["trials"]) == (8, 8)
    assert ev.delta["steps"][0] == 5


def test_steady_outcome_settling_away_from_the_prediction_is_deviated():
    ev = evaluate(steady_rec(), observation([40.0] * 5 + [61.5] * 8), T0, PERIOD, settle=5)
    assert ev.verdict.value == "deviated"


def test_steady_outcome_ending_before_the_plant_settles_is_inconclusive():
    ev = evaluate(steady_rec(), observation([40.0] * 5 + [60.0] * 3), T0, PERIOD, settle=5)
    assert ev.verdict.value == "inconclusive" and ev.details["steps_aligned"] == 3


def test_settle_steps_is_the_lag_plus_the_decay_of_the_slowest_mode():
    from optimizer_pipeline.contracts import ModelArtifact, Normalisation, StateSpace

    ss = StateSpace.of([[0.9, 0.0], [0.0, 0.5]], [[1.0], [0.0]], np.zeros((2, 0)), [0.0, 0.0], [[1.0, 0.0]])
    artifact = ModelArtifact(binding_id="b", binding_revision=1, mv_tags=("q",), cv_tags=("y",), dv_tags=(), na=2,
                             nb=1, delay=3, horizon=10, sample_period_s=PERIOD, coefficients={}, state_space=ss,
                             normalisation=Normalisation(("q", "y"), (0.0, 0.0), (1.0, 1.0)), gates=(), splits={},
                             training_data_hash="x")
    assert spectral_radius(ss) == pytest.approx(0.9)
    # 0.9 ** 44 = 0.0097 < 1 % <= 0.9 ** 43 = 0.0108; lag = max(na, delay + nb - 1) = 3 (all input taps
    # see a held move from step delay + nb - 1 on)
    assert settle_steps(artifact) == 3 + 44


# --------------------------------------------------------------------------- may the outcome be recorded?


def rec_row(status="verified", expired_at=None):
    return RecommendationRecord(
        id="rec-1", run_id="or-1", binding_id="b", binding_revision=1, candidate_id=None,
        template="linear_mpc_quadratic@1", problem_ir_hash="p" * 64, model_artifact_hash="m" * 64,
        evidence_source="simulation", uq_evidence=UQ, status=RecommendationStatus(status), status_label=status,
        reasons=[], payload={}, created_at=parse_iso_utc("2027-01-15T09:00:00+00:00"),
        valid_until=parse_iso_utc("2027-01-15T10:00:00+00:00"),
        expired_at=None if expired_at is None else parse_iso_utc(expired_at), expired_reason="superseded")


def at(text):
    return parse_iso_utc(text)


def test_a_rejected_recommendation_is_refused():
    with pytest.raises(OutcomeError, match="rejected"):
        check_applicable(rec_row("rejected"), at("2027-01-15T09:10:00"))


def test_applied_after_expiry_is_refused_but_before_expiry_is_a_valid_target():
    row = rec_row("expired", expired_at="2027-01-15T09:30:00+00:00")
    check_applicable(row, at("2027-01-15T09:29:59"))
    with pytest.raises(OutcomeError, match="expired at .* before applied_at"):
        check_applicable(row, at("2027-01-15T09:30:01"))


def test_applied_after_valid_until_or_before_creation_is_refused():
    with pytest.raises(OutcomeError, match="after its valid_until"):
        check_applicable(rec_row(), at("2027-01-15T10:00:01"))
    with pytest.raises(OutcomeError, match="before it was created"):
        check_applicable(rec_row(), at("2027-01-15T08:59:59"))


# --------------------------------------------------------------------------- drift rule


COEFFICIENTS = {"A": [[[0.5]]]}
MODEL = {"artifact_hash": "a1", "binding_revision": 1, "training_data_hash": "d1",  # details.model (evaluate_row)
         "coefficients_hash": content_hash(COEFFICIENTS)}


def outcome_row(i, verdict, hits=10, trials=10, calibrated_at=UQ["calibrated_at"], model=MODEL):
    applied = parse_iso_utc("2027-01-15T09:00:00") + timedelta(minutes=i)
    return VerdictRecord(id=f"out-{i}", recommendation_id="rec-1", binding_id="b", applied_at=applied,
                         verdict=OutcomeVerdict(verdict), details={"hits": hits, "trials": trials, "promised_rate": 0.9,
                                                                   "calibrated_at": calibrated_at, "model": model},
                         created_at=applied)


def artifact_named(artifact_hash="a1", binding_revision=1, training_data_hash="d1", coefficients=COEFFICIENTS):
    """A stand-in for a ModelArtifact with only what model_identity and of_model read."""
    return types.SimpleNamespace(binding_id="b", artifact_hash=artifact_hash, binding_revision=binding_revision,
                                 training_data_hash=training_data_hash, coefficients=coefficients)


def test_two_deviated_among_the_last_three_request_recalibration_keyed_by_the_newest():
    rows = [outcome_row(0, "deviated"), outcome_row(1, "confirmed"), outcome_row(2, "deviated")]
    finding = drift_finding("b", rows, CALIBRATED)
    assert finding is not None and finding.outcome_id == "out-2" and "2 of the last 3" in finding.reason


def test_inconclusive_verdicts_neither_count_nor_hide_deviation():
    rows = [outcome_row(0, "deviated"), outcome_row(1, "inconclusive", 0, 0), outcome_row(2, "deviated", 8, 10),
            outcome_row(3, "inconclusive", 0, 0)]
    assert drift_finding("b", rows, CALIBRATED).outcome_id == "out-2"


def test_one_deviated_among_confirmed_outcomes_is_no_drift():
    rows = [outcome_row(0, "confirmed"), outcome_row(1, "deviated", 4, 10), outcome_row(2, "confirmed")]
    assert drift_finding("b", rows, CALIBRATED) is None


def test_a_pooled_hit_rate_significantly_below_the_promise_is_drift():
    # each outcome alone passes (8 of 10 at p0 0.9: p = 0.26), together 56 of 70: p = 0.0088
    rows = [outcome_row(i, "confirmed", 8, 10) for i in range(7)]
    finding = drift_finding("b", rows, CALIBRATED)
    assert finding is not None and "56/70" in finding.reason and finding.outcome_id == "out-6"
    assert drift_finding("b", rows[:6], CALIBRATED) is None  # 48 of 60: p = 0.015


def test_outcomes_from_before_the_current_calibration_do_not_count():
    rows = [outcome_row(0, "deviated"), outcome_row(1, "deviated")]
    assert drift_finding("b", rows, parse_iso_utc("2027-01-16T08:00:00+00:00")) is None


def test_steady_target_not_held_is_reported_as_mv_deviation():
    obs = observation([40.0] * 5 + [60.0] * 8)
    obs.values[2, 0] = 96.0  # step 2, during the transient
    ev = evaluate(steady_rec(), obs, T0, PERIOD, settle=5)
    assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": pytest.approx(4.0)}


# --------------------------------------------------------------------------- pinned by mutation testing (TESTING.md)


def test_observation_as_json_is_the_documented_document():
    obs = Observation(t=np.array([1.0, 2.0]), tags=("a", "b"), values=np.array([[1.0, np.nan], [3.0, 4.0]]),
                      run_ids=("r",), source="f.csv")
    assert obs.to_dict() == {"source": "f.csv", "run_ids": ["r"], "t": [1.0, 2.0],
                             "values": {"a": [1.0, 3.0], "b": [None, 4.0]}}


def test_observation_from_json_keeps_its_source_and_reads_numbers_as_floats():
    back = Observation.from_dict({"source": "f.csv", "run_ids": ["r"], "t": [1, 2], "values": {"a": [1, None]}})
    assert (back.source, back.run_ids, back.tags) == ("f.csv", ("r",), ("a",))
    assert back.t.dtype == np.float64 and back.values.dtype == np.float64
    assert back.values[0, 0] == 1.0 and math.isnan(back.values[1, 0])


def test_observation_from_json_without_source_or_runs_has_empty_ones():
    back = Observation.from_dict({"t": [1.0], "values": {"a": [2.0]}})
    assert (back.source, back.run_ids) == ("", ())


def test_observation_since_keeps_tags_values_runs_and_source():
    obs = observation([49.0, 50.0, 50.5])
    later = obs.since(T0 + PERIOD)
    assert (later.tags, later.run_ids, later.source) == (obs.tags, obs.run_ids, obs.source)
    np.testing.assert_array_equal(later.values, obs.values[1:])


def test_a_step_without_an_observed_sample_is_null_in_the_delta_document():
    obs = plan_observation(np.zeros(20))
    obs.values[3, 1] = np.nan  # the end of step 2
    ev = evaluate(mpc_rec(), obs, T0, PERIOD)
    assert ev.delta["observed"][2] == [None] and ev.delta["delta"][2] == [None] and ev.delta["inside"][2] == [None]


def test_hit_rate_p_value_without_trials_is_one():
    assert hit_rate_p_value(0, 0, 0.9) == 1.0


def test_a_refusal_names_the_recommendation():
    with pytest.raises(OutcomeError, match="recommendation rec-1: applied_at"):
        check_applicable(rec_row(), at("2027-01-15T10:00:01"))


def test_an_expiry_refusal_names_its_reason_or_says_none_was_recorded():
    from dataclasses import replace

    row = rec_row("expired", expired_at="2027-01-15T09:30:00+00:00")
    with pytest.raises(OutcomeError, match=r"\(superseded\)"):
        check_applicable(row, at("2027-01-15T09:30:01"))
    with pytest.raises(OutcomeError, match=r"\(no reason recorded\)"):
        check_applicable(replace(row, expired_reason=None), at("2027-01-15T09:30:01"))


def test_an_expired_recommendation_without_an_expiry_time_is_judged_by_valid_until():
    check_applicable(rec_row("expired", expired_at=None), at("2027-01-15T09:59:59"))


def test_without_a_calibration_time_every_conclusive_outcome_counts_for_drift():
    rows = [outcome_row(0, "deviated", calibrated_at=None), outcome_row(1, "deviated", calibrated_at=None)]
    finding = drift_finding("b", rows, None)
    assert finding is not None and finding.binding_id == "b" and finding.outcome_id == "out-1"


def test_a_rate_drift_finding_names_its_binding():
    rows = [outcome_row(i, "confirmed", 8, 10) for i in range(7)]
    assert drift_finding("b", rows, CALIBRATED).binding_id == "b"


def test_verified_needs_the_models_own_outcomes_to_show_no_drift_under_any_of_its_calibrations():
    """model_outcome_condition: the drift rule over the outcomes that judged this model, whatever
    calibration each was solved under (a recalibration of the same model does not clear them); it
    holds with no conclusive outcome and names the finding when it fails."""
    model = artifact_named()
    none = model_outcome_condition(model, [outcome_row(0, "inconclusive", 0, 0)])
    assert (none.holds, none.value, none.reason) == (True, "no conclusive outcome yet", "")
    assert none.name == "outcomes of this model in the plant"
    assert none.limit == ("no drift: deviated in < 2 of the last 3 conclusive, the band hits of the last 10 not "
                          "significantly below the promised rate")
    older = "2027-01-01T00:00:00+00:00"  # an earlier calibration of the same model
    rows = [outcome_row(0, "confirmed"), outcome_row(1, "deviated", 3, 10, calibrated_at=older),
            outcome_row(2, "deviated", 4, 10)]
    failed = model_outcome_condition(model, rows)
    assert not failed.holds and failed.value == "2 of the last 3 conclusive deviated; band hits 17/30 over the last 3"
    assert failed.reason == "the plant disagrees with this model: " + drift_finding("b", rows, None).reason
    assert "2 of the last 3 outcomes of b deviated" in failed.reason
    assert drift_finding("b", rows, CALIBRATED) is None  # the drift sensor's rule sees only the newest
    recovered = model_outcome_condition(model, rows + [outcome_row(i, "confirmed") for i in range(3, 10)])
    assert recovered.holds and recovered.value == (  # 87 of 100 at 0.9: p 0.2
        "0 of the last 3 conclusive deviated; band hits 87/100 over the last 10")
    assert model_outcome_condition(model, rows[:1]).value == (
        "0 of the last 1 conclusive deviated; band hits 10/10 over the last 1")


def test_the_outcomes_of_a_model_are_those_of_its_artifact_or_of_the_same_coefficients_from_the_same_data():
    """of_model: the same artifact hash, or (a recalibration's new artifact, a new binding revision
    that kept the model) the same coefficients identified from the same training data; other data,
    other coefficients or no recorded model count for none."""
    rows = [outcome_row(1, "deviated"), outcome_row(2, "deviated")]
    for again in (artifact_named("a2"), artifact_named("a3", binding_revision=2)):
        assert not model_outcome_condition(again, rows).holds
    for other in (artifact_named("a2", training_data_hash="d2"), artifact_named("a2", coefficients={"A": [[[0.6]]]})):
        assert model_outcome_condition(other, rows).value == "no conclusive outcome yet"
    same_hash = artifact_named("a1", training_data_hash="d9", coefficients={})  # the artifact itself
    assert not model_outcome_condition(same_hash, rows).holds
    assert model_identity(artifact_named()) == MODEL
    unnamed = [outcome_row(1, "deviated", model=None), outcome_row(2, "deviated", model=None)]
    assert model_outcome_condition(artifact_named(), unnamed).holds


def test_the_details_document_of_an_mpc_outcome(caplog):
    offsets = np.zeros(20)
    offsets[3], offsets[12] = 2.0, 3.0  # step 3 (judged) and step 12 (beyond P = 10) outside the band 1
    obs = plan_observation(offsets)
    obs.values[5, 0] = 103.0  # the MV held during step 5, 3 away from the plan
    with caplog.at_level("INFO", logger="optimizer_pipeline.outcomes"):
        ev = evaluate(mpc_rec(), obs, T0, PERIOD)
    p = 1 - 0.9 ** 10  # P(X <= 9 | 10, 0.9)
    reason = f"9 of 10 judged CV steps inside the band; promised rate 0.900, one-sided binomial p = {p:.3g} (>= 0.01)"
    assert ev.details == {
        "template": "linear_mpc_quadratic@1", "rule": "mpc_within_P", "verdict_reason": reason,
        "applied_at": "2027-01-15T08:00:00+00:00", "period_s": 10.0, "judged_steps": 10, "steps_aligned": 10,
        "steps_required": 5, "trials": 10, "hits": 9, "inside_share": 0.9, "inside_share_all_steps": 0.9,
        "promised_rate": pytest.approx(0.9), "alpha": 0.1, "p_value": pytest.approx(p, rel=1e-9),
        "significance": 0.01, "block_covered": False, "settle_steps": None, "calibrated_at": UQ["calibrated_at"],
        "band": {"y": 1.0}, "max_abs_delta": {"y": 2.0}, "mv_max_abs_deviation_from_plan": {"q": 3.0}}
    assert set(ev.delta) == {"cv_tags", "steps", "t", "observed", "predicted", "delta", "inside", "judged"}
    assert (ev.delta["cv_tags"], ev.delta["steps"][:2], ev.delta["t"][:2]) == (["y"], [0, 1], [T0 + 10, T0 + 20])
    assert ev.delta["predicted"][:2] == [[50.0], [50.5]] and ev.delta["inside"][3] == [False]
    assert caplog.messages == [f"outcome of rec-test: confirmed ({reason})"]


def test_the_details_document_of_a_steady_outcome():
    ev = evaluate(steady_rec(), observation([40.0] * 5 + [60.25] * 8), T0, PERIOD, settle=5)
    assert ev.details["verdict_reason"] == ("8 of 8 judged CV steps inside the band; promised rate 0.900, "
                                            "one-sided binomial p = 1 (>= 0.01)")
    assert {k: ev.details[k] for k in ("rule", "settle_steps", "judged_steps", "steps_aligned", "steps_required",
                                       "trials", "hits", "block_covered", "inside_share_all_steps", "band",
                                       "max_abs_delta", "mv_max_abs_deviation_from_plan")} == {
        "rule": "steady_settled", "settle_steps": 5, "judged_steps": 8, "steps_aligned": 8, "steps_required": 5,
        "trials": 8, "hits": 8, "block_covered": None, "inside_share_all_steps": 1.0, "band": {"y": 0.5},
        "max_abs_delta": {"y": 0.25}, "mv_max_abs_deviation_from_plan": {"q": 0.0}}
    assert ev.delta["steps"] == list(range(5, 13)) and ev.delta["predicted"] == [[60.0]] * 8


def test_an_unstable_steady_model_is_inconclusive_and_says_why():
    ev = evaluate(steady_rec(), observation([60.0] * 13), T0, PERIOD, settle=None)
    assert ev.verdict.value == "inconclusive" and ev.details["steps_aligned"] == 0
    assert ev.details["verdict_reason"] == ("the model is not stable, so it never settles: "
                                            "no settled observation to compare")


def test_inconclusive_reasons_name_what_is_missing():
    few = evaluate(mpc_rec(), observation([49.0, 50.0, 50.5, 51.0, 51.5]), T0, PERIOD)
    assert few.details["verdict_reason"] == "4 aligned steps within the first 10; at least 5 are needed"
    steady = evaluate(steady_rec(), observation([40.0] * 5 + [60.0] * 3), T0, PERIOD, settle=5)
    assert steady.details["verdict_reason"] == "3 aligned settled steps (from step 5); at least 5 are needed"
    unbanded = evaluate(mpc_rec(band=(None,), uq=None), plan_observation(np.zeros(20)), T0, PERIOD)
    assert unbanded.details["verdict_reason"] == ("the recommendation has no UQ band (no calibration evidence): "
                                                  "nothing to judge against")
    assert (unbanded.details["band"], unbanded.details["inside_share"], unbanded.details["alpha"],
            unbanded.details["calibrated_at"]) == (None, None, None, None)


def test_a_deviated_reason_says_below_the_significance():
    offsets = np.concatenate([np.zeros(4), np.full(16, 2.0)])
    ev = evaluate(mpc_rec(), plan_observation(offsets), T0, PERIOD)
    assert ev.details["verdict_reason"].endswith(f"p = {hit_rate_p_value(4, 10, 0.9):.3g} (< 0.01)")


# --------------------------------------------------------------------------- pinned by mutation testing (TESTING.md)


def test_a_column_without_any_sample_does_not_stop_the_next_columns():
    t = np.array([0.0, 10.0])
    values = np.array([[np.nan, 1.0, 5.0], [np.nan, 2.0, 6.0]])
    got = nearest_samples(t, values, np.array([10.0]), PERIOD)
    assert math.isnan(got[0, 0]) and (got[0, 1], got[0, 2]) == (2.0, 6.0)


def test_samples_of_two_runs_at_the_same_time_tie_to_the_earlier_one_in_order():
    # runs a and b both sampled at t = 10; read at t = 8: both 2 s away, the first in order is taken
    got = nearest_samples(np.array([10.0, 10.0]), np.array([[1.0], [2.0]]), np.array([8.0]), PERIOD)
    assert got[0, 0] == 1.0


def test_the_promised_rate_without_a_measured_coverage_is_one_minus_alpha():
    assert promised_rate({"method": "empirical_max", "alpha": 0.25}) == 0.75


def test_a_plan_that_moves_the_mv_followed_exactly_shows_no_deviation():
    rec = mpc_rec()
    rec["controls"] = [[100.0 + k] for k in range(20)]
    obs = plan_observation(np.zeros(20))
    obs.values[:20, 0] = 100.0 + np.arange(20)  # the MV held during step k is the sample at applied_at + k T
    ev = evaluate(rec, obs, T0, PERIOD)
    assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": 0.0}


def test_a_recommendation_without_a_band_entry_is_inconclusive():
    rec = mpc_rec()
    del rec["band"]
    ev = evaluate(rec, plan_observation(np.zeros(20)), T0, PERIOD)
    assert (ev.verdict.value, ev.details["band"], ev.details["inside_share_all_steps"]) == ("inconclusive", None, None)
    assert ev.details["verdict_reason"] == ("the recommendation has no UQ band (no calibration evidence): nothing to "
                                            "judge against")


def test_a_band_without_uq_evidence_is_inconclusive():
    ev = evaluate(mpc_rec(uq=None), plan_observation(np.zeros(20)), T0, PERIOD)
    assert (ev.verdict.value, ev.details["p_value"], ev.details["promised_rate"]) == ("inconclusive", None, None)
    assert ev.details["verdict_reason"].startswith("the recommendation has no UQ band")


def test_a_block_with_a_missing_step_and_no_miss_is_neither_covered_nor_missed():
    offsets = np.zeros(20)
    obs = plan_observation(offsets)
    obs.values[3, 1] = np.nan  # step 2 ends without a sample of y; the other 9 judged steps are inside
    ev = evaluate(mpc_rec(), obs, T0, PERIOD)
    assert (ev.details["block_covered"], ev.details["hits"], ev.details["trials"]) == (None, 9, 9)
    assert ev.delta["inside"][2] == [None] and ev.delta["inside"][0] == [True]


def test_nothing_aligned_has_no_share_of_steps_inside():
    ev = evaluate(mpc_rec(), observation([49.0], start_step=-30), T0, PERIOD)  # one sample long before
    assert (ev.details["inside_share_all_steps"], ev.details["trials"], ev.verdict.value) == (None, 0, "inconclusive")


def test_an_mpc_outcome_records_no_settling_steps():
    ev = evaluate(mpc_rec(), plan_observation(np.zeros(20)), T0, PERIOD, settle=7)
    assert ev.details["settle_steps"] is None and ev.details["rule"] == "mpc_within_P"


def test_the_applied_at_of_the_details_is_utc_whatever_the_local_time_zone(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC + 5:30
    time.tzset()
    try:
        ev = evaluate(mpc_rec(), plan_observation(np.zeros(20)), T0, PERIOD)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert ev.details["applied_at"] == "2027-01-15T08:00:00+00:00"  # T0 = 1 800 000 000 s


def steady_two_mv_rec():
    return {"id": "rec-steady2", "template": "steady_response@1", "mv_tags": ["q", "r"], "cv_tags": ["y"],
            "controls": [[100.0, 7.0]], "predicted": [[60.0]], "band": [0.5], "evidence": {"uq": dict(UQ, block_length=1)}}


def test_a_steady_target_of_two_mvs_is_checked_per_mv_until_the_last_sample():
    # samples at steps 0..7: q on target throughout, r on target except 7.75 at the last sample
    t = T0 + np.arange(8) * PERIOD
    values = np.column_stack([np.full(8, 100.0), np.r_[np.full(7, 7.0), 7.75], np.full(8, 60.0)])
    obs = Observation(t=t, tags=("q", "r", "y"), values=values, run_ids=("obs",), source="test")
    ev = evaluate(steady_two_mv_rec(), obs, T0, PERIOD, settle=2)
    assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": 0.0, "r": 0.75}
    assert (ev.details["hits"], ev.details["trials"], ev.details["settle_steps"]) == (6, 6, 2)


def test_a_steady_outcome_with_no_sample_after_applied_at_judges_no_step():
    empty = Observation(t=np.zeros(0), tags=("q", "y"), values=np.zeros((0, 2)), run_ids=(), source="test")
    ev = evaluate(steady_rec(), empty, T0, PERIOD, settle=1)
    assert (ev.verdict.value, ev.delta["steps"], ev.details["steps_aligned"]) == ("inconclusive", [], 0)
    assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": None}


def test_a_sample_just_under_half_a_period_past_the_last_step_is_no_step_of_its_own():
    # applied at 100 s, period 10: samples on target at 100 and 110, then one 4.999999999 s after 110 with q off.
    # The observation ends at step 1 (1 + 0.4999999999 rounds down to 1); step 1's MV is the sample at 110 (0 s
    # away), and no step 2 is read, although the off sample is within half a period (+ 1e-9) of it. The same with
    # only the sample at 100 before the off one (the observation ends at step 0).
    for tail in ([100.0, 110.0], [100.0]):
        t = np.array(tail + [tail[-1] + 4.999999999])
        values = np.column_stack([np.r_[np.full(len(tail), 100.0), 130.0], np.full(len(t), 60.0)])
        obs = Observation(t=t, tags=("q", "y"), values=values, run_ids=("obs",), source="test")
        ev = evaluate(steady_rec(), obs, 100.0, PERIOD, settle=1)
        assert ev.details["mv_max_abs_deviation_from_plan"] == {"q": 0.0}, tail
