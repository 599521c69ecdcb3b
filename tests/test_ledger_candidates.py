"""Candidate rows (issue 8): plans as DOUBLE[][] and reports as orjson JSON read back the canonical values;
non-finite numbers refused; bulk batches."""

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import CandidateKind, ContractError, SolveCandidate, canonical_json
from optimizer_pipeline.ledger.candidates import BULK_CANDIDATE_ROWS, CANDIDATE_ARROW_SCHEMA

from ledger_helpers import candidates, recommendation, run_row


@pytest.fixture
def ledger(any_ledger):
    """Every test of this module runs on both backends (DuckDB file, PostgreSQL database)."""
    return any_ledger


def candidate(seq=0, controls=((1.0, 2.0),), predicted=((7.0, 7.5),), cost=1.0, constraints=None,
              verify_report=None) -> SolveCandidate:
    return SolveCandidate(seq=seq, kind=CandidateKind.NOMINAL, solver_status="solved", controls=controls,
                          predicted=predicted, cost=cost, constraints=constraints or {}, feasible=True,
                          verified=True, independent_cost=cost, verify_report=verify_report or {})


def test_plan_and_report_columns_read_back_the_values_of_the_canonical_texts(ledger):
    rng = np.random.default_rng(3)
    awkward = candidate(
        seq=0, controls=tuple(map(tuple, rng.normal(0, 1e-9, (30, 2)).tolist())) + ((1e300, -0.0),),
        predicted=((1 / 3, 2.5e-7), (123456789.123, -1e-310)),
        constraints={"osqp_status": "solved", "iterations": np.int64(25), "prim_res": np.float64(1.5e-6),
                     "y_lo": np.array([2.0, 2.0]), "big": 2 ** 70, "nested": {"b": [1, 2.0], "a": None}},
        verify_report={"reasons": ["null space is fine"], "mv_bound_violation": [0.0, None], "ok": True})
    written = [awkward, *candidates()[1:]]
    run_id = ledger.insert_run(run_row())
    ledger.insert_candidates(run_id, written, "m" * 64)
    stored = sorted(ledger.list_candidates(run_id=run_id), key=lambda row: row.seq)
    for row, c in zip(stored, written, strict=True):
        for column in ("controls", "predicted", "constraints", "verify_report"):
            assert getattr(row, column) == json.loads(canonical_json(getattr(c, column))), column


def test_plans_read_back_as_nested_lists_of_python_floats(ledger):
    run_id = ledger.insert_run(run_row())
    ledger.insert_candidates(run_id, [candidate(seq=0, controls=((1, 2.5), (3.0, 4.0)), predicted=((7.0,),))], "m")
    row = ledger.list_candidates(run_id=run_id)[0]
    assert (row.controls, row.predicted) == ([[1.0, 2.5], [3.0, 4.0]], [[7.0]])
    assert {type(x) for plan in (row.controls, row.predicted) for step in plan for x in step} == {float}
    doc = row.to_json_dict()  # what `ledger --json` prints, no fallback needed
    assert json.loads(json.dumps(doc)) == doc


def test_a_candidate_without_a_plan_reads_back_empty_plans(ledger):
    run_id = ledger.insert_run(run_row())
    ledger.insert_candidates(run_id, [candidate(seq=0, controls=(), predicted=())], "m")
    row = ledger.list_candidates(run_id=run_id)[0]
    assert (row.controls, row.predicted) == ([], [])


def test_a_bulk_batch_is_stored_whole_and_leaves_the_checkpoint_threshold_as_it_was(ledger):
    run_id = ledger.insert_run(run_row())
    batch = [candidate(seq=i, controls=((float(i), -float(i)),), predicted=((i / 7,),))
             for i in range(BULK_CANDIDATE_ROWS)]
    duckdb_file = ledger.backend.dialect == "duckdb"  # the checkpoint setting is DuckDB's bulk mode
    with ledger.session():
        threshold = ledger.query("SELECT current_setting('checkpoint_threshold') AS t")["t"][0] if duckdb_file else 0
        ledger.insert_candidates(run_id, batch, "m")
        if duckdb_file:
            assert ledger.query("SELECT current_setting('checkpoint_threshold') AS t")["t"][0] == threshold
    stored = sorted(ledger.list_candidates(run_id=run_id), key=lambda row: row.seq)
    assert [(r.controls, r.predicted) for r in stored] == [([[i, -i]], [[i / 7]]) for i in range(len(batch))]


