"""Ledger.session(): one lock and one connection for a batch of transactions (issue 8, "ledger write speed")."""

import subprocess
import sys
from dataclasses import replace

import pytest
from filelock import FileLock, Timeout

from optimizer_pipeline.ledger import Ledger, LedgerBusyError, LedgerError

from ledger_helpers import candidates, recommendation, run_row, solve

# a second process that reads the ledger once and prints how long that took (s)
TIMED_READ = """
import sys, time
from optimizer_pipeline.ledger import Ledger
ledger = Ledger(sys.argv[1])
started = time.monotonic()
ledger.counts()
print(time.monotonic() - started)
"""

# a second process: "busy" when the ledger is locked past its 0.2 s bound, else the number of runs
OTHER_PROCESS = """
import sys
from optimizer_pipeline.ledger import Ledger, LedgerBusyError
try:
    print(Ledger(sys.argv[1], lock_timeout_s=0.2).counts()["optimizer_runs"])
except LedgerBusyError:
    print("busy")
"""


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "optimizer.duckdb")


def other_process_reads(path) -> str:
    done = subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def lock_is_free(ledger: Ledger) -> bool:
    """Whether another holder could take the ledger's lock file now (a second FileLock is a second flock)."""
    probe = FileLock(str(ledger.path) + ".lock")
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return False
    probe.release()
    return True


def test_every_transaction_of_a_session_runs_on_one_connection(ledger):
    with ledger.session():
        with ledger.transaction() as first:
            ledger.insert_run(run_row(), first)
        solve(ledger)
        with ledger.transaction() as second:
            runs = second.execute("SELECT count(*) FROM optimizer_runs").fetchall()[0][0]
    assert second is first and runs == 2


def test_another_process_waits_during_a_session_and_reads_after_it(ledger):
    with ledger.session():
        solve(ledger)
        assert other_process_reads(ledger.path) == "busy"
    assert other_process_reads(ledger.path) == "1"


def test_the_session_holds_the_file_open_against_other_processes_from_its_first_call_until_it_ends(ledger):
    opener = "import duckdb, sys; duckdb.connect(sys.argv[1]).close()"
    with ledger.session():
        assert lock_is_free(ledger)  # nothing taken before the first call
        ledger.counts()
        held = subprocess.run([sys.executable, "-c", opener, str(ledger.path)], capture_output=True, text=True)
    after = subprocess.run([sys.executable, "-c", opener, str(ledger.path)], capture_output=True, text=True)
    assert held.returncode != 0 and "lock" in held.stderr.lower()
    assert after.returncode == 0, after.stderr


def test_a_failed_transaction_in_a_session_rolls_back_alone(ledger):
    run = replace(run_row(), id="or-duplicates")
    with ledger.session():
        first_run, first_rec = solve(ledger)
        with pytest.raises(LedgerError, match="(?i)duplicate key"):  # duplicate candidate ids: the primary key refuses
            ledger.record_solve(run, candidates() + candidates(), "m" * 64, recommendation(run.id),
                                run_status="succeeded", independent_cost=1.0, diagnostics={},
                                evidence_source="simulation")
        last_run, last_rec = solve(ledger)
    assert [r.id for r in ledger.list_runs()] == [first_run, last_run]
    assert ledger.counts()["optimizer_candidates"] == 4
    assert [r.status for r in ledger.list_recommendations()] == ["expired", "verified"]
    assert ledger.get_recommendation(first_rec).expired_reason == f"superseded by {last_rec}"


def test_a_nested_session_joins_the_open_one_and_the_outer_end_releases_the_lock(ledger):
    with ledger.session():
        with ledger.transaction() as outer:
            pass
        with ledger.session():
            with ledger.transaction() as inner:
                pass
        solve(ledger)  # the inner end closed nothing
        assert not lock_is_free(ledger)
    assert inner is outer and lock_is_free(ledger)
    assert ledger.counts()["optimizer_runs"] == 1


def test_a_second_ledger_object_of_the_same_file_joins_the_session(ledger):
    with ledger.session():
        with ledger.transaction() as conn:
            pass
        twin = Ledger(ledger.path, lock_timeout_s=0.2)  # its own lock would time out if it did not join
        with twin.transaction() as twin_conn:
            pass
        solve(twin)
    assert twin_conn is conn and ledger.counts()["optimizer_runs"] == 1


