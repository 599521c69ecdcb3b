"""History as plants record it (data/flags.py): spikes, stuck transmitters, values pinned at a range's end
and slices excluded by hand count as missing in cleaning, are reported where users look (the cleaning
report, ingest's summary, the artifact, `ledger`), and a flagged newest sample keeps a plan unverified.
Each rule on both sides of its threshold."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
import shutil

from test_cli import assert_one_line_error, cli, cli_main

from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import ContractError, binding_from_dict
from optimizer_pipeline.data.clean import clean_newest_run, clean_runs
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.data.flags import (SPIKE_SIGMAS, STUCK_MIN_SAMPLES, noise_sigma, repeat_frequency, spikes,
                                           stuck)
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

PERIOD = 1.0


def binding(**cv):
    return binding_from_dict({
        "id": "f1", "sample_period_s": PERIOD,
        "mvs": [{"tag": "u", "lo": 0, "hi": 10, "max_move": 1}],
        "cvs": [{"tag": "y", "lo": 10, "hi": 90, "target": 50, **cv}],
        "dvs": [{"tag": "d"}], "model": {"na": 1, "nb": 1, "delay": 1, "horizon": 5},
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"}})


def frame(y, u=None, d=None, run="r1", t0=0.0):
    n = len(y)
    rng = np.random.default_rng(3)
    return pd.DataFrame({"run_id": run, "timestamp": t0 + PERIOD * np.arange(n),
                         "u": np.ones(n) if u is None else u, "y": y,
                         "d": rng.normal(0, 0.1, n) if d is None else d})


def step_response(n=300, noise=0.1, seed=0):
    """A CV answering MV steps of 3 (30 noise sigmas) every 50 samples through a first-order lag of 4
    samples, with noise."""
    rng = np.random.default_rng(seed)
    u = 3.0 * ((np.arange(n) // 50) % 2)
    y = np.zeros(n)
    for k in range(1, n):
        y[k] = y[k - 1] + (u[k - 1] - y[k - 1]) / 4.0
    return u, 40.0 + y + rng.normal(0, noise, n)


def flagged(report, rule):
    return sorted((s["tag"], s["run_id"], s["start_s"], s["samples"]) for s in report["flags"] if s["rule"] == rule)


# --------------------------------------------------------------------------- spikes


def test_a_spike_on_a_moving_cv_is_flagged_and_the_move_itself_is_not():
    """Spikes of +-20 noise sigmas inside the fast transients (a window median's MAD there is 5-30 sigmas: the
    Hampel filter this rule replaced missed such spikes); the steps of the response are kept."""
    u, y = step_response()
    glitches = [52, 53 + 50, 151, 202, 253]  # in the first samples of each response
    y[glitches] += np.array([2.0, -2.0, 2.0, -2.0, 2.0])
    mask = spikes(y[:, None], noise_sigma(y[:, None]))[:, 0]
    assert np.flatnonzero(mask).tolist() == glitches


def test_a_level_step_and_a_spike_at_a_runs_end():
    """A step is kept wherever it falls, also in the last two samples; a spike next to a run's edge is seen
    (the short side through its neighbour); the newest run's last sample is left to the samples after it."""
    rng = np.random.default_rng(1)
    for last in (1, 2, 3):
        y = rng.normal(0, 0.1, 60)
        y[-last:] += 5.0
        assert not spikes(y[:, None], noise_sigma(y[:, None]), open_end=True).any()
    y = rng.normal(0, 0.1, 60)
    y[[1, 58]] += 3.0
    assert np.flatnonzero(spikes(y[:, None], noise_sigma(y[:, None]))[:, 0]).tolist() == [1, 58]
    y[-1] += 3.0  # the last sample of a finished run: judged by its one side; of the newest, not yet
    assert spikes(y[:, None], noise_sigma(y[:, None]))[-1, 0]
    assert not spikes(y[:, None], noise_sigma(y[:, None]), open_end=True)[-1, 0]


def test_a_spike_of_two_samples_is_flagged_and_a_step_of_two_is_not():
    """Two neighbouring samples off by 20 and 15 noise sigmas, on a moving CV and at rest: both flagged and
    nothing else, also in a step response's first samples; the same displacement held on (a step) is not
    flagged, and two samples off the opposite ways are each a spike alone."""
    u, y = step_response()
    glitches = [30, 52, 120, 170]  # 52: in the response to the step at 50, the way it moves
    for k, sign in zip(glitches, (-1, 1, 1, -1)):
        y[[k, k + 1]] += sign * np.array([2.0, 1.5])
    mask = spikes(y[:, None], noise_sigma(y[:, None]))[:, 0]
    assert np.flatnonzero(mask).tolist() == sorted(glitches + [k + 1 for k in glitches])
    _, stepped = step_response()
    stepped[120:] += 2.0  # a step of 20 sigmas: one side moves
    assert not spikes(stepped[:, None], noise_sigma(stepped[:, None])).any()
    _, opposite = step_response()
    opposite[[120, 121]] += [2.0, -2.0]
    assert np.flatnonzero(spikes(opposite[:, None], noise_sigma(opposite[:, None]))[:, 0]).tolist() == [120, 121]


