"""Several OS processes writing the same ledger lose nothing (issue 2, "Many writers"), on both backends."""

import multiprocessing as mp
import time

import pytest

from ledger_helpers import ledger_at, solve

PROCESSES = 4
RUNS_EACH = 6


def _writer(path: str, index: int, queue) -> None:
    ledger = ledger_at(path)
    ids = [solve(ledger, binding_id=f"b{index}", problem_hash=f"{index:064d}")[0] for _ in range(RUNS_EACH)]
    queue.put(ids)


@pytest.mark.timeout(600)  # the waits below: 300 s for the writers' results, then 60 s for their exits
def test_concurrent_writer_processes_keep_every_row(ledger_location):
    path = ledger_location
    ledger_at(path)  # the schema, before the writers race for it
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, i, queue)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    # the writers run at once: one wait for them all, not one each (a bound: the test takes ~16 s at load 2)
    deadline = time.monotonic() + 300
    written = [run_id for _ in procs for run_id in queue.get(timeout=max(deadline - time.monotonic(), 0.1))]
    deadline = time.monotonic() + 60
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.1))
        assert p.exitcode == 0
    ledger = ledger_at(path)
    runs = ledger.list_runs()
    assert sorted(r.id for r in runs) == sorted(written)
    assert len(runs) == PROCESSES * RUNS_EACH
    assert ledger.counts()["optimizer_candidates"] == 2 * PROCESSES * RUNS_EACH
    recs = ledger.list_recommendations()
    # per binding exactly one open recommendation: every later one superseded the earlier
    for i in range(PROCESSES):
        statuses = [r.status for r in recs if r.binding_id == f"b{i}"]
        assert statuses.count("verified") == 1 and statuses.count("expired") == RUNS_EACH - 1
