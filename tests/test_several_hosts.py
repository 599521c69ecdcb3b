"""Past one machine (issue 14): the ledger and the Dagster instance on PostgreSQL, runs on Celery
workers, with real servers started by the tests. Two workers, each with its own home directory
(they share nothing but the two servers), a daemon, a 4-binding refresh split into two runs of 2 (one
on each worker); then one worker is killed in the middle of a run, and a new refresh completes on the
other.

One test with its phases in order: starting the servers, two workers and a daemon is most of its
cost, so the deployment is started once. The workers come up while the bindings are seeded and the
refresh is submitted; every wait is on the event itself (a log line, a run status, a run event),
looked at every 0.1-0.2 s."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import DagsterInstance

from optimizer_pipeline.automation import CELERY_TASK_ID_TAG
from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.plants import get_plant

from ledger_helpers import ledger_at
from reliability_helpers import check_ledger_whole
from servers import redis_server

BINDINGS = [f"heater-{i}" for i in range(4)]
OPEN = {"verified", "unverified", "rejected"}
# the simulated histories end when they are seeded; these tests take minutes, and the live state's
# age is not their subject (tests/test_decision_matrix.py has it)
LIVE_AGE_S = 86_400


@pytest.fixture(scope="module")
def redis():
    with redis_server() as url:
        yield url


def _home(root: Path, name: str, settings: dict) -> Path:
    home = root / name
    home.mkdir(parents=True)
    (home / "settings.yaml").write_text(yaml.safe_dump(settings))
    return home


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}


def _start(home: Path, *args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args],
                            env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each, as a service manager would (all at once: they stop in parallel); each command
    must end within 60 s and leave no process of its group."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    late = []
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            late.append(proc.args)
    assert not late, f"did not stop within 60 s of SIGTERM: {late}"


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_for(text: str, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {log.name} after {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def _wait_for_runs(instance, run_ids: set[str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = {run_id: instance.get_run_by_id(run_id) for run_id in run_ids}
        statuses = {run_id: run.status.value if run else "MISSING" for run_id, run in runs.items()}
        if all(status in ("SUCCESS", "FAILURE", "CANCELED") for status in statuses.values()):
            return statuses
        time.sleep(0.2)
    raise AssertionError(f"runs not finished after {timeout_s:g} s: {statuses}")


def _celery_child(wrapper_pid: int) -> int:
    """The Celery worker process under an `optimizer-pipeline worker` command."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == wrapper_pid and b"celery" in cmdline:
                return int(entry.name)
    raise AssertionError(f"no celery process under {wrapper_pid}")