def test_a_pair_next_to_a_runs_edge_and_a_burst_of_two_pairs():
    """A pair two samples from either edge is flagged, and the edge sample whose one side runs through it is
    not; two pairs with two clean samples between them (the clean ones look like a pair against them) are a
    burst: nothing flagged rather than the clean samples (an exclusion by hand is for bursts)."""
    base = np.random.default_rng(4).normal(0, 0.1, 60)
    for pair in ([2, 3], [56, 57]):
        y = base.copy()
        y[pair] += 2.5
        assert np.flatnonzero(spikes(y[:, None], noise_sigma(y[:, None]))[:, 0]).tolist() == pair
    burst = base.copy()
    burst[[8, 9, 12, 13]] -= 2.5
    assert not spikes(burst[:, None], noise_sigma(burst[:, None]))[10:12].any()


def test_white_noise_gets_no_spike_flag():
    """The threshold's false-flag rate on clean noise: none in 400 000 samples at 4 sigmas (two sides
    beyond it by chance: < 1e-6 per sample measured; one side alone would flag ~6e-5), single samples or
    pairs."""
    noise = np.random.default_rng(7).normal(size=(100_000, 4))
    assert SPIKE_SIGMAS == 4.0 and not spikes(noise, noise_sigma(noise)).any()


def test_a_sample_after_a_time_gap_is_no_spike():
    """Neighbours across a time gap are no neighbours: the jump between two stretches is no spike."""
    y = np.r_[np.random.default_rng(2).normal(50, 0.1, 40), np.random.default_rng(3).normal(60, 0.1, 40)]
    f = frame(y)
    f.loc[40:, "timestamp"] += 10 * PERIOD
    _, report = clean_runs(f, binding(), 10)
    assert report["flags"] == []


# --------------------------------------------------------------------------- stuck values


def test_a_stuck_transmitter_is_flagged_and_an_mv_held_is_not():
    """The CV repeats one value for 80 samples (79 flagged after its first); the MV held by an operator for
    200 samples is not judged; the run is cut at the stretch and the report names it."""
    rng = np.random.default_rng(4)
    y = rng.normal(50, 0.5, 400)
    y[100:180] = y[100]
    u = np.r_[np.ones(200), np.full(200, 2.0)]
    series, report = clean_runs(frame(y, u), binding(), 10)
    assert flagged(report, "stuck") == [("y", "r1", 101.0, 79)]
    assert report["totals"]["flagged"] == {"y": {"stuck": 79}}
    assert [s.run_id for s in series] == ["r1#1", "r1#2"] and report["runs"][0]["action"] == "split"


@pytest.mark.parametrize("length, is_stuck", [(STUCK_MIN_SAMPLES - 1, False), (STUCK_MIN_SAMPLES, True)])
def test_a_noisy_tag_repeating_is_stuck_from_the_minimum_length(length, is_stuck):
    y = np.random.default_rng(5).normal(50, 0.5, 300)
    y[100:100 + length] = y[100]
    assert bool(stuck(y[:, None], np.array([repeat_frequency(y)]), len(y)).any()) is is_stuck


def test_a_quantized_tag_repeats_by_chance_and_is_judged_by_how_often():
    """Rounded to 0.1 with noise 0.06: it repeats its value ~2 times in 5 (p 0.42), so its longest stretch of
    12 equal samples, longer than the minimum, is chance (n p^11 ~ 0.3); one of 40 is not (~1e-11)."""
    rng = np.random.default_rng(6)
    y = np.round(rng.normal(50, 0.06, 4000), 1)
    p = repeat_frequency(y)
    assert 0.4 < p < 0.5
    natural = stuck(y[:, None], np.array([p]), len(y))[:, 0]
    runs = max(len(s) for s in np.split(y, np.flatnonzero(np.diff(y)) + 1))
    assert not natural.any() and runs >= STUCK_MIN_SAMPLES
    y[1000:1040] = y[1000]
    assert stuck(y[:, None], np.array([repeat_frequency(y)]), len(y))[:, 0].sum() == 39


