"""outcomes.py's ledger and file paths in process (record_outcome, evaluate_row, evaluate_pending,
Observation.from_frame, summary) on a DuckDB ledger in tmp_path: test_outcomes_pipeline.py drives
the same code end to end through Dagster and the CLI, too slow to run once per mutant
(`make mutation MUTATION_MODULES=outcomes`).

One MV q and one CV y, sample period 10 s. The stored recommendation holds q at 100 and predicts
y = 50 + k / 2 at the end of step k (k = 0 .. 19), band 1, UQ block length 10 (so 10 steps are
judged), promised rate min(1 - alpha, coverage) = min(0.9, 0.95) = 0.9.
"""

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline.contracts import (
    Outcome,
    OutcomeVerdict,
    Normalisation,
    Recommendation,
    RecommendationStatus,
    Template,
    binding_from_dict,
    iso_utc,
)
from optimizer_pipeline.ledger import Ledger, NewRun, NotFoundError
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.outcomes import (
    EVALUATION_SUFFIX,
    Observation,
    OutcomeError,
    evaluate_pending,
    model_identity,
    SETTLE_FRACTION,
    record_outcome,
    settle_steps,
    summary,
)

T0 = datetime(2026, 1, 15, 9, 0, tzinfo=timezone.utc)  # when the plan is applied (before today: see the revision test)
SPEC = binding_from_dict({
    "id": "heat", "sample_period_s": 10,
    "mvs": [{"tag": "q", "lo": 0, "hi": 200, "max_move": 50}],
    "cvs": [{"tag": "y", "lo": 0, "hi": 100, "target": 55}],
    "profile": {"id": "p", "template": "linear_mpc_quadratic@1", "horizon": 20}})
UQ = {"method": "split_conformal", "alpha": 0.1, "coverage": 0.95, "block_length": 10,
      "calibrated_at": "2026-01-15T08:00:00+00:00"}
PREDICTED = tuple((50.0 + 0.5 * k,) for k in range(20))


def stored_recommendation(ledger: Ledger, status=RecommendationStatus.VERIFIED, rec_id="rec-a",
                          binding_id="heat") -> Recommendation:
    rec = Recommendation(
        id=rec_id, binding_id=binding_id, binding_revision=1, run_id="or-" + rec_id, candidate_id=None,
        template=Template.LINEAR_MPC, status=status, reasons=(), created_at=iso_utc(T0 - timedelta(minutes=1)),
        valid_until=iso_utc(T0 + timedelta(hours=1)), mv_tags=("q",), cv_tags=("y",), controls=((100.0,),) * 20,
        predicted=PREDICTED, band=(1.0,), cost=1.0, independent_cost=1.0, problem_ir_hash="p" * 64,
        model_artifact_hash="m" * 64, evidence={"source": "simulation", "uq": UQ}, band_steps=10)
    ledger.insert_recommendation(rec, "simulation")
    return rec


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.upsert_binding(SPEC)
    stored_recommendation(ledger)
    return ledger


def observed_file(path, offset=0.0, rows=21):
    """Row 0 at T0 (y 49, before the first step ends), row k + 1 at T0 + 10 (k + 1) s: the plan's prediction of
    step k plus `offset`; q held at 100."""
    y = [49.0] + [p[0] + offset for p in PREDICTED]
    frame = pd.DataFrame({"run_id": "after", "timestamp": [iso_utc(T0 + timedelta(seconds=10 * k)) for k in range(rows)],
                          "q": 100.0, "y": y[:rows]})
    frame.to_csv(path, index=False)
    return path


def test_an_observed_cv_beyond_its_transforms_limits_is_judged_not_refused(tmp_path):
    """A CV the binding says saturates before 60 that the plant shows at 75: ingest would refuse the file
    (history), an outcome judges it, in engineering units, as what the plant did."""
    transformed = binding_from_dict({**SPEC.to_dict(), "cvs": [{"tag": "y", "lo": 0, "hi": 59, "target": 55,
                                                               "transform": {"kind": "logit", "lo": -1, "hi": 60}}]})
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.upsert_binding(transformed)
    stored_recommendation(ledger)
    outcome = record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv", offset=20.0))
    assert outcome.verdict == OutcomeVerdict.DEVIATED and outcome.binding_id == "heat"


