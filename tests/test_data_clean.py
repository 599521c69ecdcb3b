"""Cleaning: outliers, grid alignment, gap interpolation vs split, drops — each recorded with its reason."""

import json

import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.data.clean import clean_runs

PERIOD = 5.0


def _binding(dvs=()):
    return binding_from_dict({
        "id": "t1", "sample_period_s": PERIOD,
        "mvs": [{"tag": "v1", "lo": 0, "hi": 6, "max_move": 0.5}],
        "cvs": [{"tag": "y1", "lo": -10, "hi": 10, "target": 0}],
        "dvs": [{"tag": t} for t in dvs],
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
    })


def _run(run_id="r1", n=40, t0=1000.0, dv=False):
    """A smooth CV (sine), a stepping MV, on an exact grid; row k at t0 + 5 k."""
    k = np.arange(n)
    frame = pd.DataFrame({"run_id": run_id, "timestamp": t0 + PERIOD * k,
                          "v1": np.where((k // 4) % 2 == 0, 1.0, 2.0), "y1": np.sin(k / 6.0)})
    if dv:
        frame["f1"] = np.cos(k / 9.0)
    return frame


def _entry(report, run_id):
    return next(r for r in report["runs"] if r["run_id"] == run_id)


def test_clean_run_without_defects_is_unchanged():
    frame = _run()
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    np.testing.assert_array_equal(series.t, frame["timestamp"])
    np.testing.assert_array_equal(series.u[:, 0], frame["v1"])
    np.testing.assert_array_equal(series.y[:, 0], frame["y1"])
    assert _entry(report, "r1")["action"] == "kept" and _entry(report, "r1")["flagged"] == 0


def test_shapes_follow_binding_tag_groups_and_no_dv_gives_empty_d():
    (series,), _ = clean_runs(_run(n=20), _binding(), min_length=5)
    assert (series.u.shape, series.y.shape, series.d.shape, series.t.shape) == ((20, 1), (20, 1), (20, 0), (20,))
    (series,), _ = clean_runs(_run(n=20, dv=True), _binding(dvs=["f1"]), min_length=5)
    np.testing.assert_array_equal(series.d[:, 0], np.cos(np.arange(20) / 9.0))


def test_spike_is_removed_counted_and_replaced_by_interpolation():
    frame = _run()
    frame.loc[17, "y1"] = 40.0
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    expected = (np.sin(16 / 6.0) + np.sin(18 / 6.0)) / 2
    assert series.y[17, 0] == pytest.approx(expected, abs=1e-12)
    np.testing.assert_array_equal(np.delete(series.y[:, 0], 17), np.delete(np.sin(np.arange(40) / 6.0), 17))
    assert _entry(report, "r1")["flagged"] == 1 and _entry(report, "r1")["flagged_by_tag"] == {"y1": {"spike": 1}}
    assert report["totals"]["flagged"] == {"y1": {"spike": 1}}


@pytest.mark.parametrize("last", [1, 2, 3])
def test_a_step_in_the_newest_samples_is_kept_and_the_run_keeps_its_end(last):
    """A DV that steps in the run's last 1-3 samples: without samples after them a step looks like a
    spike to the window, and cutting it made the live run end a sample before "now"."""
    frame = _run(dv=True)
    frame.loc[40 - last:, "f1"] = 5.0
    (series,), report = clean_runs(frame, _binding(dvs=["f1"]), min_length=10)
    assert len(series.t) == 40 and series.t[-1] == frame["timestamp"].iloc[-1]
    np.testing.assert_array_equal(series.d[-last:, 0], 5.0)
    np.testing.assert_array_equal(series.u[:, 0], frame["v1"])
    assert _entry(report, "r1")["flagged"] == 0 and _entry(report, "r1")["action"] == "kept"


@pytest.mark.parametrize("row", [35, 36, 37, 38])
def test_a_spike_near_the_end_with_normal_samples_after_it_is_still_removed(row):
    frame = _run()
    frame.loc[row, "y1"] = 40.0
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    assert series.y[row, 0] == pytest.approx((np.sin((row - 1) / 6.0) + np.sin((row + 1) / 6.0)) / 2, abs=1e-12)
    assert len(series.t) == 40 and _entry(report, "r1")["flagged_by_tag"] == {"y1": {"spike": 1}}


def test_only_the_newest_run_keeps_a_step_at_its_end():
    """A finished run's flagged end is cut as before: no sample will come after it to judge it."""
    finished, newest = _run("r0", dv=True), _run("r1", t0=2000.0, dv=True)
    finished.loc[39, "f1"] = 5.0
    newest.loc[39, "f1"] = 5.0
    series, report = clean_runs(pd.concat([finished, newest]), _binding(dvs=["f1"]), min_length=10)
    assert [len(s.t) for s in series] == [39, 40]
    assert _entry(report, "r0")["action"] == "trimmed" and _entry(report, "r1")["action"] == "kept"


def test_mv_pulses_are_not_treated_as_outliers():
    frame = _run()
    frame["v1"] = 1.0
    frame.loc[[10, 20, 21], "v1"] = 3.0  # a one-sample and a two-sample move of a step test
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    np.testing.assert_array_equal(series.u[:, 0], frame["v1"])
    assert _entry(report, "r1")["flagged"] == 0


def test_non_finite_values_are_dropped_and_filled():
    frame = _run()
    frame.loc[5, "y1"] = np.inf
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    assert series.y[5, 0] == pytest.approx((np.sin(4 / 6.0) + np.sin(6 / 6.0)) / 2, abs=1e-12)
    assert _entry(report, "r1")["non_finite"] == 1


def test_jittered_samples_snap_to_the_grid_anchored_at_the_first_timestamp():
    frame = _run(n=20)
    frame["timestamp"] += np.random.default_rng(0).uniform(-2.0, 2.0, 20) * (np.arange(20) > 0)
    (series,), _ = clean_runs(frame, _binding(), min_length=5)
    np.testing.assert_allclose(series.t, frame["timestamp"].iloc[0] + PERIOD * np.arange(20))
    np.testing.assert_array_equal(series.y[:, 0], frame["y1"])


def test_two_samples_in_one_bucket_are_averaged():
    frame = _run(n=20)
    extra = frame.iloc[[6]].assign(timestamp=frame["timestamp"].iloc[6] + 1.0, y1=frame["y1"].iloc[6] + 0.2)
    frame = pd.concat([frame, extra]).sort_values("timestamp")
    (series,), _ = clean_runs(frame, _binding(), min_length=5)
    assert series.y[6, 0] == pytest.approx(np.sin(6 / 6.0) + 0.1, abs=1e-12)
    assert len(series) == 20


def test_gap_of_three_samples_is_interpolated():
    frame = _run().drop(index=[20, 21, 22])
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    assert len(series) == 40 and series.run_id == "r1"
    y19, y23 = np.sin(19 / 6.0), np.sin(23 / 6.0)
    np.testing.assert_allclose(series.y[20:23, 0], y19 + (y23 - y19) * np.arange(1, 4) / 4)
    entry = _entry(report, "r1")
    assert (entry["action"], entry["interpolated"]) == ("kept", 6)  # 3 samples x 2 tags


def test_cv_values_filled_in_are_marked_unmeasured_and_a_measured_run_has_no_mark():
    """A spike removed and a gap interpolated are values cleaning made: marked in RunSeries.unmeasured
    (CVs only; an MV's interpolated values are inputs, not fitted)."""
    (clean,), _ = clean_runs(_run(), _binding(), min_length=10)
    assert clean.unmeasured is None
    frame = _run()
    frame.loc[17, "y1"] = 40.0
    frame.loc[[25, 26], ["v1", "y1"]] = np.nan
    (series,), _ = clean_runs(frame, _binding(), min_length=10)
    assert series.unmeasured.shape == (40, 1) and np.flatnonzero(series.unmeasured[:, 0]).tolist() == [17, 25, 26]


@pytest.mark.parametrize("missing", [1, 2, 3])
def test_the_newest_runs_last_missing_cv_values_are_held_and_marked_for_the_live_state(missing):
    finished, newest = _run("r0"), _run("r1", t0=2000.0)
    for frame in (finished, newest):
        frame.loc[40 - missing:, "y1"] = np.nan
    series, report = clean_runs(pd.concat([finished, newest]), _binding(), min_length=10)
    assert [len(s) for s in series] == [40 - missing, 40]  # a finished run's end is cut as before
    live = series[1]
    np.testing.assert_array_equal(live.y[40 - missing:, 0], np.sin((39 - missing) / 6.0))  # a placeholder
    assert live.newest_unmeasured == missing and live.unmeasured[:40 - missing].sum() == 0
    assert (_entry(report, "r1")["action"], _entry(report, "r1")["held_newest"]) == ("kept", missing)


@pytest.mark.parametrize("columns, rows", [(["y1"], 4), (["v1"], 1), (["v1", "y1"], 1), (["f1"], 1)])
def test_the_newest_runs_end_is_cut_when_more_than_a_few_cv_values_or_an_input_are_missing(columns, rows):
    frame = _run(dv=True)
    frame.loc[40 - rows:, columns] = np.nan
    (series,), report = clean_runs(frame, _binding(dvs=["f1"]), min_length=10)
    assert len(series) == 40 - rows and series.unmeasured is None
    assert _entry(report, "r1")["action"] == "trimmed" and _entry(report, "r1")["held_newest"] == 0


def test_gap_of_four_samples_splits_the_run_with_the_reason():
    frame = _run().drop(index=[20, 21, 22, 23])
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [(s.run_id, len(s)) for s in series] == [("r1#1", 20), ("r1#2", 16)]
    assert [(s.source_run, s.plant_run) for s in series] == [("r1", "r1")] * 2  # one run of the plant
    np.testing.assert_array_equal(series[1].t, 1000.0 + PERIOD * np.arange(24, 40))
    entry = _entry(report, "r1")
    assert entry["action"] == "split" and entry["pieces"] == ["r1#1", "r1#2"]
    assert "a gap of 4 samples (20 s) in 'v1', 'y1' starting 100 s into the run" in entry["reason"]


def test_long_gap_in_one_tag_splits_the_run():
    frame = _run()
    frame.loc[10:19, "y1"] = np.nan
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [(s.run_id, len(s)) for s in series] == [("r1#1", 10), ("r1#2", 20)]
    assert "in 'y1' starting" in _entry(report, "r1")["reason"]


def test_short_run_is_dropped_with_its_reason():
    frame = pd.concat([_run("long", n=40), _run("short", n=8, t0=5000.0)])
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [(s.run_id, s.source_run, s.plant_run) for s in series] == [("long", "", "long")]
    assert report["dropped"] == [
        {"run_id": "short", "reason": "8 samples after cleaning < min_length 10 (one model window)"}]
    assert _entry(report, "short")["action"] == "dropped"


def test_short_piece_after_a_split_is_dropped_and_the_rest_kept():
    frame = _run().drop(index=range(5, 12))  # piece #1 has 5 samples
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [(s.run_id, s.plant_run) for s in series] == [("r1#2", "r1")]
    assert report["dropped"][0]["run_id"] == "r1#1" and "5 samples" in report["dropped"][0]["reason"]
    assert _entry(report, "r1")["action"] == "split"


def test_missing_values_at_the_run_edge_are_trimmed():
    frame = _run()
    frame.loc[[0, 1], "y1"] = np.nan
    (series,), report = clean_runs(frame, _binding(), min_length=10)
    assert series.run_id == "r1" and series.t[0] == 1000.0 + 2 * PERIOD
    assert _entry(report, "r1")["action"] == "trimmed"


def test_run_without_values_of_a_tag_is_dropped_naming_the_tag():
    frame = pd.concat([_run("a"), _run("b", t0=5000.0).assign(y1=np.nan)])
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [s.run_id for s in series] == ["a"]
    assert report["dropped"] == [{"run_id": "b", "reason": "no values of 'y1' in this run"}]


def test_runs_come_out_in_start_time_order():
    frame = pd.concat([_run("z", t0=0.0), _run("a", t0=9000.0), _run("m", t0=4000.0)])
    series, _ = clean_runs(frame, _binding(), min_length=10)
    assert [s.run_id for s in series] == ["z", "m", "a"]


def test_report_is_json_serialisable():
    frame = pd.concat([_run().drop(index=[20, 21, 22, 23]), _run("s", n=3, t0=9000.0)])
    frame.loc[frame.index == 7, "y1"] = 99.0
    _, report = clean_runs(frame, _binding(), min_length=10)
    assert json.loads(json.dumps(report, allow_nan=False)) == report


def test_gaussian_noise_is_not_eroded_by_the_outlier_filter():
    # The plain 7-sample Hampel rule flags ~4.7 % of white Gaussian noise; the noise floor keeps it
    # near the nominal 3-sigma rate (0.27 %).
    noise = np.random.default_rng(5).normal(0.0, 0.5, 20000)
    frame = pd.DataFrame({"run_id": "r1", "timestamp": PERIOD * np.arange(noise.size), "v1": 1.0, "y1": noise})
    _, report = clean_runs(frame, _binding(), min_length=10)
    assert report["runs"][0]["flagged"] / noise.size < 0.005


def test_spike_in_noise_is_removed():
    rng = np.random.default_rng(6)
    y = np.sin(np.arange(400) / 30.0) + rng.normal(0.0, 0.05, 400)
    y[[50, 200, 333]] += np.array([1.0, -1.0, 1.5])  # 20 to 30 sigma
    frame = pd.DataFrame({"run_id": "r1", "timestamp": PERIOD * np.arange(400), "v1": 1.0, "y1": y})
    (series,), _ = clean_runs(frame, _binding(), min_length=10)
    assert np.all(np.abs(series.y[[50, 200, 333], 0] - np.sin(np.array([50, 200, 333]) / 30.0)) < 0.2)


def test_long_shutdown_inside_a_run_splits_without_building_its_empty_grid():
    frame = pd.concat([_run(n=20), _run(n=20, t0=1000.0 + 1e9)])  # ~30 years of no samples at 5 s
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert [(s.run_id, len(s)) for s in series] == [("r1#1", 20), ("r1#2", 20)]
    np.testing.assert_array_equal(series[1].t, 1000.0 + 1e9 + PERIOD * np.arange(20))
    entry = report["runs"][0]
    assert entry["grid_samples"] == 40
    assert f"a gap of {int(1e9 / PERIOD) - 20} samples" in entry["reason"] and "in 'v1', 'y1'" in entry["reason"]


def test_history_sampled_slower_than_the_grid_is_warned_and_reasons_stay_short():
    frame = _run(n=30)
    frame["timestamp"] = 1000.0 + 30.0 * np.arange(30)  # every 6th grid point has a sample
    series, report = clean_runs(frame, _binding(), min_length=10)
    assert series == [] and "sampled every 30 s" in report["warnings"][0]
    reason = report["runs"][0]["reason"]
    assert "... and 26 more" in reason and len(reason) < 600
