"""Benchmark: `refresh` of many small bindings, the way the CLI runs it, and where the time goes.

Usage: .venv/bin/python bench/bench_pipeline.py [--bindings 100] [--plant tanks] [--per-run N]
Target (issue 5 / 8): <= 60 s for 100 bindings. The refresh is `automation.run_partitions` (what
`optimizer-pipeline materialize --all` and `demo` call): one in-process Dagster run over the whole
partition range on the home's instance. `--per-run N` also times N bindings the old way, one run
per binding, for the per-run overhead. The split is measured by timing the domain steps (history
preparation, identification, scoring + calibration, compile + solve + verify + ledger) separately in
the same process with the same data; Dagster overhead = wall time per binding - domain time.
"""

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=100)
    parser.add_argument("--plant", default="tanks")
    parser.add_argument("--per-run", type=int, default=0,
                        help="also refresh this many more bindings with one Dagster run each (the per-run cost)")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    os.environ.pop("DAGSTER_HOME", None)  # run_partitions uses <home>/dagster, as the CLI does

    from optimizer_pipeline import pipeline
    from optimizer_pipeline.contracts import SolveResult, binding_from_dict, utc_now
    from optimizer_pipeline.automation import run_partitions
    from optimizer_pipeline.ledger import Ledger
    from optimizer_pipeline.plants import get_plant
    from optimizer_pipeline.settings import ledger_path, load_settings
    from optimizer_pipeline.solver.pool import SolverPool
    from optimizer_pipeline.solver.shared import kept_alive

    plant = get_plant(args.plant)
    frame = plant.history(1).frame
    ledger = Ledger(ledger_path(home))
    ids = [f"{args.plant}-{i:03d}" for i in range(args.bindings)]
    t0 = time.perf_counter()
    for binding_id in ids:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
    ingest_s = time.perf_counter() - t0

    t_all = time.perf_counter()
    results = run_partitions(home, ids)
    total = time.perf_counter() - t_all
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    runs = len({r.dagster_run_id for r in results})
    statuses = [ledger.latest_recommendation(b).status for b in ids]

    per_run = []
    if args.per_run:
        extra = [f"{args.plant}-single-{i:03d}" for i in range(args.per_run)]
        for binding_id in extra:
            ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
        with kept_alive():
            run_partitions(home, extra[:1])  # the pool start, not timed
            for binding_id in extra[1:]:
                t = time.perf_counter()
                assert run_partitions(home, [binding_id])[0].ok
                per_run.append(time.perf_counter() - t)

    # Domain split on the same data, in the same process (one binding, repeated).
    settings = load_settings(home)
    stored = ledger.get_binding(ids[0])
    split_t, ident_t, cal_t, solve_t = [], [], [], []
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
            split_t.append(t1 - t)
            ident_t.append(t2 - t1)
            cal_t.append(t3 - t2)
            solve_t.append(t4 - t3)

    def med(values):
        return sorted(values)[len(values) // 2]

    domain = med(split_t) + med(ident_t) + med(cal_t) + med(solve_t)
    per = total / args.bindings
    print(f"refresh of {args.bindings} '{args.plant}' bindings, automation.run_partitions: {runs} Dagster run(s) "
          f"on the home's instance (load average {open('/proc/loadavg').read().split()[0]})")
    print(f"  ingest of {args.bindings} bindings: {ingest_s:.2f} s")
    print(f"  total wall: {total:.1f} s  (target 60 s for 100 -> ratio {total / 60 * 100 / args.bindings:.2f} "
          f"scaled to 100), including the pool start")
    print(f"  per binding: {per:.3f} s (total / bindings)")
    if per_run:
        print(f"  one run per binding ({len(per_run)} runs, pool kept alive): median {med(per_run):.3f} s, "
              f"min {min(per_run):.3f} s, max {max(per_run):.3f} s")
    print(f"  statuses: {dict((s, statuses.count(s)) for s in set(statuses))}")
    print("  split of one binding (median of 5, domain functions in process):")
    for name, values in (("history prep", split_t), ("identification", ident_t), ("scores + calibration", cal_t),
                         ("compile + solve + verify + ledger", solve_t)):
        print(f"    {name:<34} {med(values) * 1000:8.1f} ms")
    print(f"    {'Dagster overhead (wall - domain)':<34} {max(0.0, per - domain) * 1000:8.1f} ms")
    print(f"  peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
