"""Benchmark: the resident live service (`optimizer-pipeline live`) at an offered load of ~1000
re-solves a minute, staggered and in a burst (issue 34), and the other processes sharing its ledger beside it
(issue "Sharing the ledger").

Usage:
    .venv/bin/python bench/bench_live.py [--bindings 100] [--arrival-s 6] [--minutes 10] [--ledger duckdb|postgres]
                                         [--hosts N] [--anchor-bindings K] [--home DIR] [--setup-only]
                                         [--no-others] [--repeat 3]

The issue's shape (a kept home: its setup is made once and reused; the first run took 16 min on 2 cores at a
load average of ~7 beside other work, its setup 15 min more; PostgreSQL 22 min with its setup):
    .venv/bin/python bench/bench_live.py --home /tmp/bench-live-home --bindings 100 --arrival-s 6 --minutes 3
    .venv/bin/python bench/bench_live.py --ledger postgres --bindings 100 --arrival-s 6 --minutes 3
(the second on a fresh home and a throwaway server: its setup is in its time).
The samples run ahead of the clock while they arrive (Historian): MINUTES plus the busy others (~2-3 min at
--repeat 3) should stay within ~7 min; the busy rounds stop early (and say so) before the samples get
AHEAD_MAX_S ahead.

Setup (not timed): a home with BINDINGS copies of the demo quadruple tank (history ending now), refreshed
through Dagster in one in-process run (`automation.run_partitions`, as `materialize --all`), with --others one
more copy, OTHER (tanks-other), that the live service does not serve; `--home DIR` keeps and reuses it.
`--ledger postgres` puts the ledger on a throwaway PostgreSQL server (tests/servers.py).

Then `optimizer-pipeline live --binding ...` (the BINDINGS copies) runs as a subprocess with its defaults
(Dagster reporter, report interval 300 s, the solver pool of the settings: 2 workers) and this process is the
plant historian: every binding gets one new sample period in its inbox folder every ARRIVAL_S seconds (a
one-row CSV, written under a temporary name and renamed), at its own offset within the period (staggered:
binding i at i * ARRIVAL_S / BINDINGS), for MINUTES; then every binding at once (a burst, as one OPC UA grid
gives), five times, one period apart; then nothing (the idle service). Offered load: BINDINGS * 60 / ARRIVAL_S
re-solves a minute.

Other processes (--others, default on; bench/live_others.py): REPEAT rounds of CLI commands, one at a time,
each a subprocess with the DuckDB backend's lock-wait logging on: `status`, `recommendation` of a served
binding, `ingest` of a binding file and its history (a new unserved binding each time, the same 3600 samples)
and `materialize OTHER` (a Dagster run in process). First on the idle home (nothing running, before the live
service starts); again beside the busy service: after the staggered phase its arrivals go on (not counted in
the service's figures below) while the same rounds run, from a period after; then the bursts. (--hosts: the
services share the unserved bindings too, which get no samples; --anchor-bindings: the daemon's sensors may
refresh them on their own before the drop, not timed.)

Figures (printed at the end, with the targets of issue 34):
  sustained re-solves / min   publications in the staggered phase / its duration
  latency p50 / p99           a file's rename -> its publication's commit (live_publications.published_at)
  burst drain                 the last file of a burst -> the last of its publications
  missed periods              arrivals whose sample was never solved from (coalesced into a later solve)
  CPU per re-solve            (user + system CPU of the service's process tree: its solver workers, and the
                              processes of it that ended, e.g. the figure processes) / publications
  peak RSS                    the service's VmHWM + its workers' (MiB)
  ledger growth               bytes per publication (DuckDB file / PostgreSQL database size), per day at
                              1000 bindings re-solved every minute
  idle service                after the bursts and SETTLE_S (10 s), nothing arriving for IDLE_S (30 s): the
                              service's user + system CPU (/proc/<pid>/stat) / wall time in cores, its own process
                              and its process tree (target <= 0.02 of a core); a Dagster report (every 300 s)
                              may fall in the window
  other processes             per command: end-to-end time (interpreter start to exit) on the idle home (median)
                              and beside the busy service (median, worst), worst - idle against +2 s (materialize:
                              worst / idle against 1.5x), and the re-solves / min the service published meanwhile;
                              DuckDB: the contended lock acquisitions those processes logged (`waited <s> s for
                              the lock`; an uncontended one logs nothing): count, p50, max (target max <= 1 s);
                              PostgreSQL: n/a. The issue's figures before the fix (20 bindings, a sample every
                              0.5 s): status 1.4 s idle vs 9.6 s busy, recommendation 1.5 vs 21.4 s, ingest of
                              another binding 2.0 vs 25.2 s; the idle service 0.14 of a core.

With `--hosts N` (N >= 2, `--ledger postgres` only) and after the run above: N live services, a home each
(settings.yaml naming the one ledger), split the bindings by their leases; every binding's file goes to the
inbox of the home whose service holds its lease. Over a staggered phase of MINUTES: re-solves / min overall,
CPU per re-solve of each service's process tree, of all of them and of the PostgreSQL server, and the hosts
projected for 1000 re-solves / min (2 cores each, at most half of them busy). Then the first service's process
group gets SIGKILL; the samples go on, its bindings' files into the next home's inbox from that moment (a
plant's data source re-subscribed by the new owner); take-over: from the SIGKILL until every binding of the
killed service has a publication by another service (live_publications.service_id) from a sample dropped
after it (its leases expire LEASE_S after their last renewal, at most a heartbeat before the kill).

With `--anchor-bindings K` (K >= 1) the daemon path is measured too, in the same run, once no live service runs
(their leases given up): `optimizer-pipeline daemon` starts; first (not timed) its sensors tick and the runs
they launch on their own end (nothing queued or running, no inbox file waiting, automation.re_solve_requests
empty), and its idle CPU is measured for IDLE_S; then the first K bindings each get one new sample in their
inbox at once (its history_inbox sensor ingests them and launches a Dagster `solve` run per binding).
Figures: time from the drop until all K are re-solved (a recommendation whose run finished after the drop,
optimizer_runs.finished_at), p50 of it per binding, and CPU per re-solve: the daemon's process tree (the
daemon, its code server, the runs and their processes, reaped into cutime / cstime; the sensor ticks meanwhile
included) from the drop until the runs ended, / the re-solves; beside the issue's 20-binding anchor (162.7 s
until all re-solved, p50 122 s, ~15 CPU-s per re-solve, 7.4 re-solves / min on 2 cores) and the live
service's figures of this run.
"""

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from live_others import Others, print_others  # noqa: E402

