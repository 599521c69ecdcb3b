"""At most one open recommendation per binding, under contention and across a binding change, held
by the database itself (issue 18, "the race"), on both backends.

Before this test existed nothing made two solves of one binding overlap; the database had no
guarantee behind the rule; and a solve that read revision r and committed after the binding moved
to r + 1 left an open recommendation for the old revision."""

import multiprocessing as mp
import threading
import time
from dataclasses import replace

import pytest

from optimizer_pipeline.contracts import RecommendationStatus, binding_from_dict
from optimizer_pipeline.ledger import Ledger, LedgerError
from optimizer_pipeline.ledger.postgres_backend import PostgresBackend

from conftest import BINDING_DOC
from ledger_helpers import candidates, ledger_at, recommendation, run_row, solve

SOLVERS = 6
OPEN = {RecommendationStatus.VERIFIED.value, RecommendationStatus.UNVERIFIED.value,
        RecommendationStatus.REJECTED.value}


def _solver(where: str, barrier, queue) -> None:
    ledger = ledger_at(where)
    # every process is connected; now all of them write at once. A bound, not a pause: 6 spawned processes
    # import and connect in ~10-15 s on 2 cores at load 2 (the whole test: 15-21 s)
    barrier.wait(timeout=240)
    queue.put(solve(ledger)[1])


def _open(ledger, binding_id="tanks-1"):
    return [r for r in ledger.list_recommendations(binding_id) if r.status in OPEN]


@pytest.mark.timeout(600)  # the waits below: 300 s for the solvers' results, then 60 s for their exits
def test_processes_released_together_on_one_binding_leave_exactly_one_open_recommendation(ledger_location):
    ledger = ledger_at(ledger_location)
    ledger.upsert_binding(binding_from_dict(BINDING_DOC))  # tanks-1, revision 1: the row the writers lock
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(SOLVERS), ctx.Queue()
    procs = [ctx.Process(target=_solver, args=(ledger_location, barrier, queue)) for _ in range(SOLVERS)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300  # the solvers run at once: one wait for them all, not one each
    published = [queue.get(timeout=max(deadline - time.monotonic(), 0.1)) for _ in procs]
    deadline = time.monotonic() + 60
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.1))
        assert p.exitcode == 0
    recs = ledger.list_recommendations("tanks-1")
    assert sorted(r.id for r in recs) == sorted(published)
    [still_open] = _open(ledger)
    superseded = [r for r in recs if r.status == "expired"]
    assert len(superseded) == SOLVERS - 1
    assert all(r.expired_reason.startswith("superseded by rec-") for r in superseded)
    # the open one is the last published: every other names a later one as its successor
    assert {r.expired_reason.removeprefix("superseded by ") for r in superseded} <= {r.id for r in recs}
    assert still_open.id not in {r.id for r in superseded}


def test_the_database_refuses_a_second_open_recommendation_of_a_binding(any_ledger):
    first = recommendation("or-first")
    any_ledger.insert_recommendation(first, "simulation")
    with pytest.raises(LedgerError):
        any_ledger.insert_recommendation(recommendation("or-second"), "simulation")  # supersedes nothing
    assert [r.id for r in _open(any_ledger)] == [first.id]


def test_an_expired_recommendation_no_longer_counts_as_open_for_the_database(any_ledger):
    first = recommendation("or-first")
    any_ledger.insert_recommendation(first, "simulation")
    any_ledger.expire(binding_id="tanks-1", reason="operator withdrew it")
    second = recommendation("or-second")
    any_ledger.insert_recommendation(second, "simulation")
    assert [r.id for r in _open(any_ledger)] == [second.id]


