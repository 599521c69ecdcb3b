"""Benchmark runner (issue 8): every topic for repeated rounds; per figure its median, its spread, the
ratio to its anchor measured in the same round, and PASS / MISS against the issue's targets.

Topics (each a bench/bench_*.py module, see their docstrings for what is timed):
  solver    bench_pool.measure: pool vs bare OSQP, cvxpy, in-process solve_problem, a process per
            solve and the original probe + process per solve, two plants x --steps re-solves
  uq        bench_uq.measure: block_scores rows / s vs a per-block Python loop (same scores checked)
  ledger    bench_ledger.measure: record_solve p50, 10 000 candidates by Ledger / per row / frame
  pipeline  bench/bench_pipeline.py (the lead's, run as a subprocess) for the refresh wall time and
            split; its process is watched by bench_memory.run_tree for the memory topic
  memory    bench_memory.worker_peak + the refresh process's peak RSS (from the pipeline run)

Statistics: a latency figure's value in a round is the p50 of that round's samples; the table shows
the median of the per-round values and, as spread, p10-p90 of all samples of all rounds. A
throughput or wall-time figure's value is one number per round (the median of its repeats for
block scoring); its spread is min-max over rounds (and repeats). A ratio is computed inside each
round (figure and anchor from the same round) and its median over rounds is shown.

Before the first topic the runner waits (up to --wait-max-s, before later ones up to --topic-wait-s)
for the 1-minute load average to drop below --max-load, and records the load before and after each topic. OPENBLAS_NUM_THREADS defaults to 1 here
(set before numpy is imported) so BLAS threads do not fight over the 2 cores; OPENBLAS_CORETYPE is
left as the environment has it.

    .venv/bin/python bench/run.py [--rounds 3] [--topics solver,uq,ledger,pipeline,memory] [--markdown OUT.md]
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy / scipy load OpenBLAS

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import bench_ledger  # noqa: E402
import bench_memory  # noqa: E402
import bench_pool  # noqa: E402
import bench_uq  # noqa: E402
from optimizer_pipeline.solver.pool import SolverPool  # noqa: E402
from quiet import load1, wait_for_quiet  # noqa: E402

TOPICS = ("solver", "uq", "ledger", "pipeline", "memory")
PACKAGES = ("numpy", "scipy", "osqp", "duckdb", "pandas", "pyarrow", "dagster", "cvxpy")


@dataclass
class Row:
    """One line of the table."""

    topic: str
    label: str
    unit: str
    per_round: list[float]  # the figure's value in each round
    spread: tuple[float, float] | None = None
    spread_kind: str = ""
    ratio: list[float] = field(default_factory=list)  # per round, figure vs its anchor
    ratio_label: str = ""
    target: str = ""
    verdict: str = ""  # PASS / MISS / "" (no target)

    @property
    def median(self) -> float:
        return float(np.median(self.per_round))


def p10_p90(samples: list[float], scale: float = 1.0) -> tuple[float, float]:
    values = np.asarray(samples) * scale
    return float(np.percentile(values, 10)), float(np.percentile(values, 90))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --------------------------------------------------------------------------- topics


def solver_rows(rounds: int, steps: int, process_samples: int, seed: int) -> list[Row]:
    runs = []
    with SolverPool(size=1, request_timeout_ms=10_000) as pool:
        for _ in range(rounds):
            runs.append(bench_pool.measure(pool, steps, process_samples, seed))
    rows = []
    for plant in runs[0]:
        def p50s(mode: str) -> list[float]:
            return [float(np.median(r[plant][mode])) * 1000 for r in runs if r[plant][mode]]

        def pooled(mode: str) -> list[float]:
            return [s for r in runs for s in r[plant][mode]]

        pool50 = p50s("pool")
        short = plant.split(" (")[0]

        def row(mode: str, label: str, **kw) -> Row:
            return Row("solver", f"{short}: {label}", "ms", p50s(mode), p10_p90(pooled(mode), 1000), "p10-p90 solves",
                       **kw)

        rows.append(row("bare", "bare OSQP nominal QP, warm (1 QP)",
                        ratio=[p / b for p, b in zip(pool50, p50s("bare"))], ratio_label="pool / this"))
        if p50s("cvxpy"):
            gap = max(r[plant]["cvxpy_move_gap"][0] for r in runs)
            rows.append(row("cvxpy", f"cvxpy parameterised re-solve (1 QP; |du0 gap| {gap:.0e})",
                            ratio=[c / b for c, b in zip(p50s("cvxpy"), p50s("bare"))], ratio_label="this / bare"))
        else:
            rows.append(Row("solver", f"{short}: cvxpy parameterised re-solve", "ms", [float("nan")],
                            target="skipped: cvxpy not installed"))
        raw50 = p50s("raw")
        rows.append(row("raw", "in-process solve_problem, warm (3 QPs + verify)"))
        rows.append(row("codec", "in-process + pool JSON codec, no IPC",
                        ratio=[c - r for c, r in zip(p50s("codec"), raw50)], ratio_label="ms over raw"))
        over = [p - r for p, r in zip(pool50, raw50)]
        rows.append(row("pool", "pool round trip (1 worker, warm)", ratio=over, ratio_label="ms over raw",
                        target="<= raw + 1 ms", verdict=verdict(float(np.median(over)) <= 1.0)))
        process = [p / q for p, q in zip(p50s("process"), pool50)]
        rows.append(row("process", f"process per solve ({process_samples}/round)", ratio=process,
                        ratio_label="x pool", target=">= 100x pool", verdict=verdict(float(np.median(process)) >= 100)))
        total = float(np.median(p50s("original"))) * steps / 1000
        rows.append(row("original", f"original: probe + process per solve (~{total:.0f} s / {steps})",
                        ratio=[o / q for o, q in zip(p50s("original"), pool50)], ratio_label="x pool"))
        rows.append(row("probe", "  of which the probe process"))
    return rows


def uq_rows(rounds: int, samples: int, repeat: int, loop_runs: int) -> list[Row]:
    runs = [bench_uq.measure(samples, 100, repeat, loop_runs) for _ in range(rounds)]
    rates = [float(np.median(r["rows"] / np.asarray(r["times"]))) for r in runs]
    all_rates = [r["rows"] / t for r in runs for t in r["times"]]
    loop = [r["loop_rows"] / r["loop_s"] for r in runs]
    diff = max(r["max_abs_diff"] for r in runs)
    return [
        Row("uq", f"block_scores, {samples:.0e} rows (P = 10)", "M rows/s", [x / 1e6 for x in rates],
            (min(all_rates) / 1e6, max(all_rates) / 1e6), f"min-max {rounds}x{repeat} repeats",
            ratio=[f / a for f, a in zip(rates, loop)], ratio_label="x loop",
            target=">= 6.5 M rows/s", verdict=verdict(float(np.median(rates)) >= bench_uq.TARGET_ROWS_PER_S)),
        Row("uq", f"per-block Python loop anchor ({loop_runs} runs; max |score diff| {diff:.0e})", "M rows/s",
            [x / 1e6 for x in loop], (min(loop) / 1e6, max(loop) / 1e6), "min-max rounds"),
    ]


def ledger_rows(rounds: int, writes: int, batch: int) -> list[Row]:
    runs = [bench_ledger.measure(writes, batch) for _ in range(rounds)]

    def lat(name: str) -> tuple[list[float], tuple[float, float]]:
        return ([float(np.median(r[name])) * 1000 for r in runs],
                p10_p90([s for r in runs for s in r[name]], 1000))

    def once(name: str) -> tuple[list[float], tuple[float, float]]:
        values = [r[name] for r in runs]
        return values, (min(values), max(values))

    session, session_spread = lat("record_solve_session")
    record, record_spread = lat("record_solve")
    connect, connect_spread = lat("connect_close")
    rows = [Row("ledger", "record_solve: run + 3 candidates + recommendation, in one Ledger.session()", "ms", session,
                session_spread, f"p10-p90 {writes}x{rounds} writes", target="<= 5 ms p50",
                verdict=verdict(float(np.median(session)) <= 5)),
            Row("ledger", "record_solve with its own lock + connection (the default outside a session)", "ms", record,
                record_spread, f"p10-p90 {writes}x{rounds} writes"),
            Row("ledger", "  of which lock + connect + close (empty transaction)", "ms", connect, connect_spread,
                f"p10-p90 {writes}x{rounds}")]
    per_row = [r["per_row"] for r in runs]
    for name, label in (("executemany", "Ledger.insert_candidates (as committed)"),
                        ("per_row", "one INSERT per row (anchor)"),
                        ("dataframe", "DataFrame insert of the same rows, in the bench"),
                        ("build_table", "  building the rows alone (plans as Arrow lists, reports by orjson, as Ledger)"),
                        ("build_rows", "  building the rows with canonical JSON instead (the old way, no SQL)"),
                        ("frame_plain", "DataFrame insert, JSON texts by plain json.dumps, in the bench")):
        values, spread = once(name)
        target = {"target": "<= 0.3 s", "verdict": verdict(float(np.median(values)) <= 0.3)} if name == "executemany" else {}
        ratio = {} if name.startswith("build") else {"ratio": [a / v for a, v in zip(per_row, values)],
                                                 "ratio_label": "x faster than per-row"}
        rows.append(Row("ledger", f"{batch} candidates: {label}", "s", values, spread, "min-max rounds", **ratio, **target))
    return rows


PIPELINE_PATTERNS = {
    "total": r"total wall: ([\d.]+) s",
    "per_binding": r"per binding: ([\d.]+) s",
    "ingest": r"ingest of \d+ bindings: ([\d.]+) s",
    "history prep": r"history prep\s+([\d.]+) ms",
    "identification": r"identification\s+([\d.]+) ms",
    "scores + calibration": r"scores \+ calibration\s+([\d.]+) ms",
    "compile + solve + verify + ledger": r"compile \+ solve \+ verify \+ ledger\s+([\d.]+) ms",
    "Dagster overhead": r"Dagster overhead \(wall - domain\)\s+([\d.]+) ms",
}


def pipeline_and_memory_rows(rounds: int, bindings: int, worker_steps: int, seed: int,
                             topics: set[str]) -> tuple[list[Row], list[str]]:
    """The refresh runs (pipeline figures and the refresh process's memory) and the worker's memory."""
    parsed, trees, notes = [], [], []
    for _ in range(rounds):
        text, tree = bench_memory.run_tree(bench_memory.pipeline_cmd(bindings))
        values = {}
        for key, pattern in PIPELINE_PATTERNS.items():
            found = re.search(pattern, text)
            if found is None:
                raise RuntimeError(f"bench_pipeline.py output has no {key!r} line:\n{text}")
            values[key] = float(found.group(1))
        parsed.append(values)
        trees.append(tree)
        statuses = re.search(r"statuses: (.*)", text)
        notes.append(f"refresh statuses: {statuses.group(1) if statuses else '?'}")
    rows = []
    if "pipeline" in topics:
        total = [p["total"] for p in parsed]
        spread = (min(total), max(total))
        rows.append(Row("pipeline", f"refresh of {bindings} bindings, one Dagster run (wall)", "s", total, spread,
                        "min-max rounds", ratio=[t / 60 for t in total], ratio_label="x the 60 s target",
                        target="<= 60 s", verdict=verdict(float(np.median(total)) <= 60)))
        for key, unit in (("per_binding", "s"), ("ingest", "s"), ("history prep", "ms"), ("identification", "ms"),
                          ("scores + calibration", "ms"), ("compile + solve + verify + ledger", "ms"),
                          ("Dagster overhead", "ms")):
            values = [p[key] for p in parsed]
            label = {"per_binding": "  per binding (wall / bindings)", "ingest": f"  ingest of {bindings} bindings "
                     "(before the timed refresh)"}.get(key, f"  split: {key}")
            rows.append(Row("pipeline", label, unit, values, (min(values), max(values)), "min-max rounds"))
    if "memory" in topics:
        worker = [bench_memory.worker_peak(worker_steps, seed) for _ in range(rounds)]
        for key, label in (("ready_mib", "solver worker VmHWM at ready"),
                           ("peak_mib", f"solver worker VmHWM after 2 x {worker_steps} solves")):
            values = [w[key] for w in worker]
            rows.append(Row("memory", label, "MiB", values, (min(values), max(values)), "min-max rounds"))
        for key, label in (("process_mib", f"refresh of {bindings}: process peak RSS"),
                           ("workers_mib", "  its largest child process VmHWM (solver or figure worker, sampled)"),
                           ("tree_mib", "  process + children RSS, largest sampled sum")):
            values = [t[key] for t in trees]
            rows.append(Row("memory", label, "MiB", values, (min(values), max(values)), "min-max rounds"))
    return rows, notes


# --------------------------------------------------------------------------- report


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")))
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return {"nproc": str(os.cpu_count()), "cpu": cpu, "memory": f"{mem_kib / 1024 ** 2:.1f} GiB",
            "python": platform.python_version(), "packages": ", ".join(versions),
            "blas threads": f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} "
                            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}"}


def fmt(value: float) -> str:
    if value != value:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table(rows: list[Row]) -> list[list[str]]:
    out = []
    for row in rows:
        spread = f"{fmt(row.spread[0])}-{fmt(row.spread[1])} ({row.spread_kind})" if row.spread else ""
        ratio = f"{fmt(float(np.median(row.ratio)))} {row.ratio_label}" if row.ratio else ""
        out.append([row.topic, row.label, row.unit, fmt(row.median), spread, ratio, row.target, row.verdict])
    return out


HEADER = ["topic", "figure", "unit", "median", "spread", "ratio to anchor (same round)", "target", "verdict"]


def print_table(cells: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in cells + [HEADER]) for i in range(len(HEADER))]
    for line in [HEADER] + cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def markdown(cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default=",".join(TOPICS), help=f"comma-separated subset of {','.join(TOPICS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline-rounds", type=int, default=1, help="rounds of the 100-binding refresh (~1-4 min each)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--process-samples", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--uq-repeat", type=int, default=5)
    parser.add_argument("--loop-runs", type=int, default=5)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--wait-max-s", type=float, default=600.0, help="longest wait for a quiet machine before "
                        "the first topic")
    parser.add_argument("--topic-wait-s", type=float, default=120.0, help="longest wait before each later topic")
    parser.add_argument("--markdown", type=Path, help="also write the table (and the loads) as markdown here")
    parser.add_argument("--json", type=Path, help="also write every per-round value here")
    args = parser.parse_args()
    topics = set(args.topics.split(","))
    unknown = topics - set(TOPICS)
    if unknown:
        parser.error(f"--topics: unknown {', '.join(sorted(unknown))} (known: {', '.join(TOPICS)})")

    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    rows: list[Row] = []
    loads: list[str] = []
    notes: list[str] = []
    started = time.monotonic()

    def topic(name: str, collect) -> None:
        load, waited = wait_for_quiet(args.max_load, args.topic_wait_s if loads else args.wait_max_s)
        print(f"\n[{name}] load before {load:.2f} (waited {waited:.0f} s) ...", flush=True)
        t = time.monotonic()
        got = collect()
        found, extra = got if isinstance(got, tuple) else (got, [])
        rows.extend(found)
        notes.extend(extra)
        loads.append(f"{name}: load {load:.2f} before (waited {waited:.0f} s), {load1():.2f} after, "
                     f"{time.monotonic() - t:.0f} s")
        print_table(table(found))

    if "solver" in topics:
        topic("solver", lambda: solver_rows(args.rounds, args.steps, args.process_samples, args.seed))
    if "uq" in topics:
        topic("uq", lambda: uq_rows(args.rounds, args.samples, args.uq_repeat, args.loop_runs))
    if "ledger" in topics:
        topic("ledger", lambda: ledger_rows(args.rounds, args.writes, args.batch))
    if topics & {"pipeline", "memory"}:
        topic("pipeline+memory", lambda: pipeline_and_memory_rows(args.pipeline_rounds, args.bindings, args.steps,
                                                                  args.seed, topics))
    cells = table(rows)
    print(f"\nall topics, {args.rounds} rounds ({args.pipeline_rounds} for the refresh), "
          f"{time.monotonic() - started:.0f} s")
    print_table(cells)
    for line in loads + notes:
        print(line)
    if args.markdown:
        body = "\n".join(f"* {k}: {v}" for k, v in info.items()) + "\n\n" + markdown(cells) + "\n"
        body += "\n".join(f"* {line}" for line in loads + notes) + "\n"
        args.markdown.write_text(body)
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "loads": loads, "notes": notes,
                                         "rows": [row.__dict__ for row in rows]}, indent=1))


if __name__ == "__main__":
    main()
