"""The resident live service with real processes: `optimizer-pipeline live` on a home whose bindings
Dagster calibrated, the real solver pool, the real Dagster instance it reports to; and the service
loop in process against a Dagster solve of the same samples."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest
from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, instance_for_test

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.live import LedgerSource, LiveService
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import load_settings
from optimizer_pipeline.solver.pool import SolverPool

from pipeline_fixtures import DemoHome, seed_home
from servers import alive, descendants

CLI = [sys.executable, "-m", "optimizer_pipeline.cli"]
WAIT_S = 60.0
SPIN_GUARD_CORES = 0.2  # the loop's CPU while it has nothing to do (bench/bench_live.py measures the 0.02 target)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A home with the heater and the tanks ingested and refreshed through Dagster (the fake in-process
    solver: the refresh is the setting, not the subject); the tests copy it."""
    root = tmp_path_factory.mktemp("calibrated")
    plants = [get_plant("heater"), get_plant("tanks")]
    ledger = seed_home(root / "home", plants)
    (root / "dagster").mkdir()
    with instance_for_test(temp_dir=str(root / "dagster")) as instance:
        home = DemoHome(root / "home", ledger, instance, {p.spec.id: p for p in plants}, in_process_solver=True)
        instance.add_dynamic_partitions("bindings", list(home.plants))
        for binding_id in home.plants:
            home.run(binding_id)
    return root / "home"


@pytest.fixture
def home(calibrated, tmp_path):
    import shutil

    target = tmp_path / "home"
    shutil.copytree(calibrated, target, ignore=shutil.ignore_patterns("*.lock"))
    return target


def _continue_live_run(ledger: Ledger, binding_id: str, steps: int) -> pd.DataFrame:
    """The live run continued by `steps` periods (its last sample held): what a historian exports next."""
    spec = ledger.get_binding(binding_id).spec
    last = ledger.recent_samples(binding_id, spec.tags, run_id=ledger.newest_run(binding_id), rows=1)
    t0 = float(last["timestamp"].iloc[0])
    return pd.concat([last.assign(timestamp=t0 + k * spec.sample_period_s) for k in range(1, steps + 1)],
                     ignore_index=True)


def _drop(home: Path, binding_id: str, frame: pd.DataFrame, name: str) -> Path:
    folder = home / "inbox" / binding_id
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / f"{name}.part", index=False)
    return (folder / f"{name}.part").rename(folder / name)


