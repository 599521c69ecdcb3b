"""Benchmark: ledger writes — one solve record (run + 3 candidates + recommendation) and 10 000 candidates.

Issue 8. A fresh DuckDB ledger in a temporary directory; the rows are the ones the pipeline writes
(plans of 30 steps x 2 MVs / CVs, verify reports; every candidate of the 10 000 has its own plan).
Figures (seconds):
  record_solve   Ledger.record_solve: run + HOLD / NOMINAL / ROBUST candidates + finish + recommendation
                 (superseding the binding's open ones) in one transaction, each write on its own
                 connection (lock + connect + transaction + close: the default outside a session)
  record_solve_session
                 the same writes inside one `Ledger.session()` (one lock + connection for all of them,
                 each write still its own transaction): what a Dagster step writing many bindings
                 pays per write, and the figure judged against the 5 ms target
  connect_close  the cross-process lock + duckdb.connect + close of the ledger file alone (the fixed
                 cost of a connection per transaction, part of record_solve, absent in a session)
  executemany    Ledger.insert_candidates with 10 000 candidates of one run, own connection (the key
                 is historical: executemany until 04af45d, a DataFrame insert until issue 8, then an
                 Arrow table with orjson JSON texts, since schema version 2 an Arrow table with the
                 plans as list<list<double>> committed by a checkpoint that skips the WAL)
  build_table    building those rows alone as Ledger does (plans as Arrow lists of doubles, reports
                 as orjson texts, one Arrow table), no SQL
  per_row        the same rows through one INSERT per row, in one transaction (the anchor); the
                 plans as canonical_json texts, which DuckDB casts to the DOUBLE[][] columns
  dataframe      the rows with canonical_json texts as one pandas DataFrame insert, in one transaction
                 (what insert_candidates did before issue 8; plan texts cast by DuckDB as above)
  build_rows     building the rows with canonical_json texts alone (4 per candidate), no SQL
  frame_plain    the DataFrame insert with the JSON texts from plain json.dumps (sorted keys, no
                 spaces, NaN refused); checked to give the same texts as canonical_json on these rows
                 (they hold no -0.0 and no numpy scalars, the two cases canonical_json normalises)
Targets: record_solve <= 5 ms p50 (inside a session); 10 000 candidates <= 0.3 s.
The 10 000 plans are distinct since issue 8: equal plans (as before) flatter canonical_json (it
memoises the text of equal float tuples) and DuckDB's checkpoint on close (30 MB of equal texts
compress as a dictionary; distinct ones cost ~0.2-0.6 s of DICT_FSST analysis here).

    .venv/bin/python bench/bench_ledger.py [--writes 200] [--batch 10000]

bench/run.py calls `measure` for repeated rounds and reports medians, spreads and ratios.
"""

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import (
    CandidateKind,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    Template,
    canonical_json,
    iso_utc,
    utc_now,
)
from optimizer_pipeline.ledger import Ledger, NewRun, candidate_id, new_id
from optimizer_pipeline.ledger.candidates import candidate_table

HORIZON = 30
CANDIDATE_COLUMNS = 15  # optimizer_candidates


def plan_candidates(seed: int = 0) -> list[SolveCandidate]:
    """HOLD, NOMINAL, ROBUST candidates with N = 30 plans of 2 MVs / 2 CVs, as a solve returns them."""
    rng = np.random.default_rng(seed)
    out = []
    for seq, kind in enumerate((CandidateKind.HOLD, CandidateKind.NOMINAL, CandidateKind.ROBUST)):
        controls = tuple(map(tuple, rng.uniform(0, 6, (HORIZON, 2)).tolist()))
        predicted = tuple(map(tuple, rng.uniform(2, 10, (HORIZON, 2)).tolist()))
        out.append(SolveCandidate(seq=seq, kind=kind, solver_status="solved", controls=controls, predicted=predicted,
                                  cost=1.0 + seq, constraints={"osqp_status": "solved", "iterations": 25,
                                                               "y_lo": [2.0, 2.0], "y_hi": [10.0, 10.0]},
                                  feasible=True, verified=True, independent_cost=1.0 + seq,
                                  verify_report={"ok": True, "max_dynamics_residual": 1e-9}))
    return out


