"""Process faults on the ledger (issue 9): a writer SIGKILLed inside record_solve's transaction leaves
none of its rows; writers killed at random moments leave only whole runs; a stale `running` run is
closed as `interrupted` at the next start. Larger variant: `bench/reliability.py process --kills 50`.
"""

from dataclasses import replace
from datetime import timedelta

import pytest

from optimizer_pipeline.contracts import utc_now
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver import errors
from optimizer_pipeline.solver.errors import SolverError

from ledger_helpers import ledger_at, run_row, solve
from reliability_helpers import (
    KILL_POINTS,
    check_ledger_whole,
    heater_case,
    kill_paused_writer,
    ledger_dump,
    random_writer_kills,
)

RANDOM_KILLS = 3


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "optimizer.duckdb")
    solve(ledger, binding_id="crash")  # an open recommendation the killed write would have superseded
    return ledger


@pytest.mark.parametrize("point", KILL_POINTS)
def test_writer_killed_inside_the_recommendation_transaction_leaves_none_of_it(ledger_location, tmp_path, point):
    """On both backends: the writer holds the transaction open (DuckDB: the file lock; PostgreSQL: an
    open transaction on the server) when it is SIGKILLed; none of its rows remain."""
    ledger = ledger_at(ledger_location)
    solve(ledger, binding_id="crash")  # an open recommendation the killed write would have superseded
    before = ledger_dump(ledger)
    assert kill_paused_writer(ledger_location, point, tmp_path), "the paused writer held no open transaction"
    assert ledger_dump(ledger) == before
    assert [r.status for r in ledger.list_recommendations("crash")] == ["verified"]


def test_ledger_takes_writes_again_after_a_writer_was_killed_holding_its_lock(ledger, tmp_path):
    kill_paused_writer(ledger.path, "_insert_recommendation", tmp_path)
    run_id, rec_id = solve(Ledger(ledger.path, lock_timeout_s=5.0), binding_id="crash")
    assert ledger.get_recommendation(rec_id).status == "verified"
    assert check_ledger_whole(ledger, [run_id]) == 2


def test_writers_killed_at_random_moments_leave_only_whole_runs_and_lose_no_commit(ledger):
    report = random_writer_kills(ledger.path, RANDOM_KILLS, seed=0)
    assert len(report.committed) >= RANDOM_KILLS  # each writer committed at least once before its kill
    assert check_ledger_whole(ledger, report.committed) >= 1 + len(report.committed)


def test_stale_running_run_is_closed_as_interrupted_at_the_next_recommend(tmp_path):
    settings = Settings(solver_request_timeout_ms=1_000)
    case = heater_case(Ledger(tmp_path / "optimizer.duckdb"), settings=settings)
    now = utc_now()
    # pipeline.recommend closes runs older than the request timeout (a live writer never takes longer)
    stale = case.ledger.insert_run(replace(run_row("heater-1"), started_at=now - timedelta(seconds=2.5)))
    recent = case.ledger.insert_run(replace(run_row("heater-1"), started_at=now - timedelta(seconds=0.5)))
    record = case.recommend(_unavailable, now=now)
    runs = {r.id: r for r in case.ledger.list_runs("heater-1")}
    assert runs[stale].status == "interrupted" and "reconciled" in runs[stale].diagnostics
    assert runs[recent].status == "running"  # younger than the bound: may still be a live writer's
    assert runs[record.run_id].status == "failed"


def _unavailable(problem):
    raise SolverError(errors.SOLVER_UNAVAILABLE, "no solver pool in this test")
