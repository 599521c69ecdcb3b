"""Sensors and the schedule on a real Dagster instance (issue 5, "Sensors", "Schedule").

The heater's home is seeded once per module, and refreshed once through Dagster; each test starts from a
copy of one of the two (the ledger's DuckDB file and the Dagster instance's folder, copied while no
instance is open on it: a real ledger and a real instance, this test's own)."""

import json
import shutil
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dagster import (RunRequest, SensorResult, SkipReason, build_schedule_context, build_sensor_context,
                     instance_for_test)

from optimizer_pipeline.assets.compat import range_tags
from optimizer_pipeline.automation import partition_ranges
from optimizer_pipeline.contracts import binding_from_dict, utc_now
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.model import identify
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.resources.ledger import LedgerResource, SettingsResource
from optimizer_pipeline.settings import ledger_path

from pipeline_fixtures import SEED, DemoHome, allow_live_age, seed_home


@pytest.fixture(scope="module")
def seeded_template(tmp_path_factory):
    """The heater's home seeded (no partition, no run yet) and an empty Dagster instance folder."""
    folder = tmp_path_factory.mktemp("seeded")
    # the module's tests decide minutes after this seeding on a loaded machine; their subject is not
    # the live state's age (pipeline_fixtures.LIVE_AGE_S)
    allow_live_age(folder / "home")
    seed_home(folder / "home", [get_plant("heater")])
    (folder / "dagster").mkdir()
    with instance_for_test(temp_dir=str(folder / "dagster")):
        pass  # the instance's storage created once
    return folder


@pytest.fixture(scope="module")
def refreshed_template(tmp_path_factory, seeded_template):
    """The seeded home with heater-1's partition added and its refresh run: a verified recommendation."""
    folder = tmp_path_factory.mktemp("refreshed")
    for name in ("home", "dagster"):
        shutil.copytree(seeded_template / name, folder / name)
    with _demo_home(folder) as home:
        home.instance.add_dynamic_partitions("bindings", ["heater-1"])
        home.run("heater-1")
        assert home.ledger.latest_recommendation("heater-1").status == "verified"
    return folder


@contextmanager
def _demo_home(folder: Path):
    plant = get_plant("heater")
    with instance_for_test(temp_dir=str(folder / "dagster")) as instance:
        yield DemoHome(folder / "home", Ledger(ledger_path(folder / "home")), instance, {plant.spec.id: plant},
                       in_process_solver=True)


def _copy_home(template: Path, tmp_path: Path):
    for name in ("home", "dagster"):
        shutil.copytree(template / name, tmp_path / name)
    return _demo_home(tmp_path)


@pytest.fixture
def heater_home(tmp_path, seeded_template):
    """This test's copy of the seeded home: no partition, no run yet."""
    with _copy_home(seeded_template, tmp_path) as home:
        yield home


@pytest.fixture
def refreshed_home(tmp_path, refreshed_template):
    """This test's copy of the refreshed home: heater-1's partition added and its refresh run (the
    tests that began with `add_dynamic_partitions` and `run("heater-1")`)."""
    with _copy_home(refreshed_template, tmp_path) as home:
        yield home


def _tick(home: DemoHome, name: str, cursor: str | None = None):
    defs = home.defs()
    sensor = defs.resolve_sensor_def(name)
    context = build_sensor_context(instance=home.instance, cursor=cursor, definitions=defs,
                                   resources={"ledger": LedgerResource(home=str(home.home)),
                                              "settings": SettingsResource(home=str(home.home))})
    return sensor(context)


def test_new_binding_adds_its_partition_and_requests_refresh(heater_home):
    result = _tick(heater_home, "binding_changes")
    assert [r.partition_key for r in result.run_requests] == ["heater-1"]
    assert [r.run_key for r in result.run_requests] == ["heater-1@r1"]
    assert result.dynamic_partitions_requests[0].partition_keys == ["heater-1"]
    runs = heater_home.ledger.run_counts()["heater-1"]
    assert runs > 2 and json.loads(result.cursor) == {"heater-1": [1, runs]}


def test_unchanged_binding_requests_nothing(heater_home):
    first = _tick(heater_home, "binding_changes")
    heater_home.instance.add_dynamic_partitions("bindings", ["heater-1"])
    again = _tick(heater_home, "binding_changes", first.cursor)
    assert again.run_requests == [] and again.skip_reason is not None