def batch_candidates(batch: int, seed: int = 1) -> list[SolveCandidate]:
    """`batch` NOMINAL-like candidates of one run, each with its own N = 30 plan (distinct plans: the
    texts of equal plans would be memoised by canonical_json and flatter its figure)."""
    rng = np.random.default_rng(seed)
    template = plan_candidates()[1]
    return [replace(template, seq=i, controls=tuple(map(tuple, rng.uniform(0, 6, (HORIZON, 2)).tolist())),
                    predicted=tuple(map(tuple, rng.uniform(2, 10, (HORIZON, 2)).tolist())))
            for i in range(batch)]


def run_row(binding_id: str) -> NewRun:
    return NewRun(binding_id, 1, "track", 1, "p" * 64, {"source": "bench"},
                  {"template": "linear_mpc_quadratic@1", "horizon": HORIZON}, id=new_id("or"))


def recommendation(run_id: str, binding_id: str, nominal: SolveCandidate) -> Recommendation:
    now = utc_now()
    return Recommendation(
        id=new_id("rec"), binding_id=binding_id, binding_revision=1, run_id=run_id,
        candidate_id=candidate_id(run_id, nominal.seq), template=Template.LINEAR_MPC,
        status=RecommendationStatus.VERIFIED, reasons=(), created_at=iso_utc(now),
        valid_until=iso_utc(now + timedelta(hours=1)), mv_tags=("v1", "v2"), cv_tags=("y1", "y2"),
        controls=nominal.controls, predicted=nominal.predicted, band=(0.1, 0.2), cost=nominal.cost,
        independent_cost=nominal.independent_cost, problem_ir_hash="p" * 64, model_artifact_hash="m" * 64,
        evidence={"source": "simulation", "uq": None})


BINDINGS = tuple(f"bench-{i}" for i in range(10))  # record_solve writes go round these


def record_solve_once(ledger: Ledger, binding_id: str, candidates: list[SolveCandidate]) -> float:
    """One record_solve of the bench payload (a run + `candidates` + supersede + a recommendation
    of the NOMINAL plan) for `binding_id`: seconds of the call alone (the rows are built before).
    Shared with bench/bench_postgres.py."""
    run = run_row(binding_id)
    rec = recommendation(run.id, binding_id, candidates[1])
    t = time.perf_counter()
    ledger.record_solve(run, candidates, "m" * 64, rec, run_status="succeeded", independent_cost=2.0,
                        diagnostics={"iterations": 25}, evidence_source="simulation")
    return time.perf_counter() - t


def time_record_solve(ledger: Ledger, writes: int) -> list[float]:
    candidates = plan_candidates()
    return [record_solve_once(ledger, BINDINGS[i % len(BINDINGS)], candidates) for i in range(writes)]