def test_candidate_rows_keep_their_ids_kinds_flags_and_costs(ledger):
    run_id = ledger.insert_run(run_row())
    written = candidates()
    ids = ledger.insert_candidates(run_id, written, "model-1")
    stored = ledger.list_candidates(run_id=run_id)
    assert ids == [f"oc-{run_id[3:]}-{c.seq}" for c in written] == [row.id for row in stored]
    assert [(r.seq, r.kind, r.solver_status, r.cost, r.independent_cost, r.feasible,
             r.verified, r.model_id) for r in stored] == \
        [(c.seq, c.kind.value, c.solver_status, c.cost, c.independent_cost, c.feasible, c.verified, "model-1")
         for c in written]


@pytest.mark.parametrize("column, bad, path", [
    ("controls", ((1.0, math.nan),), "[0][1]"),
    ("predicted", ((7.0, 7.5), (math.inf, 7.5)), "[1][0]"),
    ("verify_report", {"cost_abs_diff": -math.inf}, ".cost_abs_diff"),
])
def test_a_non_finite_number_in_a_plan_or_report_is_refused_before_any_write(ledger, column, bad, path):
    run = replace(run_row(), id="or-nonfinite")
    bad_candidate = candidate(seq=1, **{column: bad})
    with pytest.raises(ContractError, match=rf"candidate 1 of run or-nonfinite, {column}: .*non-finite .* at "
                                            rf"{re.escape(path)}$"):
        ledger.record_solve(run, [candidate(seq=0), bad_candidate], "m" * 64, recommendation(run.id),
                            run_status="succeeded", independent_cost=1.0, diagnostics={},
                            evidence_source="simulation")
    counts = ledger.counts()
    assert counts["optimizer_runs"] == counts["optimizer_candidates"] == counts["optimizer_recommendations"] == 0


@pytest.mark.parametrize("column, bad", [("controls", ((1.0, None),)), ("predicted", (("7.0",),)),
                                         ("controls", (None,))])
def test_a_plan_with_a_missing_or_non_numeric_value_is_refused_naming_it(ledger, column, bad):
    run_id = ledger.insert_run(run_row())
    with pytest.raises(ContractError, match=rf"candidate 3 of run {run_id}, {column}: a plan must be rows of numbers"):
        ledger.insert_candidates(run_id, [candidate(seq=2), candidate(seq=3, **{column: bad})], "m")
    assert ledger.list_candidates(run_id=run_id) == []


def test_non_finite_costs_are_stored_as_null(ledger):
    run_id = ledger.insert_run(run_row())
    ledger.insert_candidates(run_id, [replace(candidate(seq=0), cost=math.nan, independent_cost=math.inf)], "m" * 64)
    row = ledger.list_candidates(run_id=run_id)[0]
    assert row.cost is None and row.independent_cost is None


def test_the_arrow_schema_is_the_candidate_table_column_for_column(ledger):
    columns = ledger.query("""SELECT column_name FROM information_schema.columns
                              WHERE table_name = 'optimizer_candidates' ORDER BY ordinal_position""")
    assert CANDIDATE_ARROW_SCHEMA.names == columns["column_name"].tolist()


def test_a_run_without_candidates_is_recorded(ledger):
    run = replace(run_row(), id="or-empty")
    ledger.record_solve(run, [], "m" * 64, None, run_status="failed", independent_cost=None,
                        diagnostics={"error": "timeout"}, evidence_source="simulation")
    stored = ledger.get_run("or-empty")
    assert (stored.status, stored.diagnostics) == ("failed", {"error": "timeout"})
    assert ledger.list_candidates(run_id="or-empty") == []
