"""optimizer_pipeline.assets.batch: ledger sessions across the bindings of a many-partition step."""

import threading
import time

import pytest

from optimizer_pipeline.assets.batch import in_ledger_sessions
from optimizer_pipeline.ledger import Ledger, LedgerBusyError
from optimizer_pipeline.ledger.duckdb_backend import DuckDBBackend


def _can_write_from_another_thread(path) -> bool:
    """A second Ledger on the file, in another thread, with a short lock timeout."""
    outcome = []

    def write():
        try:
            with Ledger(path, lock_timeout_s=0.2).transaction():
                outcome.append(True)
        except LedgerBusyError:
            outcome.append(False)

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    return outcome[0]


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "ledger.duckdb")


@pytest.fixture
def opened(monkeypatch) -> list:
    """One entry per connection the ledger opens (the real open, counted)."""
    calls, real_open = [], DuckDBBackend._open
    monkeypatch.setattr(DuckDBBackend, "_open", lambda self: calls.append(1) or real_open(self))
    return calls


def test_one_connection_serves_the_bindings_within_the_hold_time(ledger, opened):
    with in_ledger_sessions(ledger, range(5), hold_s=60) as items:
        for _ in items:
            ledger.list_bindings()
            ledger.list_bindings()
    assert len(opened) == 1


def test_the_lock_is_let_go_after_the_hold_time(ledger, opened):
    with in_ledger_sessions(ledger, range(3), hold_s=0) as items:
        for _ in items:
            ledger.list_bindings()
    assert len(opened) == 3


def test_the_session_holds_the_ledger_between_bindings_while_nobody_waits(ledger):
    with in_ledger_sessions(ledger, range(2), hold_s=60) as items:
        for _ in items:
            ledger.list_bindings()  # the session takes the lock at its first call and keeps it
            assert not _can_write_from_another_thread(ledger.path)  # 0.2 s: it did not hand over for that
    assert _can_write_from_another_thread(ledger.path)


def test_a_writer_waiting_during_a_binding_goes_first_after_that_binding(ledger):
    """Another process or thread that waits for the ledger has it between two bindings (the step
    breaks its session and hands over), not after the whole step; the step then goes on."""
    started_at, served_at, wrote_at = {}, {}, []

    def write():
        with Ledger(ledger.path, lock_timeout_s=60).transaction():
            wrote_at.append(time.monotonic())

    writer = threading.Thread(target=write)
    with in_ledger_sessions(ledger, range(3), hold_s=60) as items:
        for i in items:
            started_at[i] = time.monotonic()
            ledger.list_bindings()
            served_at[i] = time.monotonic()
            if i == 0:
                writer.start()
                deadline = time.monotonic() + 30  # a bound, not a pause: the writer marks itself at once
                while not ledger.others_waiting():
                    assert time.monotonic() < deadline, "the writer never waited"
                    time.sleep(0.01)
                time.sleep(0.3)  # the binding goes on for a while: the writer keeps waiting meanwhile
                assert not wrote_at
    writer.join(timeout=60)
    assert sorted(started_at) == [0, 1, 2]  # every binding served
    # the writer had the ledger after binding 0 and before binding 1's first ledger call returned
    assert wrote_at and served_at[0] < wrote_at[0] < served_at[1]


def test_an_error_in_a_binding_releases_the_session_at_once(ledger):
    with pytest.raises(RuntimeError):
        with in_ledger_sessions(ledger, range(3), hold_s=60) as items:
            for i in items:
                if i == 1:
                    raise RuntimeError("binding failed")
    assert _can_write_from_another_thread(ledger.path)