def test_an_outcome_applied_at_the_files_first_sample_is_judged_stored_and_summarised(ledger, tmp_path):
    outcome = record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv"))
    assert outcome.id.startswith("out-") and (outcome.recommendation_id, outcome.binding_id) == ("rec-a", "heat")
    assert (outcome.applied_at, outcome.verdict) == (iso_utc(T0), OutcomeVerdict.CONFIRMED)
    assert outcome.observed["source"] == "obs.csv" and outcome.observed["run_ids"] == ["after"]
    assert outcome.observed["t"] == [T0.timestamp() + 10 * k for k in range(21)]
    assert [(r.id, r.verdict) for r in ledger.list_outcomes("heat")] == [(outcome.id, "confirmed")]
    # the recommendation's model artifact is not in this ledger: the outcome names it by its hash alone
    assert outcome.details["model"] == ledger.list_outcomes("heat")[0].details["model"] == {"artifact_hash": "m" * 64}
    doc = summary(outcome)
    assert {k: doc[k] for k in ("outcome_id", "recommendation_id", "binding_id", "applied_at", "verdict",
                                "rule", "judged_steps", "trials", "hits", "promised_rate", "p_value", "band",
                                "max_abs_delta", "mv_max_abs_deviation_from_plan")} == {
        "outcome_id": outcome.id, "recommendation_id": "rec-a", "binding_id": "heat", "applied_at": iso_utc(T0),
        "verdict": "confirmed", "rule": "mpc_within_P", "judged_steps": 10, "trials": 10, "hits": 10,
        "promised_rate": 0.9, "p_value": 1.0, "band": {"y": 1.0}, "max_abs_delta": {"y": 0.0},
        "mv_max_abs_deviation_from_plan": {"q": 0.0}}
    assert set(doc) == {"outcome_id", "recommendation_id", "binding_id", "applied_at", "verdict", "verdict_reason",
                        "rule", "judged_steps", "steps_aligned", "steps_required", "trials", "hits", "inside_share",
                        "inside_share_all_steps", "promised_rate", "p_value", "block_covered", "band",
                        "max_abs_delta", "mv_max_abs_deviation_from_plan"}


def test_a_given_applied_at_drops_the_earlier_samples_and_aligns_the_plan_from_there(ledger, tmp_path):
    # applied at T0 + 50 s (row 5): the sample kept first is the one at T0 + 50 (within half a period);
    # step k ends at row 6 + k, y = 50 + (k + 5) / 2: 2.5 off the prediction, beyond the band 1 at every step
    outcome = record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv"), "2026-01-15T09:00:50Z")
    assert outcome.applied_at == iso_utc(T0 + timedelta(seconds=50))
    assert outcome.observed["t"] == [T0.timestamp() + 10 * k for k in range(5, 21)]
    assert outcome.observed["values"]["y"][0] == 52.0
    assert outcome.verdict is OutcomeVerdict.DEVIATED
    assert (outcome.details["hits"], outcome.details["trials"], outcome.details["max_abs_delta"]) == (0, 10, {"y": 2.5})


def test_an_applied_at_that_is_not_iso_8601_is_refused_and_nothing_is_written(ledger, tmp_path):
    with pytest.raises(OutcomeError) as refused:
        record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv"), "yesterday")
    assert str(refused.value) == "--applied-at: 'yesterday' is not an ISO 8601 timestamp"
    assert ledger.list_outcomes("heat") == []


def test_an_applied_at_after_valid_until_is_refused_and_nothing_is_written(ledger, tmp_path):
    with pytest.raises(OutcomeError, match="after its valid_until"):
        record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv"), "2026-01-15T10:00:01Z")
    assert ledger.list_outcomes("heat") == []


def test_a_rejected_recommendation_is_refused_before_its_file_is_read(tmp_path):
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.upsert_binding(SPEC)
    stored_recommendation(ledger, RecommendationStatus.REJECTED, "rec-r")
    with pytest.raises(OutcomeError) as refused:
        record_outcome(ledger, "rec-r", tmp_path / "no-such-file.csv")
    assert str(refused.value) == "recommendation rec-r was rejected (no feasible plan); there is nothing to apply"