def _wait(condition, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _publications(ledger: Ledger, binding_id: str) -> pd.DataFrame:
    return ledger.query("SELECT * FROM live_publications WHERE binding_id = ? ORDER BY live_t", [binding_id])


# ---------------------------------------------------------------------------- in process


def test_a_live_re_solve_decides_as_a_dagster_solve_of_the_same_samples(home, tmp_path):
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    ledger.append_samples("heater-1", _continue_live_run(ledger, "heater-1", 2), ("q_heat", "t_out", "t_in"),
                          "simulation")
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.1)],
                              bindings=["heater-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 1})
        thread.start()
        thread.join(WAIT_S)
        assert not thread.is_alive()
    live = ledger.latest_recommendation("heater-1")
    live_run = ledger.get_run(live.run_id)
    assert _publications(ledger, "heater-1")["run_id"].tolist() == [live.run_id]

    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        instance.add_dynamic_partitions("bindings", ["heater-1"])
        DemoHome(home, ledger, instance, {}, in_process_solver=True).run("heater-1", job="solve")
    dagster = ledger.latest_recommendation("heater-1")
    dagster_run = ledger.get_run(dagster.run_id)
    assert dagster.id != live.id and ledger.get_recommendation(live.id).status == "expired"  # superseded
    for key in ("live_t", "live_run", "calibration_id", "model_artifact_hash"):
        assert live_run.context[key] == dagster_run.context[key], key
    live_doc, dagster_doc = live.document(), dagster.document()
    # the same decision: the reasons differ only in the live state's age, which grew between the solves
    assert dagster_doc["status"] in ("verified", "unverified")
    assert [r.split(" ")[0:3] for r in live_doc["reasons"]] == [r.split(" ")[0:3] for r in dagster_doc["reasons"]]
    assert live_doc["band"] == dagster_doc["band"]
    for key in ("controls", "predicted"):
        assert pd.DataFrame(live_doc[key]).values == pytest.approx(pd.DataFrame(dagster_doc[key]).values, abs=1e-4)


def test_samples_arriving_during_a_solve_are_coalesced_into_the_next_one(home):
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    entered, release = threading.Event(), threading.Event()
    with SolverPool(size=1) as pool:
        def slow_solve(problem, timeout_ms=None):  # the first solve waits until three batches arrived
            entered.set()
            release.wait(WAIT_S)
            return pool.solve(problem, timeout_ms)

        service = LiveService(ledger, settings, slow_solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        tags = ledger.get_binding("tanks-1").spec.tags
        thread.start()
        frame = _continue_live_run(ledger, "tanks-1", 4)
        ledger.append_samples("tanks-1", frame.iloc[[0]], tags, "simulation")
        assert entered.wait(WAIT_S)
        for k in (1, 2, 3):
            ledger.append_samples("tanks-1", frame.iloc[[k]], tags, "simulation")
        cpu_before, started = _thread_cpu_s(thread), time.monotonic()
        time.sleep(3.0)  # several polls while the first solve is in flight: the samples wait for it, parked
        cores = (_thread_cpu_s(thread) - cpu_before) / (time.monotonic() - started)
        release.set()
        thread.join(WAIT_S)
        assert not thread.is_alive()
    published = _publications(ledger, "tanks-1")
    assert published["live_t"].tolist() == pytest.approx([frame["timestamp"].iloc[0], frame["timestamp"].iloc[3]])
    assert cores <= SPIN_GUARD_CORES  # the loop slept meanwhile (it spun at a whole core while they were "work")


class RecordingReporter:
    """A stand-in Reporter that keeps what the service hands over (the Dagster reporter is fed below)."""

    def __init__(self):
        self.published = []

    def report(self, published):
        self.published.extend(published)


def test_a_status_change_is_flagged_against_the_ledger_and_only_it_gets_the_plan_figure_in_dagster(home, tmp_path):
    from optimizer_pipeline.assets.live_report import DagsterReporter

    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    before = ledger.latest_recommendation("tanks-1").status  # the Dagster refresh's recommendation
    recorder = RecordingReporter()
    tags = ledger.get_binding("tanks-1").spec.tags
    frame = _continue_live_run(ledger, "tanks-1", 2)
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"],
                              reporter=recorder)
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        thread.start()
        ledger.append_samples("tanks-1", frame.iloc[[0]], tags, "simulation")
        _wait(lambda: service.published >= 1, "the first publication")
        ledger.append_samples("tanks-1", frame.iloc[[1]], tags, "simulation")
        thread.join(WAIT_S)
        assert not thread.is_alive()
    first, second = recorder.published
    statuses = [p.solved.decision.recommendation.status.value for p in (first, second)]
    assert first.status_changed == (statuses[0] != before)
    assert second.status_changed == (statuses[1] != statuses[0])
    # a service's first publication of a binding is whole; the next is summarised unless its status changed
    assert first.whole and second.whole == second.status_changed

    # the Dagster side: every publication reported (interval 0), the figure only with a status change
    changed = dataclasses.replace(second, status_changed=True)
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        reporter = DagsterReporter(instance, interval_s=0)
        reporter.report([dataclasses.replace(first, status_changed=False)])
        reporter.report([changed])
        reporter.close()
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=["tanks-1"]), limit=10).records
        checks = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey("recommendation"), "conditions"), limit=10)
        evaluations = instance.all_logs(first.service_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    assert reporter.reported == 2
    # both check evaluations are in the event log, under the service's id (Dagster refuses a second
    # *runless* one of a partition); the partition's check shows the newest
    assert [e.dagster_event.event_specific_data.partition for e in evaluations] == ["tanks-1", "tanks-1"]
    assert [(c.run_id, c.partition) for c in checks] == [(first.service_id, "tanks-1")]
    assert checks[0].event.timestamp == evaluations[-1].timestamp
    newest, oldest = [r.asset_materialization.metadata for r in records]  # newest first
    assert "plot" in newest and "plot" not in oldest
    assert newest["recommendation_id"].value == second.solved.decision.recommendation.id


@pytest.mark.timeout(420)  # 4 publications of up to 60 s each, then the service's end: 300 s
def test_publications_with_an_unchanged_status_are_summarised_with_their_advice_and_a_lapse_writes_one_whole(
        home, capsys):
    """The ledger keeps every publication's status, reasons and advice; only the first (and one whose
    recommendation is no longer open, or past live.whole_every_s) is written whole; `recommendation`
    shows the newest summarised advice beside the open recommendation."""
    from optimizer_pipeline import cli

    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    recorder = RecordingReporter()
    tags = ledger.get_binding("tanks-1").spec.tags
    frame = _continue_live_run(ledger, "tanks-1", 4)
    runs_before = ledger.counts()["optimizer_runs"]
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"],
                              reporter=recorder)
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 4})
        thread.start()
        for k in range(4):
            if k == 3:  # the whole one it would follow expires (as past its valid_until): written whole again
                ledger.expire_past_valid_until(now=pd.Timestamp.now("UTC") + pd.Timedelta(days=1))
            ledger.append_samples("tanks-1", frame.iloc[[k]], tags, "simulation")
            _wait(lambda: service.published >= k + 1, f"publication {k + 1}")
            if k == 2:
                capsys.readouterr()
                assert cli.main(["--home", str(home), "recommendation", "tanks-1", "--json"]) == 0
                shown = json.loads(capsys.readouterr().out)
        thread.join(WAIT_S)
        assert not thread.is_alive()
    published = recorder.published
    newest = published[2].solved.decision.recommendation
    assert shown["run_id"] == published[0].run_id
    assert shown["live_advice"]["advice"] == dict(zip(newest.mv_tags, newest.controls[0]))
    statuses = [p.solved.decision.recommendation.status.value for p in published]
    assert len(set(statuses)) == 1, statuses  # the same samples held: the same status throughout
    rows = _publications(ledger, "tanks-1")
    assert rows["whole"].tolist() == [True, False, False, True]
    assert [p.whole for p in published] == [True, False, False, True]
    # summarised: they follow the first one's run, which stays the open recommendation
    assert rows["run_id"].tolist()[1:3] == [published[0].run_id] * 2
    assert ledger.counts()["optimizer_runs"] == runs_before + 2
    assert ledger.latest_recommendation("tanks-1").run_id == published[3].run_id
    # every publication's advice (the MVs' first move), status and reasons kept exactly
    for row, item in zip(rows.itertuples(), published):
        rec = item.solved.decision.recommendation
        assert json.loads(row.advice_json) == dict(zip(rec.mv_tags, rec.controls[0]))
        assert row.status == rec.status.value and json.loads(row.reasons_json) == list(rec.reasons)
        assert row.live_t == pytest.approx(float(item.split.live.t[-1]))