def test_a_solve_whose_binding_changed_before_its_commit_is_recorded_born_expired(any_ledger):
    """A barrier between the solve's read of the binding (revision 1) and its commit; meanwhile the
    binding changes to revision 2."""
    any_ledger.upsert_binding(binding_from_dict(BINDING_DOC))
    read_done, changed = threading.Barrier(2), threading.Event()

    def change_binding():
        read_done.wait(timeout=30)
        any_ledger.upsert_binding(binding_from_dict({**BINDING_DOC, "unit": "renamed while solving"}))
        changed.set()

    thread = threading.Thread(target=change_binding)
    thread.start()
    revision = any_ledger.get_binding("tanks-1").revision  # what the solve was compiled for
    read_done.wait(timeout=30)
    assert changed.wait(timeout=30)
    _, rec_id = solve(any_ledger, revision=revision)
    thread.join()

    rec = any_ledger.get_recommendation(rec_id)
    assert (revision, any_ledger.get_binding("tanks-1").revision) == (1, 2)
    assert rec.status == "expired" and rec.expired_at is not None
    assert rec.expired_reason == "binding tanks-1 changed to revision 2 while solving revision 1"
    assert rec.payload["status"] == "verified"  # what it was decided as, kept in the published payload
    assert _open(any_ledger) == []
    assert any_ledger.get_run(rec.run_id).status == "succeeded"  # the run and its candidates are recorded


def test_a_solve_for_the_current_revision_supersedes_the_open_one(any_ledger):
    any_ledger.upsert_binding(binding_from_dict(BINDING_DOC))
    _, first = solve(any_ledger)
    _, second = solve(any_ledger)
    assert [r.id for r in _open(any_ledger)] == [second]
    assert any_ledger.get_recommendation(first).expired_reason == f"superseded by {second}"


def test_a_solve_that_supersedes_nothing_is_refused_whole_while_the_binding_has_an_open_one(any_ledger):
    _, first = solve(any_ledger)
    run = replace(run_row(), id="or-second")
    with pytest.raises(LedgerError):
        any_ledger.record_solve(run, candidates(), "m" * 64, recommendation("or-second"), run_status="succeeded",
                                independent_cost=2.0, diagnostics={}, evidence_source="simulation", supersede=False)
    assert [r.id for r in _open(any_ledger)] == [first]
    counts = any_ledger.counts()  # one transaction: nothing of the refused solve is written
    assert (counts["optimizer_runs"], counts["optimizer_candidates"], counts["optimizer_recommendations"]) == (1, 2, 1)


def test_a_binding_change_during_a_solves_locked_publish_waits_for_it_and_expires_it(postgres, monkeypatch):
    """The interleaving the file lock rules out on DuckDB: a solve has locked its binding and read
    revision 1 (held there by the test), and the binding changes meanwhile. The change waits for the
    solve's lock (the server shows it waiting), then expires the recommendation the solve committed:
    no open recommendation is left for revision 1. Without the lock in `upsert_binding` the change
    commits at once and the solve's recommendation stays open for the old revision."""
    import psycopg

    url = postgres.new_database()
    ledger = Ledger(PostgresBackend(url))
    watcher = psycopg.connect(url, autocommit=True)
    try:
        ledger.upsert_binding(binding_from_dict(BINDING_DOC))
        read, release = threading.Event(), threading.Event()
        original = Ledger._insert_recommendation

        def paused(*args, **kwargs):  # called by _publish after the lock and the revision read
            read.set()
            assert release.wait(timeout=60)
            return original(*args, **kwargs)

        monkeypatch.setattr(Ledger, "_insert_recommendation", staticmethod(paused))
        published, changed = [], []
        solver = threading.Thread(target=lambda: published.append(solve(ledger)[1]))
        solver.start()
        assert read.wait(timeout=60)
        changer = threading.Thread(target=lambda: changed.append(
            ledger.upsert_binding(binding_from_dict({**BINDING_DOC, "unit": "renamed while solving"}))))
        changer.start()

        def waiting_on_a_lock() -> int:
            return watcher.execute("""SELECT count(*) FROM pg_stat_activity
                                      WHERE datname = current_database() AND wait_event_type = 'Lock'""").fetchone()[0]

        deadline = time.monotonic() + 60
        while waiting_on_a_lock() == 0 and changer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting_on_a_lock() == 1 and changer.is_alive() and not changed
        release.set()
        solver.join(timeout=60)
        changer.join(timeout=60)
        assert not solver.is_alive() and not changer.is_alive()
        [change] = changed
        assert (change.revision, change.expired) == (2, 1)
        rec = ledger.get_recommendation(published[0])
        assert (rec.binding_revision, rec.status) == (1, "expired")
        assert rec.expired_reason == "binding tanks-1 changed to revision 2"
        assert [r for r in ledger.list_recommendations("tanks-1") if r.status != "expired"] == []
    finally:
        release.set()
        watcher.close()
        ledger.backend.close()
