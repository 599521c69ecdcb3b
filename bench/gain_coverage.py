"""How often the recorded steady-gain standard errors cover the plant's true gain where it is used.

For every judge variant (bench/judge.py; the steady-target and orders-unset copies share their
plant and history with a variant here, so they are left out) and seed:

* the model identified from the history against the true plant's local MV gain at the live MVs and
  DVs (central differences of its noise-free steady state, bench/linear_floor.py);
* where identification chose the local refit (model/local.py), the refit a solve makes midway from
  the live state to the plant's settled state at its targets (the MVs that put it there, found from
  the true plant), against the true local gain at those midway MVs.

Printed per variant: the share of gain entries (CV, MV) whose error |G - G_true| is within 2
standard errors, and the median of error / se, for the jackknife over the train runs alone and for
the recorded total (the identified model's: the jackknife plus the local gains' spread over the
held-out operating points, model/artifact.py `steady_gain_record`; a refit's records the jackknife
of its weighted fit alone, so its two columns agree). A calibrated 2-se interval covers about 95 %.

Usage: .venv/bin/python bench/gain_coverage.py [--seeds 1 2 3]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import variants  # noqa: E402
from linear_floor import local_gain  # noqa: E402
from scipy.optimize import fsolve  # noqa: E402

from optimizer_pipeline.data.prepare import prepare_history  # noqa: E402
from optimizer_pipeline.data.ingest import validate_history_frame  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.model.artifact import local_artifact, local_fitter  # noqa: E402
from optimizer_pipeline.model.local import LOCAL, OperatingPoint, settle_limit, steady_procedure  # noqa: E402

SIGMAS = 2.0


def _ratios(artifact, record, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|G - G_true| / se per gain entry of a gain `record`, with the jackknife se and the recorded total."""
    _, u_std = artifact.normalisation.of(artifact.mv_tags)
    _, y_std = artifact.normalisation.of(artifact.cv_tags)
    scale = y_std[:, None] / u_std[None, :]  # normalised -> engineering
    error = np.abs(np.asarray(record["gain"]) * scale - truth)
    uncertainty = record["uncertainty"]
    if uncertainty is None:  # fewer than 2 train runs: no standard errors to judge
        return np.zeros(0), np.zeros(0)
    return (error / (np.asarray(uncertainty["jackknife_std"]) * scale)).ravel(), \
        (error / (np.asarray(uncertainty["std"]) * scale)).ravel()


def ratios(plant, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """`_ratios` of the identified model at the live state, and of the refit midway to the targets
    (None where identification did not choose the refit, or the refit is refused)."""
    spec = plant.spec
    history = plant.history(seed)
    split = prepare_history(validate_history_frame(history.frame, spec, "gain_coverage"), spec)
    artifact = identify(split, spec, 1)
    live = history.live
    identified = _ratios(artifact, artifact.steady_gain, local_gain(plant, live.u, live.d))
    if steady_procedure(artifact) != LOCAL:
        return identified, None
    target = np.array([c.target for c in spec.cvs], float)
    start = live.u + np.linalg.lstsq(local_gain(plant, live.u, live.d), target - plant.steady_output(live.u, live.d),
                                     rcond=None)[0]
    settled = fsolve(lambda u: plant.steady_output(u, live.d) - target, start)
    u_mean, u_std = artifact.normalisation.of(artifact.mv_tags)
    y_mean, y_std = artifact.normalisation.of(artifact.cv_tags)
    y_live = plant.steady_output(live.u, live.d)
    point = OperatingPoint.of_move((live.u - u_mean) / u_std, (y_live - y_mean) / y_std,
                                   (settled - u_mean) / u_std, (target - y_mean) / y_std)
    refit, _ = local_artifact(artifact, spec, local_fitter(artifact, split.train), point,
                              settle_limit(artifact.state_space))
    if refit is None:
        return identified, None
    return identified, _ratios(artifact, refit.steady_gain, local_gain(plant, (live.u + settled) / 2, live.d))


def _row(name: str, jackknife: np.ndarray, total: np.ndarray) -> str:
    return (f"| {name} | {np.mean(jackknife <= SIGMAS):.2f} | {np.median(jackknife):.2f} | "
            f"{np.mean(total <= SIGMAS):.2f} | {np.median(total):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    print(f"| gains of | within {SIGMAS:g} se, jackknife | median error/se | within {SIGMAS:g} se, recorded | "
          "median error/se |")
    print("|---|---|---|---|---|")
    everything: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"identified": [], "refit": []}
    for plant in variants():
        if plant.spec.id.endswith(("-ss", "-unset")):
            continue
        found = [ratios(plant, seed) for seed in args.seeds]
        for kind, pairs in (("identified", [f[0] for f in found]), ("refit", [f[1] for f in found if f[1]])):
            if pairs:
                jackknife, total = (np.concatenate(parts) for parts in zip(*pairs))
                everything[kind].append((jackknife, total))
                print(_row(f"{plant.spec.id}, {kind} ({len(pairs)} seeds)", jackknife, total), flush=True)
    for kind, pairs in everything.items():
        if pairs:
            jackknife, total = (np.concatenate(parts) for parts in zip(*pairs))
            print(_row(f"all, {kind} ({jackknife.size} gains)", jackknife, total))


if __name__ == "__main__":
    main()
