"""The live service's pieces below the loop: the live window's cleaning against prepare_history's, and
the ledger rows it reads and writes (publication keys, heartbeats, samples since), on both backends."""

import time
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from ledger_helpers import candidates, recommendation, run_row
from optimizer_pipeline.contracts import ContractError
from optimizer_pipeline.data.prepare import prepare_history, with_live_run
from optimizer_pipeline.ledger import Publication, new_id
from optimizer_pipeline.ledger.records import naive_now
from optimizer_pipeline.plants import get_plant

PLANT = get_plant("heater")


def _history() -> pd.DataFrame:
    return PLANT.history(3).frame


def _live_rows(frame: pd.DataFrame) -> pd.DataFrame:
    newest = frame.groupby("run_id")["timestamp"].max().idxmax()
    return frame[frame["run_id"] == newest].reset_index(drop=True)


def _same_run(a, b) -> None:
    assert (a.run_id, a.source_run) == (b.run_id, b.source_run)
    for name in ("t", "u", "y", "d"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_the_live_window_is_cleaned_as_prepare_history_cleans_the_live_run():
    frame = _history()
    full = prepare_history(frame, PLANT.spec)
    live = with_live_run(full, _live_rows(frame), PLANT.spec)
    _same_run(live.live, full.live)
    for key in ("live", "live_behind_s", "live_tail_dropped", "warnings"):
        assert live.report[key] == full.report[key]
    assert live.train is full.train and live.data_hash == full.data_hash


def test_new_live_samples_give_the_state_a_whole_history_gives_them_spikes_and_a_dropped_tail_included():
    frame = _history()
    base = prepare_history(frame, PLANT.spec)
    rows = _live_rows(frame)
    period = PLANT.spec.sample_period_s
    more = rows.tail(3).copy()
    more["timestamp"] = rows["timestamp"].iloc[-1] + period * np.arange(1, 4)
    more.loc[more.index[0], "t_out"] += 40.0  # a spike with normal samples after it: removed in both
    grown = pd.concat([frame, more], ignore_index=True)
    full = prepare_history(grown, PLANT.spec)
    live = with_live_run(base, pd.concat([rows, more], ignore_index=True), PLANT.spec)
    _same_run(live.live, full.live)
    assert live.report["live_tail_dropped"] is full.report["live_tail_dropped"] is False
    # a last sample far after a gap: its piece is too short, cleaning drops it in both
    late = more.tail(1).copy()
    late["timestamp"] += 100 * period
    full = prepare_history(pd.concat([grown, late], ignore_index=True), PLANT.spec)
    live = with_live_run(base, pd.concat([rows, more, late], ignore_index=True), PLANT.spec)
    _same_run(live.live, full.live)
    assert live.report["live_tail_dropped"] is full.report["live_tail_dropped"] is True
    assert live.report["live_behind_s"] == pytest.approx(full.report["live_behind_s"])


def test_a_window_too_short_for_a_run_piece_asks_for_the_whole_history():
    frame = _history()
    assert with_live_run(prepare_history(frame, PLANT.spec), _live_rows(frame).tail(3), PLANT.spec) is None


# ---------------------------------------------------------------------------- ledger rows, both backends


def _publication(run, rec, live_t=100.0, calibration="cal-1"):
    return Publication(binding_id=rec.binding_id, binding_revision=rec.binding_revision, calibration_id=calibration,
                       live_t=live_t, run=run, candidates=candidates(), model_id="m" * 64, recommendation=rec,
                       run_status="succeeded", independent_cost=2.0, diagnostics={}, evidence_source="simulation")


def _new(binding_id="tanks-1", live_t=100.0, calibration="cal-1"):
    run = replace(run_row(binding_id), id=new_id("or"))
    return _publication(run, recommendation(run.id, binding_id), live_t, calibration)


def test_publications_are_written_together_and_each_key_once(any_ledger, binding_doc):
    from optimizer_pipeline.contracts import binding_from_dict

    any_ledger.upsert_binding(binding_from_dict(binding_doc))
    first, other = _new(), _new("heater-1")
    assert any_ledger.publish_live("live-a", [first, other]) == [(first.run.id, True), (other.run.id, True)]
    again = _new()  # the same binding, revision, calibration and newest sample: a duplicate
    later, recalibrated = _new(live_t=105.0), _new(live_t=105.0, calibration="cal-2")
    assert any_ledger.publish_live("live-b", [again, later, recalibrated]) == \
        [None, (later.run.id, True), (recalibrated.run.id, True)]
    keys = any_ledger.query("SELECT binding_id, calibration_id, live_t, service_id FROM live_publications "
                            "ORDER BY binding_id, live_t, calibration_id")
    assert keys.values.tolist() == [["heater-1", "cal-1", 100.0, "live-a"], ["tanks-1", "cal-1", 100.0, "live-a"],
                                    ["tanks-1", "cal-1", 105.0, "live-b"], ["tanks-1", "cal-2", 105.0, "live-b"]]
    assert again.run.id not in set(any_ledger.query("SELECT id FROM optimizer_runs")["id"])
    # one open recommendation per binding: the newest publication's
    open_ids = any_ledger.query("SELECT id FROM optimizer_recommendations WHERE binding_id = 'tanks-1' "
                                "AND status <> 'expired'")["id"].tolist()
    assert open_ids == [recalibrated.recommendation.id]


def test_a_publication_following_an_open_recommendation_is_summarised_and_one_following_a_closed_one_is_whole(
        any_ledger, binding_doc):
    from optimizer_pipeline.contracts import binding_from_dict

    any_ledger.upsert_binding(binding_from_dict(binding_doc))
    first = _new()
    any_ledger.publish_live("live-a", [first])
    follows = first.recommendation.id
    summarised = replace(_new(live_t=105.0), follows=follows)
    assert any_ledger.publish_live("live-a", [summarised]) == [(first.run.id, False)]
    assert summarised.run.id not in set(any_ledger.query("SELECT id FROM optimizer_runs")["id"])
    row = any_ledger.latest_live_publication("tanks-1")
    rec = summarised.recommendation
    assert (row.whole, row.run_id, row.status, row.live_t) == (False, first.run.id, rec.status.value, 105.0)
    assert row.advice == dict(zip(rec.mv_tags, rec.controls[0]))
    hour = timedelta(hours=1)
    assert any_ledger.live_published_up_to("tanks-1", 1, "cal-1", naive_now() - hour) == 105.0
    assert any_ledger.live_published_up_to("tanks-1", 1, "cal-1", naive_now() + hour) is None  # none since
    # the followed recommendation closed (its valid_until passed): the next is written whole
    any_ledger.expire_past_valid_until(now=naive_now() + timedelta(days=30))
    lapsed = replace(_new(live_t=110.0), follows=follows)
    assert any_ledger.publish_live("live-a", [lapsed]) == [(lapsed.run.id, True)]


def test_a_batch_with_a_bad_publication_writes_none_of_it(any_ledger):
    good = _new()
    bad = _new("heater-1")
    bad = replace(bad, candidates=[replace(bad.candidates[0], controls=((1.0, float("inf")), (1.5, 2.0)))])
    with pytest.raises(ContractError, match="non-finite|finite"):
        any_ledger.publish_live("live-a", [good, bad])
    assert any_ledger.counts()["optimizer_runs"] == 0 and any_ledger.counts()["live_publications"] == 0


def test_the_heartbeat_says_which_services_are_alive(any_ledger):
    any_ledger.live_register("live-a", "host-a", 11, None)
    any_ledger.live_register("live-b", "host-b", 12, ["tanks-1"])
    any_ledger.live_heartbeat("live-b", "serving")
    [b, a] = any_ledger.live_services(alive_within_s=60)
    assert (a.id, a.state, a.serves("anything")) == ("live-a", "starting", True)
    assert (b.state, b.serves("tanks-1"), b.serves("heater-1")) == ("serving", True, False)
    any_ledger.live_heartbeat("live-a", "stopped")
    assert [s.id for s in any_ledger.live_services(alive_within_s=60)] == ["live-b"]
    later = naive_now() + timedelta(seconds=61)
    assert any_ledger.live_services(alive_within_s=60, now=later) == []
    assert [s.stopped_at is not None for s in any_ledger.live_services()] == [False, True]
    with pytest.raises(ValueError, match="state must be one of"):
        any_ledger.live_heartbeat("live-a", "asleep")


def test_samples_are_found_by_ingestion_time_and_read_by_run_and_newest_rows(any_ledger):
    tags = ("v1", "y1")
    frame = pd.DataFrame({"run_id": ["r1"] * 3 + ["r2"] * 4, "timestamp": [0.0, 5, 10, 20, 25, 30, 35],
                          "v1": np.arange(7.0), "y1": np.arange(7.0) * 2})
    assert any_ledger.samples_ingested_since(None) == ({}, None)
    any_ledger.append_samples("b1", frame, tags, "real")
    newest, since = any_ledger.samples_ingested_since(None)
    assert newest == {"b1": 35.0} and since is not None
    assert any_ledger.samples_ingested_since(since)[0] == {}
    more = pd.DataFrame({"run_id": ["r2"], "timestamp": [40.0], "v1": [7.0], "y1": [14.0]})
    any_ledger.append_samples("b1", more, tags, "real")
    assert any_ledger.samples_ingested_since(since)[0] == {"b1": 40.0}
    assert any_ledger.newest_run("b1") == "r2"
    tail = any_ledger.recent_samples("b1", tags, run_id="r2", rows=3)
    assert tail["timestamp"].tolist() == [30.0, 35.0, 40.0] and tail["y1"].tolist() == [10.0, 12.0, 14.0]
    after = any_ledger.recent_samples("b1", tags, after_ts=25.0)
    assert after["timestamp"].tolist() == [30.0, 35.0, 40.0] and set(after["run_id"]) == {"r2"}
    assert any_ledger.recent_samples("b1", tags, after_ts=40.0).empty


def test_fingerprints_change_with_the_revision(any_ledger, binding_doc):
    from optimizer_pipeline.contracts import binding_from_dict

    any_ledger.upsert_binding(binding_from_dict(binding_doc))
    [(binding_id, first)] = any_ledger.fingerprints().items()
    assert (first.revision, first.artifact_hash, first.calibration_id, first.verdicts) == (1, None, None, 0)
    binding_doc["cvs"][0]["target"] = 6.0
    any_ledger.upsert_binding(binding_from_dict(binding_doc))
    assert any_ledger.fingerprints()[binding_id].revision == 2


def test_a_lease_is_taken_once_renewed_by_its_holder_and_free_again_when_released_or_expired(any_ledger):
    assert any_ledger.live_lease("live-a", take=["b1", "b2"], keep=[], release=[], ttl_s=60) == {"b1", "b2"}
    assert any_ledger.live_lease("live-b", take=["b1", "b2", "b3"], keep=[], release=[], ttl_s=60) == {"b3"}
    assert any_ledger.live_leases() == {"b1": "live-a", "b2": "live-a", "b3": "live-b"}
    # live-a keeps b1 and gives b2 up: live-b takes it; a renewal of a lease it does not hold is refused
    assert any_ledger.live_lease("live-a", take=[], keep=["b1", "b3"], release=["b2"], ttl_s=60) == {"b1"}
    assert any_ledger.live_lease("live-b", take=["b2"], keep=["b3"], release=[], ttl_s=60) == {"b2", "b3"}
    # live-a stops renewing: once its lease has expired, another service takes it
    assert any_ledger.live_lease("live-a", take=[], keep=["b1"], release=[], ttl_s=3.0) == {"b1"}
    assert any_ledger.live_lease("live-b", take=["b1"], keep=["b2", "b3"], release=[], ttl_s=60) == {"b2", "b3"}
    # the lease's expiry is the event, and it is on the clock: live_lease stamps expires_at = now + ttl_s
    # with this process's clock and live_leases compares it with the same clock, so 3.1 s after the
    # renewal returned it has passed however slow the machine (the take just above needs to come within
    # 3 s of the renewal: two ledger calls, milliseconds quiet)
    time.sleep(3.1)
    assert "b1" not in any_ledger.live_leases()
    assert any_ledger.live_lease("live-b", take=["b1"], keep=["b2", "b3"], release=[], ttl_s=60) == {"b1", "b2", "b3"}


def test_live_runs_names_each_bindings_live_run_newest_sample_and_source_in_one_read(any_ledger, binding_doc):
    from optimizer_pipeline.contracts import binding_from_dict

    spec = binding_from_dict(binding_doc)
    any_ledger.upsert_binding(spec)
    other = binding_from_dict({**binding_doc, "id": "tanks-2"})
    any_ledger.upsert_binding(other)

    def rows(run_id, times):
        return pd.DataFrame({"run_id": run_id, "timestamp": times, **{tag: 1.0 for tag in spec.tags}})

    any_ledger.append_samples("tanks-1", rows("r1", [10.0, 20.0]), spec.tags, "simulation")
    any_ledger.append_samples("tanks-1", rows("r2", [15.0, 30.0]), spec.tags, "real")
    any_ledger.append_samples("tanks-2", rows("a", [5.0]), spec.tags, "simulation")
    any_ledger.append_samples("tanks-2", rows("b", [5.0]), spec.tags, "simulation")  # a tie: the larger run id
    assert any_ledger.live_runs() == {"tanks-1": ("r2", 30.0, "real"), "tanks-2": ("b", 5.0, "simulation")}
    assert any_ledger.newest_run("tanks-2") == "b"
