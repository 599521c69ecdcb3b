"""The tracking error no linear model can beat on the judge's nonlinear plants (issue 15's 10 % goal).

A steady target computed from a linear model moves the MVs from the live ones by G^-1 (target - y_live).
With the plant's exact local gain at the live MVs (the best a model identified around the live state
can know) or the best linear fit of the steady-state map over the whole excitation band (what one
global linear fit of the history aims at), the true plant then settles at y(u) != target. Printed per
variant: that settled error as a fraction of holding's, ||(y(u) - target) / range|| / ||(y_live -
target) / range||, the same measure as bench/judge.py's err/hold, from the noise-free steady-state
equations (no identification, no noise, no dynamics). A figure above 0.10 means the judge's goal is
out of reach for the product's linear model on that plant whatever the data, short of a nonlinear
steady-state model or a re-solve from the new state (the live loop).

Usage: .venv/bin/python bench/linear_floor.py
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judge import variants  # noqa: E402

FIT_SAMPLES = 4000


def local_gain(plant, u: np.ndarray, d: np.ndarray) -> np.ndarray:
    """d y_ss / d u at u by central differences (ny, nu)."""
    step = 1e-5 * np.maximum(1.0, np.abs(u))
    columns = []
    for j in range(len(u)):
        du = np.zeros_like(u)
        du[j] = step[j]
        columns.append((plant.steady_output(u + du, d) - plant.steady_output(u - du, d)) / (2 * step[j]))
    return np.stack(columns, axis=1)


def global_gain(plant, d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The steady-state map's least-squares linear fit over the excitation band (ny, nu)."""
    lo, hi = np.array(plant.excitation.mv_band, float).T
    u = rng.uniform(lo, hi, (FIT_SAMPLES, len(lo)))
    y = np.stack([plant.steady_output(row, d) for row in u])
    coef = np.linalg.lstsq(np.column_stack([u, np.ones(len(u))]), y, rcond=None)[0]
    return coef[:-1].T


def floor(plant, gain: np.ndarray) -> float:
    """err/hold of the steady target the linear gain computes from the live MVs (offset-free at the live state)."""
    spec = plant.spec
    u0, d = np.array(plant.excitation.mv_live, float), np.array(plant.nominal_d, float)
    target = np.array([c.target for c in spec.cvs], float)
    scale = np.array([c.hi - c.lo for c in spec.cvs], float)
    y0 = plant.steady_output(u0, d)
    u = u0 + np.linalg.lstsq(gain, target - y0, rcond=None)[0]
    return float(np.linalg.norm((plant.steady_output(u, d) - target) / scale)
                 / np.linalg.norm((y0 - target) / scale))


def main() -> None:
    rng = np.random.default_rng(0)
    print("| variant | exact local gain at the live MVs | best global linear fit over the excitation band |")
    print("|---|---|---|")
    for plant in variants():
        d = np.array(plant.nominal_d, float)
        u0 = np.array(plant.excitation.mv_live, float)
        print(f"| {plant.spec.id} | {floor(plant, local_gain(plant, u0, d)):.3f} | "
              f"{floor(plant, global_gain(plant, d, rng)):.3f} |")


if __name__ == "__main__":
    main()