def test_samples_of_several_runs_are_ordered_by_time(ledger, tmp_path):
    frame = pd.read_csv(observed_file(tmp_path / "obs.csv"))
    frame.loc[frame.index % 2 == 1, "run_id"] = "other"
    # the file holds run "other" (odd rows) first, then run "after": each run in time order, the file not
    pd.concat([frame[frame.run_id == "other"], frame[frame.run_id == "after"]]).to_csv(tmp_path / "shuffled.csv",
                                                                                    index=False)
    outcome = record_outcome(ledger, "rec-a", tmp_path / "shuffled.csv", iso_utc(T0))
    assert outcome.observed["t"] == [T0.timestamp() + 10 * k for k in range(21)]
    assert outcome.observed["values"]["y"] == [49.0] + [p[0] for p in PREDICTED]
    assert outcome.observed["run_ids"] == ["other", "after"]  # as read
    assert outcome.verdict is OutcomeVerdict.CONFIRMED


def pending(ledger, outcome_id, offset=0.0, rec_id="rec-a", binding_id="heat"):
    observed = Observation(t=pd.Series([T0.timestamp() + 10 * k for k in range(21)]).to_numpy(float), tags=("q", "y"),
                           values=pd.DataFrame({"q": 100.0, "y": [49.0] + [p[0] + offset for p in PREDICTED]}
                                               ).to_numpy(float), run_ids=("after",), source="inbox.csv")
    row = Outcome(id=outcome_id, recommendation_id=rec_id, binding_id=binding_id, applied_at=iso_utc(T0),
                  observed=observed.to_dict(), delta={}, verdict=None, details={})
    ledger.insert_outcome(row)
    return row


def test_a_pending_observation_is_judged_once_by_its_own_evaluation_row(ledger, tmp_path):
    judged = record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv"))  # has a verdict: not pending
    first, second = pending(ledger, "out-p1"), pending(ledger, "out-p2", offset=2.5)
    written = evaluate_pending(ledger, "heat")
    assert [(o.id, o.verdict) for o in written] == [("out-p1" + EVALUATION_SUFFIX, OutcomeVerdict.CONFIRMED),
                                                    ("out-p2-eval", OutcomeVerdict.DEVIATED)]
    for row, out in zip((first, second), written):
        assert (out.recommendation_id, out.binding_id, out.applied_at, out.observed) == (
            "rec-a", "heat", row.applied_at, row.observed)
        assert out.details["evaluates"] == row.id and out.details["trials"] == 10
    assert (written[0].details["hits"], written[1].details["hits"]) == (10, 0)
    assert evaluate_pending(ledger, "heat") == []  # nothing is judged twice
    assert sorted(r.id for r in ledger.list_outcomes("heat")) == sorted(
        [judged.id, "out-p1", "out-p2", "out-p1-eval", "out-p2-eval"])


def test_the_outcome_stores_the_delta_document_and_logs_the_verdict(ledger, tmp_path, caplog):
    with caplog.at_level("INFO", logger="optimizer_pipeline.outcomes"):
        outcome = record_outcome(ledger, "rec-a", observed_file(tmp_path / "obs.csv", offset=0.25))
    assert outcome.delta["steps"] == list(range(20)) and outcome.delta["delta"][:2] == [[0.25], [0.25]]
    assert ledger.list_outcomes("heat")[0].delta == outcome.delta
    assert [m for m in caplog.messages if m.startswith("outcome of ")] == [
        f"outcome of rec-a: confirmed ({outcome.details['verdict_reason']})"]


def test_a_pending_observation_is_judged_with_its_own_delta_and_a_pending_outcome_summarises_without_verdict(ledger):
    row = pending(ledger, "out-p", offset=0.25)
    [out] = evaluate_pending(ledger, "heat")
    assert out.delta["delta"][0] == [0.25] and out.delta["steps"] == list(range(20))
    assert summary(replace(row, verdict=None))["verdict"] is None


def test_only_the_bindings_own_pending_observations_are_judged(ledger):
    ledger.upsert_binding(replace(SPEC, id="heat-2"))
    stored_recommendation(ledger, rec_id="rec-b", binding_id="heat-2")
    pending(ledger, "out-other", rec_id="rec-b", binding_id="heat-2")
    pending(ledger, "out-own")
    assert [o.id for o in evaluate_pending(ledger, "heat")] == ["out-own-eval"]
    assert [o.id for o in evaluate_pending(ledger, "heat-2")] == ["out-other-eval"]


def test_a_pending_observation_that_a_row_already_evaluates_is_not_judged_again(ledger):
    pending(ledger, "out-p")
    ledger.insert_outcome(Outcome(id="out-judged-by-hand", recommendation_id="rec-a", binding_id="heat",
                                  applied_at=iso_utc(T0), observed={}, delta={}, verdict=OutcomeVerdict.CONFIRMED,
                                  details={"evaluates": "out-p"}))
    assert evaluate_pending(ledger, "heat") == []


