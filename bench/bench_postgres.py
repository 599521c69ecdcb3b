"""Benchmark: the PostgreSQL ledger (issue 14) next to DuckDB in the same run — record_solve and 4 writer processes.

Usage:
    .venv/bin/python bench/bench_postgres.py [--writes 200] [--rounds 4] [--seconds 10] [--processes 4]
                                             [--batch 10000] [--before] [--skip-duckdb-writers]

A throwaway PostgreSQL (tests/servers.py: the machine's binaries, initdb in a temporary directory,
a free loopback port, fsync on) is started by the bench and stopped at the end, also on error.
Every figure gets a fresh database (DuckDB: a fresh file). The payload is bench/bench_ledger.py's
record_solve (imported, not copied): a run with its end status + HOLD / NOMINAL / ROBUST candidates
with 30-step plans of 2 MVs / 2 CVs + the supersession of the binding's open recommendation + the
new recommendation, one transaction. The bindings written to exist in the ledger (revision 1):
their `bindings` rows are what PostgreSQL's record_solve locks.

Figures:
  record_solve   p50 / p10-p90 per write over 10 bindings, on ONE long-lived
                 `Ledger(PostgresBackend(url))`: inside `ledger.session()` (one pooled connection
                 pinned: what a Dagster step pays, judged against 3 ms) and without (a pooled
                 connection taken per write). DuckDB beside it: inside a session (lock + connection
                 held) and with a lock + connection per write. The modes take turns, writes/rounds
                 writes at a time, so that they see the same load; the ratios are taken per round
                 and the median over rounds is printed. Beside each: CPU per write of this process
                 (time.process_time; DuckDB's engine runs in it) and of the PostgreSQL cluster (its
                 processes' utime + stime from /proc): what the write costs whatever the machine's
                 load, while the p50 also holds the waits for a core. The floor of any PostgreSQL
                 write is timed in the same rounds: a one-row INSERT committed alone (round trip +
                 WAL flush, fsync on).
  connect        psycopg.connect + close alone (what a fresh connection per write would add)
  writers        --processes writer processes (spawned, each with its own Ledger), released
                 together, each writing record_solve for --seconds: on separate bindings (writer i
                 on binding w<i>) and all on ONE binding. Run writes/s = all writes / the longest
                 writer's time. Each writer holds sessions as a Dagster step does
                 (assets/batch.in_ledger_sessions, re-taken every second); DuckDB also with a lock +
                 connection per write (sensors, the CLI). Retries (PostgreSQL 40001 / 40P01 /
                 23505 of the backstop) are counted from the backend's log. The invariant is checked
                 in SQL afterwards: exactly one open recommendation per binding written, every run
                 whole (succeeded, 3 candidates, 1 recommendation), no candidate or recommendation
                 without its run, every write a writer counted stored, none extra.
  batch          Ledger.insert_candidates of --batch candidates of one run, each with its own plan
                 (bench_ledger.batch_candidates), on PostgreSQL (DuckDB's figure: bench_ledger.py).
  --before       every PostgreSQL figure also with `insert_table` as it was before COPY (one
                 pipelined executemany, the plans adapted by psycopg's list dumper), in the same
                 run: the record_solve modes interleaved, the writers and the batch one after the other.
Targets (issue 14): record_solve on PostgreSQL <= 3 ms p50 with a long-lived connection; 4 writer
processes >= 500 run writes/s with 0 invariant breaks, judged with each writer on its own binding
(the issue's anchor: "a per-binding row lock"); the one-binding layout, where the row lock
serialises every writer, is printed beside it.
"""

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench", ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_ledger import BINDINGS, batch_candidates, plan_candidates, record_solve_once  # noqa: E402
from ledger_helpers import ledger_at  # noqa: E402
from quiet import add_quiet_arguments, wait_if_asked  # noqa: E402

from optimizer_pipeline.contracts import binding_from_dict  # noqa: E402
from optimizer_pipeline.ledger import Ledger, new_id  # noqa: E402
from optimizer_pipeline.ledger.errors import LedgerError  # noqa: E402
from optimizer_pipeline.ledger.postgres_backend import PostgresBackend  # noqa: E402
from optimizer_pipeline.plants import get_plant  # noqa: E402

RECORD_SOLVE_TARGET_S = 0.003
WRITES_TARGET_PER_S = 500.0
OPEN = ("verified", "unverified", "rejected")
BACKEND_LOGGER = "optimizer_pipeline.ledger.postgres_backend"


