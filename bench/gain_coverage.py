"""How often the recorded steady-gain standard errors cover the plant's true gain where the plan starts.

For every judge variant (bench/judge.py; the steady-target and orders-unset copies share their
plant and history with a variant here, so they are left out) and seed: the model identified from
the history, and the true plant's local MV gain at the live MVs and DVs (central differences of its
noise-free steady state, bench/linear_floor.py). Printed per variant: the share of gain entries
(CV, MV) whose error |G - G_true| is within 2 standard errors, and the median of error / se, for
the jackknife over the train runs alone and for the recorded total (the jackknife plus the local
gains' spread over the held-out operating points, model/artifact.py `steady_gain_record`).
A calibrated 2-se interval covers about 95 %.

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

from optimizer_pipeline.data import prepare_history, validate_history_frame  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402

SIGMAS = 2.0


def ratios(plant, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """|G - G_true| / se per gain entry, with the jackknife se and with the recorded total."""
    spec = plant.spec
    history = plant.history(seed)
    split = prepare_history(validate_history_frame(history.frame, spec, "gain_coverage"), spec)
    artifact = identify(split, spec, 1)
    _, u_std = artifact.normalisation.of(artifact.mv_tags)
    _, y_std = artifact.normalisation.of(artifact.cv_tags)
    scale = y_std[:, None] / u_std[None, :]  # normalised -> engineering
    record = artifact.steady_gain
    error = np.abs(np.asarray(record["gain"]) * scale - local_gain(plant, history.live.u, history.live.d))
    uncertainty = record["uncertainty"]
    return (error / (np.asarray(uncertainty["jackknife_std"]) * scale)).ravel(), \
        (error / (np.asarray(uncertainty["std"]) * scale)).ravel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    print(f"| variant | within {SIGMAS:g} se, jackknife | median error/se | within {SIGMAS:g} se, recorded | "
          "median error/se |")
    print("|---|---|---|---|---|")
    everything: list[tuple[np.ndarray, np.ndarray]] = []
    for plant in variants():
        if plant.spec.id.endswith(("-ss", "-unset")):
            continue
        found = [ratios(plant, seed) for seed in args.seeds]
        jackknife, total = (np.concatenate(parts) for parts in zip(*found))
        everything.append((jackknife, total))
        print(f"| {plant.spec.id} | {np.mean(jackknife <= SIGMAS):.2f} | {np.median(jackknife):.2f} | "
              f"{np.mean(total <= SIGMAS):.2f} | {np.median(total):.2f} |", flush=True)
    jackknife, total = (np.concatenate(parts) for parts in zip(*everything))
    print(f"| all ({jackknife.size} gains) | {np.mean(jackknife <= SIGMAS):.2f} | {np.median(jackknife):.2f} | "
          f"{np.mean(total <= SIGMAS):.2f} | {np.median(total):.2f} |")


if __name__ == "__main__":
    main()
