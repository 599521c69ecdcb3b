"""Run split: by run, deterministic per seed, live run excluded, normalisation from train only, data hash."""

import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline.contracts import ContractError, RunSeries, binding_from_dict
from optimizer_pipeline.data.ingest import HistoryError
from optimizer_pipeline.data.prepare import default_min_length, prepare_history
from optimizer_pipeline.data.split import split_runs
from optimizer_pipeline.data.split import SPLIT_FRACTIONS, split_counts


def _binding(model=None, dvs=("f1",)):
    return binding_from_dict({
        "id": "t1", "sample_period_s": 5,
        "mvs": [{"tag": "v1", "lo": 0, "hi": 6, "max_move": 0.5}],
        "cvs": [{"tag": "y1", "lo": -10, "hi": 10, "target": 0}, {"tag": "y2", "lo": -10, "hi": 10, "target": 0}],
        "dvs": [{"tag": t} for t in dvs],
        "model": model or {"horizon": 10},
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
    })


def _runs(n_runs=11, n=30, seed=0):
    """Runs r00.. with distinct random values; run i starts at 1000 i (so the last one is the live run)."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n_runs):
        t = 1000.0 * i + 5.0 * np.arange(n)
        u, y, d = rng.normal(i, 1, (n, 1)), rng.normal(-i, 2, (n, 2)), rng.normal(0, 1, (n, 1))
        runs.append(RunSeries(f"r{i:02d}", t, u, y, d))
    return runs


def _ids(split):
    return {name: [r.run_id for r in getattr(split, name)] for name in ("train", "val", "test")}


def test_same_seed_gives_the_same_split_and_hash():
    a, b = split_runs(_runs(), _binding(), seed=3), split_runs(_runs()[::-1], _binding(), seed=3)
    assert _ids(a) == _ids(b) and a.data_hash == b.data_hash


def test_different_seeds_can_give_different_splits():
    splits = {str(_ids(split_runs(_runs(), _binding(), seed=s))) for s in range(5)}
    assert len(splits) > 1


def test_every_run_lands_whole_in_exactly_one_split():
    runs = _runs()
    split = split_runs(runs, _binding(), seed=1)
    placed = [r for name in ("train", "val", "test") for r in getattr(split, name)] + [split.live]
    assert sorted(r.run_id for r in placed) == [r.run_id for r in runs]
    by_id = {r.run_id: r for r in runs}
    assert all(r is by_id[r.run_id] for r in placed)  # the run itself, all rows, never a row subset


def test_live_run_is_the_latest_and_excluded():
    runs = _runs()
    runs[3] = RunSeries("late", runs[3].t + 20000.0, runs[3].u, runs[3].y, runs[3].d)
    split = split_runs(runs, _binding())
    assert split.live.run_id == "late"
    assert "late" not in sum(_ids(split).values(), [])
    assert split.report["runs"]["live"] == ["late"]


@pytest.mark.parametrize("n, expected", [(1, (1, 0, 0)), (2, (1, 1, 0)), (3, (1, 1, 1)), (4, (2, 1, 1)),
                                         (5, (3, 1, 1)), (7, (4, 2, 1)), (10, (6, 2, 2)), (11, (7, 2, 2))])
def test_split_counts_follow_the_rounding_rule(n, expected):
    assert split_counts(n, (0.6, 0.2, 0.2)) == expected


@pytest.mark.parametrize("n, expected", [(1, (1, 0, 0)), (2, (1, 1, 0)), (3, (1, 1, 1)), (5, (3, 1, 1)),
                                         (10, (6, 2, 2)), (13, (7, 3, 3)), (15, (8, 3, 4))])
def test_default_split_gives_test_at_least_val(n, expected):
    """The default 55/20/25 (the module docstring's table): test as many runs as val or more from three runs
    on, val one run from two runs on (selection scores on it) though its share alone would give it none."""
    assert split_counts(n, SPLIT_FRACTIONS) == expected


def test_split_sizes_match_split_counts():
    split = split_runs(_runs(11), _binding())
    assert tuple(len(getattr(split, name)) for name in ("train", "val", "test")) == (6, 2, 2)


def test_normalisation_is_computed_from_train_rows_only():
    runs = _runs()
    split = split_runs(runs, _binding(), seed=2)
    train_ids = set(_ids(split)["train"])
    rows = np.vstack([np.column_stack([r.u, r.y, r.d]) for r in runs if r.run_id in train_ids])
    assert split.normalisation.tags == ("v1", "y1", "y2", "f1")
    np.testing.assert_allclose(split.normalisation.mean, rows.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(split.normalisation.std, rows.std(axis=0), rtol=1e-12)
    all_rows = np.vstack([np.column_stack([r.u, r.y, r.d]) for r in runs])
    assert not np.allclose(split.normalisation.mean, all_rows.mean(axis=0))


def test_constant_tag_keeps_its_tiny_std_and_warns():
    runs = [RunSeries(r.run_id, r.t, r.u, r.y, np.full_like(r.d, 4.0)) for r in _runs(5)]
    split = split_runs(runs, _binding())
    assert split.normalisation.std[3] == 0.0
    assert any("'f1' is constant" in w for w in split.report["warnings"])


def test_a_single_run_is_not_enough():
    with pytest.raises(HistoryError, match=r"1 usable run\(s\) after cleaning; at least 2 runs are needed "
                                           r"\(1 live \+ >= 1 train\)"):
        split_runs(_runs(1), _binding())


def test_bad_fractions_are_rejected():
    with pytest.raises(ContractError, match=r"split fractions"):
        split_runs(_runs(), _binding(), fractions=(0.5, 0.2, 0.2))


def test_data_hash_changes_when_a_train_sample_changes():
    runs = _runs()
    split = split_runs(runs, _binding())
    victim = split.train[0]
    y = victim.y.copy()
    y[0, 0] += 1e-9
    changed = [RunSeries(r.run_id, r.t, r.u, y, r.d) if r is victim else r for r in runs]
    assert split_runs(changed, _binding()).data_hash != split.data_hash


def test_data_hash_ignores_new_live_samples():
    runs = _runs()
    live = runs[-1]
    longer = RunSeries(live.run_id, np.append(live.t, live.t[-1] + 5), np.vstack([live.u, live.u[-1:]]),
                       np.vstack([live.y, live.y[-1:]]), np.vstack([live.d, live.d[-1:]]))
    assert split_runs(runs[:-1] + [longer], _binding()).data_hash == split_runs(runs, _binding()).data_hash


# --------------------------------------------------------------------------- prepare_history


def _frame(n_runs, lengths):
    rng = np.random.default_rng(7)
    parts = [pd.DataFrame({"run_id": f"run{i}", "timestamp": 1000.0 * i + 5.0 * np.arange(n),
                           "v1": rng.normal(size=n), "y1": rng.normal(size=n), "y2": rng.normal(size=n),
                           "f1": rng.normal(size=n)})
             for i, n in zip(range(n_runs), lengths)]
    return pd.concat(parts, ignore_index=True)


def test_default_min_length_is_one_model_window():
    assert default_min_length(_binding({"na": 2, "nb": 3, "delay": 2, "horizon": 10})) == 4 + 10 + 1
    # orders left to the data: a delay per channel up to 12 samples with nb <= 3 (model/select.py)
    assert default_min_length(_binding({"horizon": 10})) == 14 + 10 + 1
    assert default_min_length(_binding({"delay": 2, "horizon": 10})) == 4 + 10 + 1  # grid na, nb <= 3


def test_prepare_history_drops_short_runs_and_keeps_the_cleaning_report():
    split = prepare_history(_frame(6, [40, 40, 16, 40, 40, 40]), _binding({"horizon": 10}))
    assert split.report["cleaning"]["dropped"] == [
        {"run_id": "run2", "reason": "16 samples after cleaning < min_length 25 (one model window)"}]
    assert "run2" not in sum(_ids(split).values(), []) + [split.live.run_id]
    assert split.live.run_id == "run5"


def test_prepare_history_warns_when_the_live_tail_was_dropped():
    split = prepare_history(_frame(4, [40, 40, 40, 5]), _binding())
    assert split.live.run_id == "run2"
    assert any("newest samples were dropped" in w for w in split.report["warnings"])
    latest = _frame(4, [40, 40, 40, 5])["timestamp"].max()
    assert split.report["live_tail_dropped"] and split.report["live_behind_s"] == latest - split.live.t[-1] > 0


def test_prepare_history_does_not_warn_about_grid_snapping_of_the_last_sample():
    frame = _frame(4, [40, 40, 40, 40])
    frame.loc[frame.index[-1], "timestamp"] += 2.0  # jitter < half a period
    split = prepare_history(frame, _binding())
    assert split.report["warnings"] == []
    assert split.report["live_behind_s"] == 2.0 and split.report["live_tail_dropped"] is False


@pytest.mark.parametrize("empty, missing", [
    ((), []), (("f1",), []),  # a DV without a value is not the state the plan starts from
    (("y2",), ["y2"]), (("f1", "v1", "y1"), ["v1", "y1"]),
])
def test_prepare_history_names_the_mvs_and_cvs_without_a_value_in_the_newest_sample(empty, missing):
    frame = _frame(4, [40, 40, 40, 40])
    for tag in empty:
        frame.loc[frame.index[-1], tag] = np.nan
    frame.loc[frame.index[-2], "y1"] = np.nan  # one sample before the newest: cleaning's business
    assert prepare_history(frame, _binding()).report["live_missing"] == missing


@pytest.mark.parametrize("after_gap, warming", [(5, True), (24, True), (25, False)])
def test_the_newest_samples_after_a_gap_are_warming_up_until_they_hold_the_models_window(after_gap, warming):
    binding = _binding()
    need = default_min_length(binding)  # 25
    frame = _frame(4, [40, 40, 40, 40])
    live = frame[frame["run_id"] == "run3"]
    more = live.tail(after_gap).assign(timestamp=live["timestamp"].max() + 5.0 * (10 + np.arange(after_gap)))
    split = prepare_history(pd.concat([frame, more], ignore_index=True), binding)
    expected = {"samples": after_gap, "needed": need, "since": float(more["timestamp"].iloc[0])} if warming \
        else None
    assert split.report["live_warming_up"] == expected
    assert split.report["live_tail_dropped"] is warming


def _in_pieces(run, cut):
    """`run` as cleaning splits it at a gap after row `cut`: two pieces of one run of the plant."""
    return [RunSeries(f"{run.run_id}#{i + 1}", run.t[rows], run.u[rows], run.y[rows], run.d[rows],
                      source_run=run.run_id) for i, rows in enumerate((slice(None, cut), slice(cut, None)))]


def test_the_pieces_of_a_run_split_at_a_gap_go_to_one_split_together():
    """A run cleaning split at a gap is one run of the plant: its pieces land in the same split (val and
    test never hold parts of one run), and the counts follow the rounding rule over the plant's runs."""
    base = _runs()  # r00 .. r09, live r10
    runs = [piece for run in base[:6] for piece in _in_pieces(run, 12)] + base[6:]
    for seed in range(20):
        split = split_runs(runs, _binding(), seed=seed)
        homes: dict[str, set] = {}
        for name in ("train", "val", "test"):
            for run in getattr(split, name):
                homes.setdefault(run.plant_run, set()).add(name)
        assert all(len(names) == 1 for names in homes.values()), (seed, homes)
        assert len(homes) == 10 and split.live.run_id == "r10"
        units = tuple(len({r.plant_run for r in getattr(split, name)}) for name in ("train", "val", "test"))
        assert units == split_counts(10, SPLIT_FRACTIONS)


def test_the_live_runs_earlier_piece_is_a_run_of_its_own_split():
    """The live run's own earlier piece (before a gap) is not the live state: it goes to a split, whole."""
    base = _runs(n_runs=6)
    runs = base[:5] + _in_pieces(base[5], 12)
    split = split_runs(runs, _binding(), seed=0)
    assert split.live.run_id == "r05#2"
    assert sorted(r.run_id for name in ("train", "val", "test") for r in getattr(split, name)) == \
        ["r00", "r01", "r02", "r03", "r04", "r05#1"]