def test_changed_revision_expires_the_old_recommendation_and_requests_one_refresh(refreshed_home):
    old = refreshed_home.ledger.latest_recommendation("heater-1")
    cursor = _tick(refreshed_home, "binding_changes").cursor  # revision 1 already solved: no request
    assert json.loads(cursor)["heater-1"][0] == 1

    doc = refreshed_home.plants["heater-1"].binding_doc()
    doc["cvs"][0]["target"] = 48.0
    upsert = refreshed_home.ledger.upsert_binding(binding_from_dict(doc))
    assert (upsert.revision, upsert.expired) == (2, 1)
    assert refreshed_home.ledger.get_recommendation(old.id).status == "expired"

    _append_live_samples(refreshed_home, "heater-1", 2)  # new samples: the new revision's refresh, not a solve
    assert isinstance(_tick(refreshed_home, "new_samples"), SkipReason)
    result = _tick(refreshed_home, "binding_changes", cursor)
    assert [(r.partition_key, r.run_key) for r in result.run_requests] == [("heater-1", "heater-1@r2")]
    assert _tick(refreshed_home, "binding_changes", result.cursor).run_requests == []

    refreshed_home.run("heater-1")  # what the requested run does
    new = refreshed_home.ledger.latest_recommendation("heater-1")
    assert new.binding_revision == 2 and new.status == "verified"
    assert new.payload["predicted"][-1][0] == pytest.approx(48.0, abs=0.5)


def _outcome(result) -> tuple[list, str | None, str | None]:
    """(run requests, skip message, cursor) of a sensor's answer (SensorResult, a list or a SkipReason)."""
    if isinstance(result, SensorResult):
        skip = result.skip_reason.skip_message if result.skip_reason else None
        return list(result.run_requests or []), skip, result.cursor
    if isinstance(result, SkipReason):
        return [], result.skip_message, None
    return list(result), None, None


def _calibrate(heater_home, days_old: float) -> str:
    plant = heater_home.plants["heater-1"]
    artifact = identify(prepare_history(plant.history(SEED).frame, plant.spec), plant.spec, 1)
    return heater_home.ledger.put_calibration(artifact, {}, has_evidence=False, method=None, coverage=None,
                                              threshold=None, reasons=["test"],
                                              calibrated_at=utc_now() - timedelta(days=days_old))


def test_fresh_calibration_requests_nothing_and_says_so(heater_home):
    heater_home.instance.add_dynamic_partitions("bindings", ["heater-1"])
    _calibrate(heater_home, days_old=6.9)  # uq.fresh_days = 7
    requests, skip, _ = _outcome(_tick(heater_home, "uq_freshness"))
    assert (requests, skip) == ([], "every calibration is fresh")


def test_stale_calibration_requests_recalibrate_once(heater_home):
    heater_home.instance.add_dynamic_partitions("bindings", ["heater-1"])
    cal_id = _calibrate(heater_home, days_old=8)
    first, _, cursor = _outcome(_tick(heater_home, "uq_freshness"))
    assert [(r.partition_key, r.run_key) for r in first] == [("heater-1", f"heater-1@{cal_id}")]
    assert all(isinstance(r, RunRequest) for r in first)
    second, skip, cursor = _outcome(_tick(heater_home, "uq_freshness", cursor))  # the same stale calibration
    assert second == [] and skip == "stale calibration(s) of heater-1 already requested"
    third, _, cursor = _outcome(_tick(heater_home, "uq_freshness", cursor))
    assert third == []
    _calibrate(heater_home, days_old=0)  # what the requested run does
    requests, skip, _ = _outcome(_tick(heater_home, "uq_freshness", cursor))
    assert (requests, skip) == ([], "every calibration is fresh")


def test_expiry_sensor_records_expiry_past_valid_until(heater_home):
    from ledger_helpers import solve

    _, rec_id = solve(heater_home.ledger, binding_id="heater-1", valid_for_s=-5)
    skip = _tick(heater_home, "recommendation_expiry")
    assert "expired 1 recommendation" in skip.skip_message
    assert heater_home.ledger.get_recommendation(rec_id).status == "expired"


def _schedule_tick(home: DemoHome, defs, schedule, when: datetime):
    """One tick, its context closed on the way out: the context enters an instance of its own (from
    the instance's ref), which makes it Dagster's current one until closed. Left to the garbage
    collector, its closing would put back, during some later test, the current instance of this one
    (by then gone: "Attempted to resolve undefined DagsterInstance weakref", seen under xdist)."""
    with build_schedule_context(instance=home.instance, scheduled_execution_time=when,
                                repository_def=defs.get_repository_def()) as context:
        return schedule.evaluate_tick(context)