def test_a_tag_that_repeats_more_often_than_not_is_never_stuck():
    """A noise-free DV held for long (it repeats its value 99 % of the time) has no noise that says it
    should move."""
    d = np.repeat([1.0, 2.0, 1.5], 300)
    assert repeat_frequency(d) > 0.5
    assert not stuck(d[:, None], np.array([repeat_frequency(d)]), len(d)).any()


def test_a_cv_that_repeats_more_often_than_not_is_named_in_the_warnings():
    """A transmitter dead for 70 % of the history repeats its value more often than not: the stuck rule cannot
    judge it (its repeats are no evidence), so cleaning names it, with how often it repeats; a noise-free DV
    held for long and a noisy CV are not named."""
    y = np.random.default_rng(9).normal(50, 0.5, 1000)
    y[300:] = y[300]
    d = np.repeat([1.0, 2.0], 500)
    _, report = clean_runs(frame(y, d=d), binding(), 10)
    [warning] = [w for w in report["warnings"] if "repeats its previous value" in w]
    assert warning.startswith("CV 'y' repeats its previous value in 70% of its samples") and "exclude" in warning
    _, healthy = clean_runs(frame(np.random.default_rng(9).normal(50, 0.5, 1000), d=d), binding(), 10)
    assert not any("repeats" in w for w in healthy["warnings"])


# --------------------------------------------------------------------------- pinned, excluded


def test_values_at_a_transmitter_ranges_end_are_pinned():
    y = np.random.default_rng(8).normal(50, 0.5, 100)
    y[[10, 11, 12, 60]] = [100.0, 100.0, 100.05, 0.01]  # at the end, beyond it, within 0.1 % of the span
    y[30] = 99.8  # near, not at
    _, report = clean_runs(frame(y), binding(range=[0, 100]), 10)
    assert flagged(report, "pinned") == [("y", "r1", 10.0, 3), ("y", "r1", 60.0, 1)]
    _, plain = clean_runs(frame(y), binding(), 10)
    assert flagged(plain, "pinned") == []


@pytest.mark.parametrize("change, message", [
    ({"range": [20, 100]}, "binding.cvs[0].range: expected a range with the CV's limits [10, 90] strictly inside it"),
    ({"range": [0]}, "binding.cvs[0].range: expected two numbers [lo, hi], the transmitter's range, got [0]"),
    ({"range": [100, 0]}, "binding.cvs[0].range: lo (100) must be < hi (0)"),
])
def test_a_bad_range_is_refused_naming_the_field(change, message):
    with pytest.raises(ContractError) as refused:
        binding(**change)
    assert str(refused.value).startswith(message)


def test_a_binding_without_ranges_keeps_its_hash():
    assert "range" not in binding().canonical_json() and binding(range=[0, 100]).cvs[0].range == (0.0, 100.0)
    assert binding().spec_hash != binding(range=[0, 100]).spec_hash


def test_an_exclusion_flags_its_slice_of_its_tags_or_every_tag():
    from optimizer_pipeline.contracts import Exclusion

    y = np.random.default_rng(9).normal(50, 0.5, 100)
    only_y = Exclusion("ex-1", "f1", 20.0, 25.0, ("y",), "calibration")
    every = Exclusion("ex-2", "f1", 70.0, 72.0, (), "trip")
    _, report = clean_runs(frame(y), binding(), 10, [only_y, every])
    assert flagged(report, "excluded") == [("d", "r1", 70.0, 2), ("u", "r1", 70.0, 2), ("y", "r1", 20.0, 5),
                                           ("y", "r1", 70.0, 2)]
    assert report["settings"]["flags"]["exclusions"] == ["ex-1", "ex-2"]


# --------------------------------------------------------------------------- the live window


def live_frame(y_tail):
    y = np.r_[np.random.default_rng(10).normal(50, 0.5, 100), y_tail]
    return frame(y)


def newest_flagged(window, spec):
    return clean_newest_run(window, spec, 1)[1]


def test_the_newest_sample_flagged_or_off_its_trend_is_named_and_a_plan_from_it_unverified():
    spec = binding()
    stuck_now = live_frame(np.full(20, 51.0))
    assert newest_flagged(stuck_now, spec) == {"y": "stuck"}
    glitch = live_frame([50.0, 49.8, 60.0])
    assert newest_flagged(glitch, spec) == {"y": "jump"}
    step_held = live_frame([50.0, 49.8, 60.0, 60.2])  # the next sample holds: a step, no flag
    assert newest_flagged(step_held, spec) == {}
    held_mv = live_frame(np.random.default_rng(11).normal(50, 0.5, 20))
    assert newest_flagged(held_mv, spec) == {}  # the MV u is 1.0 throughout: held, not stuck
    condition, = pipeline.flagged_newest({"y": "stuck"})
    assert not condition.holds and condition.reason.startswith("the newest sample's value of y: stuck is flagged")
    assert pipeline.flagged_newest({})[0].holds and pipeline.flagged_newest(None) == []


