"""optimizer_pipeline.assets.batch: ledger sessions across the bindings of a many-partition step."""

import threading

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


def test_other_writers_wait_during_the_session_and_not_after_it(ledger):
    with in_ledger_sessions(ledger, range(2), hold_s=60) as items:
        for _ in items:
            assert not _can_write_from_another_thread(ledger.path)
    assert _can_write_from_another_thread(ledger.path)


def test_an_error_in_a_binding_releases_the_session_at_once(ledger):
    with pytest.raises(RuntimeError):
        with in_ledger_sessions(ledger, range(3), hold_s=60) as items:
            for i in items:
                if i == 1:
                    raise RuntimeError("binding failed")
    assert _can_write_from_another_thread(ledger.path)