def test_with_whole_every_0_every_live_publication_is_written_whole(home):
    (home / "settings.yaml").write_text("live:\n  whole_every_s: 0\n")
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    tags = ledger.get_binding("tanks-1").spec.tags
    frame = _continue_live_run(ledger, "tanks-1", 2)
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        thread.start()
        for k in range(2):
            ledger.append_samples("tanks-1", frame.iloc[[k]], tags, "simulation")
            _wait(lambda: service.published >= k + 1, f"publication {k + 1}")
        thread.join(WAIT_S)
    rows = _publications(ledger, "tanks-1")
    assert rows["whole"].tolist() == [True, True] and rows["run_id"].nunique() == 2


def test_a_failed_re_solve_is_recorded_for_its_binding_which_stays_served(home):
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    tags = ledger.get_binding("tanks-1").spec.tags
    calls = []
    with SolverPool(size=1) as pool:
        def failing_once(problem, timeout_ms=None):  # FAKE fault: the first solve ends in an unexpected error
            calls.append(problem)
            if len(calls) == 1:
                raise RuntimeError("an unexpected fault in the solve")
            return pool.solve(problem, timeout_ms)

        service = LiveService(ledger, settings, failing_once, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 1})
        thread.start()
        ledger.append_samples("tanks-1", _continue_live_run(ledger, "tanks-1", 1), tags, "simulation")
        failures = _wait(lambda: ledger.list_failures("tanks-1"), "the failure recorded")
        second = _continue_live_run(ledger, "tanks-1", 1)
        ledger.append_samples("tanks-1", second, tags, "simulation")
        thread.join(WAIT_S)
        assert not thread.is_alive()
    [failure] = failures
    assert (failure.stage, failure.error) == ("recommendation", "RuntimeError")
    assert failure.message == f"live {service.id}: an unexpected fault in the solve"
    assert _publications(ledger, "tanks-1")["live_t"].tolist() == pytest.approx([second["timestamp"].iloc[0]])


