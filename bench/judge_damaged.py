"""Judge the demo plants on history as plant historians record it (issue 38): each plant's clean history,
the same with sensor spikes (1 % of the historic CV samples replaced by glitches of +-20 noise sigmas) and
with a stuck transmitter (in 3 historic runs the first CV repeats one value for 80 samples), through the
product's path (bench/judge.py `run_product`: the plan applied to the true plant from the live state).
The live run is left clean: what a damaged newest sample does is the live window's rule, tested in
tests/test_flags.py.

Each damaged history is judged twice in the same run: "before", with cleaning's rule before issue 38 (the
7-sample Hampel filter on CVs and DVs, no stuck or range rule; `hampel_before` below, its code as it was)
and "after", with data/flags.py. Per plant and history the counts verified-good / verified-wrong /
good-unverified / bad and err/hold median / worst; per damage the samples injected and flagged.
Targets (issue 38): on the damaged history at most one plan in six fewer `verified` than on the clean
one, every plan <= 0.10 of holding's error, 0 verified-but-wrong.

Usage: .venv/bin/python bench/judge_damaged.py [--seeds 1 2 3 4 5 6] [--only tanks-1 ...] [--markdown FILE]
"""

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import OUTCOMES, SEEDS, outcome, run_product, variants  # noqa: E402

import optimizer_pipeline.data.clean as clean  # noqa: E402
from optimizer_pipeline.data.flags import SPIKE  # noqa: E402
from optimizer_pipeline.ledger import Ledger  # noqa: E402
from optimizer_pipeline.solver.solve import SolverCache  # noqa: E402

SPIKE_FRACTION, SPIKE_SIGMAS = 0.01, 20.0
STUCK_RUNS, STUCK_SAMPLES, STUCK_START = 3, 80, 50
HISTORIES = ("clean", "spikes", "stuck")