def test_a_split_and_the_live_services_window_report_the_newest_sample_flagged():
    """prepare_history (a Dagster solve) and with_live_run (the live service's window) name the same flag."""
    from optimizer_pipeline.data.prepare import with_live_run

    history = frame(np.random.default_rng(12).normal(50, 0.5, 200), run="r0", t0=-1000)
    split = prepare_history(pd.concat([history, live_frame([50.0, 49.8, 65.0])], ignore_index=True), binding())
    assert split.report["live_flagged"] == {"y": "jump"}
    window = live_frame(np.full(20, 51.0))
    assert with_live_run(split, window, binding()).report["live_flagged"] == {"y": "stuck"}
    assert with_live_run(split, live_frame([50.0, 49.8, 50.1]), binding()).report["live_flagged"] == {}


# --------------------------------------------------------------------------- reported, excluded by hand


@pytest.fixture(scope="module")
def damaged_files(tmp_path_factory):
    """The heater's history with a stuck transmitter in its second run and 5 spikes in its third (made
    once: the tests read these files and write their changes elsewhere)."""
    tmp_path = tmp_path_factory.mktemp("damaged")
    plant = get_plant("heater")
    doc = plant.binding_doc()
    path = tmp_path / "heater.yaml"
    path.write_text(yaml.safe_dump(doc))
    history = plant.history(1).frame
    cv = plant.spec.cv_tags[0]
    runs = history["run_id"].unique()
    rows = history.index[history["run_id"] == runs[1]][40:100]
    history.loc[rows, cv] = history.loc[rows[0], cv]
    spikes_at = history.index[history["run_id"] == runs[2]][[30, 60, 90, 120, 150]]
    history.loc[spikes_at, cv] += 20 * plant.cv_noise[0]
    csv = tmp_path / "history.csv"
    history.to_csv(csv, index=False)
    return plant, path, csv, runs


@pytest.fixture(scope="module")
def damaged_home(tmp_path_factory, damaged_files):
    """A home the damaged files were ingested into by a real `ingest` process, and what it printed."""
    _, binding_file, csv, _ = damaged_files
    home = tmp_path_factory.mktemp("damaged-home") / "home"
    return home, cli(home, "ingest", str(binding_file), str(csv))


@pytest.fixture
def ingested_home(tmp_path, damaged_home):
    """This test's copy of the ingested home (a copied DuckDB file is a real ledger)."""
    home, done = damaged_home
    assert done.returncode == 0, done.stderr
    shutil.copytree(home, tmp_path / "home")
    return tmp_path / "home"


def test_ingest_counts_the_flags_per_tag_and_rule(damaged_files, damaged_home):
    plant, binding_file, csv, _ = damaged_files
    _, done = damaged_home  # the ingest of the damaged files, in a process of its own
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["flagged"] == {plant.spec.cv_tags[0]: {"stuck": 59, "spike": 5}} and summary["warnings"] == []


def test_ingest_warns_of_a_cv_dead_for_most_of_the_file(tmp_path, damaged_files, capsys):
    """The heater's CV reading one value in 11 of its 12 runs: not flagged stuck (it repeats more often than
    not), named in ingest's warnings, exit 0 (a warning, not a refusal)."""
    plant, binding_file, csv, runs = damaged_files
    history = pd.read_csv(csv)
    cv = plant.spec.cv_tags[0]
    dead = history["run_id"].isin(runs[:-1])
    history.loc[dead, cv] = history.loc[dead, cv].iloc[0]
    csv = tmp_path / "dead.csv"
    history.to_csv(csv, index=False)
    done = cli_main(capsys, tmp_path / "home", "ingest", str(binding_file), str(csv))
    assert done.returncode == 0, done.stderr
    [warning] = json.loads(done.stdout)["warnings"]
    assert warning.startswith(f"CV {cv!r} repeats its previous value in ")