def test_a_recalibration_and_a_new_revision_are_picked_up_without_a_restart(home):
    """A recalibration (what the recalibrate job writes) ends with a re-solve from the same samples with
    the new calibration; a new revision without a model stops the binding being served until it has one."""
    from optimizer_pipeline import pipeline
    from optimizer_pipeline.contracts import utc_now

    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    tags = ledger.get_binding("tanks-1").spec.tags
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        thread.start()
        try:
            ledger.append_samples("tanks-1", _continue_live_run(ledger, "tanks-1", 1), tags, "simulation")
            _wait(lambda: service.published == 1, "the first publication")
            stored = ledger.get_binding("tanks-1")
            artifact = pipeline.load_artifact(ledger, stored)
            split = pipeline.load_split(ledger, stored)
            calibration = pipeline.calibrate(ledger, artifact, pipeline.load_scores(ledger, stored.spec, artifact, split),
                                             settings, utc_now())
            thread.join(WAIT_S)  # the second publication: the same samples, the new calibration
            assert not thread.is_alive()
        finally:
            service.request_stop()
    published = _publications(ledger, "tanks-1")
    assert published["live_t"].nunique() == 1 and published["calibration_id"].tolist()[-1] == calibration.calibration_id

    from optimizer_pipeline.contracts import binding_from_dict

    doc = stored.spec.to_dict()
    doc["cvs"][0]["target"] = 6.5
    ledger.upsert_binding(binding_from_dict(doc))  # revision 2: no model of it yet
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        ledger.append_samples("tanks-1", _continue_live_run(ledger, "tanks-1", 1), tags, "simulation")
        started = time.monotonic()
        service.run(until=lambda: time.monotonic() > started + 3.0)
    assert service.published == 0 and "tanks-1" in service.unservable
    assert "no model artifact" in service.unservable["tanks-1"] or "no plant_history" in service.unservable["tanks-1"]


def test_a_new_run_too_short_for_a_state_is_solved_from_the_whole_history_as_a_dagster_solve_would(home):
    """The first sample of a new run: its window is too short to clean into a piece, so the service
    prepares the whole history (the live state is then the previous run's end) and says why it is
    not verified, as a Dagster solve of the same samples would."""
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    tags = ledger.get_binding("tanks-1").spec.tags
    first = _continue_live_run(ledger, "tanks-1", 1).assign(run_id="a-new-run")
    with SolverPool(size=1) as pool:
        service = LiveService(ledger, settings, pool.solve, [LedgerSource(ledger, 0.05)],
                              bindings=["tanks-1"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 1})
        thread.start()
        ledger.append_samples("tanks-1", first, tags, "simulation")
        thread.join(WAIT_S)
        assert not thread.is_alive()
    rec = ledger.latest_recommendation("tanks-1")
    assert rec.status == "unverified"
    assert any(reason.startswith("warming up: ") for reason in rec.document()["reasons"])  # a new run: after a gap
    assert ledger.get_run(rec.run_id).context["live_run"] != "a-new-run"


# ---------------------------------------------------------------------------- the command, real processes