CLI = [sys.executable, "-m", "optimizer_pipeline.cli"]
TICKS = os.sysconf("SC_CLK_TCK")
TAKEOVER_MAX_S = 180.0  # --hosts: the longest the take-over is waited for
SETTLE_MAX_S = 3600.0  # --anchor-bindings: the longest the runs the sensors launch on their own may take
ANCHOR_MAX_S = 1800.0  # --anchor-bindings: the longest its re-solves may take
IDLE_S = 30.0  # how long the idle service's CPU is measured (after the bursts), and the idle daemon's (--anchor)
SETTLE_S = 10.0  # after the last burst, before the idle service's CPU is measured
AHEAD_MAX_S = 270.0  # --others: the busy rounds stop before the samples run this far ahead of the clock (Historian)
BURSTS_LEAD_S = 30.0  # what the bursts add to it at most (5 periods of 10 s in 5 x ARRIVAL_S)
OTHER = "tanks-other"  # --others: the binding beside the served ones that the live service does not serve
ISSUE_ANCHOR = "20 bindings, 162.7 s until all re-solved, p50 122 s, ~15 CPU-s per re-solve, 7.4 re-solves/min"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and the processes below it (the solver workers, the Dagster runs),
    with those of their children that ended and were waited for (/proc stat cutime, cstime): the difference
    of two readings is what the tree spent between them, also in the processes that ended in between."""
    from servers import descendants

    total = 0.0
    for p in (pid, *descendants(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / TICKS
    return total


def _own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process `pid` alone (not its children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return sum(int(f) for f in fields[11:13]) / TICKS


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


def _epoch(ts) -> float:
    """A ledger TIMESTAMP (naive UTC) as seconds since the epoch."""
    ts = pd.Timestamp(ts)
    return (ts if ts.tzinfo else ts.tz_localize("UTC")).timestamp()


def _naive_utc(t: float) -> datetime:
    """Seconds since the epoch as the ledger's naive UTC."""
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None)


def _ledger(home: Path):
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.settings import load_settings

    return open_ledger(home, load_settings(home))


