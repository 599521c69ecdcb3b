"""How well the move-plan band covers what a move plan predicts: its blocks are scored open-loop without
the held disturbance (uq.MAX_RESIDUAL / MAX_RESIDUAL_LOCAL), while the live solve's prediction holds
the disturbance fitted over the W rows before the plan (model.arx.state_and_bias; docs/ARCHITECTURE.md,
"Offset-free prediction").

For each move-plan variant of bench/judge.py and seed: identify as the product does, then score the
val / test blocks twice on the same block starts (W rows after the first measured state): as the
evidence does (no disturbance), and as the solve predicts (the disturbance fitted over the W rows
before each block, each local refit with its own, model.local.local_paths). Printed: the evidence's
test coverage (worst CV, as uq.compute_block_uq reports it), the coverage of that band over the test
predictions that hold the disturbance, and the band a calibration of those predictions would give
(its coverage, and its qhat over the evidence's, per CV).

Usage: OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/disturbance_coverage.py [--seeds 1 2 3] [--only ID ...]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import variants  # noqa: E402

from optimizer_pipeline import pipeline, uq  # noqa: E402
from optimizer_pipeline.contracts import BlockScores, Template  # noqa: E402
from optimizer_pipeline.data import prepare_history, validate_history_frame  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.model.artifact import stack_for  # noqa: E402
from optimizer_pipeline.model.arx import Orders, disturbance_window, fit_disturbance, rollout_windows, window_rows  # noqa: E402
from optimizer_pipeline.model.local import LOCAL, LocalFitter, local_paths, steady_procedure  # noqa: E402
from optimizer_pipeline.model.statespace import disturbance_step_gains  # noqa: E402


def scores(artifact, runs, train, held: bool) -> BlockScores:
    """P-step block scores (max over the block of |measured - predicted|) from W rows into each run."""
    h, ss = artifact.horizon, artifact.state_space
    stacked, orders = stack_for(artifact, runs), Orders(artifact.na, artifact.nb, artifact.delay)
    window = disturbance_window(ss, h)
    rows, which = window_rows(stacked, orders.first_state_row + window, h, h)
    predicted, measured = rollout_windows(ss, stacked, orders, rows, h)
    if steady_procedure(artifact) == LOCAL:
        fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, train))
        path = local_paths(fitter, ss, stacked, orders, rows, predicted, window if held else None)[1]
    elif held:
        estimate = fit_disturbance(ss, stacked, orders, rows, window)
        path = predicted + np.einsum("jki,mi->mjk", disturbance_step_gains(ss, h), estimate)
    else:
        path = predicted
    run_ids = np.asarray(stacked.run_ids, dtype=object)[which]
    return BlockScores(cv_tags=tuple(artifact.cv_tags), h=h, run_ids=run_ids, starts=rows - stacked.offsets[which],
                       scores=np.max(np.abs(measured - path), axis=1), n_unique_steps=int(rows.size * h),
                       n_runs=len({runs[i].plant_run for i in np.unique(which)}), score=uq.MAX_RESIDUAL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", nargs="+", help="binding ids (default: every move-plan variant)")
    args = parser.parse_args()
    print(f"{'variant':<15}{'seed':>4}  {'model':<7}{'test blocks':>11}  {'evidence':>8}  {'its band, held d':>16}  "
          f"{'band of held d':>14}  qhat held d / evidence")
    for plant in variants():
        spec = plant.spec
        if spec.profile.template is Template.STEADY_RESPONSE or (args.only and spec.id not in args.only):
            continue
        for seed in args.seeds:
            split = prepare_history(validate_history_frame(plant.history(seed).frame, spec, "bench"), spec)
            artifact = identify(split, spec, 1)
            train = pipeline.artifact_runs(artifact, split, "train")
            val, test = (scores(artifact, split.val, train, False), scores(artifact, split.test, train, False))
            held_val, held_test = (scores(artifact, split.val, train, True), scores(artifact, split.test, train, True))
            evidence, held = uq.compute_block_uq(val, test), uq.compute_block_uq(held_val, held_test)
            if evidence.qhat is None or held.qhat is None:
                print(f"{spec.id:<15}{seed:>4}  no evidence: {evidence.reasons or held.reasons}")
                continue
            old_band = np.min(np.mean(held_test.scores <= np.asarray(evidence.qhat), axis=0))
            ratio = np.asarray(held.qhat) / np.asarray(evidence.qhat)
            print(f"{spec.id:<15}{seed:>4}  {steady_procedure(artifact):<7}{test.n_blocks:>11}  {evidence.coverage:>8.3f}  "
                  f"{old_band:>16.3f}  {held.coverage:>14.3f}  {np.array2string(ratio, precision=2)}", flush=True)


if __name__ == "__main__":
    main()