def load() -> float:
    return os.getloadavg()[0]


# ------------------------------------------------------------------ the insert before COPY (the anchor of --before)


def _plain(value: Any) -> Any:
    """pandas / numpy scalars as plain Python values for psycopg (the anchor's conversion)."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple)):
        return value.item()
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value


def insert_table_executemany(conn: Any, table: str, rows: Any, *, skip_existing: bool = False) -> None:
    """PostgresBackend.insert_table as it was before COPY (commit f47d596), kept here as the anchor:
    one pipelined executemany, list columns adapted by psycopg's array dumper."""
    columns = rows.column_names if hasattr(rows, "column_names") else list(rows.columns)
    records = rows.to_pylist() if hasattr(rows, "to_pylist") else rows.to_dict("records")
    if not records:
        return
    placeholders = ", ".join(["%s"] * len(columns))
    conflict = " ON CONFLICT DO NOTHING" if skip_existing else ""
    with conn.conn.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} VALUES ({placeholders}){conflict}",
                           [[_plain(r[c]) for c in columns] for r in records])


@contextlib.contextmanager
def inserts_as_before(before: bool) -> Iterator[None]:
    """With `before`, PostgresBackend.insert_table is the executemany anchor inside the block."""
    if not before:
        yield
        return
    current = PostgresBackend.__dict__["insert_table"]
    PostgresBackend.insert_table = staticmethod(insert_table_executemany)
    try:
        yield
    finally:
        PostgresBackend.insert_table = current


# ------------------------------------------------------------------ ledgers


def add_bindings(ledger: Ledger, binding_ids: list[str] | tuple[str, ...]) -> None:
    """The bindings at revision 1 (the payload's recommendations are for revision 1)."""
    doc = get_plant("tanks").binding_doc()
    for binding_id in dict.fromkeys(binding_ids):
        ledger.upsert_binding(binding_from_dict({**doc, "id": binding_id}))


def close(ledger: Ledger) -> None:
    if isinstance(ledger.backend, PostgresBackend):
        ledger.backend.close()


def percentiles_ms(samples: list[float]) -> tuple[float, float, float]:
    ms = np.asarray(samples) * 1000
    return float(np.median(ms)), float(np.percentile(ms, 10)), float(np.percentile(ms, 90))


# ------------------------------------------------------------------ record_solve