def _start(home: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, OPTIMIZER_LIVE_REPORT_INTERVAL_S="0")
    return subprocess.Popen([*CLI, "--home", str(home), "live", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _ready(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line.startswith("live service "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line


@pytest.mark.timeout(540)  # its waits: 3 x 60 s, two commands of 120 s, 10 s: 430 s
def test_the_live_command_serves_its_inbox_reports_to_dagster_and_stops_cleanly(home):
    proc = _start(home)
    try:
        assert "2 binding(s) served" in _ready(proc)
        children = descendants(proc.pid)
        assert len(children) >= 2  # the solver pool's workers (and the figure processes' resource tracker)
        ledger = Ledger(home / "optimizer.duckdb")
        good = _drop(home, "heater-1", _continue_live_run(ledger, "heater-1", 2), "export-1.csv")
        bad = _drop(home, "tanks-1", _continue_live_run(ledger, "tanks-1", 1).drop(columns=["y2"]), "broken.csv")
        stray = _drop(home, "no-such-binding", _continue_live_run(ledger, "tanks-1", 1), "x.csv")
        _wait(lambda: len(_publications(ledger, "heater-1")) == 1, "the heater's publication")
        rejected = bad.parent / "rejected"
        _wait(lambda: (rejected / "broken.csv").exists() and (stray.parent / "rejected" / "x.csv").exists(),
              "the refused files moved aside")
        assert not bad.exists() and not stray.exists() and (good.parent / "done" / "export-1.csv").exists()
        assert "missing required column(s) 'y2'" in (rejected / "broken.csv.error.txt").read_text()
        assert "binding 'no-such-binding' is not in the ledger" in \
            (stray.parent / "rejected" / "x.csv.error.txt").read_text()
        tanks = _drop(home, "tanks-1", _continue_live_run(ledger, "tanks-1", 1), "export-2.csv")
        _wait(lambda: len(_publications(ledger, "tanks-1")) == 1, "the tanks' publication after a refused file")
        assert not tanks.exists()

        second = subprocess.run([*CLI, "--home", str(home), "live"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and second.stderr.count("\n") == 1
        assert "a live service already runs on it" in second.stderr and "Traceback" not in second.stderr
        [service] = [s for s in ledger.live_services(alive_within_s=60)]
        assert service.state == "serving" and service.bindings is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        print(err)  # the service's log, shown when the test fails
    assert proc.returncode == 0, err
    assert "binding heater-1: rec-" in err and " latency " in err  # one INFO line per publication
    # every process it started ends with it (multiprocessing's resource tracker a moment after it)
    _wait(lambda: not [pid for pid in children if alive(pid)], "its solver workers and helpers to end", 10.0)
    assert [s.state for s in ledger.live_services()] == ["stopped"]
    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=["heater-1"]), limit=1).records
    [record] = records
    metadata = record.asset_materialization.metadata
    assert record.run_id == "" and metadata["published_by"].value == "live service"
    assert metadata["recommendation_id"].value == ledger.latest_recommendation("heater-1").id


@pytest.mark.timeout(480)  # its waits: 60 + 60 + 60 + 15 + 60 + 120 s: 375 s
def test_a_killed_live_service_resumes_from_the_ledger_without_solving_a_batch_twice_and_sleeps_while_idle(home):
    """Killed after its first publication, the service started again publishes nothing from the samples
    already solved, and meanwhile (nothing to do) it sleeps: its process's CPU over 10 s, from 5 s after it
    said it serves (past its first heartbeat and polls), is at most SPIN_GUARD_CORES. (The idle check was a
    test of its own, with a service started for it alone.)"""
    ledger = Ledger(home / "optimizer.duckdb")
    proc = _start(home, "--binding", "tanks-1")
    _ready(proc)
    _drop(home, "tanks-1", _continue_live_run(ledger, "tanks-1", 1), "a.csv")
    _wait(lambda: len(_publications(ledger, "tanks-1")) == 1, "the first publication")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    again = _start(home, "--binding", "tanks-1")
    try:
        _ready(again)
        # 15 s of polls: the samples already solved are not solved again, and the idle loop sleeps
        time.sleep(5.0)  # past its first heartbeat and polls
        stat = Path(f"/proc/{again.pid}/stat")
        ticks = lambda: sum(int(f) for f in stat.read_text().rsplit(")", 1)[1].split()[11:13])  # noqa: E731
        before, started = ticks(), time.monotonic()
        time.sleep(10.0)
        cores = (ticks() - before) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - started)
        print(f"idle service: {cores:.4f} cores")
        assert cores <= SPIN_GUARD_CORES
        assert len(_publications(ledger, "tanks-1")) == 1
        _drop(home, "tanks-1", _continue_live_run(ledger, "tanks-1", 1), "b.csv")
        _wait(lambda: len(_publications(ledger, "tanks-1")) == 2, "the publication after the restart")
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=120)
    assert again.returncode == 0
    open_recs = ledger.query("SELECT count(*) AS n FROM optimizer_recommendations WHERE binding_id = 'tanks-1' "
                             "AND status <> 'expired'")["n"].iloc[0]
    assert open_recs == 1


# ---------------------------------------------------------------------------- sharing the ledger

# the longest another process waits for the ledger while the service works (RELIABILITY.md: one tick of the
# loop plus the waiter's own poll; ~0.1 s measured on a quiet machine), with room for a loaded one
LEDGER_WAIT_BOUND_S = 2.5
# a CLI command with the embedded ledger's lock waits logged on stderr (DuckDBBackend._acquire logs each at DEBUG)
_LOGGING_LOCK_WAITS = ("import logging, sys\n"
                       "log = logging.getLogger('optimizer_pipeline.ledger.duckdb_backend')\n"
                       "log.setLevel(logging.DEBUG)\n"
                       "log.addHandler(logging.StreamHandler())\n"
                       "from optimizer_pipeline.cli import main\n"
                       "sys.exit(main(sys.argv[1:]))\n")


def _command_lock_waits(home: Path, *args: str, env: dict | None = None) -> list[float]:
    """Run `optimizer-pipeline --home HOME ARGS`; the lock waits it logged (s)."""
    done = subprocess.run([sys.executable, "-c", _LOGGING_LOCK_WAITS, "--home", str(home), *args], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, (args, done.stderr)
    return [float(w) for w in re.findall(r"waited ([0-9.]+) s for the lock", done.stderr)]


def _thread_cpu_s(thread: threading.Thread) -> float:
    """User + system CPU of one thread of this process so far (/proc)."""
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Arrivals(threading.Thread):
    """New samples of a binding's live run appended every `every_s` (a historian writing to the ledger),
    each append timed, until stopped."""

    def __init__(self, ledger: Ledger, binding_id: str, tags, every_s: float = 0.05):
        super().__init__(daemon=True)
        self.ledger, self.binding_id, self.tags, self.every_s = ledger, binding_id, tags, every_s
        self.frame = _continue_live_run(ledger, binding_id, 20_000)
        self.count, self.waits = 0, []
        self._halt = threading.Event()

    @property
    def last_t(self) -> float:
        return float(self.frame["timestamp"].iloc[self.count - 1])

    def run(self):
        while not self._halt.wait(self.every_s):
            started = time.monotonic()
            self.ledger.append_samples(self.binding_id, self.frame.iloc[[self.count]], self.tags, "simulation")
            self.waits.append(time.monotonic() - started)
            self.count += 1

    def halt(self):
        self._halt.set()
        self.join(WAIT_S)


def _held_and_fed(ledger: Ledger, settings, binding_id: str,
                  during: Callable[[], dict]) -> tuple[dict, float, Arrivals]:
    """A live service in this process serving `binding_id`, whose first solve is held while its samples keep
    arriving; `during()` runs meanwhile. Returns what it returned, the service thread's CPU meanwhile (cores)
    and the arrivals; the service then publishes the held solve and one from every sample that arrived."""
    entered, release = threading.Event(), threading.Event()
    tags = ledger.get_binding(binding_id).spec.tags
    with SolverPool(size=1) as pool:
        def held_solve(problem, timeout_ms=None):  # the first solve waits until `during` is done
            entered.set()
            release.wait(600)
            return pool.solve(problem, timeout_ms)

        service = LiveService(ledger, settings, held_solve, [LedgerSource(ledger, interval_s=0.05)],
                              bindings=[binding_id])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        arrivals = Arrivals(ledger, binding_id, tags)
        thread.start()
        arrivals.start()
        try:
            assert entered.wait(WAIT_S)
            cpu_before, started = _thread_cpu_s(thread), time.monotonic()
            result = during()
            cores = (_thread_cpu_s(thread) - cpu_before) / (time.monotonic() - started)
        finally:
            arrivals.halt()
            release.set()
        thread.join(WAIT_S)
        assert not thread.is_alive()
    published = _publications(ledger, binding_id)
    assert arrivals.count >= 20  # samples kept arriving throughout
    # the samples that arrived during the solve make the next one, none lost
    assert published["live_t"].tolist() == pytest.approx([arrivals.frame["timestamp"].iloc[0], arrivals.last_t])
    return result, cores, arrivals


@pytest.mark.timeout(900)  # three commands of up to 600 s in all, 2 x 60 s
def test_while_a_solve_is_held_and_samples_arrive_other_processes_get_the_embedded_ledger_within_the_bound(
        home, tmp_path):
    """A binding whose solve is in flight is parked, not work: the loop sleeps and hands the ledger over,
    so another process's ingest, a Dagster step's writes (materialize) and a CLI read each wait for the
    lock at most one tick of the loop."""
    ledger, settings = Ledger(home / "optimizer.duckdb"), load_settings(home)
    binding_file, history = tmp_path / "heater.json", tmp_path / "heater-more.csv"
    binding_file.write_text(ledger.get_binding("heater-1").spec.canonical_json())
    _continue_live_run(ledger, "heater-1", 3).to_csv(history, index=False)

    def commands() -> dict:
        return {"ingest": _command_lock_waits(home, "ingest", str(binding_file), str(history),
                                              "--source", "simulation"),
                "materialize": _command_lock_waits(home, "materialize", "heater-1"),
                "recommendation": _command_lock_waits(home, "recommendation", "heater-1")}

    waits, cores, arrivals = _held_and_fed(ledger, settings, "tanks-1", commands)
    print(waits, cores, max(arrivals.waits))
    assert sum(len(w) for w in waits.values()) >= 3  # they did meet the ledger held (by the service or the arrivals)
    for command, seen in waits.items():
        assert max(seen, default=0.0) <= LEDGER_WAIT_BOUND_S, (command, seen)
    assert max(arrivals.waits) <= LEDGER_WAIT_BOUND_S  # the historian's appends too
    assert cores <= SPIN_GUARD_CORES


# ---------------------------------------------------------------------------- PostgreSQL: several hosts, restarts

PG_IDS = [f"heater-{i}" for i in range(2)]
PG_TAGS = ("q_heat", "t_out", "t_in")
ENV = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}


def _pg_home(root: Path, url: str) -> Path:
    import yaml

    root.mkdir(parents=True)
    (root / "settings.yaml").write_text(yaml.safe_dump({"ledger": {"url": url}, "live": {"max_age_s": 86_400}}))
    return root


@pytest.fixture(scope="module")
def pg_template(postgres, tmp_path_factory) -> str:
    """A PostgreSQL ledger with two heaters ingested and refreshed (`materialize --all`, the real pool);
    each test works on a copy of it (CREATE DATABASE ... TEMPLATE)."""
    from optimizer_pipeline.contracts import binding_from_dict
    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend

    url = postgres.new_database()
    backend = PostgresBackend(url)
    plant = get_plant("heater")
    for binding_id in PG_IDS:
        Ledger(backend).ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), plant.history(1).frame,
                               "simulation")
    backend.close()
    home = _pg_home(tmp_path_factory.mktemp("pg") / "home", url)
    done = subprocess.run([*CLI, "--home", str(home), "materialize", "--all"], capture_output=True, text=True, env=ENV,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return url.rsplit("/", 1)[1]


def _pg_copy(postgres, template: str) -> str:
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    return postgres.url(name)


@pytest.mark.timeout(1200)  # pg_template's refresh 600 s (the first of its users), 60 + 60 + 3 + 60 + 90 + 2 x 120 s
def test_two_live_services_share_a_postgres_ledgers_bindings_and_one_takes_over_from_a_killed_one(
        postgres, pg_template, tmp_path):
    """Two hosts (a home each) on one PostgreSQL ledger: the bindings are split by leases, every sample
    batch is published exactly once, and a SIGKILLed service's bindings are taken over."""
    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend

    url = _pg_copy(postgres, pg_template)
    homes = [_pg_home(tmp_path / name, url) for name in ("host-a", "host-b")]
    ids, env = PG_IDS, ENV
    backend = PostgresBackend(url)
    ledger = Ledger(backend)
    procs = []
    try:
        for home in homes:
            procs.append(subprocess.Popen([*CLI, "--home", str(home), "live"], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=env, start_new_session=True))
            _ready(procs[-1])
        split = _wait(lambda: (lambda leases: len(leases) == 2 and len(set(leases.values())) == 2 and leases)(
            ledger.live_leases()), "the bindings split between the two services")
        owners = set(split.values())

        def batch(steps: int) -> None:
            for binding_id in ids:
                ledger.append_samples(binding_id, _continue_live_run(ledger, binding_id, steps), PG_TAGS,
                                      "simulation")

        def published() -> pd.DataFrame:
            return ledger.query("SELECT binding_id, live_t, service_id FROM live_publications")

        batch(1)
        _wait(lambda: len(published()) == 2, "one publication of each binding")
        time.sleep(3.0)  # more polls by both: still exactly one each
        first = published()
        assert len(first) == 2 and sorted(first["binding_id"]) == ids
        assert {row.binding_id: row.service_id for row in first.itertuples()} == split

        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].communicate(timeout=60)
        killed = [s.id for s in ledger.live_services() if s.pid == procs[0].pid][0]
        batch(1)
        taken = time.monotonic()
        _wait(lambda: len(published()) == 4, "the survivor publishing every binding", timeout_s=90)
        takeover_s = time.monotonic() - taken
        assert (published().groupby("binding_id").size() == 2).all()
        [survivor] = owners - {killed}
        assert set(ledger.live_leases().values()) == {survivor}
        assert takeover_s < 60, takeover_s
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=120)
        backend.close()
    assert procs[1].returncode == 0
    backend = PostgresBackend(url)
    try:
        assert Ledger(backend).live_leases() == {}  # a stopped service gives its leases up
    finally:
        backend.close()