def test_an_outcome_is_judged_by_the_binding_revision_its_recommendation_was_solved_for(ledger, tmp_path):
    # revision 2 samples every 20 s: the recommendation of revision 1 (10 s) is still judged on 10 s steps, and
    # a sample is kept from half of ITS period (5 s) before applied_at: the one 4 s before, not the one 7 s before
    ledger.upsert_binding(replace(SPEC, sample_period_s=20.0))  # expires rec-a now, after it was applied
    frame = pd.read_csv(observed_file(tmp_path / "obs.csv"))
    early = pd.DataFrame({"run_id": "after", "timestamp": [iso_utc(T0 - timedelta(seconds=s)) for s in (7, 4)],
                          "q": 100.0, "y": 48.0})
    pd.concat([early, frame]).to_csv(tmp_path / "early.csv", index=False)
    outcome = record_outcome(ledger, "rec-a", tmp_path / "early.csv", iso_utc(T0))
    assert outcome.observed["t"][:2] == [T0.timestamp() - 4, T0.timestamp()]
    assert (outcome.verdict, outcome.details["period_s"], outcome.details["hits"]) == (OutcomeVerdict.CONFIRMED, 10.0, 10)
    pending(ledger, "out-p")
    [judged] = evaluate_pending(ledger, "heat")
    assert (judged.verdict, judged.details["period_s"]) == (OutcomeVerdict.CONFIRMED, 10.0)


STEADY = binding_from_dict({
    "id": "heat-steady", "sample_period_s": 10,
    "mvs": [{"tag": "q", "lo": 0, "hi": 200, "max_move": 50}],
    "cvs": [{"tag": "y", "lo": 0, "hi": 100, "target": 60}],
    "profile": {"id": "p", "template": "steady_response@1", "horizon": 20}})


def test_a_steady_outcome_is_judged_from_the_settling_steps_of_its_model_artifact(tmp_path):
    # y = u(k - 1) / 2: no pole, so the model settles after its lag max(na, delay + nb - 1) = 1 step
    model = ArxModel(Orders(1, 1, 1), np.zeros((1, 1, 1)), np.full((1, 1, 1), 0.5), np.zeros((1, 1, 0)), np.zeros(1))
    artifact = artifact_from_model(model, STEADY, 1, Normalisation(("q", "y"), (100.0, 50.0), (10.0, 5.0)))
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.upsert_binding(STEADY)
    ledger.put_artifact(artifact)
    rec = Recommendation(
        id="rec-s", binding_id="heat-steady", binding_revision=1, run_id="or-s", candidate_id=None,
        template=Template.STEADY_RESPONSE, status=RecommendationStatus.VERIFIED, reasons=(),
        created_at=iso_utc(T0 - timedelta(minutes=1)), valid_until=iso_utc(T0 + timedelta(hours=1)), mv_tags=("q",),
        cv_tags=("y",), controls=((100.0,),), predicted=((60.0,),), band=(0.5,), cost=1.0, independent_cost=1.0,
        problem_ir_hash="p" * 64, model_artifact_hash=artifact.artifact_hash,
        evidence={"source": "simulation", "uq": dict(UQ, block_length=1)}, band_steps=1)
    ledger.insert_recommendation(rec, "simulation")
    # step 0 still far from the target (not judged), steps 1 .. 6 settled on it
    frame = pd.DataFrame({"run_id": "after", "timestamp": [iso_utc(T0 + timedelta(seconds=10 * k)) for k in range(7)],
                          "q": 100.0, "y": [40.0] + [60.0] * 6})
    frame.to_csv(tmp_path / "steady.csv", index=False)
    outcome = record_outcome(ledger, "rec-s", tmp_path / "steady.csv")
    assert (outcome.verdict, outcome.details["settle_steps"], outcome.delta["steps"]) == (
        OutcomeVerdict.CONFIRMED, 1, [1, 2, 3, 4, 5, 6])
    # the outcome names the model it judged (what the condition for `verified` matches), as stored
    assert outcome.details["model"] == model_identity(artifact) == ledger.list_outcomes("heat-steady")[0].details["model"]
    assert outcome.details["model"]["artifact_hash"] == artifact.artifact_hash
    # a steady recommendation whose artifact is not in the ledger cannot be judged: its settling is unknown
    ledger.upsert_binding(replace(STEADY, id="heat-steady-2"))
    ledger.insert_recommendation(replace(rec, id="rec-gone", binding_id="heat-steady-2", model_artifact_hash="g" * 64),
                                 "simulation")
    with pytest.raises(NotFoundError, match=f"^model artifact {'g' * 64} is not in the ledger$"):
        record_outcome(ledger, "rec-gone", tmp_path / "steady.csv")


