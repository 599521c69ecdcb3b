"""The `optimizer-pipeline` CLI as a user runs it: subprocesses on a temporary home (issue 5, "CLI").

Each command family keeps a real subprocess where the process boundary is the subject (exit codes a
shell sees: the round trip, usage errors, a bad binding file, the `outcome` command); checks whose
subject is a command's own result (its exit code, its lines, what it wrote) call the same `main(argv)`
in this process (`cli_main`), and the homes that only set the scene are ingested once per module and
copied (a copied DuckDB file is a real ledger)."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

from test_pipeline_e2e import REC_KEYS

HOME_ENV = ("OPTIMIZER_HOME", "DAGSTER_HOME")


def cli(home, *args, timeout=180):
    env = {k: v for k, v in os.environ.items() if k not in HOME_ENV}
    return subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def cli_main(capsys, home, *args) -> subprocess.CompletedProcess:
    """The command run in this process by the CLI's own `main(argv)` (what `python -m
    optimizer_pipeline.cli` calls, its return value the exit code; argparse's refusals exit 2 through
    SystemExit), with the environment `cli` gives it (no OPTIMIZER_HOME / DAGSTER_HOME, and whatever a
    command exports for Dagster taken back after it); returned as `cli` returns a finished process."""
    from optimizer_pipeline.cli import main

    saved = {k: os.environ.pop(k) for k in HOME_ENV if k in os.environ}
    capsys.readouterr()
    argv = ["--home", str(home), *map(str, args)]
    try:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    finally:
        for k in HOME_ENV:
            os.environ.pop(k, None)
        os.environ.update(saved)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


@pytest.fixture(scope="module")
def heater_files(tmp_path_factory):
    """The heater's binding document and history CSV text, made once (plant.history simulates)."""
    plant = get_plant("heater")
    return yaml.safe_dump(plant.binding_doc()), plant.history(1).frame.to_csv(index=False)


@pytest.fixture
def files(tmp_path, heater_files):
    binding = tmp_path / "heater.yaml"
    binding.write_text(heater_files[0])
    history = tmp_path / "history.csv"
    history.write_text(heater_files[1])
    return binding, history


@pytest.fixture(scope="module")
def ingested_template(tmp_path_factory, heater_files):
    """A home the heater's files were ingested into by a real `ingest` process, and its summary."""
    folder = tmp_path_factory.mktemp("ingested")
    binding, history = folder / "heater.yaml", folder / "history.csv"
    binding.write_text(heater_files[0])
    history.write_text(heater_files[1])
    done = cli(folder / "home", "ingest", str(binding), str(history))
    assert done.returncode == 0, done.stderr
    return folder / "home", json.loads(done.stdout)


@pytest.fixture
def ingested(tmp_path, ingested_template):
    """A copy of the ingested home, this test's own (its first `ingest` done), and that ingest's summary."""
    home = tmp_path / "home"
    shutil.copytree(ingested_template[0], home)
    return home, ingested_template[1]


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.timeout(5 * 180 + 60)  # 5 commands, each waited for up to 180 s
def test_ingest_materialize_recommendation_round_trip(tmp_path, files, capsys):
    home = tmp_path / "home"
    ingest = cli(home, "ingest", *map(str, files))
    assert ingest.returncode == 0, ingest.stderr
    summary = json.loads(ingest.stdout)
    assert (summary["binding_id"], summary["revision"], summary["created"], summary["source"]) == \
        ("heater-1", 1, True, "real")
    assert summary["samples_added"] > 0

    done = cli(home, "materialize", "heater-1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "verified"

    rec = cli(home, "recommendation", "heater-1", "--json")
    doc = json.loads(rec.stdout)
    assert set(doc) >= REC_KEYS and doc["evidence"]["source"] == "real"
    assert len(doc["controls"]) == 40 and len(doc["controls"][0]) == 1 and len(doc["predicted"][0]) == 1

    # the live state's values: the history's last row (the live run's last sample)
    last = pd.read_csv(files[1]).iloc[-1]
    live = doc["evidence"]["live_state"]
    assert live["mvs"] == {"q_heat": pytest.approx(last["q_heat"])} and live["cvs"] == {"t_out": pytest.approx(last["t_out"])}
    text = cli_main(capsys, home, "recommendation", "heater-1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.rstrip().splitlines()
    assert lines[1] == "status: verified — " + doc["status_label"]
    assert doc["band_steps"] == 15 < len(doc["predicted"])  # P of the heater's binding, of a 40-step plan
    mv = lines.index("MVs: now -> first move -> end of plan (40 steps)  [limits]")
    (heater,) = get_plant("heater").spec.mvs
    assert lines[mv + 1] == (f"  q_heat: {live['mvs']['q_heat']:.4g} -> {doc['controls'][0][0]:.4g} -> "
                             f"{doc['controls'][-1][0]:.4g}  [{heater.lo:g}, {heater.hi:g}]")
    assert lines[mv + 2] == ("CVs: now -> predicted at the end of the horizon (40 steps) ± band, target or [limits] "
                             "(the band is calibrated for the first 15 steps only)")
    (t_out,) = get_plant("heater").spec.cvs
    assert lines[mv + 3] == (f"  t_out: {live['cvs']['t_out']:.4g} -> {doc['predicted'][-1][0]:.4g} ± "
                             f"{doc['band'][0]:.3g}, target {t_out.target:g}")

    ledger = json.loads(cli_main(capsys, home, "ledger", "--binding", "heater-1", "--json").stdout)
    assert len(ledger["runs"]) == 1 and len(ledger["recommendations"]) == 1 and len(ledger["candidates"]) == 3


@pytest.mark.timeout(3 * 180 + 60)  # 3 commands, each waited for up to 180 s
def test_reingest_of_a_changed_binding_bumps_revision_and_expires(files, ingested, capsys):
    home, _ = ingested  # the files ingested once
    binding, history = files
    from ledger_helpers import solve

    _, rec_id = solve(Ledger(ledger_path(home)), binding_id="heater-1")
    same = json.loads(cli_main(capsys, home, "ingest", str(binding), str(history)).stdout)
    assert (same["revision"], same["changed"], same["samples_added"]) == (1, False, 0)
    doc = yaml.safe_load(binding.read_text())
    doc["cvs"][0]["target"] = 45.0
    binding.write_text(yaml.safe_dump(doc))
    bumped = json.loads(cli_main(capsys, home, "ingest", str(binding), str(history)).stdout)
    assert (bumped["revision"], bumped["changed"], bumped["expired_recommendations"]) == (2, True, 1)
    assert Ledger(ledger_path(home)).get_recommendation(rec_id).status == "expired"


@pytest.mark.timeout(2 * 180 + 60)  # 2 commands, each waited for up to 180 s
def test_reingest_with_only_a_new_opcua_section_keeps_the_revision_and_says_the_wiring_changed(files, ingested,
                                                                                              capsys):
    home, first = ingested  # the files ingested once: that ingest's summary
    binding, history = files
    assert first["wiring_changed"] is False
    doc = yaml.safe_load(binding.read_text())
    doc["opcua"] = {"endpoint": "opc.tcp://127.0.0.1:4840/heater",
                    "nodes": {"q_heat": "ns=2;s=Heater.q", "t_out": "ns=2;s=Heater.t_out",
                              "t_in": "ns=2;s=Heater.t_in"}}
    binding.write_text(yaml.safe_dump(doc))
    wired = json.loads(cli_main(capsys, home, "ingest", str(binding), str(history)).stdout)
    assert (wired["revision"], wired["changed"], wired["expired_recommendations"], wired["wiring_changed"]) == \
        (1, False, 0, True)
    assert Ledger(ledger_path(home)).get_binding("heater-1").spec.opcua.endpoint == "opc.tcp://127.0.0.1:4840/heater"


def test_bad_binding_file_writes_nothing(tmp_path, files):
    home = tmp_path / "home"
    binding, history = files
    doc = yaml.safe_load(binding.read_text())
    doc["mvs"][0]["max_move"] = 0
    binding.write_text(yaml.safe_dump(doc))
    assert_one_line_error(cli(home, "ingest", str(binding), str(history)), "mvs[0].max_move: must be > 0")
    assert not ledger_path(home).exists() or Ledger(ledger_path(home)).counts()["bindings"] == 0


@pytest.mark.parametrize("args, line", [
    (["frobnicate"], "error: optimizer-pipeline: argument command: invalid choice: 'frobnicate' (choose from "),
    (["ingest", "heater.yaml"], "error: optimizer-pipeline ingest: the following arguments are required: "
                                "history_file; see 'optimizer-pipeline ingest --help'"),
    (["ledger", "--frob"], "error: optimizer-pipeline: unrecognized arguments: --frob; see 'optimizer-pipeline --help'"),
])
def test_usage_error_is_one_error_line_exit_2_and_creates_no_home(tmp_path, args, line):
    home = tmp_path / "home"
    done = cli(home, *args, timeout=60)
    assert_one_line_error(done, line)
    assert done.stderr.startswith(line) and "usage:" not in done.stderr and done.stdout == ""
    assert not home.exists()


def test_bad_history_file_stores_neither_binding_nor_samples(tmp_path, files, capsys):
    home = tmp_path / "home"
    binding, history = files
    lines = history.read_text().splitlines()
    lines[5] = lines[5].replace(",", ",oops,", 1).rsplit(",", 1)[0]
    history.write_text("\n".join(lines) + "\n")
    proc = cli_main(capsys, home, "ingest", str(binding), str(history))
    assert_one_line_error(proc, "history.csv")
    counts = Ledger(ledger_path(home)).counts() if ledger_path(home).exists() else {}
    assert counts.get("bindings", 0) == 0 and counts.get("plant_samples", 0) == 0


@pytest.mark.timeout(2 * 180 + 60)  # 2 commands, each waited for up to 180 s
@pytest.mark.parametrize("column, value, fragment", [
    ("q_heat", "inf", "column 'q_heat': infinite value inf in run 'heater-run-03-again' at row 903 (line 904)"),
    ("timestamp", "4102444800", "run 'heater-run-03-again': timestamp 2100-01-01T00:00:00+00:00 at row 903 (line 904) "
                                "is in the future"),
])
def test_ingest_refuses_an_infinite_value_or_a_future_timestamp_and_leaves_the_ledger_unchanged(
        tmp_path, files, ingested, capsys, column, value, fragment):
    home, _ = ingested  # the files ingested once
    binding, history = files
    before = Ledger(ledger_path(home)).counts()
    frame = pd.read_csv(history, dtype=str)  # text in, text out: only the run ids and the one cell change
    # runs the ledger does not hold yet: a sample written from the refused file would count
    frame["run_id"] = frame["run_id"] + "-again"
    frame.loc[902, column] = value  # the third row of run 03 (300 rows per run)
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    assert_one_line_error(cli_main(capsys, home, "ingest", str(binding), str(bad)), "bad.csv: ", fragment)
    assert Ledger(ledger_path(home)).counts() == before


@pytest.mark.parametrize("args, fragment, process", [
    (["recommendation", "nope"], "no ledger at", False),
    (["materialize", "nope"], "no ledger at", False),
    (["ledger", "--binding", "nope"], "no ledger at", False),
    (["export", "nope", "out.csv"], "no ledger at", False),
    (["outcome", "rec-nope", "x.csv"], "no ledger at", True),  # a process of its own: its exit code as a shell sees it
    (["ingest", "missing.yaml", "missing.csv"], "missing.yaml: binding file not found", False),
])
def test_commands_on_a_home_without_a_ledger_give_one_line_and_create_nothing(tmp_path, capsys, args, fragment,
                                                                              process):
    done = cli(tmp_path / "home", *args) if process else cli_main(capsys, tmp_path / "home", *args)
    assert_one_line_error(done, fragment)
    assert not (tmp_path / "home" / "optimizer.duckdb").exists()


def test_a_home_that_cannot_be_created_is_one_line(tmp_path, files, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert_one_line_error(cli_main(capsys, blocker, "ingest", *map(str, files)), f"home {blocker}")


@pytest.mark.timeout(3 * 180 + 60)  # 3 commands, each waited for up to 180 s
def test_bad_setting_gives_one_line(tmp_path, files, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_text("solver: {pool_size: 9}\n")
    # every command reads the settings (where the ledger is: ledger.url), so a broken file is refused
    # by the first one, naming the setting, before anything is written
    assert_one_line_error(cli_main(capsys, home, "ingest", *files), "solver.pool_size must be an integer from 1 to 4")
    assert not (home / "optimizer.duckdb").exists()
    (home / "settings.yaml").write_text("solver: {pool_size: 2}\n")
    assert cli_main(capsys, home, "ingest", *files).returncode == 0
    (home / "settings.yaml").write_text("solver: {pool_size: 9}\n")
    assert_one_line_error(cli_main(capsys, home, "materialize", "heater-1"),
                          "solver.pool_size must be an integer from 1 to 4")


@pytest.mark.timeout(2 * 180 + 60)  # 2 commands, each waited for up to 180 s
def test_materialize_of_a_history_too_short_to_split_is_one_line(tmp_path, files, capsys):
    home = tmp_path / "home"
    binding, history = files
    import pandas as pd

    frame = pd.read_csv(history)
    frame[frame["run_id"] == frame["run_id"].iloc[-1]].to_csv(history, index=False)  # only the live run
    assert cli_main(capsys, home, "ingest", str(binding), str(history)).returncode == 0
    proc = cli_main(capsys, home, "materialize", "heater-1")  # Dagster in this process, as in a CLI's
    assert_one_line_error(proc, "heater-1 (plant_history: binding 'heater-1': 1 usable run(s)",
                          "at least 2 runs are needed")
    assert Ledger(ledger_path(home)).latest_recommendation("heater-1") is None


@pytest.mark.timeout(2 * 180 + 60)  # 2 commands, each waited for up to 180 s
def test_materialize_all_refreshes_every_binding_in_one_dagster_run(tmp_path, files, capsys):
    home = tmp_path / "home"
    binding, history = files
    second = tmp_path / "heater-2.yaml"
    second.write_text(yaml.safe_dump({**get_plant("heater").binding_doc(), "id": "heater-2"}))
    for spec in (binding, second):
        assert cli_main(capsys, home, "ingest", str(spec), str(history)).returncode == 0
    done = cli_main(capsys, home, "materialize", "--all")  # Dagster and the solver workers, as in a CLI's process
    assert done.returncode == 0, done.stderr
    docs = json.loads(done.stdout)
    assert [d["binding_id"] for d in docs] == ["heater-1", "heater-2"]
    assert len({d["dagster_run_id"] for d in docs}) == 1
    assert [d["status"] for d in docs] == ["verified", "verified"]
    ledger = Ledger(ledger_path(home))
    assert [d["recommendation_id"] for d in docs] == [ledger.latest_recommendation(b).id
                                                      for b in ("heater-1", "heater-2")]


@pytest.mark.timeout(2 * 180 + 60)  # 2 commands, each waited for up to 180 s
@pytest.mark.parametrize("args, fragment", [
    ([], "give binding ids or --all"),
    (["heater-1", "--all"], "give binding ids or --all"),
    (["heater-1", "nope"], "nope"),
])
def test_materialize_refuses_a_bad_selection_before_any_run(ingested, capsys, args, fragment):
    home, _ = ingested  # the files ingested once
    assert_one_line_error(cli_main(capsys, home, "materialize", *args), fragment)
    assert Ledger(ledger_path(home)).list_runs("heater-1") == []
    assert not (home / "dagster" / "storage").exists()


def test_help_describes_the_tool_in_whole_sentences_and_lists_every_command(capsys):
    from optimizer_pipeline.cli import build_parser, main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    description = text.split("positional arguments:")[0]
    assert description.rstrip().endswith("README.md walks the rest.") and "recommendation whose status" in description
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) <= set(text.replace(",", " ").replace("{", " ").replace("}", " ").split())