def _setup(home: Path, n: int, ledger_url: str | None, extra: tuple[str, ...] = ()) -> list[str]:
    from optimizer_pipeline.automation import run_partitions
    from optimizer_pipeline.contracts import binding_from_dict
    from optimizer_pipeline.plants import get_plant

    plant = get_plant("tanks")
    ids = [f"tanks-{i:04d}" for i in range(n)]
    if ledger_url:
        (home / "settings.yaml").write_text(f"ledger:\n  url: {ledger_url}\n")
    ledger = _ledger(home)
    have = {b.spec.id for b in ledger.list_bindings()}
    todo = [b for b in (*ids, *extra) if b not in have]
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
    """Writes one new sample per binding into its inbox folder (in the home of `home_of`: --hosts, the home
    whose service holds the binding's lease); remembers when each arrived."""

    def __init__(self, home: Path, ids: list[str]):
        ledger = _ledger(home)
        spec = ledger.get_binding(ids[0]).spec
        self.home_of, self.tags, self.period = dict.fromkeys(ids, home), spec.tags, spec.sample_period_s
        self.last = {}
        self.rng = np.random.default_rng(0)
        now = time.time()
        caught_up = []
        for binding_id in ids:
            row = ledger.recent_samples(binding_id, spec.tags, run_id=ledger.newest_run(binding_id), rows=1)
            self.last[binding_id] = last = row.iloc[0].to_dict()
            # up to 2 min ago: each drop advances one sample period (10 s) every ARRIVAL_S (6 s), so the
            # samples run ahead of the clock by ~(period - ARRIVAL_S) per drop; ingestion refuses a sample
            # more than 300 s ahead (a run of up to ~7 min at the defaults stays within it)
            gap = np.arange(float(last["timestamp"]) + self.period, now - 120.0, self.period)
            if len(gap):  # the live run caught up to now (as a historian backfill): a state that is current
                frame = pd.DataFrame({"run_id": last["run_id"], "timestamp": gap,
                                      **{t: float(last[t]) + 1e-3 * self.rng.standard_normal(len(gap))
                                         for t in self.tags}})
                caught_up.append((binding_id, frame, self.tags))
                self.last[binding_id] = frame.iloc[-1].to_dict()
        if caught_up:
            ledger.append_samples_many(caught_up, "simulation")
            print(f"historian: {len(caught_up)} live runs caught up to now "
                  f"({sum(len(f) for _, f, _ in caught_up)} samples)", flush=True)
        self.arrivals: dict[tuple[str, float], float] = {}  # (binding, sample time) -> wall time of the rename

    def too_far_ahead(self, more_s: float) -> str | None:
        """Whether the samples, `more_s` further ahead of the clock, would come near the ingestion's bound
        (AHEAD_MAX_S): why, else None."""
        ahead = max(float(row["timestamp"]) for row in self.last.values()) - time.time()
        if ahead + more_s > AHEAD_MAX_S:
            return (f"the samples run {ahead:.0f} s ahead of the clock, another round would take them past "
                    f"{AHEAD_MAX_S:.0f} s (ingestion refuses 300 s)")
        return None

    def drop(self, binding_id: str) -> None:
        row = dict(self.last[binding_id])
        row["timestamp"] = float(row["timestamp"]) + self.period
        for tag in self.tags:
            row[tag] = float(row[tag]) + 1e-3 * self.rng.standard_normal()
        self.last[binding_id] = row
        folder = self.home_of[binding_id] / "inbox" / binding_id
        folder.mkdir(parents=True, exist_ok=True)
        name = f"s{row['timestamp']:.0f}.csv"
        header = "run_id,timestamp," + ",".join(self.tags)
        line = f"{row['run_id']},{row['timestamp']}," + ",".join(repr(float(row[t])) for t in self.tags)
        (folder / (name + ".part")).write_text(header + "\n" + line + "\n")
        os.rename(folder / (name + ".part"), folder / name)
        self.arrivals[(binding_id, row["timestamp"])] = time.time()


def _stagger(historian: Historian, ids: list[str], arrival_s: float, start: float, end: float,
             stop: threading.Event | None = None) -> None:
    """Staggered arrivals from `start` until `end` (or `stop`): binding i of n at start + i * arrival_s / n, then
    every arrival_s."""
    stop = stop or threading.Event()
    n, k = len(ids), 0
    while True:
        m, i = divmod(k, n)
        due = start + m * arrival_s + i * arrival_s / n
        if due >= end or stop.wait(max(0.0, due - time.time())):
            return
        historian.drop(ids[i])
        k += 1