def test_daily_schedule_recalibrates_every_partition_in_one_run(heater_home):
    plant = heater_home.plants["heater-1"]
    heater_home.ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": "heater-2"}), plant.history(SEED).frame,
                              "simulation")
    heater_home.instance.add_dynamic_partitions("bindings", ["heater-1", "heater-2"])
    defs = heater_home.defs()
    schedule = defs.resolve_schedule_def("daily_recalibration")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.execution_timezone == "UTC"
    when = datetime(2026, 11, 30, 3, 0, tzinfo=timezone.utc)
    (request,) = _schedule_tick(heater_home, defs, schedule, when).run_requests
    assert request.job_name in (None, "refresh") and request.partition_key is None
    assert range_tags("heater-1", "heater-2").items() <= request.tags.items()
    # one run per scheduled time: the same tick again has the same key, the next day's tick another
    assert request.run_key == "all@2026-11-30T03:00:00+00:00"
    (same,) = _schedule_tick(heater_home, defs, schedule, when).run_requests
    (next_day,) = _schedule_tick(heater_home, defs, schedule, when + timedelta(days=1)).run_requests
    assert (same.run_key, next_day.run_key) == (request.run_key, "all@2026-12-01T03:00:00+00:00")

    # the schedule's job: the run ends with a recommendation from the new calibration
    result = defs.resolve_job_def(schedule.job_name).execute_in_process(instance=heater_home.instance,
                                                                        tags=range_tags("heater-1", "heater-2"))
    assert result.success
    materialized = {(e.asset_key.path[-1], e.partition) for e in result.get_asset_materialization_events()}
    assert {("uq_calibration", b) for b in ("heater-1", "heater-2")} <= materialized
    assert {("recommendation", b) for b in ("heater-1", "heater-2")} <= materialized
    for binding_id in ("heater-1", "heater-2"):
        calibration = heater_home.ledger.latest_calibration(binding_id)
        run = heater_home.ledger.get_run(heater_home.ledger.latest_recommendation(binding_id).run_id)
        assert run.context["calibration_id"] == calibration.id


def test_schedule_cron_and_timezone_come_from_settings(heater_home, monkeypatch):
    monkeypatch.setenv("OPTIMIZER_SCHEDULE_CRON", "30 4 * * 1-5")
    monkeypatch.setenv("OPTIMIZER_SCHEDULE_TIMEZONE", "Europe/Berlin")
    schedule = heater_home.defs().resolve_schedule_def("daily_recalibration")
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("30 4 * * 1-5", "Europe/Berlin")


@pytest.mark.parametrize("wanted, expected", [
    (["a", "b", "c", "d"], [("a", "d")]),
    (["b", "d"], [("b", "b"), ("d", "d")]),
    (["d", "a", "b"], [("a", "b"), ("d", "d")]),
    ([], []),
])
def test_partition_ranges_are_the_stretches_of_the_wanted_keys_in_instance_order(wanted, expected):
    assert partition_ranges(["a", "b", "c", "d"], wanted) == expected


def _append_live_samples(home: DemoHome, binding_id: str, steps: int) -> float:
    """Continue the live run by `steps` sample periods (its last row repeated later); the newest time."""
    stored = home.ledger.get_binding(binding_id)
    frame = home.ledger.history_frame(binding_id, stored.spec.tags)
    live = frame[frame["run_id"] == frame.loc[frame["timestamp"].idxmax(), "run_id"]]
    last = live.iloc[[-1]].copy()
    rows = []
    for k in range(1, steps + 1):
        row = last.copy()
        row["timestamp"] = float(last["timestamp"].iloc[0]) + k * stored.spec.sample_period_s
        rows.append(row)
    import pandas as pd

    home.ledger.append_samples(binding_id, pd.concat(rows), stored.spec.tags, "simulation")
    return float(rows[-1]["timestamp"].iloc[0])


def test_new_samples_request_one_solve_of_their_binding_and_none_once_solved(heater_home):
    assert isinstance(_tick(heater_home, "new_samples"), SkipReason)  # no recommendation yet: binding_changes' job
    heater_home.instance.add_dynamic_partitions("bindings", ["heater-1"])
    heater_home.run("heater-1")
    assert isinstance(_tick(heater_home, "new_samples"), SkipReason)  # solved from the newest sample

    _append_live_samples(heater_home, "heater-1", 2)
    newest = _append_live_samples(heater_home, "heater-1", 4)  # a burst: two files before one tick
    requests = _tick(heater_home, "new_samples")
    assert [(r.partition_key, r.run_key) for r in requests] == [("heater-1", f"heater-1@t{newest:.3f}")]

    heater_home.run("heater-1", job="solve")
    assert isinstance(_tick(heater_home, "new_samples"), SkipReason)
    run = heater_home.ledger.get_run(heater_home.ledger.latest_recommendation("heater-1").run_id)
    assert run.context["live_t"] == pytest.approx(newest)


