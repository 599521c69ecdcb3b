"""CV transforms: a CV that saturates (a composition near its purity limit) identified and planned in
units where a linear model follows it (docs/ARCHITECTURE.md, "CV transforms").

The one kind, `logit` between limits lo < hi: z = r atanh((y - c) / r), y = c + r tanh(z / r), with
c = (lo + hi) / 2 and r = (hi - lo) / 2. It is the logit of (y - lo) / (hi - lo) scaled so that z = y
and dz/dy = 1 at the midpoint; toward a limit z grows without bound, so equal steps of z are ever
smaller steps of y. A plant whose CV is a linear system's output passed through such a saturation (a
Wiener system) is linear in z. The model, its disturbance and the optimisation work in z; what a user
reads (predictions, bands, limits, targets) stays in engineering units.
"""

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

KINDS = ("logit",)


@dataclass(frozen=True)
class CVTransform:
    kind: str  # one of KINDS
    lo: float  # engineering units: the CV saturates toward lo and hi and never reaches them
    hi: float

    @property
    def _centre_radius(self) -> tuple[float, float]:
        return (self.lo + self.hi) / 2, (self.hi - self.lo) / 2

    def forward(self, y: Any) -> np.ndarray:
        """Engineering -> transformed units; NaN beyond the limits, +-inf at them."""
        c, r = self._centre_radius
        with np.errstate(divide="ignore", invalid="ignore"):
            return r * np.arctanh((np.asarray(y, float) - c) / r)

    def inverse(self, z: Any) -> np.ndarray:
        """Transformed -> engineering units (always strictly inside the limits for finite z)."""
        c, r = self._centre_radius
        return c + r * np.tanh(np.asarray(z, float) / r)

    def slope(self, z: Any) -> np.ndarray:
        """dy/dz at z: how far a unit of transformed error moves the CV in engineering units (<= 1)."""
        _, r = self._centre_radius
        return 1.0 - np.tanh(np.asarray(z, float) / r) ** 2

    def inside(self, y: Any) -> np.ndarray:
        """Whether each value is strictly inside (lo, hi) (NaN: False)."""
        y = np.asarray(y, float)
        return (y > self.lo) & (y < self.hi)

    def describe(self) -> str:
        return f"{self.kind} between {self.lo:g} and {self.hi:g}"

    @staticmethod
    def from_dict(doc: Any) -> "CVTransform":
        return CVTransform(str(doc["kind"]), float(doc["lo"]), float(doc["hi"]))


def _by_column(transforms: Sequence[CVTransform | None], values: Any,
               apply: Callable[[CVTransform, np.ndarray], np.ndarray]) -> np.ndarray:
    out = np.array(values, float)
    for j, transform in enumerate(transforms):
        if transform is not None:
            out[..., j] = apply(transform, out[..., j])
    return out


def forward_columns(transforms: Sequence[CVTransform | None], values: Any) -> np.ndarray:
    """values (..., ny) in engineering units -> transformed units, column j by transforms[j] (None: as is)."""
    return _by_column(transforms, values, CVTransform.forward)


def inverse_columns(transforms: Sequence[CVTransform | None], values: Any) -> np.ndarray:
    """values (..., ny) in transformed units -> engineering units, column j by transforms[j] (None: as is)."""
    return _by_column(transforms, values, CVTransform.inverse)


def slope_columns(transforms: Sequence[CVTransform | None], values: Any) -> np.ndarray:
    """dy/dz per column at values (..., ny) in transformed units (1 where a column has no transform)."""
    values = np.asarray(values, float)
    out = np.ones_like(values)
    for j, transform in enumerate(transforms):
        if transform is not None:
            out[..., j] = transform.slope(values[..., j])
    return out
