"""Benchmark: `refresh` of many small bindings, the way the CLI runs it, and where the time goes.

Usage: .venv/bin/python bench/bench_pipeline.py [--bindings 100] [--plant tanks] [--per-run N] [--baseline REF]
Target (issue 5 / 8): <= 60 s for 100 bindings; issue 39: Dagster's share <= 20 % of the domain time.
The refresh is `automation.run_partitions` (what `optimizer-pipeline materialize --all` and `demo`
call): one in-process Dagster run over the whole partition range on the home's instance. The split
is measured inside that run: the time in `assets.bindings.run_binding` (the binding's stages: domain
work, ledger writes, figures queued) is the domain time, the time the step waits for figures drawn
in background processes is counted apart, and the rest of the run's wall time is Dagster's (run
and step events, one materialization per stage and binding, the check evaluations, the planned
events). The domain steps are also timed one by one on one binding (median of 5).
`--baseline REF` runs the same measurement first on the code of git commit REF (installed without
dependencies into a scratch folder), so both lines come from one run on one machine.
`--per-run N` also times N bindings the old way, one run per binding, for the per-run overhead.
"""

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("BENCH_BASELINE"):  # a baseline run imports the package of its own PYTHONPATH
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from baseline import installed  # noqa: E402


def med(values):
    return sorted(values)[len(values) // 2]


def measure(bindings: int, plant_name: str, per_run: int, profile: int = 0) -> dict:
    home = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    os.environ.pop("DAGSTER_HOME", None)  # run_partitions uses <home>/dagster, as the CLI does

    import optimizer_pipeline.assets.batch as batch
    import optimizer_pipeline.assets.bindings as stages
    from optimizer_pipeline import pipeline
    from optimizer_pipeline.automation import run_partitions
    from optimizer_pipeline.contracts import SolveResult, binding_from_dict, utc_now
    from optimizer_pipeline.ledger import Ledger
    from optimizer_pipeline.plants import get_plant
    from optimizer_pipeline.settings import ledger_path, load_settings
    from optimizer_pipeline.solver.pool import SolverPool
    from optimizer_pipeline.solver.shared import kept_alive

    plant = get_plant(plant_name)
    frame = plant.history(1).frame
    ledger = Ledger(ledger_path(home))
    ids = [f"{plant_name}-{i:03d}" for i in range(bindings)]
    t0 = time.perf_counter()
    for binding_id in ids:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
    ingest_s = time.perf_counter() - t0

    # the step calls both by their module-level names: run_binding (a binding's stages) and shown (the
    # materialization metadata as Dagster gets it, which waits for the figures drawn in the background)
    in_stages, in_figures = [], []
    run_binding, shown = stages.run_binding, batch.shown
    stages.run_binding, batch.shown = _timed(run_binding, in_stages), _timed(shown, in_figures)
    profiler = cProfile.Profile() if profile else None
    t_all = time.perf_counter()
    try:
        if profiler:
            profiler.enable()
        results = run_partitions(home, ids)
    finally:
        if profiler:
            profiler.disable()
        stages.run_binding, batch.shown = run_binding, shown
    total = time.perf_counter() - t_all
    costs = _domain_costs(profiler, bindings, profile) if profiler else []
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    run_ids = {r.dagster_run_id for r in results}
    # the baseline's records hold the status as text, later ones as an enum of text
    statuses = [str(getattr(rec.status, "value", rec.status)) for rec in map(ledger.latest_recommendation, ids)]
    events = _events(home, run_ids)

    per_run_s = []
    if per_run:
        extra = [f"{plant_name}-single-{i:03d}" for i in range(per_run)]
        for binding_id in extra:
            ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
        with kept_alive():
            run_partitions(home, extra[:1])  # the pool start, not timed
            for binding_id in extra[1:]:
                t = time.perf_counter()
                assert run_partitions(home, [binding_id])[0].ok
                per_run_s.append(time.perf_counter() - t)

    # Domain steps one by one on the same data, in the same process (one binding, repeated).
    settings = load_settings(home)
    stored = ledger.get_binding(ids[0])
    steps = {"history prep": [], "identification": [], "scores + calibration": [],
             "compile + solve + verify + ledger": []}
    with SolverPool(size=settings.solver_pool_size, request_timeout_ms=settings.solver_request_timeout_ms) as pool:
        for _ in range(5):
            t = time.perf_counter()
            split = pipeline.prepare_split(ledger, stored)
            t1 = time.perf_counter()
            artifact = pipeline.identify_model(ledger, stored, split)
            t2 = time.perf_counter()
            scores = pipeline.score_and_store(ledger, stored.spec, artifact, split)
            calibration = pipeline.calibrate(ledger, artifact, scores, settings, utc_now())
            t3 = time.perf_counter()
            pipeline.recommend(stored, artifact, split, calibration, lambda p: SolveResult.from_dict(pool.solve(p)),
                               ledger, settings, "simulation", utc_now())
            t4 = time.perf_counter()
            for name, value in zip(steps, (t1 - t, t2 - t1, t3 - t2, t4 - t3)):
                steps[name].append(value)
    domain, figures = sum(in_stages), sum(in_figures)
    return {"bindings": bindings, "plant": plant_name, "runs": len(run_ids), "ingest_s": ingest_s, "total_s": total,
            "domain_s": domain, "figures_s": figures, "dagster_s": total - domain - figures, "events": events,
            "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
            "per_run_s": per_run_s, "steps_ms": {name: med(values) * 1000 for name, values in steps.items()},
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "costs": costs,
            "load": open("/proc/loadavg").read().split()[0]}


def _domain_costs(profiler: cProfile.Profile, bindings: int, top: int) -> list[tuple[str, float, float]]:
    """The `top` functions of the product (optimizer_pipeline/, assets/, resources/) by cumulative time
    in the refresh: (function, cumulative ms per binding, own ms per binding)."""
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, callers)}
    rows = [(f"{Path(file).relative_to(ROOT)}:{name}", cumulative, own)
            for (file, _, name), (_, _, own, cumulative, _) in stats.items()
            if file.startswith(str(ROOT)) and not file.startswith((str(ROOT / "bench"), str(ROOT / ".venv")))
            and name != "timed"]
    rows.sort(key=lambda row: -row[1])
    return [(name, cumulative * 1000 / bindings, own * 1000 / bindings) for name, cumulative, own in rows[:top]]