def _drop(home: DemoHome, binding_id: str, name: str, steps: int, start: int = 1) -> float:
    """A historian export: the live run continued by `steps` periods, written under a temporary name
    and renamed when done (as docs/history.md, "Historian drop folder", asks); returns the newest time."""
    import pandas as pd

    stored = home.ledger.get_binding(binding_id)
    frame = home.ledger.history_frame(binding_id, stored.spec.tags)
    live = frame[frame["run_id"] == frame.loc[frame["timestamp"].idxmax(), "run_id"]]
    last = live.iloc[[-1]]
    rows = pd.concat([last.assign(timestamp=float(last["timestamp"].iloc[0]) + k * stored.spec.sample_period_s)
                      for k in range(start, start + steps)])
    folder = home.home / "inbox" / binding_id
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / f"{name}.part", index=False)
    (folder / f"{name}.part").rename(folder / name)
    return float(rows["timestamp"].max())


def test_a_dropped_history_file_is_ingested_and_re_solves_its_binding(refreshed_home):
    newest = _drop(refreshed_home, "heater-1", "export-1.csv", 3)
    (refreshed_home.home / "inbox" / "heater-1" / "export-2.csv.part").write_text("still being written")
    [request] = _tick(refreshed_home, "history_inbox")  # ingested, and its binding's re-solve requested at once
    assert (request.partition_key, request.run_key) == ("heater-1", f"heater-1@t{newest:.3f}")
    folder = refreshed_home.home / "inbox" / "heater-1"
    assert (folder / "done" / "export-1.csv").exists() and not (folder / "export-1.csv").exists()
    assert (folder / "export-2.csv.part").exists()  # unfinished: left alone
    refreshed_home.run("heater-1", job="solve")
    assert isinstance(_tick(refreshed_home, "new_samples"), SkipReason)  # solved from the file's newest sample
    assert _tick(refreshed_home, "history_inbox").skip_message == "no history file waiting in the inbox"


def test_a_burst_of_five_files_gives_one_re_solve(refreshed_home):
    newest = max(_drop(refreshed_home, "heater-1", f"burst-{i}.csv", 2, start=1 + 2 * i) for i in range(5))
    requests = _tick(refreshed_home, "history_inbox")
    assert [r.run_key for r in requests] == [f"heater-1@t{newest:.3f}"]
    assert len(list((refreshed_home.home / "inbox" / "heater-1" / "done").iterdir())) == 5


def test_a_file_for_a_binding_without_a_recommendation_is_ingested_and_left_to_binding_changes(heater_home):
    newest = _drop(heater_home, "heater-1", "early.csv", 2)
    skipped = _tick(heater_home, "history_inbox")
    assert "1 file(s) ingested, 0 rejected; nothing to re-solve" in skipped.skip_message
    assert heater_home.ledger.newest_samples()["heater-1"] == pytest.approx(newest)


def test_a_broken_or_unknown_binding_file_is_set_aside_with_its_reason_and_the_ledger_unchanged(heater_home):
    before = heater_home.ledger.counts()
    folder = heater_home.home / "inbox" / "heater-1"
    folder.mkdir(parents=True)
    (folder / "broken.csv").write_text("run_id,timestamp\nr1,not-a-time\n")
    _drop(heater_home, "heater-1", "good.csv", 1)
    stray = heater_home.home / "inbox" / "no-such-binding"
    stray.mkdir()
    (stray / "x.csv").write_text("run_id,timestamp\n")
    assert "1 file(s) ingested, 2 rejected" in _tick(heater_home, "history_inbox").skip_message
    reason = (folder / "rejected" / "broken.csv.error.txt").read_text().strip()
    assert reason.startswith(str(folder / "broken.csv")) and len(reason.splitlines()) == 1
    assert "binding 'no-such-binding' is not in the ledger" in (stray / "rejected" / "x.csv.error.txt").read_text()
    after = heater_home.ledger.counts()
    assert after["plant_samples"] > before["plant_samples"]  # only the good file's samples
    assert {k: v for k, v in after.items() if k != "plant_samples"} == \
        {k: v for k, v in before.items() if k != "plant_samples"}