def cluster_cpu_s(data_dir: Path) -> float:
    """CPU seconds (user + system) used so far by a PostgreSQL cluster: its postmaster (with its
    ended children) and its live processes (backends, WAL writer, checkpointer), from /proc."""
    master = int((data_dir / "postmaster.pid").read_text().split()[0])
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == master:
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        elif ppid == master:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def record_solve_modes(pg_url: str, pg_data: Path, duck_path: Path, writes: int, rounds: int, before: bool) -> dict:
    """Per mode: all samples (s), the per-round p50s and the CPU seconds of this process and of the
    PostgreSQL cluster over the timed writes. Mode `pg_commit` is the floor of any PostgreSQL write:
    a one-row INSERT committed on its own connection (round trip + WAL flush)."""
    import psycopg

    pg, duck = Ledger(PostgresBackend(pg_url)), Ledger(duck_path)
    floor = psycopg.connect(pg_url, autocommit=True)
    try:
        floor.execute("CREATE TABLE commit_floor (n integer)")
        for ledger in (pg, duck):
            add_bindings(ledger, BINDINGS)
        modes = [("pg_session", pg, True, False), ("pg_pooled", pg, False, False)]
        if before:
            modes += [("pg_session_before", pg, True, True), ("pg_pooled_before", pg, False, True)]
        modes += [("pg_commit", None, False, False), ("duck_session", duck, True, False),
                  ("duck_own", duck, False, False)]
        candidates = plan_candidates()
        out = {name: {"samples": [], "round_p50": [], "cpu": 0.0, "server_cpu": 0.0} for name, *_ in modes}
        counter = {name: 0 for name, *_ in modes}

        def one_commit() -> float:
            t = time.perf_counter()
            floor.execute("INSERT INTO commit_floor VALUES (1)")
            return time.perf_counter() - t

        def batch(name: str, ledger: Ledger | None, session: bool, old: bool, n: int) -> list[float]:
            if ledger is None:
                return [one_commit() for _ in range(n)]
            with inserts_as_before(old), (ledger.session() if session else contextlib.nullcontext()):
                times = []
                for _ in range(n):
                    times.append(record_solve_once(ledger, BINDINGS[counter[name] % len(BINDINGS)], candidates))
                    counter[name] += 1
            return times

        for name, ledger, session, old in modes:  # warm-up: the first writes create pages and plans
            batch(name, ledger, session, old, 10)
        per_round = max(1, writes // rounds)
        for _ in range(rounds):
            for name, ledger, session, old in modes:
                cpu, server = time.process_time(), cluster_cpu_s(pg_data)
                times = batch(name, ledger, session, old, per_round)
                out[name]["cpu"] += time.process_time() - cpu
                out[name]["server_cpu"] += cluster_cpu_s(pg_data) - server
                out[name]["samples"] += times
                out[name]["round_p50"].append(float(np.median(times)))
        return out
    finally:
        floor.close()
        close(pg)


def connect_close(pg_url: str, samples: int) -> list[float]:
    import psycopg

    times = []
    for _ in range(samples):
        t = time.perf_counter()
        psycopg.connect(pg_url).close()
        times.append(time.perf_counter() - t)
    return times


# ------------------------------------------------------------------ writer processes


class _Retries(logging.Handler):
    """Counts the backend's 'retried' warnings (one per retried transaction attempt)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retried" in record.getMessage():
            self.count += 1


def _writer(where: str, binding_id: str, seconds: float, hold_sessions: bool, before: bool, ready, go,
            results) -> None:
    """One writer process: record_solve of the bench payload on `binding_id` until `seconds` passed."""
    from optimizer_pipeline.assets.batch import in_ledger_sessions

    retries = _Retries()
    logging.getLogger(BACKEND_LOGGER).addHandler(retries)
    with inserts_as_before(before):
        ledger = ledger_at(where)
        candidates = plan_candidates()
        writes, errors, first_error = 0, 0, None
        ready.put(os.getpid())
        go.wait()
        start = time.perf_counter()
        deadline = start + seconds
        ticks = iter(lambda: time.perf_counter() < deadline, False)
        with (in_ledger_sessions(ledger, ticks) if hold_sessions else contextlib.nullcontext(ticks)) as each:
            for _ in each:
                try:
                    record_solve_once(ledger, binding_id, candidates)
                    writes += 1
                except LedgerError as exc:
                    errors += 1
                    first_error = first_error or str(exc)
        elapsed = time.perf_counter() - start
        close(ledger)
    results.put({"pid": os.getpid(), "writes": writes, "errors": errors, "first_error": first_error,
                 "elapsed": elapsed, "retries": retries.count})


def invariant_breaks(ledger: Ledger, binding_ids: set[str], counted_writes: int) -> dict[str, int]:
    """What breaks the ledger's promises after the writers, each counted (all 0 when it holds)."""

    def scalar(sql: str, params: list | tuple = ()) -> int:
        return int(ledger.query(sql, params).iloc[0, 0])

    open_list = ", ".join(f"'{s}'" for s in OPEN)
    frame = ledger.query(f"""SELECT binding_id, count(*) AS n FROM optimizer_recommendations
                             WHERE status IN ({open_list}) GROUP BY binding_id""")
    open_per_binding = dict(zip(frame["binding_id"], frame["n"]))
    stored_runs = scalar("SELECT count(*) FROM optimizer_runs")
    return {
        "bindings without exactly one open recommendation":
            sum(1 for b in binding_ids if open_per_binding.get(b, 0) != 1),
        "runs not succeeded": scalar("SELECT count(*) FROM optimizer_runs WHERE status <> 'succeeded'"),
        "runs without exactly 3 candidates": scalar("""SELECT count(*) FROM (SELECT r.id FROM optimizer_runs r
            LEFT JOIN optimizer_candidates c ON c.run_id = r.id GROUP BY r.id HAVING count(c.id) <> 3) x"""),
        "runs without exactly 1 recommendation": scalar("""SELECT count(*) FROM (SELECT r.id FROM optimizer_runs r
            LEFT JOIN optimizer_recommendations m ON m.run_id = r.id GROUP BY r.id HAVING count(m.id) <> 1) x"""),
        "candidates without their run": scalar("""SELECT count(*) FROM optimizer_candidates c
            WHERE NOT EXISTS (SELECT 1 FROM optimizer_runs r WHERE r.id = c.run_id)"""),
        "recommendations without their run": scalar("""SELECT count(*) FROM optimizer_recommendations m
            WHERE NOT EXISTS (SELECT 1 FROM optimizer_runs r WHERE r.id = m.run_id)"""),
        "writes counted but not stored": max(0, counted_writes - stored_runs),
        "runs stored but not counted": max(0, stored_runs - counted_writes),
    }


def writers(where: str, one_binding: bool, processes: int, seconds: float, hold_sessions: bool,
            before: bool) -> dict:
    """`processes` writers released together on a fresh ledger at `where`; writes/s and the invariant."""
    binding_ids = ["shared"] * processes if one_binding else [f"w{i}" for i in range(processes)]
    ledger = ledger_at(where)
    add_bindings(ledger, binding_ids)
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(where, b, seconds, hold_sessions, before, ready, go, results))
             for b in binding_ids]
    load_before = load()
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=300)
        go.set()
        out = [results.get(timeout=seconds + 300) for _ in procs]
        for proc in procs:
            proc.join(60)
            if proc.exitcode != 0:
                raise RuntimeError(f"writer {proc.pid} ended with exit code {proc.exitcode}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    writes = sum(r["writes"] for r in out)
    try:
        breaks = invariant_breaks(ledger, set(binding_ids), writes)
    finally:
        close(ledger)
    return {"writes": writes, "per_s": writes / max(r["elapsed"] for r in out), "errors": sum(r["errors"] for r in out),
            "first_error": next((r["first_error"] for r in out if r["first_error"]), None),
            "retries": sum(r["retries"] for r in out), "breaks": breaks, "load": (load_before, load())}


# ------------------------------------------------------------------ 10 000 candidates


def insert_batch(pg_url: str, batch: int, before: bool) -> float:
    ledger = Ledger(PostgresBackend(pg_url))
    try:
        many = batch_candidates(batch)
        ledger.insert_candidates(new_id("or"), many[:10], "m" * 64)  # warm-up
        with inserts_as_before(before):
            t = time.perf_counter()
            ids = ledger.insert_candidates(new_id("or"), many, "m" * 64)
            elapsed = time.perf_counter() - t
        assert len(ids) == batch
        return elapsed
    finally:
        close(ledger)


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200, help="record_solve writes per mode")
    parser.add_argument("--rounds", type=int, default=4, help="the modes take turns this many times")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each writer phase writes")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10_000, help="candidates of one run (0: skip)")
    parser.add_argument("--before", action="store_true",
                        help="also every PostgreSQL figure with the executemany insert from before COPY")
    parser.add_argument("--skip-duckdb-writers", action="store_true")
    add_quiet_arguments(parser)
    args = parser.parse_args()
    wait_if_asked(args)

    import psycopg
    import pytest

    from servers import postgres_server

    try:
        with postgres_server() as pg, tempfile.TemporaryDirectory(prefix="bench-postgres-") as tmp:
            run(args, pg, Path(tmp), psycopg.__version__)
    except pytest.skip.Exception as exc:  # servers.py skips (pytest's way) when it cannot start one
        sys.exit(f"bench_postgres: {exc.msg}")


