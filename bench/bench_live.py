"""Benchmark: the resident live service (`optimizer-pipeline live`) at an offered load of ~1000
re-solves a minute, staggered and in a burst (issue 34).

Usage:
    .venv/bin/python bench/bench_live.py [--bindings 100] [--arrival-s 6] [--minutes 10] [--ledger duckdb|postgres]
                                         [--home DIR] [--setup-only]

Setup (not timed): a home with BINDINGS copies of the demo quadruple tank (history ending now), refreshed
through Dagster in one in-process run (`cli.run_partitions`, as `materialize --all`); `--home DIR` keeps
and reuses it. `--ledger postgres` puts the ledger on a throwaway PostgreSQL server (tests/servers.py).

Then `optimizer-pipeline live` runs as a subprocess with its defaults (Dagster reporter, report interval
300 s, the solver pool of the settings: 2 workers) and this process is the plant historian: every
binding gets one new sample period in its inbox folder every ARRIVAL_S seconds (a one-row CSV, written
under a temporary name and renamed), at its own offset within the period (staggered: binding i at
i * ARRIVAL_S / BINDINGS), for MINUTES; then every binding at once (a burst, as one OPC UA grid
gives), five times, one period apart. Offered load: BINDINGS * 60 / ARRIVAL_S re-solves a minute.

Figures (printed at the end, with the targets of issue 34):
  sustained re-solves / min   publications in the staggered phase / its duration
  latency p50 / p99           a file's rename -> its publication's commit (live_publications.published_at)
  burst drain                 the last file of a burst -> the last of its publications
  missed periods              arrivals whose sample was never solved from (coalesced into a later solve)
  CPU per re-solve            (user + system CPU of the service and its solver workers) / publications
  peak RSS                    the service's VmHWM + its workers' (MiB)
  ledger growth               bytes per publication (DuckDB file / PostgreSQL database size), per day at
                              1000 bindings re-solved every minute
With `--anchor-bindings K` (K >= 1) the daemon path is measured too, in the same run: K bindings each given
one new sample in its inbox with `optimizer-pipeline daemon` running and no live service (a Dagster run per
re-solve): time until all K are re-solved and CPU per re-solve (the issue's 20-binding anchor: 162.7 s,
~15 CPU-s per re-solve).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

CLI = [sys.executable, "-m", "optimizer_pipeline.cli"]
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and the processes below it (the solver workers)."""
    from servers import descendants

    total = 0.0
    for p in (pid, *descendants(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def _rss_mib(pid: int) -> float:
    from servers import descendants

    total = 0
    for p in (pid, *descendants(pid)):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    return total / 1024


def _setup(home: Path, n: int, ledger_url: str | None) -> list[str]:
    from optimizer_pipeline.cli import run_partitions
    from optimizer_pipeline.contracts import binding_from_dict
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.plants import get_plant
    from optimizer_pipeline.settings import load_settings

    plant = get_plant("tanks")
    ids = [f"tanks-{i:04d}" for i in range(n)]
    if ledger_url:
        (home / "settings.yaml").write_text(f"ledger:\n  url: {ledger_url}\n")
    ledger = open_ledger(home, load_settings(home))
    have = {b.spec.id for b in ledger.list_bindings()}
    todo = [b for b in ids if b not in have]
    if todo:
        t0 = time.perf_counter()
        frame = plant.history(1).frame
        for binding_id in todo:
            ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
        print(f"setup: {len(todo)} bindings ingested in {time.perf_counter() - t0:.1f} s; refreshing through Dagster",
              flush=True)
        t0 = time.perf_counter()
        results = run_partitions(home, todo, "refresh")
        failed = [r.binding_id for r in results if not r.ok]
        print(f"setup: refreshed in {time.perf_counter() - t0:.1f} s ({len(failed)} failed)", flush=True)
    return ids


class Historian:
    """Writes one new sample per binding into its inbox folder; remembers when each arrived."""

    def __init__(self, home: Path, ids: list[str]):
        from optimizer_pipeline.ledger import open_ledger
        from optimizer_pipeline.settings import load_settings

        ledger = open_ledger(home, load_settings(home))
        spec = ledger.get_binding(ids[0]).spec
        self.home, self.tags, self.period = home, spec.tags, spec.sample_period_s
        self.last = {}
        for binding_id in ids:
            row = ledger.recent_samples(binding_id, spec.tags, run_id=ledger.newest_run(binding_id), rows=1)
            self.last[binding_id] = row.iloc[0].to_dict()
        self.arrivals: dict[tuple[str, float], float] = {}  # (binding, sample time) -> wall time of the rename
        self.rng = np.random.default_rng(0)

    def drop(self, binding_id: str) -> None:
        row = dict(self.last[binding_id])
        row["timestamp"] = float(row["timestamp"]) + self.period
        for tag in self.tags:
            row[tag] = float(row[tag]) + 1e-3 * self.rng.standard_normal()
        self.last[binding_id] = row
        folder = self.home / "inbox" / binding_id
        folder.mkdir(parents=True, exist_ok=True)
        name = f"s{row['timestamp']:.0f}.csv"
        header = "run_id,timestamp," + ",".join(self.tags)
        line = f"{row['run_id']},{row['timestamp']}," + ",".join(repr(float(row[t])) for t in self.tags)
        (folder / (name + ".part")).write_text(header + "\n" + line + "\n")
        os.rename(folder / (name + ".part"), folder / name)
        self.arrivals[(binding_id, row["timestamp"])] = time.time()


def _publications(home: Path):
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.settings import load_settings

    return open_ledger(home, load_settings(home)).query(
        "SELECT binding_id, live_t, published_at FROM live_publications")


def _ledger_bytes(home: Path, ledger_url: str | None) -> int:
    if not ledger_url:
        return (home / "optimizer.duckdb").stat().st_size
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.settings import load_settings

    return int(open_ledger(home, load_settings(home)).query("SELECT pg_database_size(current_database()) AS n")["n"][0])


def _run_live(home: Path, ids: list[str], arrival_s: float, minutes: float, ledger_url: str | None) -> dict:
    historian = Historian(home, ids)
    proc = subprocess.Popen([*CLI, "--home", str(home), "live"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("live service"):
            raise SystemExit(f"live did not start: {ready!r}")
        print(ready.strip(), flush=True)
        time.sleep(2.0)
        before = len(_publications(home))
        bytes_before, cpu_before = _ledger_bytes(home, ledger_url), _cpu_s(proc.pid)
        start = time.time()
        end = start + minutes * 60
        n = len(ids)
        k = 0
        while True:  # staggered: binding i at start + i * arrival_s / n + m * arrival_s
            m, i = divmod(k, n)
            due = start + m * arrival_s + i * arrival_s / n
            if due >= end:
                break
            time.sleep(max(0.0, due - time.time()))
            historian.drop(ids[i])
            k += 1
        time.sleep(arrival_s)  # the last ones solved
        stagger_s = time.time() - start
        cpu_stagger = _cpu_s(proc.pid) - cpu_before
        published = _publications(home)
        stagger_count = len(published) - before
        bytes_stagger = _ledger_bytes(home, ledger_url) - bytes_before
        staggered = dict(historian.arrivals)

        bursts = []
        for _ in range(5):
            count0, t0 = len(_publications(home)), time.time()
            for binding_id in ids:
                historian.drop(binding_id)
            last_drop = time.time()
            deadline = last_drop + 60
            while len(_publications(home)) < count0 + n and time.time() < deadline:
                time.sleep(0.05)
            bursts.append((time.time() - last_drop, time.time() - t0, len(_publications(home)) - count0))
            time.sleep(max(0.0, t0 + arrival_s - time.time()))
        rss = _rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    published = _publications(home)
    latencies, solved = [], set()
    for row in published.itertuples():
        solved.add((row.binding_id, float(row.live_t)))
    for (binding_id, t), arrived in staggered.items():
        match = published[(published["binding_id"] == binding_id) & (abs(published["live_t"] - t) < 1e-3)]
        if len(match):
            latencies.append(match["published_at"].iloc[0].timestamp() - arrived
                             if match["published_at"].iloc[0].tzinfo else
                             match["published_at"].iloc[0].replace(tzinfo=__import__("datetime").timezone.utc).timestamp()
                             - arrived)
    missed = sum(1 for key in staggered if not any(abs(key[1] - t) < 1e-3 for b, t in solved if b == key[0]))
    return {"offered_per_min": n * 60 / arrival_s, "stagger_s": stagger_s, "published": stagger_count,
            "per_min": stagger_count / stagger_s * 60, "p50_ms": float(np.percentile(latencies, 50)) * 1000,
            "p99_ms": float(np.percentile(latencies, 99)) * 1000, "missed": missed, "arrivals": len(staggered),
            "cpu_ms": cpu_stagger / max(stagger_count, 1) * 1000, "rss_mib": rss,
            "bytes_per_publication": bytes_stagger / max(stagger_count, 1), "bursts": bursts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--arrival-s", type=float, default=6.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--ledger", choices=("duckdb", "postgres"), default="duckdb")
    parser.add_argument("--home", type=Path, help="keep the prepared home here and reuse it")
    parser.add_argument("--setup-only", action="store_true", help="prepare --home and stop")
    args = parser.parse_args()

    from contextlib import ExitStack

    with ExitStack() as stack:
        url = None
        if args.ledger == "postgres":
            from servers import postgres_server

            url = stack.enter_context(postgres_server()).new_database()
        home = args.home or Path(tempfile.mkdtemp(prefix="bench-live-"))
        home.mkdir(parents=True, exist_ok=True)
        os.environ["OPTIMIZER_HOME"] = str(home)
        os.environ.pop("DAGSTER_HOME", None)
        ids = _setup(home, args.bindings, url)
        if args.setup_only:
            return
        shutil.rmtree(home / "inbox", ignore_errors=True)
        r = _run_live(home, ids, args.arrival_s, args.minutes, url)

    day = 1000 * 60 * 24
    print(f"\nlive service, {args.bindings} bindings, a sample every {args.arrival_s:g} s each, {args.ledger} ledger "
          f"(offered {r['offered_per_min']:.0f} re-solves/min), {args.minutes:g} min staggered + 5 bursts")
    print(f"  sustained re-solves/min : {r['per_min']:.0f}   (target >= 1000 on 2 cores)")
    print(f"  latency p50 / p99       : {r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms   (target p99 <= 2000 ms)")
    print(f"  missed periods          : {r['missed']} of {r['arrivals']} arrivals   (target 0)")
    print(f"  CPU per re-solve        : {r['cpu_ms']:.1f} ms   (target <= 60 ms)")
    print(f"  peak RSS                : {r['rss_mib']:.0f} MiB   (target <= 1024 MiB)")
    print(f"  ledger growth           : {r['bytes_per_publication'] / 1024:.1f} kB per publication, "
          f"{r['bytes_per_publication'] * day / 1e9:.1f} GB/day at 1000 bindings x 1/min   (target <= 1 GB/day)")
    for k, (drain, total, count) in enumerate(r["bursts"]):
        print(f"  burst {k + 1}: {count} of {args.bindings} published {drain:.2f} s after the last file "
              f"({total:.2f} s after the first; target: within one period, {args.arrival_s:g} s)")


if __name__ == "__main__":
    main()