def _publications(home: Path):
    return _ledger(home).query("SELECT binding_id, live_t, published_at FROM live_publications")


def _ledger_bytes(home: Path, ledger_url: str | None) -> int:
    if not ledger_url:  # the blocks in use and the WAL (the file keeps freed blocks: its size lags)
        size = _ledger(home).query("CALL pragma_database_size()")
        return int(size["used_blocks"][0] * size["block_size"][0]) + _bytes(size["wal_size"][0])
    return int(_ledger(home).query("SELECT pg_database_size(current_database()) AS n")["n"][0])


def _bytes(text: str) -> int:
    """DuckDB's size text ("1.2 MiB") in bytes."""
    value, unit = str(text).split()
    return int(float(value) * {"bytes": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[unit])


def _start_live(home: Path, served: list[str] | None = None) -> subprocess.Popen:
    """`optimizer-pipeline live` for `home` (its own process group; `served`: only those bindings, --binding),
    once it serves."""
    only = [arg for binding_id in served or () for arg in ("--binding", binding_id)]
    proc = subprocess.Popen([*CLI, "--home", str(home), "live", *only], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    ready = proc.stdout.readline()
    if not ready.startswith("live service"):
        _stop_live(proc)
        raise SystemExit(f"live did not start: {ready!r}")
    print(ready.strip(), flush=True)
    return proc


def _stop_live(proc: subprocess.Popen) -> None:
    """A clean stop (SIGTERM: the service publishes what is in flight and gives its leases up)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def _run_live(home: Path, ids: list[str], historian: Historian, arrival_s: float, minutes: float,
              ledger_url: str | None, others: Others | None = None, repeat: int = 0) -> dict:
    since = pd.Timestamp.now("UTC").tz_localize(None)  # published_at is naive UTC
    proc = _start_live(home, ids)
    try:
        deadline = time.time() + 600
        while _publications(home).query("published_at > @since")["binding_id"].nunique() < len(ids) and \
                time.time() < deadline:
            time.sleep(1.0)  # every binding solved once from its caught-up state (not timed)
        time.sleep(2.0)
        before = len(_publications(home))
        bytes_before, cpu_before = _ledger_bytes(home, ledger_url), _cpu_s(proc.pid)
        start = time.time()
        _stagger(historian, ids, arrival_s, start, start + minutes * 60)
        time.sleep(arrival_s)  # the last ones solved
        stagger_s = time.time() - start
        cpu_stagger = _cpu_s(proc.pid) - cpu_before
        published = _publications(home)
        stagger_count = len(published) - before
        bytes_stagger = _ledger_bytes(home, ledger_url) - bytes_before
        staggered = dict(historian.arrivals)

        busy = None
        drift = historian.period / arrival_s - 1  # sample time gained on the clock per second of arrivals
        if others is not None:  # the staggered arrivals go on while the other processes run (module docstring)
            stop, start = threading.Event(), time.time()
            dropper = threading.Thread(target=_stagger, args=(historian, ids, arrival_s, start, math.inf, stop))
            dropper.start()
            try:
                time.sleep(arrival_s)  # a period of arrivals before the first command
                others.run_phase("busy", repeat,
                                 lambda round_s: historian.too_far_ahead(round_s * drift + BURSTS_LEAD_S))
            finally:
                stop.set()
                dropper.join()
            time.sleep(arrival_s)  # the last ones solved
            span_s = time.time() - start
            busy = {"span_s": span_s, "per_min": (len(_publications(home)) - len(published)) / span_s * 60}

        n = len(ids)
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
        time.sleep(SETTLE_S)  # nothing arrives from here on: the idle service
        own_before, tree_before, t0 = _own_cpu_s(proc.pid), _cpu_s(proc.pid), time.time()
        time.sleep(IDLE_S)
        idle_s = time.time() - t0
        idle = ((_own_cpu_s(proc.pid) - own_before) / idle_s, (_cpu_s(proc.pid) - tree_before) / idle_s)
        rss = _rss_mib(proc.pid)
    finally:
        _stop_live(proc)
    published = _publications(home)
    latencies, solved = [], set()
    for row in published.itertuples():
        solved.add((row.binding_id, float(row.live_t)))
    for (binding_id, t), arrived in staggered.items():
        match = published[(published["binding_id"] == binding_id) & (abs(published["live_t"] - t) < 1e-3)]
        if len(match):
            latencies.append(_epoch(match["published_at"].iloc[0]) - arrived)
    missed = sum(1 for key in staggered if not any(abs(key[1] - t) < 1e-3 for b, t in solved if b == key[0]))
    return {"offered_per_min": n * 60 / arrival_s, "stagger_s": stagger_s, "published": stagger_count,
            "per_min": stagger_count / stagger_s * 60, "p50_ms": float(np.percentile(latencies, 50)) * 1000,
            "p99_ms": float(np.percentile(latencies, 99)) * 1000, "missed": missed, "arrivals": len(staggered),
            "cpu_ms": cpu_stagger / max(stagger_count, 1) * 1000, "rss_mib": rss,
            "bytes_per_publication": bytes_stagger / max(stagger_count, 1), "bursts": bursts, "busy": busy,
            "idle_cores": idle}


def _split(ledger, ids: list[str], services: int) -> dict[str, str] | None:
    """The leases of `ids` ({binding: service}) once every one has one and `services` services share the leases
    evenly (the other bindings of --others, which get no samples, count in the shares)."""
    leases = ledger.live_leases()
    held = pd.Series(list(leases.values())).value_counts()
    even = len(held) == services and held.max() <= -(-len(leases) // services)
    return {b: leases[b] for b in ids} if set(ids) <= set(leases) and even else None


def _taken_over(ledger, historian: Historian, lost: list[str], survivors: list[str], killed_at: float) -> float | None:
    """Seconds from the SIGKILL until every binding in `lost` had a publication by a survivor from a sample
    dropped after it (None: not yet)."""
    first: dict[str, float] = {}  # binding -> its first sample dropped after the kill
    for (binding_id, t), arrived in dict(historian.arrivals).items():
        if binding_id in lost and arrived >= killed_at:
            first[binding_id] = min(first.get(binding_id, t), t)
    marks = ", ".join("?" for _ in survivors)
    published = ledger.query(f"SELECT binding_id, live_t, published_at FROM live_publications WHERE service_id IN "
                             f"({marks}) AND published_at > ?", [*survivors, _naive_utc(killed_at)])
    taken = []
    for binding_id in lost:
        after = first.get(binding_id, np.inf) - 1e-3
        mine = published[(published["binding_id"] == binding_id) & (published["live_t"] > after)]
        if mine.empty:
            return None
        taken.append(_epoch(mine["published_at"].min()) - killed_at)
    return max(taken)


def _run_hosts(homes: list[Path], ids: list[str], historian: Historian, arrival_s: float, minutes: float,
               postgres_pid: int) -> dict:
    """A live service per home on one PostgreSQL ledger: a staggered phase (re-solves / min, CPU per re-solve of
    each service's process tree, of them all and of the PostgreSQL server), then the take-over of the first
    service's bindings after its SIGKILL."""
    from optimizer_pipeline.live.service import HEARTBEAT_S

    ledger = _ledger(homes[0])
    procs: list[subprocess.Popen] = []
    try:
        for home in homes:
            procs.append(_start_live(home))
        deadline, leases = time.time() + 120, None
        while True:  # the split, stable over a heartbeat
            split = _split(ledger, ids, len(homes))
            if split is not None and split == leases:
                break
            if time.time() > deadline:
                raise SystemExit(f"hosts: the bindings did not split between the {len(homes)} live services")
            leases = split
            time.sleep(HEARTBEAT_S + 1)
        by_pid = {s.pid: s.id for s in ledger.live_services() if s.state == "serving"}
        services = [by_pid[proc.pid] for proc in procs]
        historian.home_of.update({b: homes[services.index(owner)] for b, owner in leases.items()})
        print(f"hosts: {', '.join(f'{s} serves {list(leases.values()).count(s)}' for s in services)}", flush=True)

        count = "SELECT service_id, count(*) AS n FROM live_publications GROUP BY service_id"
        before = ledger.query(count).set_index("service_id")["n"]
        cpu_before, pg_before = [_cpu_s(proc.pid) for proc in procs], _cpu_s(postgres_pid)
        start = time.time()
        _stagger(historian, ids, arrival_s, start, start + minutes * 60)
        time.sleep(arrival_s)  # the last ones solved
        span_s = time.time() - start
        cpu = [_cpu_s(proc.pid) - c for proc, c in zip(procs, cpu_before)]
        pg_cpu = _cpu_s(postgres_pid) - pg_before
        after = ledger.query(count).set_index("service_id")["n"]
        published = [int(after.get(s, 0) - before.get(s, 0)) for s in services]

        lost = sorted(b for b, owner in leases.items() if owner == services[0])
        os.killpg(procs[0].pid, signal.SIGKILL)
        killed_at = time.time()
        procs[0].wait()
        historian.home_of.update(dict.fromkeys(lost, homes[1]))
        stop = threading.Event()
        dropper = threading.Thread(target=_stagger, args=(historian, ids, arrival_s, killed_at,
                                                          killed_at + TAKEOVER_MAX_S, stop))
        dropper.start()
        try:
            takeover_s = None
            while takeover_s is None and time.time() < killed_at + TAKEOVER_MAX_S:
                time.sleep(0.5)
                takeover_s = _taken_over(ledger, historian, lost, services[1:], killed_at)
        finally:
            stop.set()
            dropper.join()
    finally:
        for proc in procs:
            _stop_live(proc)
    return {"span_s": span_s, "published": published, "cpu_s": cpu, "pg_cpu_s": pg_cpu, "lost": len(lost),
            "takeover_s": takeover_s}


def _active_runs(instance) -> int:
    from dagster import DagsterRunStatus, RunsFilter

    return instance.get_runs_count(RunsFilter(statuses=[
        DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING]))


def _ticked(instance, after: float) -> bool:
    """Whether the sensors that re-solve new samples (history_inbox, new_samples) have ticked since `after`."""
    states = [s for s in instance.all_instigator_state() if s.instigator_name in ("history_inbox", "new_samples")]
    return len(states) == 2 and all(instance.get_ticks(s.instigator_origin_id, s.selector_id, after=after, limit=1)
                                    for s in states)


def _resolved(ledger, since: datetime) -> pd.DataFrame:
    """The recommendations whose run finished after `since`: binding, finished_at."""
    return ledger.query("SELECT c.binding_id, r.finished_at FROM optimizer_recommendations c JOIN optimizer_runs r "
                        "ON r.id = c.run_id WHERE r.finished_at > ?", [since])


def _run_processes(pid: int) -> list[int]:
    """The processes below `pid` that run a Dagster run or its steps (the code server starts a run, the run its
    steps, as multiprocessing's spawned children), or ended unreaped (zombies: not yet in cutime / cstime)."""
    from servers import descendants

    found = []
    for p in descendants(pid):
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            spawned = b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if state == "Z" or spawned:
            found.append(p)
    return found


def _stop_tree(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to `proc`'s process group, up to `grace_s` for it to end, then SIGKILL to the group and to any
    process below it left (`optimizer-pipeline daemon` runs dagster-daemon in a process group of its own)."""
    from servers import alive, descendants

    from optimizer_pipeline.supervise import stop_group

    below = descendants(proc.pid)
    stop_group(proc, grace_s)
    for pid in below:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _run_anchor(home: Path, ids: list[str], historian: Historian) -> dict:
    """The daemon path (module docstring): `optimizer-pipeline daemon`, no live service; the bindings `ids` each
    get one new sample at once."""
    from dagster import DagsterInstance, RunsFilter, build_sensor_context

    from optimizer_pipeline.automation import re_solve_requests
    from optimizer_pipeline.inbox import waiting_files
    from optimizer_pipeline.live.service import LEASE_S
    from optimizer_pipeline.settings import dagster_home

    ledger = _ledger(home)
    deadline = time.time() + LEASE_S + 10
    while ledger.live_leases():  # a clean stop gives them up; a killed service's expire
        if time.time() > deadline:
            raise SystemExit(f"anchor: live leases still held: {ledger.live_leases()}")
        time.sleep(1.0)
    started = time.time()
    proc = subprocess.Popen([*CLI, "--home", str(home), "daemon"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with DagsterInstance.from_config(str(dagster_home(home))) as instance:
            deadline = started + SETTLE_MAX_S
            while not _ticked(instance, started) or _active_runs(instance) or _run_processes(proc.pid) or \
                    waiting_files(home) or re_solve_requests(build_sensor_context(instance=instance), ledger):
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit("anchor: the daemon ended" if proc.poll() is not None else
                                     f"anchor: the sensors' own runs did not end within {SETTLE_MAX_S:.0f} s")
                time.sleep(5.0)
            settled = instance.get_runs_count(RunsFilter(created_after=datetime.fromtimestamp(started, timezone.utc)))
            print(f"anchor: the daemon's sensors launched {settled} run(s) on their own before the drop "
                  f"({time.time() - started:.0f} s; not timed)", flush=True)
            idle_before = _cpu_s(proc.pid)
            time.sleep(IDLE_S)
            cpu_before, dropped = _cpu_s(proc.pid), time.time()
            idle_rate = (cpu_before - idle_before) / IDLE_S
            for binding_id in ids:
                historian.drop(binding_id)
            since = _naive_utc(dropped)
            done = _resolved(ledger, since)
            # re-solved, the runs ended and their processes reaped (their CPU in cutime / cstime)
            while not set(ids) <= set(done["binding_id"]) or _active_runs(instance) or _run_processes(proc.pid):
                if proc.poll() is not None or time.time() > dropped + ANCHOR_MAX_S:
                    raise SystemExit(f"anchor: {len(set(ids) & set(done['binding_id']))} of {len(ids)} re-solved "
                                     f"after {time.time() - dropped:.0f} s")
                time.sleep(0.5)
                done = _resolved(ledger, since)
            cpu, window_s = _cpu_s(proc.pid) - cpu_before, time.time() - dropped
            runs = instance.get_runs_count(RunsFilter(created_after=datetime.fromtimestamp(dropped, timezone.utc)))
    finally:
        _stop_tree(proc)
    first = done.groupby("binding_id")["finished_at"].min()
    latency = [_epoch(first[b]) - dropped for b in ids]
    return {"bindings": len(ids), "all_s": max(latency), "p50_s": float(np.percentile(latency, 50)),
            "resolves": len(done), "runs": runs, "cpu_s": cpu / max(len(done), 1), "idle_rate": idle_rate,
            "window_s": window_s}


def _print_hosts(h: dict, args: argparse.Namespace) -> None:
    from optimizer_pipeline.live.service import LEASE_S

    total = max(sum(h["published"]), 1)
    cpu_s, pg_s = sum(h["cpu_s"]) / total, h["pg_cpu_s"] / total
    hosts = ", ".join(f"host {k + 1} {c / max(n, 1) * 1000:.1f} ms ({n} re-solves)"
                      for k, (c, n) in enumerate(zip(h["cpu_s"], h["published"])))
    print(f"\n{args.hosts} live services (a home each) on one PostgreSQL ledger, {args.minutes:g} min staggered")
    print(f"  sustained re-solves/min : {sum(h['published']) / h['span_s'] * 60:.0f}   "
          f"(offered {args.bindings * 60 / args.arrival_s:.0f})")
    print(f"  CPU per re-solve        : {hosts}; all {cpu_s * 1000:.1f} ms; the PostgreSQL server {pg_s * 1000:.1f} ms")
    print(f"  projected hosts for 1000 re-solves/min on 2 cores each: ceil(1000 x {cpu_s * 1000:.1f} ms / 60 s / "
          f"(2 cores x 0.5)) = {math.ceil(1000 * cpu_s / 60 / (2 * 0.5))}   (assumed: at most half of a host's cores "
          f"busy, the rest for bursts; the PostgreSQL server apart: {1000 * pg_s / 60:.2f} cores)")
    taken = f"not within {TAKEOVER_MAX_S:.0f} s" if h["takeover_s"] is None else f"{h['takeover_s']:.1f} s"
    print(f"  take-over after SIGKILL : {taken} for the {h['lost']} bindings of the killed service   "
          f"(lease expiry LEASE_S = {LEASE_S:g} s)")


def _print_anchor(a: dict, r: dict) -> None:
    per_min = a["bindings"] / a["all_s"] * 60
    cpu_bound = 2 * 60 / a["cpu_s"]  # the re-solves/min 2 cores give at the anchor's CPU per re-solve
    print(f"\nanchor (daemon, one Dagster run per re-solve): {a['bindings']} re-solved in {a['all_s']:.1f} s, "
          f"p50 {a['p50_s']:.1f} s, {a['cpu_s']:.1f} CPU-s per re-solve, {per_min:.1f} re-solves/min on 2 cores")
    print(f"  Dagster runs            : {a['runs']} for {a['resolves']} re-solves; the idle daemon (sensor ticks) "
          f"spends {a['idle_rate']:.2f} CPU-s/s, {a['idle_rate'] * a['window_s'] / max(a['resolves'], 1):.1f} of "
          f"the CPU-s per re-solve here ({a['window_s']:.0f} s from the drop until the runs ended)")
    print(f"  issue 34's anchor       : {ISSUE_ANCHOR} on 2 cores")
    print(f"  live / anchor           : re-solves/min {r['per_min'] / cpu_bound:.0f}x (live {r['per_min']:.0f} vs "
          f"2 cores / {a['cpu_s']:.1f} CPU-s = {cpu_bound:.1f}); CPU per re-solve "
          f"1/{a['cpu_s'] * 1000 / r['cpu_ms']:.0f} ({r['cpu_ms']:.1f} ms vs {a['cpu_s'] * 1000:.0f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--arrival-s", type=float, default=6.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--ledger", choices=("duckdb", "postgres"), default="duckdb")
    parser.add_argument("--hosts", type=int, default=1, metavar="N",
                        help="N >= 2: also N live services on one PostgreSQL ledger")
    parser.add_argument("--anchor-bindings", type=int, default=0, metavar="K",
                        help="K >= 1: also the daemon path, K bindings re-solved by Dagster runs")
    parser.add_argument("--others", action=argparse.BooleanOptionalAction, default=True,
                        help="the other processes' commands on the idle home and beside the busy service (default on)")
    parser.add_argument("--repeat", type=int, default=3, metavar="R", help="--others: rounds of the commands, each")
    parser.add_argument("--home", type=Path, help="keep the prepared home here and reuse it")
    parser.add_argument("--setup-only", action="store_true", help="prepare --home and stop")
    args = parser.parse_args()
    if args.hosts > 1 and args.ledger != "postgres":
        parser.error("--hosts needs --ledger postgres (the hosts share its ledger)")
    if not 0 <= args.anchor_bindings <= args.bindings:
        parser.error("--anchor-bindings must be between 0 and --bindings")

    from contextlib import ExitStack

    hosts = anchor = None
    with ExitStack() as stack:
        url = server = None
        if args.ledger == "postgres":
            from servers import postgres_server

            server = stack.enter_context(postgres_server())
            url = server.new_database()
        home = args.home or Path(tempfile.mkdtemp(prefix="bench-live-"))
        home.mkdir(parents=True, exist_ok=True)
        os.environ["OPTIMIZER_HOME"] = str(home)
        os.environ.pop("DAGSTER_HOME", None)
        ids = _setup(home, args.bindings, url, (OTHER,) if args.others else ())
        if args.setup_only:
            return
        shutil.rmtree(home / "inbox", ignore_errors=True)
        others = None
        if args.others:  # the idle home: nothing running
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-live-others-")))
            others = Others(home, ids[0], OTHER, folder)
            others.run_phase("idle", args.repeat)
        historian = Historian(home, ids)
        r = _run_live(home, ids, historian, args.arrival_s, args.minutes, url, others, args.repeat)
        if args.hosts > 1:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-live-hosts-")))
            homes = [home] + [root / f"host-{k + 1}" for k in range(1, args.hosts)]
            for other in homes[1:]:
                other.mkdir()
                (other / "settings.yaml").write_text(f"ledger:\n  url: {url}\n")
            postgres_pid = int((server.data / "postmaster.pid").read_text().split()[0])
            hosts = _run_hosts(homes, ids, historian, args.arrival_s, args.minutes, postgres_pid)
            historian.home_of = dict.fromkeys(ids, home)
        if args.anchor_bindings:
            anchor = _run_anchor(home, ids[:args.anchor_bindings], historian)

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
    own, tree = r["idle_cores"]
    missed = "".join(f"  MISSED ({name})" for name, cores in (("its process", own), ("its tree", tree)) if cores > 0.02)
    print(f"  idle service            : {own:.4f} of a core (its process; {tree:.4f} with its process tree), over "
          f"{IDLE_S:g} s with nothing arriving, {SETTLE_S:g} s after the last burst   (target <= 0.02){missed}")
    if others:
        busy = r["busy"]
        print_others(others, args.ledger == "duckdb",
                     f"{r['offered_per_min']:.0f} offered re-solves/min, {busy['per_min']:.0f}/min published over "
                     f"those {busy['span_s']:.0f} s")
    if hosts:
        _print_hosts(hosts, args)
    if anchor:
        _print_anchor(anchor, r)


if __name__ == "__main__":
    main()
