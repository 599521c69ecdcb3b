"""Render time and PNG size of every UI figure on the three demo plants (in-process pipeline, no Dagster).

Run: .venv/bin/python bench/bench_plots.py   (prints one line per figure; median of 5 renders after a warm-up)
"""

import statistics
import tempfile
import time
from pathlib import Path

from optimizer_pipeline import pipeline, plots
from optimizer_pipeline.contracts import utc_now
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.model import identify
from optimizer_pipeline.plants import demo_plants
from optimizer_pipeline.settings import ledger_path, load_settings
from optimizer_pipeline.solver.solve import SolverCache, solve_problem

REPEATS = 5


def figures(home: Path):
    ledger, settings, cache = Ledger(ledger_path(home)), load_settings(home), SolverCache()
    for plant in demo_plants():
        spec = plant.spec
        ledger.ingest(spec, plant.history(1).frame, "simulation")
        stored = ledger.get_binding(spec.id)
        split = prepare_history(ledger.history_frame(spec.id, spec.tags), spec, seed=pipeline.SPLIT_SEED)
        artifact = identify(split, spec, stored.revision)
        ledger.put_artifact(artifact)
        scores = pipeline.score_blocks(spec, artifact, split)
        calibration = pipeline.calibrate(ledger, artifact, scores, settings, utc_now())
        ev = calibration.evidence
        rec = pipeline.recommend(stored, artifact, split, calibration, lambda p: solve_problem(p, cache), ledger,
                                 settings, "simulation", utc_now()).recommendation
        series = plots.plan_series(spec, split.live, rec, plots.HISTORY_HORIZONS * artifact.horizon)
        fit = plots.model_fit_series(artifact, split.test[0])
        yield spec.id, "recommendation", lambda: plots.recommendation_figure(series)
        yield spec.id, "uq_calibration", lambda: plots.calibration_figure(
            ev.cv_tags, scores.val.scores, scores.test.scores, ev.qhat, ev.coverage_per_cv, ev.coverage_threshold, "t")
        yield spec.id, "model_artifact", lambda: plots.model_fit_figure(fit, "t")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'binding':<10} {'figure':<16} {'median ms':>9} {'max ms':>7} {'PNG kB':>7}")
        for binding_id, name, render in figures(Path(tmp)):
            png = render()  # warm-up (fonts, caches)
            times = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                render()
                times.append(1000 * (time.perf_counter() - started))
            print(f"{binding_id:<10} {name:<16} {statistics.median(times):>9.0f} {max(times):>7.0f} "
                  f"{len(png) / 1024:>7.1f}")


if __name__ == "__main__":
    main()
