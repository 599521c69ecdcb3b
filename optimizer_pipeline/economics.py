"""The economic objective of a binding: linear and quadratic costs of MVs and CVs at steady state.

A binding's MVs and CVs may carry `cost` (per engineering unit) and `cost_quadratic` (per unit
squared, >= 0); the plant's economic cost at an operating point (u, y) is

    J(u, y) = sum_i (cost_i u_i + cost_quadratic_i u_i^2) + sum_j (cost_j y_j + cost_quadratic_j y_j^2)

in the binding's money-per-time unit (a profit is a negative cost). `economic_value` evaluates it in
engineering units (what users read); `normalised_costs` writes the same objective in the model's
normalised units for the steady-state QP (solver/steady.py), scaled so that its largest gradient
over the MV box is 1: the QP's priorities (solver/steady.py, "Priorities") then hold whatever the
currency.
"""

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from optimizer_pipeline.contracts import BindingSpec


def economic_value(spec: BindingSpec, controls: Sequence[float], predicted: Sequence[float]) -> float | None:
    """J(u, y) of one row (MVs `controls`, CVs `predicted`, engineering units); None without costs."""
    if not spec.has_costs:
        return None
    total = 0.0
    for specs, values in ((spec.mvs, controls), (spec.cvs, predicted)):
        for s, v in zip(specs, values, strict=True):
            total += s.cost * float(v) + s.cost_quadratic * float(v) ** 2
    return total


@dataclass(frozen=True)
class NormalisedCosts:
    """J in normalised units, up to a constant and the positive factor `scale`:
    J / scale = u_linear @ u + u_quadratic @ u**2 + y_linear @ y + y_quadratic @ y**2 + constant."""

    u_linear: np.ndarray
    u_quadratic: np.ndarray
    y_linear: np.ndarray
    y_quadratic: np.ndarray
    scale: float


def normalised_costs(spec: BindingSpec, u_mean: np.ndarray, u_std: np.ndarray, y_mean: np.ndarray,
                     y_std: np.ndarray, gain: np.ndarray, u_lo: np.ndarray, u_hi: np.ndarray) -> NormalisedCosts:
    """The binding's costs in normalised units (x = mean + std * z), divided by `scale`: an estimate
    of the largest absolute gradient of J with respect to one normalised MV over the MV box
    [u_lo, u_hi] (normalised), the CVs' costs reaching the MVs through the steady-state gain (ny, nu)
    (a CV's quadratic cost taken at |G| |u| at the box's far corner, the model's offset left out).
    Only the ranking of the QP's terms depends on it, not the optimum of the costs alone. A binding
    whose costs have no gradient anywhere in the box keeps scale 1."""
    a_u = np.array([m.cost for m in spec.mvs], float)
    b_u = np.array([m.cost_quadratic for m in spec.mvs], float)
    a_y = np.array([c.cost for c in spec.cvs], float)
    b_y = np.array([c.cost_quadratic for c in spec.cvs], float)
    # a (mean + std z) + b (mean + std z)^2 = const + (a + 2 b mean) std z + b std^2 z^2
    lin_u, quad_u = (a_u + 2 * b_u * u_mean) * u_std, b_u * u_std ** 2
    lin_y, quad_y = (a_y + 2 * b_y * y_mean) * y_std, b_y * y_std ** 2
    # gradient in u: |lin_u + 2 quad_u u| + |G' (lin_y + 2 quad_y y)|, at the box's largest |u|
    u_far = np.maximum(np.abs(u_lo), np.abs(u_hi))
    y_far = np.abs(gain) @ u_far
    bound = np.abs(lin_u) + 2 * quad_u * u_far + np.abs(gain).T @ (np.abs(lin_y) + 2 * quad_y * y_far)
    scale = float(bound.max()) if bound.size and bound.max() > 0 else 1.0
    return NormalisedCosts(lin_u / scale, quad_u / scale, lin_y / scale, quad_y / scale, scale)