def test_a_transaction_inside_a_transaction_of_a_session_is_refused_and_rolls_back(ledger):
    with ledger.session():
        with pytest.raises(LedgerError, match="a transaction is already open in this session"):
            with ledger.transaction() as conn:
                ledger.insert_run(run_row(), conn)
                with ledger.transaction():
                    pass
        solve(ledger)  # the session is usable after the refusal
    assert ledger.counts()["optimizer_runs"] == 1


def test_a_session_that_cannot_take_the_lock_raises_ledger_busy_at_its_first_call(tmp_path):
    path = tmp_path / "l.duckdb"
    Ledger(path)
    impatient = Ledger(path, lock_timeout_s=0.2)
    with FileLock(str(path) + ".lock"):
        with pytest.raises(LedgerBusyError, match=r"stayed locked for 0\.2 s"):
            with impatient.session():
                impatient.counts()
    with impatient.session():  # nothing was left open by the failed attempt
        solve(impatient)
    assert impatient.counts()["optimizer_runs"] == 1


def test_a_session_lets_the_ledger_go_to_a_waiting_process_after_its_current_call(ledger):
    """The session keeps calling (a busy service); the other process, which finds the lock held, leaves its
    waiter mark and gets the ledger after one call of the session, not after the session (60 s)."""
    import threading
    import time

    done = threading.Event()
    calls = []

    def busy_session():
        with ledger.session():
            end = time.monotonic() + 60.0
            while time.monotonic() < end and not done.is_set():
                ledger.counts()
                calls.append(time.monotonic())
                time.sleep(0.02)

    holder = threading.Thread(target=busy_session)
    holder.start()
    try:
        while not calls:
            time.sleep(0.01)
        reader = subprocess.run([sys.executable, "-c", TIMED_READ, str(ledger.path)], capture_output=True, text=True,
                                timeout=60)
        session_went_on = holder.is_alive()
    finally:
        done.set()
        holder.join(60)
    assert reader.returncode == 0, reader.stderr
    # it read while the session went on, within 2 s of asking (~0.05 s on a quiet machine)
    assert session_went_on and float(reader.stdout) < 2.0
    assert not ledger.others_waiting()  # its mark is gone


def test_let_go_gives_the_file_up_until_the_sessions_next_call(ledger):
    opener = "import duckdb, sys; duckdb.connect(sys.argv[1]).close()"
    with ledger.session():
        ledger.counts()
        ledger.let_go()
        free = subprocess.run([sys.executable, "-c", opener, str(ledger.path)], capture_output=True, text=True)
        ledger.counts()
        held_again = not lock_is_free(ledger)
    assert free.returncode == 0, free.stderr
    assert held_again


def test_let_go_inside_a_transaction_keeps_it(ledger):
    with ledger.session():
        with ledger.transaction() as tx:
            ledger.let_go()
            assert not lock_is_free(ledger)
            tx.execute("SELECT 1").fetchall()


def test_a_waiter_mark_of_a_dead_process_is_not_waiting_and_is_removed(ledger, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    marks = tmp_path / "optimizer.duckdb.waiting"
    marks.mkdir()
    (marks / f"{dead.stdout.strip()}-1").touch()
    assert not ledger.others_waiting()
    assert list(marks.iterdir()) == []
    (marks / f"{subprocess.os.getpid()}-1").touch()  # a live one (this process's other thread)
    assert ledger.others_waiting()


def test_the_samples_stamp_changes_with_every_append_of_samples_and_only_then(ledger):
    from conftest import BINDING_DOC
    from optimizer_pipeline.contracts import binding_from_dict
    import pandas as pd

    before = ledger.samples_stamp()
    spec = binding_from_dict(BINDING_DOC)
    ledger.upsert_binding(spec)
    after_binding = ledger.samples_stamp()
    frame = pd.DataFrame({"run_id": ["r1"], "timestamp": [0.0], "v1": [1.0], "v2": [1.0], "y1": [5.0], "y2": [5.0]})
    ledger.append_samples(spec.id, frame, spec.tags, "simulation")
    first = ledger.samples_stamp()
    ledger.append_samples(spec.id, frame.assign(timestamp=5.0), spec.tags, "simulation")
    second = ledger.samples_stamp()
    assert before == after_binding == ""
    assert first not in ("", before) and second != first
