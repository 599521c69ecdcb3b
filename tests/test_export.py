"""`optimizer-pipeline export` (issue 35, "Your own binding"): a binding's stored samples written as a
history file that `ingest` reads back unchanged, CSV or Parquet, optionally a time window; bad input is
one line and leaves no file. The home is ingested once for the module (its tests only read it); the
round trip runs `export` and `ingest` as processes, the other commands run in this process (`cli_main`)
but for one bad input, whose exit code a shell sees."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from optimizer_pipeline.contracts import iso_from_seconds
from optimizer_pipeline.data.export import write_history
from optimizer_pipeline.data.ingest import read_history
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

from test_cli import assert_one_line_error, cli, cli_main


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A home holding the heater's history with a missing value and sub-second timestamps in it
    (ingested by a real `ingest` process; the tests export from it and write nothing into it)."""
    tmp_path = tmp_path_factory.mktemp("stored")
    plant = get_plant("heater")
    binding = tmp_path / "heater.yaml"
    binding.write_text(yaml.safe_dump(plant.binding_doc()))
    frame = plant.history(2).frame
    frame.loc[5, "t_in"] = np.nan
    moments = pd.to_datetime(frame["timestamp"], unit="s", utc=True) - pd.Timedelta(milliseconds=123)
    frame["timestamp"] = moments.map(pd.Timestamp.isoformat)  # as a historian writes them, not on a whole second
    history = tmp_path / "history.csv"
    frame.to_csv(history, index=False)
    home = tmp_path / "home"
    assert cli(home, "ingest", str(binding), str(history)).returncode == 0
    return home, binding, plant.spec


def _stored_frame(home, spec) -> pd.DataFrame:
    return Ledger(ledger_path(home)).history_frame(spec.id, spec.tags)


@pytest.mark.parametrize("name", ["back.csv", "back.parquet"])
def test_export_then_ingest_in_a_new_home_gives_the_same_samples(tmp_path, stored, name):
    home, binding, spec = stored
    out = tmp_path / name
    done = cli(home, "export", spec.id, str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    original = _stored_frame(home, spec)
    assert (summary["rows"], summary["runs"]) == (len(original), original["run_id"].nunique())

    again = tmp_path / "again"
    assert cli(again, "ingest", str(binding), str(out)).returncode == 0
    pd.testing.assert_frame_equal(_stored_frame(again, spec), original, check_exact=True)
    assert _stored_frame(again, spec)["t_in"].isna().sum() == 1


def test_export_window_keeps_the_samples_between_since_and_until_inclusive(tmp_path, stored, capsys):
    home, _, spec = stored
    original = _stored_frame(home, spec)
    since, until = original["timestamp"].iloc[100], original["timestamp"].iloc[400]
    out = tmp_path / "window.csv"
    done = cli_main(capsys, home, "export", spec.id, str(out), "--since", iso_from_seconds(since),
                    "--until", iso_from_seconds(until))
    assert done.returncode == 0, done.stderr
    written = pd.read_csv(out)
    expected = original[(original["timestamp"] >= since) & (original["timestamp"] <= until)]
    assert len(written) == len(expected) == json.loads(done.stdout)["rows"]
    assert list(written["run_id"]) == list(expected["run_id"])
    assert written["timestamp"].iloc[0] == iso_from_seconds(since)


@pytest.mark.parametrize("name", ["times.csv", "times.parquet"])
def test_times_computed_in_floating_point_are_read_back_as_the_same_floats(tmp_path, name):
    spec = get_plant("heater").spec
    seconds = 1.8e9 + np.array([0.0, 0.5, 10.0 - 0.123, 20.0 - 0.123, 30.1 * 1.0000001])
    frame = pd.DataFrame({"run_id": "r1", "timestamp": seconds, **{tag: np.arange(5.0) for tag in spec.tags}})
    write_history(frame, tmp_path / name)
    np.testing.assert_array_equal(read_history(tmp_path / name, spec)["timestamp"].to_numpy(), seconds)
    if name.endswith(".csv"):
        assert pd.read_csv(tmp_path / name)["timestamp"].iloc[1] == "2027-01-15T08:00:00.500000+00:00"


@pytest.mark.parametrize("args, fragment", [
    pytest.param(["heater-1", "{tmp}/out.txt"], "unknown history file type '.txt'", id="process"),
    (["heater-1", "{tmp}/no-folder/out.csv"], "does not exist"),
    (["heater-1", "{tmp}/out.csv", "--since", "yesterday"], "--since: 'yesterday' is not an ISO 8601"),
    (["heater-1", "{tmp}/out.csv", "--since", "2026-01-02", "--until", "2026-01-01"], "is after --until"),
    (["heater-1", "{tmp}/out.csv", "--since", "2099-01-01"], "no samples in that window; its samples span"),
    (["heatr-1", "{tmp}/out.csv"], "heater-1"),
])
def test_export_bad_input_is_one_line_and_writes_no_file(request, tmp_path, stored, capsys, args, fragment):
    home = stored[0]
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(tmp=tmp_path) for a in args]
    process = request.node.callspec.id.startswith("process")  # one case as a process: the exit code a shell sees
    assert_one_line_error(cli(home, "export", *argv) if process else cli_main(capsys, home, "export", *argv), fragment)
    assert sorted(p.name for p in home.parent.iterdir()) == ["heater.yaml", "history.csv", "home"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
