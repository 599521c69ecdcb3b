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
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from optimizer_pipeline.validation import ContractError, check_number, check_text

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
        """Transformed -> engineering units: inside the limits (at them once tanh rounds to +-1, |z| >= ~19 r)."""
        c, r = self._centre_radius
        return c + r * np.tanh(np.asarray(z, float) / r)

    def inside(self, y: Any) -> np.ndarray:
        """Whether each value is strictly inside (lo, hi) (NaN: False)."""
        y = np.asarray(y, float)
        return (y > self.lo) & (y < self.hi)

    def first_outside(self, y: Any) -> int | None:
        """The index of the first value at or beyond the limits (NaN, a missing value, is not); None if none."""
        y = np.asarray(y, float)
        outside = np.flatnonzero(~self.inside(y) & ~np.isnan(y))
        return int(outside[0]) if outside.size else None

    def describe(self) -> str:
        return f"{self.kind} between {self.lo:g} and {self.hi:g}"

    @staticmethod
    def from_dict(doc: Any, where: str) -> "CVTransform":
        """From its JSON mapping; ContractError naming `where` and the field for a malformed one (the
        kind and the limits' order are checked where it is used: the binding, validate_problem)."""
        if not isinstance(doc, Mapping):
            raise ContractError(f"{where}: expected a mapping like {{kind: logit, lo: ..., hi: ...}}, got {doc!r}")
        for key in ("kind", "lo", "hi"):
            if key not in doc:
                raise ContractError(f"{where}.{key}: required field is missing")
        return CVTransform(check_text(doc["kind"], f"{where}.kind"), check_number(doc["lo"], f"{where}.lo"),
                           check_number(doc["hi"], f"{where}.hi"))


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