def run(args: argparse.Namespace, pg: Any, tmp: Path, psycopg_version: str) -> None:
    version = (pg.bin_dir.parent.name, psycopg_version)
    print(f"PostgreSQL {version[0]} (throwaway cluster, loopback, fsync on), psycopg {version[1]}; "
          f"{os.cpu_count()} cores; load average {load():.2f} at start")

    # record_solve
    load_before = load()
    t0 = time.perf_counter()
    result = record_solve_modes(pg.new_database(), pg.data, tmp / "latency.duckdb", args.writes, args.rounds,
                                args.before)
    connect = connect_close(pg.url(), 50)
    print(f"\nrecord_solve, {args.writes} writes per mode in {args.rounds} interleaved rounds "
          f"(load {load_before:.2f} before, {load():.2f} after, {time.perf_counter() - t0:.0f} s)")
    labels = {"pg_session": "PostgreSQL, long-lived, in ledger.session() (judged)",
              "pg_pooled": "PostgreSQL, long-lived, pooled connection per write",
              "pg_session_before": "PostgreSQL, in a session, executemany insert (before COPY)",
              "pg_pooled_before": "PostgreSQL, pooled per write, executemany insert (before COPY)",
              "pg_commit": "PostgreSQL, one-row INSERT + COMMIT alone (the floor: WAL flush)",
              "duck_session": "DuckDB, in ledger.session() (lock + connection held)",
              "duck_own": "DuckDB, lock + connection per write"}
    for name, values in result.items():
        p50, p10, p90 = percentiles_ms(values["samples"])
        count = len(values["samples"])
        server = "" if name.startswith("duck") else f" + PostgreSQL {values['server_cpu'] / count * 1000:.2f}"
        print(f"  {labels[name]:<64} p50 {p50:7.2f} ms  p90 {p90:7.2f}  (p10 {p10:.2f}); CPU per write: "
              f"this process {values['cpu'] / count * 1000:.2f}{server} ms")
    p50, p10, p90 = percentiles_ms(connect)
    print(f"  {'PostgreSQL: psycopg.connect + close alone (a fresh connection)':<64} p50 {p50:7.2f} ms  p90 {p90:7.2f}")

    def ratio(a: str, b: str | float) -> float:
        rb = [b] * args.rounds if isinstance(b, float) else result[b]["round_p50"]
        return float(np.median([x / y for x, y in zip(result[a]["round_p50"], rb)]))

    judged = float(np.median(result["pg_session"]["samples"]))
    print(f"  ratio to the 3 ms target (PostgreSQL in a session, median of per-round p50 / 3 ms): "
          f"{ratio('pg_session', RECORD_SOLVE_TARGET_S):.2f} -> {'PASS' if judged <= RECORD_SOLVE_TARGET_S else 'MISS'}"
          f" (p50 of all samples {judged * 1000:.2f} ms)")
    print(f"  PostgreSQL / DuckDB, both in a session: {ratio('pg_session', 'duck_session'):.2f}; "
          f"pooled per write / DuckDB lock + connection per write: {ratio('pg_pooled', 'duck_own'):.3f}")
    if args.before:
        print(f"  before / after (executemany / as committed), in a session: "
              f"{ratio('pg_session_before', 'pg_session'):.2f}; pooled: {ratio('pg_pooled_before', 'pg_pooled'):.2f}")

    # writer processes
    phases = [("PostgreSQL", True, False)]
    if args.before:
        phases.append(("PostgreSQL, executemany insert (before COPY)", True, True))
    if not args.skip_duckdb_writers:
        phases += [("DuckDB, step sessions (in_ledger_sessions)", True, False),
                   ("DuckDB, lock + connection per write", False, False)]
    print(f"\n{args.processes} writer processes, {args.seconds:g} s each phase, record_solve of the bench payload")
    judged_rates = []
    for label, hold, before in phases:
        for one_binding in (False, True):
            where = pg.new_database() if label.startswith("PostgreSQL") else \
                str(tmp / f"writers-{len(judged_rates)}-{one_binding}-{hold}.duckdb")
            out = writers(where, one_binding, args.processes, args.seconds, hold, before)
            broken = sum(out["breaks"].values())
            layout = "all on ONE binding" if one_binding else "separate bindings"
            print(f"  {label + ', ' + layout:<72} {out['per_s']:7.1f} run writes/s  ({out['writes']} writes, "
                  f"{out['errors']} errors, {out['retries']} retries, {broken} invariant breaks; "
                  f"load {out['load'][0]:.2f} -> {out['load'][1]:.2f})")
            if broken:
                print(f"    breaks: { {k: v for k, v in out['breaks'].items() if v} }")
            if out["first_error"]:
                print(f"    first error: {out['first_error']}")
            if label == "PostgreSQL":
                judged_rates.append((out["per_s"], broken))
    (rate, _), (one_rate, _) = judged_rates
    breaks = sum(b for _, b in judged_rates)
    print(f"  ratio to the 500 run writes/s target (PostgreSQL, separate bindings: each writer solving its "
          f"own binding, as a refresh does): {rate / WRITES_TARGET_PER_S:.2f}, {breaks} invariant breaks in "
          f"both layouts -> {'PASS' if rate >= WRITES_TARGET_PER_S and breaks == 0 else 'MISS'}; all on one "
          f"binding (its writers serialised by the row lock): {one_rate / WRITES_TARGET_PER_S:.2f}")

    # 10 000 candidates
    if args.batch:
        load_before = load()
        print(f"\nLedger.insert_candidates, {args.batch} candidates of one run on PostgreSQL")
        after = insert_batch(pg.new_database(), args.batch, False)
        print(f"  as committed {after:8.3f} s")
        if args.before:
            old = insert_batch(pg.new_database(), args.batch, True)
            print(f"  executemany (before COPY) {old:8.3f} s  (before / after {old / after:.1f}x)")
        print(f"  (load {load_before:.2f} before, {load():.2f} after)")
    print(f"\nload average {load():.2f} at end")


if __name__ == "__main__":
    main()