def test_a_recalibration_ends_with_one_re_solve(refreshed_home):
    """The `recalibrate` job (or a calibration materialized alone) makes a calibration the open
    recommendation was not solved with: new_samples requests one solve, keyed by the calibration."""
    assert isinstance(_tick(refreshed_home, "new_samples"), SkipReason)
    refreshed_home.run("heater-1", job="recalibrate")
    calibration = refreshed_home.ledger.latest_calibration("heater-1")
    solved = refreshed_home.ledger.get_run(refreshed_home.ledger.latest_recommendation("heater-1").run_id)
    assert calibration.id != solved.context["calibration_id"]
    [request] = _tick(refreshed_home, "new_samples")
    assert (request.partition_key, request.run_key) == ("heater-1", f"heater-1@{calibration.id}")
    assert "recalibrated" in request.tags["optimizer/reason"]
    refreshed_home.run("heater-1", job="solve")
    latest = refreshed_home.ledger.latest_recommendation("heater-1")
    assert refreshed_home.ledger.get_run(latest.run_id).context["calibration_id"] == calibration.id
    assert isinstance(_tick(refreshed_home, "new_samples"), SkipReason)


def test_a_busy_ledger_leaves_the_files_in_the_inbox_for_the_next_tick(refreshed_home, monkeypatch):
    """Not the files' fault: while another process holds the ledger's lock past the bound (0.3 s here,
    the sensor's ledger opened with it) the first file waits, the sensor stops there (the others wait
    too) and the tick ends with the reason; the next tick, the lock free, ingests them all."""
    from filelock import FileLock

    from optimizer_pipeline.ledger import Ledger

    _drop(refreshed_home, "heater-1", "a.csv", 2)
    newest = _drop(refreshed_home, "heater-1", "b.csv", 2, start=3)
    folder = refreshed_home.home / "inbox" / "heater-1"
    path = ledger_path(refreshed_home.home)
    monkeypatch.setattr(LedgerResource, "ledger", lambda self: Ledger(path, lock_timeout_s=0.3))
    with FileLock(str(path) + ".lock"):
        skipped = _tick(refreshed_home, "history_inbox")
    assert "0 file(s) ingested, 0 rejected, 2 left in the inbox for the next tick; the ledger is busy" in \
        skipped.skip_message
    assert (folder / "a.csv").exists() and (folder / "b.csv").exists() and not (folder / "rejected").exists()
    [request] = _tick(refreshed_home, "history_inbox")
    assert request.run_key == f"heater-1@t{newest:.3f}"
    assert sorted(p.name for p in (folder / "done").iterdir()) == ["a.csv", "b.csv"]


def test_a_file_that_cannot_be_moved_stays_and_does_not_hold_up_the_others(refreshed_home):
    """done/ cannot be made (a dangling link has its name): the file's samples are stored, it stays in
    the inbox (read again next tick, its samples stored once), and the files after it are still read."""
    first = _drop(refreshed_home, "heater-1", "a.csv", 2)
    folder = refreshed_home.home / "inbox" / "heater-1"
    (folder / "done").symlink_to(folder / "nowhere")
    stray = refreshed_home.home / "inbox" / "no-such-binding"
    stray.mkdir()
    (stray / "x.csv").write_text("run_id,timestamp\n")
    [request] = _tick(refreshed_home, "history_inbox")
    assert request.run_key == f"heater-1@t{first:.3f}"
    assert (folder / "a.csv").exists() and (stray / "rejected" / "x.csv.error.txt").exists()
    samples = refreshed_home.ledger.counts()["plant_samples"]
    _tick(refreshed_home, "history_inbox")  # read again: nothing stored twice
    assert refreshed_home.ledger.counts()["plant_samples"] == samples and (folder / "a.csv").exists()
    # a refused file that cannot be moved to rejected/ is still a refusal (not a file waiting for the ledger)
    from optimizer_pipeline.inbox import ingest_inbox_file

    (stray / "rejected").rename(stray / "kept")
    (stray / "rejected").symlink_to(stray / "nowhere")
    (stray / "y.csv").write_text("run_id,timestamp\n")
    refused = ingest_inbox_file(refreshed_home.ledger, stray / "y.csv")
    assert not refused.ingested and not refused.waiting and (stray / "y.csv").exists()
    assert "is not in the ledger" in refused.detail and "cannot move it to rejected/" in refused.detail