def test_a_steady_outcome_solved_with_a_local_refit_waits_for_the_refit_to_settle(tmp_path):
    """A steady target solved with a local refit (model/local.py) names the identified artifact but
    its run's problem holds the refit: the outcome waits for the refit's slowest mode (pole 0.9:
    1 + ceil(log SETTLE_FRACTION / log 0.9) steps), not the artifact's (no pole: 1 step)."""
    from optimizer_pipeline.solver.targets import compile_steered

    fast = ArxModel(Orders(1, 1, 1), np.zeros((1, 1, 1)), np.full((1, 1, 1), 0.5), np.zeros((1, 1, 0)), np.zeros(1))
    slow = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), 0.9), np.full((1, 1, 1), 0.05), np.zeros((1, 1, 0)),
                    np.zeros(1))
    norm = Normalisation(("q", "y"), (100.0, 50.0), (10.0, 5.0))
    artifact, refit = (artifact_from_model(m, STEADY, 1, norm) for m in (fast, slow))
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.upsert_binding(STEADY)
    ledger.put_artifact(artifact)
    problem = compile_steered(STEADY, refit, np.zeros(refit.state_space.arrays()[0].shape[0]), np.zeros(1),
                              [100.0], [], None, None)
    ledger.insert_run(NewRun("heat-steady", 1, "p", 1, problem.hash, {}, problem.to_dict(), id="or-s",
                             started_at=T0 - timedelta(minutes=1)))
    rec = Recommendation(
        id="rec-s", binding_id="heat-steady", binding_revision=1, run_id="or-s", candidate_id=None,
        template=Template.STEADY_RESPONSE, status=RecommendationStatus.VERIFIED, reasons=(),
        created_at=iso_utc(T0 - timedelta(minutes=1)), valid_until=iso_utc(T0 + timedelta(hours=1)), mv_tags=("q",),
        cv_tags=("y",), controls=((100.0,),), predicted=((60.0,),), band=(0.5,), cost=1.0, independent_cost=1.0,
        problem_ir_hash=problem.hash, model_artifact_hash=artifact.artifact_hash,
        evidence={"source": "simulation", "uq": dict(UQ, block_length=1)}, band_steps=1)
    ledger.insert_recommendation(rec, "simulation")
    frame = pd.DataFrame({"run_id": "after", "timestamp": [iso_utc(T0 + timedelta(seconds=10 * k)) for k in range(70)],
                          "q": 100.0, "y": 60.0})
    frame.to_csv(tmp_path / "steady.csv", index=False)
    outcome = record_outcome(ledger, "rec-s", tmp_path / "steady.csv")
    wait = 1 + math.ceil(math.log(SETTLE_FRACTION) / math.log(0.9))
    assert (outcome.verdict, outcome.details["settle_steps"], outcome.delta["steps"][0]) == (
        OutcomeVerdict.CONFIRMED, wait, wait)
    assert settle_steps(artifact) == 1  # the identified artifact alone would have judged from step 1


def test_samples_of_two_runs_at_the_same_times_keep_the_files_run_order_at_each_time():
    # runs a and b sampled at the same 40 times (a first in the file): ordered by time, a's sample of each
    # time comes before b's (a sort that is not stable mixes them up at this length)
    times = np.arange(40) * 10.0
    frame = pd.DataFrame({"run_id": ["a"] * 40 + ["b"] * 40, "timestamp": np.r_[times, times], "q": 100.0,
                          "y": np.r_[np.full(40, 1.0), np.full(40, 2.0)]})
    observation = Observation.from_frame(frame, SPEC, "two-runs.csv")
    np.testing.assert_array_equal(observation.t, np.repeat(times, 2))
    np.testing.assert_array_equal(observation.column(["y"])[:, 0], np.tile([1.0, 2.0], 40))
    assert (observation.run_ids, observation.source, observation.tags) == (("a", "b"), "two-runs.csv", ("q", "y"))
