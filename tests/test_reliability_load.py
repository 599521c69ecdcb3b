"""Load (issue 9): reader and writer OS processes on one ledger file at once; the solver pool under
four times more concurrent callers than workers. (Writers only: test_ledger_concurrency.py.)
Larger variant: `.venv/bin/python bench/reliability.py load`.
"""

import threading

import pytest

from optimizer_pipeline.contracts import SolveResult
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.solver.pool import SolverPool

from reliability_helpers import (
    FAST_BACKOFF,
    check_ledger_whole,
    check_overload,
    counting_worker_cmd,
    heater_case,
    mixed_readers_writers,
    pool_overload,
)

WORKERS = 2
CALLERS = 4 * WORKERS


@pytest.mark.timeout(1500)  # mixed_readers_writers waits up to 300 s for each of its 4 processes, then 60 s each
def test_readers_see_only_whole_runs_while_writer_processes_write(tmp_path):
    load = mixed_readers_writers(tmp_path / "shared.duckdb", writers=2, readers=2, runs_each=5)
    assert load.reader_errors == [] and load.reads_during_writes >= 2  # the reads overlapped the writes
    ledger = Ledger(tmp_path / "shared.duckdb")
    assert check_ledger_whole(ledger, load.written) == len(load.written) == 2 * 5


@pytest.fixture
def counted_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMIZER_WORKER_TEST_OPS", "1")
    log_path = tmp_path / "received.log"
    with SolverPool(size=WORKERS, request_timeout_ms=10_000, queue_wait_s=0.25, backoff_s=FAST_BACKOFF,
                    worker_cmd=counting_worker_cmd(log_path)) as pool:
        yield pool, log_path


def test_pool_under_4x_callers_answers_or_refuses_every_request_and_loses_none(counted_pool):
    pool, log_path = counted_pool
    report = pool_overload(pool, log_path, callers=CALLERS, requests_each=4, sleep_s=0.15)
    check_overload(report)
    assert report.refused > 0 and report.answered >= WORKERS  # saturated, yet serving


def test_concurrent_real_solves_each_get_the_answer_to_their_own_problem(tmp_path):
    case = heater_case(Ledger(tmp_path / "optimizer.duckdb"))
    problems = case.problems(CALLERS)
    assert len({p.hash for p in problems}) == CALLERS
    answers: dict[int, list[str]] = {}

    def caller(index: int) -> None:
        answers[index] = [SolveResult.from_dict(pool.solve(problems[index])).problem_ir_hash for _ in range(3)]

    with SolverPool(size=WORKERS, queue_wait_s=30.0) as pool:
        threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert answers == {i: [problems[i].hash] * 3 for i in range(CALLERS)}