def _timed(function, spent: list[float]):
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)
    return timed


def _events(home: Path, run_ids: set[str]) -> dict[str, int]:
    """The refresh's events in the instance's event log, by type."""
    from dagster import DagsterInstance

    counts: dict[str, int] = {}
    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        for run_id in run_ids:
            for entry in instance.all_logs(run_id):
                kind = entry.dagster_event.event_type_value if entry.dagster_event else "log message"
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def baseline(ref: str, args: argparse.Namespace) -> dict:
    """The same measurement on the code of commit `ref` (bench/baseline.py), in a process of its own."""
    with installed(ref) as site:
        env = {**os.environ, "BENCH_BASELINE": ref, "PYTHONPATH": str(site)}
        proc = subprocess.run([sys.executable, __file__, "--json", "--bindings", str(args.bindings), "--plant",
                               args.plant, "--per-run", str(args.per_run)], env=env, capture_output=True, text=True,
                              check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(label: str, m: dict) -> None:
    n = m["bindings"]
    print(f"{label}: refresh of {n} '{m['plant']}' bindings, automation.run_partitions: {m['runs']} Dagster run(s) "
          f"on the home's instance (load average {m['load']})")
    print(f"  ingest of {n} bindings: {m['ingest_s']:.2f} s")
    print(f"  total wall: {m['total_s']:.1f} s  (target 60 s for 100 -> ratio {m['total_s'] / 60 * 100 / n:.2f} "
          f"scaled to 100), including the pool start")
    print(f"  per binding: {m['total_s'] / n:.3f} s: in the binding's stages {m['domain_s'] / n:.3f} s, waiting "
          f"for figures {m['figures_s'] / n:.3f} s, Dagster {m['dagster_s'] / n:.3f} s = "
          f"{m['dagster_s'] / m['domain_s'] * 100:.0f} % of the stages' time (target <= 20 %)")
    events = m["events"]
    print(f"  events in the run(s): {sum(events.values())} = {sum(events.values()) / n:.1f} per binding: "
          + ", ".join(f"{k} {v}" for k, v in sorted(events.items(), key=lambda kv: -kv[1])))
    if m["per_run_s"]:
        values = m["per_run_s"]
        print(f"  one run per binding ({len(values)} runs, pool kept alive): median {med(values):.3f} s, "
              f"min {min(values):.3f} s, max {max(values):.3f} s")
    print(f"  statuses: {m['statuses']}")
    print("  domain steps of one binding (median of 5, in process, no Dagster):")
    for name, ms in m["steps_ms"].items():
        print(f"    {name:<34} {ms:8.1f} ms")
    if m.get("costs"):
        print("  where the refresh's time goes in the product's own functions (cProfile, ms per binding, "
              "cumulative / own):")
        for name, cumulative, own in m["costs"]:
            print(f"    {cumulative:8.1f} {own:8.1f}  {name}")
    print(f"  peak RSS of this process: {m['peak_rss_mib']:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--plant", default="tanks")
    parser.add_argument("--per-run", type=int, default=0,
                        help="also refresh this many more bindings with one Dagster run each (the per-run cost)")
    parser.add_argument("--baseline", metavar="REF", help="measure the code of this git commit first, same run")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also list the product's N most expensive functions in the refresh (cProfile)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a baseline run's output
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.bindings, args.plant, args.per_run)))
        return
    if args.baseline:
        report(f"baseline {args.baseline}", baseline(args.baseline, args))
    report("this tree", measure(args.bindings, args.plant, args.per_run, args.profile))


if __name__ == "__main__":
    main()