def spiked(plant, frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """1 % of the CV samples of every run but the live (last) one shifted by +-20 of the CV's noise sigma."""
    rng = np.random.default_rng(1000 + seed)
    frame = frame.copy()
    historic = frame.index[frame["run_id"] != frame["run_id"].iloc[-1]]
    for j, tag in enumerate(plant.spec.cv_tags):
        rows = rng.choice(historic, int(SPIKE_FRACTION * len(historic)), replace=False)
        frame.loc[rows, tag] += rng.choice([-1.0, 1.0], len(rows)) * SPIKE_SIGMAS * plant.cv_noise[j]
    return frame


def stuck(plant, frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """In STUCK_RUNS historic runs (chosen by seed) the first CV repeats its value for 80 samples."""
    rng = np.random.default_rng(2000 + seed)
    frame = frame.copy()
    runs = frame["run_id"].unique()[:-1]
    tag = plant.spec.cv_tags[0]
    for run in rng.choice(runs, STUCK_RUNS, replace=False):
        rows = frame.index[frame["run_id"] == run][STUCK_START:STUCK_START + STUCK_SAMPLES]
        frame.loc[rows, tag] = frame.loc[rows[0], tag]
    return frame


class Damaged:
    """`plant` whose history comes damaged by `damage(plant, frame, seed)`; the live state is the plant's."""

    def __init__(self, plant, damage):
        self._plant, self._damage = plant, damage

    def __getattr__(self, name):
        return getattr(self._plant, name)

    def history(self, seed: int):
        history = self._plant.history(seed)
        return replace(history, frame=self._damage(self._plant, history.frame, seed))


# --------------------------------------------------------------------------- cleaning before issue 38

HAMPEL_WINDOW, HAMPEL_N_SIGMA, MAD_TO_SIGMA, HAMPEL_RANGE_FLOOR = 7, 3.0, 1.4826, 1e-6


def hampel_before(t, values, rules, period, open_end=False) -> dict:
    """The flags cleaning made before issue 38 (data/clean.py `_hampel_outliers` at 6cc7270): a 7-sample
    Hampel filter on the CVs and DVs, sigma floored at the run's first-difference noise; in the newest run a
    flagged level holding to the end kept."""
    half = HAMPEL_WINDOW // 2
    padded = np.pad(values, ((half, half), (0, 0)), constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(padded, HAMPEL_WINDOW, axis=0)
    median = np.nanmedian(windows, axis=-1)
    mad = np.nanmedian(np.abs(windows - median[..., None]), axis=-1)
    noise = MAD_TO_SIGMA * np.nanmedian(np.abs(np.diff(values, axis=0)), axis=0) / np.sqrt(2.0)
    spread = np.nanmax(values, axis=0) - np.nanmin(values, axis=0)
    sigma = np.maximum(MAD_TO_SIGMA * mad, np.maximum(np.nan_to_num(noise), HAMPEL_RANGE_FLOOR * np.nan_to_num(spread)))
    outliers = np.abs(values - median) > HAMPEL_N_SIGMA * sigma
    if open_end:
        tail = max(len(values) - half, 0)
        for k, j in zip(*np.nonzero(outliers[tail:])):
            k += tail
            after = values[k + 1:, j]
            outliers[k, j] = not np.all(np.abs(after[~np.isnan(after)] - values[k, j])
                                        <= abs(values[k, j] - median[k, j]) / 2)
    outliers &= rules.measured
    return {SPIKE: outliers} if outliers.any() else {}


@contextmanager
def cleaning_before():
    """Cleaning as before issue 38 inside the block: the Hampel flags, no live-window flag rule."""
    saved = clean.flag_run, clean._newest_flagged
    clean.flag_run, clean._newest_flagged = hampel_before, (lambda *args: {})
    try:
        yield
    finally:
        clean.flag_run, clean._newest_flagged = saved


# --------------------------------------------------------------------------- the run


def judged(plant, seed: int, ledger: Ledger, cache: SolverCache) -> dict:
    """The plan the product makes from `plant`'s history of `seed`, judged; a failure is a bad plan."""
    try:
        product, _, split, _ = run_product(plant, seed, ledger, cache)
        product["flagged"] = split.report["cleaning"]["totals"]["flagged"]
    except Exception as error:  # reported as the plan's outcome
        product = {"status": "failed", "reasons": (f"{type(error).__name__}: {error}",), "goals": False}
    return product


def table(results: dict) -> str:
    rows = ["| plant | history | cleaning | " + " | ".join(OUTCOMES) + " | err/hold median / worst | flagged samples |",
            "|" + "---|" * 9]
    for (plant, history, rule), plans in results.items():
        ratios = [r["ratio"] for r in plans if "ratio" in r]
        flagged = sum(n for r in plans for per_rule in r.get("flagged", {}).values() for n in per_rule.values())
        rows.append(f"| {plant} | {history} | {rule} | " + " | ".join(str(sum(outcome(r) == o for r in plans))
                                                                    for o in OUTCOMES)
                    + (f" | {np.median(ratios):.3f} / {max(ratios):.3f}" if ratios else " | -") + f" | {flagged} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--only", nargs="+", help="binding ids to judge (default: every demo plant with targets)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    ledger, cache = Ledger(Path(tempfile.mkdtemp()) / "judge.duckdb"), SolverCache()
    plants = [p for p in variants() if p.name in ("tanks", "heater", "blend")
              and (not args.only or p.spec.id in args.only)]
    results: dict[tuple, list] = {}
    print(f"{'plant':<10}{'history':<8}{'cleaning':<9}{'seed':>4}  {'status':<11}{'err/hold':>9}  {'outcome':<20}"
          f"{'wall s':>7}  flagged")
    for plant in plants:
        for history in HISTORIES:
            damaged = plant if history == "clean" else Damaged(plant, spiked if history == "spikes" else stuck)
            for rule in (("after",) if history == "clean" else ("before", "after")):
                for seed in args.seeds:
                    started = time.perf_counter()
                    if rule == "before":
                        with cleaning_before():
                            r = judged(damaged, seed, ledger, cache)
                    else:
                        r = judged(damaged, seed, ledger, cache)
                    results.setdefault((plant.spec.id, history, rule), []).append(r)
                    print(f"{plant.spec.id:<10}{history:<8}{rule:<9}{seed:>4}  {r['status']:<11}"
                          f"{r.get('ratio', float('nan')):>9.3f}  {outcome(r):<20}{time.perf_counter() - started:>7.1f}"
                          f"  {r.get('flagged', {})}", flush=True)
                    if r["status"] != "verified":
                        print("      reasons:", "; ".join(r["reasons"])[:300])
    text = table(results)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