def test_an_exclusion_is_recorded_listed_applied_and_revoked(damaged_files, ingested_home, capsys):
    """exclude writes one append-only record; the next split applies it (its samples flagged `excluded`, the
    artifact's cleaning record names it); revoked, the split after that no longer does, while the split that
    applied it still loads (load_split rebuilds it with the exclusions it applied)."""
    plant, binding_file, csv, runs = damaged_files
    home = ingested_home
    ledger = Ledger(ledger_path(home))
    samples = ledger.history_frame(plant.spec.id, plant.spec.tags)
    start = samples.loc[samples["run_id"] == runs[3], "timestamp"].min()
    iso = pd.Timestamp(start, unit="s").isoformat()
    to = pd.Timestamp(start + 10 * plant.sample_period_s, unit="s").isoformat()
    made = cli(home, "exclude", plant.spec.id, "--from", iso, "--to", to, "--reason", "valve maintenance")
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)
    assert (record["tags"], record["reason"]) == ("every tag", "valve maintenance")

    stored = ledger.get_binding(plant.spec.id)
    split = pipeline.prepare_split(ledger, stored)
    excluded = [s for s in split.report["cleaning"]["flags"] if s["rule"] == "excluded"]
    assert {s["samples"] for s in excluded} == {10} and len(excluded) == len(plant.spec.tags)
    artifact = pipeline.identify_model(ledger, stored, split)
    assert artifact.cleaning["exclusions"] == [record["exclusion_id"]]
    assert {s["rule"] for s in artifact.cleaning["flags"]} >= {"stuck", "excluded"}

    listing = cli_main(capsys, home, "ledger", "--binding", plant.spec.id)
    assert f"{record['exclusion_id']}  {plant.spec.id}" in listing.stdout and "valve maintenance" in listing.stdout
    assert f"{plant.spec.cv_tags[0]}  stuck" in listing.stdout

    revoked = cli_main(capsys, home, "exclude", plant.spec.id, "--revoke", record["exclusion_id"],
                       "--reason", "was fine")
    assert revoked.returncode == 0, revoked.stderr
    assert pipeline.load_split(ledger, stored).data_hash == split.data_hash  # the applied one still loads
    again = pipeline.prepare_split(ledger, stored)
    assert not [s for s in again.report["cleaning"]["flags"] if s["rule"] == "excluded"]
    assert again.data_hash != split.data_hash
    assert "(revoked by" in cli_main(capsys, home, "ledger", "--binding", plant.spec.id).stdout


def test_bad_exclusions_are_refused_with_one_line_and_write_nothing(damaged_files, ingested_home, capsys):
    plant, binding_file, csv, _ = damaged_files
    home = ingested_home
    b = plant.spec.id
    cases = [
        (("--from", "2026-01-02", "--to", "2026-01-03", "--tags", "TI-1O1", "--reason", "x"), "has no tag 'TI-1O1'"),
        (("--from", "2026-01-03", "--to", "2026-01-02", "--reason", "x"), "--from 2026-01-03T00:00:00+00:00 must be "
                                                                          "before --to"),
        (("--from", "2026-01-02", "--to", "2026-01-03", "--reason", "  "), "--reason must say why"),
        (("--from", "yesterday", "--to", "2026-01-03", "--reason", "x"), "--from: 'yesterday' is not an ISO 8601"),
        (("--revoke", "ex-0000", "--reason", "x"), "no exclusion 'ex-0000'"),
        (("--to", "2026-01-03", "--reason", "x"), "--from and --to are required"),
    ]
    for args, fragment in cases:
        assert_one_line_error(cli_main(capsys, home, "exclude", b, *args), fragment)
    assert Ledger(ledger_path(home)).list_exclusions() == []
    missing_reason = subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), "exclude", b,
                                     "--from", "2026-01-02", "--to", "2026-01-03"], capture_output=True, text=True)
    assert missing_reason.returncode == 2 and "--reason" in missing_reason.stderr


def test_the_history_figure_shades_each_flagged_span_of_the_most_flagged_run():
    from optimizer_pipeline import plots

    rng = np.random.default_rng(13)
    y = rng.normal(50, 0.5, 200)
    y[50:80] = y[50]
    y[120] += 8.0
    series, report = clean_runs(frame(y), binding(), 10)
    drawn = plots.flag_series(binding(), series, report["flags"])
    (tag, run_id, t, values, marked), = drawn.panels
    assert (tag, run_id) == ("y", "r1") and marked == ((51.0, 79.0, "stuck"), (120.0, 120.0, "spike"))
    assert np.isnan(values[t == 60.0]).all() or not (t == 60.0).any()  # the stuck stretch is cut, not drawn
    assert plots.flags_figure(drawn, "flags").startswith(b"\x89PNG")