def test_a_revision_whose_refresh_failed_is_refreshed_again_when_a_new_run_arrives(tmp_path):
    """A binding ingested with one run: its refresh fails (no run to train on besides the live one) and
    leaves no recommendation. The same samples, or more of the same run (every export of a historian),
    request nothing more: they would fail the same way. A new run requests one refresh, which now
    succeeds; so does a cursor written before runs were counted (one retry)."""
    plant = get_plant("heater")
    frame = plant.history(SEED).frame
    runs = list(dict.fromkeys(frame["run_id"]))
    first_run = frame["run_id"] == runs[0]
    ledger = Ledger(ledger_path(tmp_path / "home"))
    ledger.ingest(plant.spec, frame[first_run].iloc[:-50], "simulation")
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        home = DemoHome(tmp_path / "home", ledger, instance, {plant.spec.id: plant}, in_process_solver=True)
        first = _tick(home, "binding_changes")
        assert [r.run_key for r in first.run_requests] == ["heater-1@r1"]
        instance.add_dynamic_partitions("bindings", ["heater-1"])
        failed = home.defs().resolve_job_def("refresh").execute_in_process(partition_key="heater-1", instance=instance,
                                                                           raise_on_error=False)
        assert not failed.success and ledger.latest_recommendation("heater-1") is None
        same = _tick(home, "binding_changes", first.cursor)
        assert same.run_requests == [] and same.skip_reason is not None
        ledger.append_samples(plant.spec.id, frame[first_run].iloc[-50:], plant.spec.tags, "simulation")
        more = _tick(home, "binding_changes", same.cursor)  # the same run, longer: still one run
        assert more.run_requests == [] and json.loads(more.cursor) == {"heater-1": [1, 1]}
        # a cursor from before runs were counted: one retry, which records the count
        assert [r.run_key for r in _tick(home, "binding_changes", json.dumps({"heater-1": 1})).run_requests] == \
            ["heater-1@r1@n1"]

        ledger.append_samples(plant.spec.id, frame[~first_run], plant.spec.tags, "simulation")
        again = _tick(home, "binding_changes", more.cursor)
        assert [(r.partition_key, r.run_key) for r in again.run_requests] == [("heater-1", f"heater-1@r1@n{len(runs)}")]
        assert f"now holds {len(runs)} run(s)" in again.run_requests[0].tags["optimizer/reason"]
        assert _tick(home, "binding_changes", again.cursor).run_requests == []
        home.run("heater-1")  # what the requested run does
        assert ledger.latest_recommendation("heater-1").status == "verified"


def test_while_a_live_service_serves_a_binding_the_sensors_leave_its_samples_and_files_to_it(refreshed_home):
    refreshed_home.ledger.live_register("live-x", "host-a", 123, ["heater-1"])
    refreshed_home.ledger.live_heartbeat("live-x", "serving")
    assert refreshed_home.ledger.live_lease("live-x", take=["heater-1"], keep=[], release=[], ttl_s=60) == {"heater-1"}
    _append_live_samples(refreshed_home, "heater-1", 2)
    assert isinstance(_tick(refreshed_home, "new_samples"), SkipReason)  # the service re-solves them
    _drop(refreshed_home, "heater-1", "export.csv", 1, start=3)
    assert _tick(refreshed_home, "history_inbox").skip_message == \
        "the history files waiting in the inbox are a live service's"
    assert (refreshed_home.home / "inbox" / "heater-1" / "export.csv").exists()
    assert "live service live-x on host-a (pid 123) serving, serving heater-1" in \
        _tick(refreshed_home, "live_service").skip_message

    with refreshed_home.ledger.transaction() as tx:  # its heartbeat stops: killed, or its host is gone
        tx.execute("UPDATE live_services SET heartbeat_at = heartbeat_at - INTERVAL 10 MINUTE")
        tx.execute("UPDATE live_leases SET expires_at = expires_at - INTERVAL 10 MINUTE")
    with pytest.raises(Exception, match=r"live service live-x on host-a \(pid 123\) has not sent a heartbeat for "
                                        r"6\d\d s: its bindings are re-solved by the sensors"):
        _tick(refreshed_home, "live_service")
    [request] = _tick(refreshed_home, "history_inbox")  # the sensors take over at once
    assert request.partition_key == "heater-1"

    refreshed_home.ledger.live_heartbeat("live-x", "stopped")
    assert _tick(refreshed_home, "live_service").skip_message.startswith("no live service is running")