@pytest.mark.timeout(1200)  # pg_template's refresh 600 s (the first of its users), two commands of 120 s, 2 x 60 s
def test_while_a_solve_is_held_and_samples_arrive_a_postgres_ledger_serves_the_others_and_the_loop_sleeps(
        postgres, pg_template, tmp_path):
    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
    from optimizer_pipeline.settings import Settings

    url = _pg_copy(postgres, pg_template)
    backend = PostgresBackend(url)
    ledger, home = Ledger(backend), _pg_home(tmp_path / "home", url)

    def commands() -> dict:
        times = {}
        for args in (("status",), ("recommendation", "heater-1")):
            started = time.monotonic()
            done = subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True, env=ENV,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            times[args[0]] = time.monotonic() - started
        return times

    try:
        times, cores, arrivals = _held_and_fed(ledger, Settings(live_max_age_s=86_400), "heater-0", commands)
    finally:
        backend.close()
    print(times, cores, max(arrivals.waits))
    assert max(arrivals.waits) <= LEDGER_WAIT_BOUND_S
    assert cores <= SPIN_GUARD_CORES


@pytest.mark.timeout(960)  # pg_template's refresh 600 s (the first of its users), then 4 x 60 s + 3 s
def test_a_postgres_restart_while_publishing_is_retried_and_no_batch_is_lost_or_doubled(postgres, pg_template):
    """The ledger goes away between a solve and its publication: the service retries with back-off and
    publishes the batch once the server is back; the batches after it too, each once."""
    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
    from optimizer_pipeline.settings import Settings

    backend = PostgresBackend(_pg_copy(postgres, pg_template))
    ledger = Ledger(backend)
    entered, release = threading.Event(), threading.Event()
    with SolverPool(size=1) as pool:
        def gated_solve(problem, timeout_ms=None):  # the first solve waits while the server is stopped
            entered.set()
            release.wait(WAIT_S)
            return pool.solve(problem, timeout_ms)

        service = LiveService(ledger, Settings(live_max_age_s=86_400), gated_solve, [LedgerSource(ledger, 0.1)],
                              bindings=["heater-0"])
        thread = threading.Thread(target=service.run, kwargs={"until": lambda: service.published >= 2})
        try:
            thread.start()
            first = _continue_live_run(ledger, "heater-0", 1)
            ledger.append_samples("heater-0", first, PG_TAGS, "simulation")
            assert entered.wait(WAIT_S)
            postgres.stop()
            release.set()
            time.sleep(3.0)  # the publication fails, is kept, and is tried again with back-off
            assert service.published == 0 and thread.is_alive()
        finally:
            postgres.start()
        _wait(lambda: service.published == 1, "the publication once the server is back")
        second = _continue_live_run(ledger, "heater-0", 1)
        ledger.append_samples("heater-0", second, PG_TAGS, "simulation")
        thread.join(WAIT_S)
        assert not thread.is_alive()
    published = _publications(ledger, "heater-0")
    backend.close()
    assert published["live_t"].tolist() == pytest.approx([first["timestamp"].iloc[0], second["timestamp"].iloc[0]])