def _wait_for_event(instance, run_id: str, event_type: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.dagster_event and e.dagster_event.event_type_value == event_type for e in instance.all_logs(run_id)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {event_type} in run {run_id} after {timeout_s:g} s")


def _wait_for_blocked_write(url: str, table: str, timeout_s: float) -> None:
    """Until a session of the server waits for a lock on `table` (a statement blocked by the test's own)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                            "WHERE c.relname = %s AND NOT l.granted", [table]).fetchone()[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"no write to {table} waited for the test's lock after {timeout_s:g} s")


def _submit(home: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), "materialize", *args],
                          env=_env(), capture_output=True, text=True, timeout=timeout_s)


# its waits: submits 300 + 300 + 900 s, workers ready 2 x 120 s, runs 900 + 120 s, a step start 600 s, a
# blocked write 300 s, the killed worker 120 s, the stop 60 s: 3840 s (it takes about 2 minutes)
@pytest.mark.timeout(3900)
def test_two_workers_share_a_refresh_and_a_worker_killed_mid_run_fails_only_that_run(postgres, redis, tmp_path):
    ledger_url, dagster_url = postgres.new_database(), postgres.new_database()
    settings = {"ledger": {"url": ledger_url}, "live": {"max_age_s": LIVE_AGE_S},
                "dagster": {"postgres_url": dagster_url, "run_launcher": "celery", "broker": redis,
                            "max_partitions_per_run": 2}}
    homes = {name: _home(tmp_path, name, settings) for name in ("submitter", "daemon", "worker-a", "worker-b")}
    logs = {name: tmp_path / f"{name}.log" for name in ("daemon", "worker-a", "worker-b")}
    # the workers come up (Celery on Redis) while the bindings are seeded and the refresh submitted
    procs = {"worker-a": _start(homes["worker-a"], "worker", "--name", "a", log=logs["worker-a"]),
             "worker-b": _start(homes["worker-b"], "worker", "--name", "b", log=logs["worker-b"])}
    try:
        ledger = ledger_at(ledger_url)
        plant = get_plant("heater")
        for binding_id in BINDINGS:
            ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), plant.history(1).frame,
                          "simulation")

        # 1. a refresh in runs of 2 over both workers. Submitted before the daemon starts, so that
        # its binding_changes sensor finds the bindings covered by queued runs and launches nothing.
        # Both workers are up before the daemon starts, and a worker takes one run at a time
        # (-P solo, prefetch 1, late acks), so the two runs launched together go one to each.
        proc = _submit(homes["submitter"], "--all", "--no-wait")
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed = json.loads(proc.stdout)
        for name in ("worker-a", "worker-b"):
            _wait_for("ready.", logs[name])
        procs["daemon"] = _start(homes["daemon"], "daemon", log=logs["daemon"])
        with DagsterInstance.from_config(str(homes["submitter"] / "dagster")) as instance:
            statuses = _wait_for_runs(instance, {d["dagster_run_id"] for d in printed}, timeout_s=900)
        assert set(statuses.values()) == {"SUCCESS"}, (statuses, "".join(p.read_text()[-3000:] for p in logs.values()))
        assert [d["binding_id"] for d in printed] == BINDINGS and all(d["submitted"] for d in printed)
        assert len({d["dagster_run_id"] for d in printed}) == 2  # runs of at most 2 bindings
        runs = ledger.list_runs()
        assert sorted(r.binding_id for r in runs) == BINDINGS  # one solve each: the sensor left them to these runs
        assert {r.context["worker"] for r in runs} == {"a", "b"}  # both workers ran bindings

        # 2. the worker that takes the next run dies in the middle of it. The test holds the run there:
        # it locks optimizer_runs against writes (reads go on) before submitting, waits until the run's
        # step has started and a write is blocked on that lock (the step's, before its solve), kills the worker and only then lets the lock go
        celery = {name: _celery_child(procs[name].pid) for name in ("worker-a", "worker-b")}
        with psycopg.connect(ledger_url) as hold, DagsterInstance.from_config(str(homes["submitter"] / "dagster")) as instance:
            hold.execute("LOCK TABLE optimizer_runs IN EXCLUSIVE MODE")
            proc = _submit(homes["submitter"], BINDINGS[0], BINDINGS[1], "--no-wait")
            assert proc.returncode == 0, proc.stderr[-3000:]
            [run_id] = {d["dagster_run_id"] for d in json.loads(proc.stdout)}
            _wait_for_event(instance, run_id, "STEP_START", timeout_s=600)
            _wait_for_blocked_write(ledger_url, "optimizer_runs", timeout_s=300)
            # the worker that received this run's Celery task (not any "Task execute_job" line: the
            # "succeeded" line of a phase-1 run may be written after that run's status was read)
            task_id = instance.get_run_by_id(run_id).tags[CELERY_TASK_ID_TAG]
            [victim] = [name for name in ("worker-a", "worker-b")
                        if f"Task execute_job[{task_id}] received" in logs[name].read_text(errors="replace")]
            assert not instance.get_run_by_id(run_id).is_finished
            os.kill(celery[victim], signal.SIGKILL)
            hold.rollback()
            survivor = ({"worker-a", "worker-b"} - {victim}).pop()
            assert procs[victim].wait(120) != 0  # the command reports the death and ends
            assert _group_gone(procs[victim].pid), "the killed worker's step processes were left running"
            assert _wait_for_runs(instance, {run_id}, timeout_s=120) == {run_id: "FAILURE"}
        assert f"run {run_id} reported failed: its worker {victim[-1]} died" in logs[victim].read_text()
        check_ledger_whole(ledger, candidates_per_run=None)  # runs whole or absent, never half-written

        # 3. a new refresh of those bindings completes on the worker left
        proc = _submit(homes["submitter"], BINDINGS[0], BINDINGS[1], timeout_s=900)
        assert proc.returncode == 0, proc.stderr[-3000:] + logs[survivor].read_text()[-3000:]
    finally:
        _stop(list(procs.values()))
    for proc_ in procs.values():
        assert _group_gone(proc_.pid), "a process of the daemon / worker tree was left running"
    for binding_id in BINDINGS:
        recs = ledger.list_recommendations(binding_id)
        assert [r.status for r in recs if r.status in OPEN] == ["verified"], binding_id
    assert check_ledger_whole(ledger, candidates_per_run=None) >= len(BINDINGS) + 2
    assert not list(tmp_path.rglob("*.duckdb")), "a DuckDB file was written: the ledger must be on PostgreSQL"
    assert not list(tmp_path.rglob("*.db")), "a SQLite file was written: the Dagster instance must be on PostgreSQL"