def time_connect_close(ledger: Ledger, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        with ledger.transaction():
            pass
        times.append(time.perf_counter() - t)
    return times


def candidate_rows(run_id: str, candidates: list[SolveCandidate]) -> list[list]:
    """The optimizer_candidates rows of Ledger.insert_candidates, built the same way."""
    now = utc_now().replace(tzinfo=None)
    return [[candidate_id(run_id, c.seq), run_id, c.seq, c.kind.value, c.solver_status, canonical_json(c.controls),
             canonical_json(c.predicted), c.cost, canonical_json(c.constraints), c.feasible, c.verified,
             c.independent_cost, canonical_json(c.verify_report), "m" * 64, now] for c in candidates]


def plain_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def candidate_rows_plain(run_id: str, candidates: list[SolveCandidate]) -> dict[str, list]:
    """The same rows as candidate_rows, column-wise, JSON texts by plain_json."""
    now = utc_now().replace(tzinfo=None)
    return {"id": [candidate_id(run_id, c.seq) for c in candidates], "run_id": [run_id] * len(candidates),
            "seq": [c.seq for c in candidates], "kind": [c.kind.value for c in candidates],
            "solver_status": [c.solver_status for c in candidates],
            "controls": [plain_json(c.controls) for c in candidates],
            "predicted": [plain_json(c.predicted) for c in candidates], "cost": [c.cost for c in candidates],
            "constraints": [plain_json(c.constraints) for c in candidates],
            "feasible": [c.feasible for c in candidates], "verified": [c.verified for c in candidates],
            "independent_cost": [c.independent_cost for c in candidates],
            "verify_report": [plain_json(c.verify_report) for c in candidates],
            "model_id": ["m" * 64] * len(candidates), "created_at": [now] * len(candidates)}


def time_batches(ledger: Ledger, batch: int) -> dict[str, float]:
    """Seconds for `batch` candidates of one run: Ledger.insert_candidates, one INSERT per row, DataFrame."""
    many = batch_candidates(batch)
    out = {}
    t = time.perf_counter()
    ids = ledger.insert_candidates(new_id("or"), many, "m" * 64)
    out["executemany"] = time.perf_counter() - t
    assert len(ids) == batch
    t = time.perf_counter()
    candidate_table(new_id("or"), many, "m" * 64)
    out["build_table"] = time.perf_counter() - t
    t = time.perf_counter()
    candidate_rows(new_id("or"), many)
    out["build_rows"] = time.perf_counter() - t
    placeholders = ", ".join("?" * CANDIDATE_COLUMNS)
    t = time.perf_counter()
    with ledger.transaction() as conn:
        for row in candidate_rows(new_id("or"), many):
            conn.execute(f"INSERT INTO optimizer_candidates VALUES ({placeholders})", row)
    out["per_row"] = time.perf_counter() - t
    t = time.perf_counter()
    with ledger.transaction() as conn:
        frame = pd.DataFrame(candidate_rows(new_id("or"), many))  # noqa: F841 (read by DuckDB by name)
        conn.execute("INSERT INTO optimizer_candidates SELECT * FROM frame")
    out["dataframe"] = time.perf_counter() - t
    reference = candidate_rows("or-x", many[:100])
    plain = candidate_rows_plain("or-x", many[:100])
    assert all(row[5:7] == [c, p] for row, c, p in zip(reference, plain["controls"], plain["predicted"]))
    t = time.perf_counter()
    with ledger.transaction() as conn:
        frame = pd.DataFrame(candidate_rows_plain(new_id("or"), many))  # noqa: F841
        conn.execute("INSERT INTO optimizer_candidates SELECT * FROM frame")
    out["frame_plain"] = time.perf_counter() - t
    with ledger.transaction() as conn:
        stored = conn.execute("SELECT count(*) FROM optimizer_candidates").fetchone()[0]
    assert stored >= 4 * batch, stored
    return out


def measure(writes: int, batch: int) -> dict[str, list[float] | float]:
    """One round in a fresh ledger: per-write seconds of record_solve (own connection / in a
    session) and connect_close, and the seconds of each 10 000-candidate batch."""
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as home:
        ledger = Ledger(Path(home) / "optimizer.duckdb")
        time_record_solve(ledger, 10)  # warm-up: first writes create the table files
        out: dict[str, list[float] | float] = {"record_solve": time_record_solve(ledger, writes)}
        with ledger.session():
            out["record_solve_session"] = time_record_solve(ledger, writes)
        out["connect_close"] = time_connect_close(ledger, writes)
        out.update(time_batches(ledger, batch))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    result = measure(args.writes, args.batch)
    print(f"1-min load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end "
          f"({os.cpu_count()} cores; other processes' load slows every figure)")
    for name, label in (("record_solve", "record_solve, own connection per write"),
                        ("record_solve_session", "record_solve in one session (judged)"),
                        ("connect_close", "lock + connect + close alone")):
        ms = np.asarray(result[name]) * 1000
        print(f"{label:<38} p50 {np.median(ms):7.2f} ms  p10-p90 {np.percentile(ms, 10):.2f}-"
              f"{np.percentile(ms, 90):.2f} ms ({args.writes} writes)")
    print(f"record_solve in a session p50 target 5 ms: "
          f"{'PASS' if np.median(result['record_solve_session']) <= 0.005 else 'MISS'}")
    for name in ("build_table", "build_rows"):
        what = "Arrow plans + orjson reports, as Ledger" if name == "build_table" else "canonical_json texts"
        print(f"{args.batch} candidates, {name:<12} {result[name]:7.3f} s  (building the rows alone: {what}; no SQL)")
    for name in ("executemany", "per_row", "dataframe", "frame_plain"):
        label = "insert_cands" if name == "executemany" else name
        print(f"{args.batch} candidates, {label:<12} {result[name]:7.3f} s  "
              f"(per-row anchor / this = {result['per_row'] / result[name]:.1f}x)")
    if args.batch == 10_000:
        print(f"Ledger.insert_candidates target 0.3 s: {'PASS' if result['executemany'] <= 0.3 else 'MISS'}")


if __name__ == "__main__":
    main()
