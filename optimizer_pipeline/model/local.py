"""Local models: the artifact's structure refitted around an operating point.

A linear model fitted to the whole history carries the history's average gain. On a plant whose gain
changes over the operating range (the blending tank: its concentration is a ratio of the flows), a
steady target computed with that gain from the live MVs misses by the difference between the average
and the secant from the live point to the answer, which no better global fit can remove
(bench/linear_floor.py); a move plan ends where the same gain puts it. The secant is close to the
plant's local gain at the midpoint of the move, so the solve refits the model there
(pipeline.solve_and_decide):

* the operating point of a move is the midpoint of its start (the MVs held there, the CVs measured
  there) and its predicted end (the MVs it holds, the CVs the identified model predicts there): a
  steady target's settled values, a move plan's at its P-th step, an evidence block's at its last;
  a solve refits at the centre of the point's region (`LocalFitter.region`: a cell of REGION_FRACTION
  of the kernel width along every MV and CV), so the solves of a plant near a steady state share one
  refit (`LocalFitter.kept`: the live service keeps a fitter per model, and a region's refit, its
  jackknife and the solver's factorisation of its problem are made once, not once per sample). The
  centre is at most half a cell, 0.05 of a kernel width, from the point along each coordinate: less
  than the point's own sample-to-sample noise on the plants of bench/judge.py;
* the local model is the artifact's structure and ridge refitted on the artifact's train runs by
  least squares with every target row weighted by a Gaussian kernel of the distance between the MVs /
  CVs of the row before it and that point, in train standard deviations (the nearest row weighs 1),
  of the width identification chose from BANDWIDTHS: a narrow kernel follows a gain that changes
  quickly (an output that saturates), a wide one averages the noise of a gently curved plant;
* a refit is refused — the identified model predicts instead — when the kernel leaves fewer than
  MIN_ROWS_PER_PARAMETER effective rows per parameter (a point far from the data), or when it is
  unstable or its slowest mode has not decayed to 5 % within SETTLE_FACTOR settling horizons of the
  identified model (`settle_limit`);
* a refit holds its own disturbance (offset-free prediction): the mean of its one-step residuals
  over the identified model's window of rows, each weighted by the refit's kernel
  (`local_disturbances`). The refit describes the plant near its point; the identified model's
  multi-step fit would carry the refit's error far from it (a live run that arrived there in its last
  samples) into the rows near it, and hold it as a disturbance;
* identification keeps the local procedure (for both templates), at the kernel width that predicts
  settled values closest on held-out windows, only when it predicts them closer there than the
  identified model (model/artifact.py, `selection.steady_model`; the models' own open-loop
  prediction, no disturbance held), and its
  evidence scores the same procedure on every val / test block (uq.SETTLED_LOCAL, uq.MAX_RESIDUAL_LOCAL,
  each block's held disturbance included), so the band covers what the recommendation does.
"""

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
from scipy.spatial.distance import cdist

from optimizer_pipeline.contracts import ModelArtifact, StateSpace
from optimizer_pipeline.model.arx import (ArxModel, Orders, Stacked, fit_disturbance, one_step_residuals,
                                          spectral_radius, states_at)
from optimizer_pipeline.model.fit import RidgeProblem, Structure
from optimizer_pipeline.model.statespace import (INTEGRATOR_TOL, SETTLE_FRACTION, disturbance_step_gains,
                                                 disturbance_step_gains_each, rollout_each, settling_steps)

# kernel widths identification chooses from, in train standard deviations over the MVs and CVs together
BANDWIDTHS = (1.0, 0.7, 0.5)
LOCAL_BANDWIDTH = BANDWIDTHS[0]  # the width of an artifact identified before the choice was recorded
MIN_ROWS_PER_PARAMETER = 10  # a refit needs this effective sample per parameter, as gate G4 asks of the model
# a refit must settle within this many of the identified model's settling horizons h: the evidence
# scores the h-step prediction, which says little of the settled value of a much slower model
SETTLE_FACTOR = 2
POINTS_BLOCK = 64  # operating points refitted together (LocalFitter.refits: its weights are (64, train rows))
REGION_FRACTION = 0.1  # a solve's region: a cell of this fraction of the kernel width (LocalFitter.region)
REGIONS_KEPT = 16  # the regions' refits a fitter keeps (LocalFitter.kept)
LOCAL = "local"
GLOBAL = "global"

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class OperatingPoint:
    """Where a local model is centred: MVs (nu,) and CVs (ny,), normalised units."""

    u: np.ndarray
    y: np.ndarray

    @staticmethod
    def of_move(u_start: np.ndarray, y_start: np.ndarray, u_end: np.ndarray, y_end: np.ndarray) -> "OperatingPoint":
        """The midpoint of a move from (u_start, y_start) to its predicted end (u_end, y_end)."""
        return OperatingPoint((np.asarray(u_start, float) + u_end) / 2, (np.asarray(y_start, float) + y_end) / 2)

    def centre(self) -> np.ndarray:
        """(nu + ny,): its MVs and CVs, the coordinates the kernel measures distance in."""
        return np.concatenate([self.u, self.y]).astype(float)

    def to_json_dict(self) -> dict[str, Any]:
        return {"u": np.asarray(self.u, float).tolist(), "y": np.asarray(self.y, float).tolist()}


def kernel(distance: np.ndarray, bandwidth: float) -> np.ndarray:
    """The Gaussian kernel weights of squared distances (..., n) in train standard deviations, scaled so
    the nearest of each last-axis row weighs 1 (no underflow far from the data: a weighted fit divides
    by the total weight)."""
    return np.exp(-0.5 * (distance - distance.min(axis=-1, keepdims=True)) / bandwidth ** 2)


def structure_of(artifact: ModelArtifact) -> tuple[Structure, float]:
    """The structure and ridge identification chose (artifact.selection); a model without that record
    (e.g. a benchmark's reference fit) is refitted with its plain orders and no ridge."""
    selection = artifact.selection or {}
    record, final = selection.get("structure"), selection.get("final") or {}
    if record:
        structure = Structure(int(record["na"]), int(record["nb"]), tuple(tuple(int(d) for d in row)
                                                                          for row in record["delays"]),
                              bool(record.get("own_ar", False)), tuple(map(bool, record.get("integrating", ()))))
    else:
        structure = Structure.common(Orders(artifact.na, artifact.nb, artifact.delay), len(artifact.cv_tags),
                                     len(artifact.mv_tags) + len(artifact.dv_tags))
    return structure, float(final.get("ridge", 0.0))


def _choice(artifact: ModelArtifact) -> Mapping[str, Any]:
    """What identification recorded of the choice ({} before it was recorded)."""
    return (artifact.selection or {}).get("steady_model") or {}


def bandwidth_of(artifact: ModelArtifact) -> float:
    """The kernel width identification chose (LOCAL_BANDWIDTH for an artifact without a positive one)."""
    width = float(_choice(artifact).get("bandwidth") or 0.0)
    return width if np.isfinite(width) and width > 0 else LOCAL_BANDWIDTH


def steady_procedure(artifact: ModelArtifact) -> str:
    """LOCAL when identification chose the local procedure (for a steady target or a move plan alike),
    else GLOBAL (also for an artifact identified before the choice was recorded for its template)."""
    return _choice(artifact).get("procedure", GLOBAL)


@dataclass(frozen=True, eq=False)
class LocalFit:
    """A refit: the model, its realisation, the point and fitter it came from, and its effective rows."""

    model: ArxModel
    state_space: StateSpace
    point: OperatingPoint
    fitter: "LocalFitter"
    effective_rows: float

    @property
    def problem(self) -> RidgeProblem:
        """The weighted regression per train run (the jackknife of its gain refits it)."""
        return self.fitter.problem.weighted(self.fitter.weights(self.point))


class LocalFitter:
    """The train regression of one structure, refitted around operating points (module docstring)."""

    def __init__(self, structure: Structure, ridge: float, train: Stacked, bandwidth: float = LOCAL_BANDWIDTH):
        self.structure, self.ridge, self.bandwidth = structure, float(ridge), float(bandwidth)
        self.problem = RidgeProblem(train, structure.na, structure.orders.max_lag)
        before = self.problem.rows - 1  # the row before each target row: same run (rows start after the lags)
        self._before = np.hstack([train.u[before], train.y[before]])  # its MVs and CVs
        self.min_rows = MIN_ROWS_PER_PARAMETER * structure.n_params() / len(structure.delays)
        self._kept: OrderedDict[Hashable, Any] = OrderedDict()

    @staticmethod
    def for_artifact(artifact: ModelArtifact, train: Stacked) -> "LocalFitter":
        return LocalFitter(*structure_of(artifact), train, bandwidth_of(artifact))

    def with_bandwidth(self, bandwidth: float) -> "LocalFitter":
        """The same regression with another kernel width."""
        fitter = copy.copy(self)
        fitter.bandwidth = float(bandwidth)
        fitter._kept = OrderedDict()
        return fitter

    def region(self, point: OperatingPoint) -> OperatingPoint:
        """The centre of `point`'s region: every coordinate rounded to a multiple of REGION_FRACTION x
        the kernel width (module docstring)."""
        width = REGION_FRACTION * self.bandwidth
        return OperatingPoint(np.round(np.asarray(point.u, float) / width) * width,
                              np.round(np.asarray(point.y, float) / width) * width)

    def kept(self, key: Hashable, make: Callable[[], T]) -> T:
        """`make()` once per `key` (model.artifact.local_artifact: a region's refit and its gain), the
        last REGIONS_KEPT kept."""
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        value = self._kept[key] = make()
        if len(self._kept) > REGIONS_KEPT:
            self._kept.popitem(last=False)
        return value

    def weights(self, point: OperatingPoint) -> np.ndarray:
        """Kernel weight of every target row of the regression (rows of `problem.rows`), scaled so the
        nearest row weighs 1 (no underflow far from the data; the fit divides by the total weight)."""
        return self._weights([point])[0]

    def _weights(self, points: Sequence[OperatingPoint]) -> np.ndarray:
        """`weights` of every point (m, n_rows)."""
        centres = np.array([p.centre() for p in points])  # (m, nu + ny)
        return kernel(cdist(centres, self._before, "sqeuclidean"), self.bandwidth)

    def refit(self, point: OperatingPoint, settle_within: int) -> tuple[LocalFit | None, str]:
        """The refit at `point`, or None with the reason it is refused: an effective (Kish) sample under
        MIN_ROWS_PER_PARAMETER rows per parameter of a CV equation (the point is too far from the
        data), or a model whose slowest mode (spectral radius) has not decayed to SETTLE_FRACTION within
        `settle_within` steps (unstable included)."""
        return next(self.refits([point], settle_within))

    def refits(self, points: Sequence[OperatingPoint], settle_within: int) -> Iterator[tuple[LocalFit | None, str]]:
        """`refit` at every point, in order; POINTS_BLOCK points' weighted regressions at a time (their
        weights are not kept: a block's memory is freed before the next is formed)."""
        for start in range(0, len(points), POINTS_BLOCK):
            block = points[start:start + POINTS_BLOCK]
            weights = self._weights(block)
            effective = weights.sum(axis=1) ** 2 / np.sum(weights ** 2, axis=1)  # Kish; the nearest row weighs 1
            near = effective >= self.min_rows
            models = iter(self.problem.weighted_fits(self.structure, self.ridge, weights[near]))
            del weights
            for point, rows, ok in zip(block, effective, near):
                yield (self._checked(next(models), point, float(rows), settle_within) if ok else
                       (None, f"{rows:.0f} effective train rows near the operating point, fewer than "
                              f"{self.min_rows:.0f}"))

    def _checked(self, model: ArxModel, point: OperatingPoint, effective: float,
                 settle_within: int) -> tuple[LocalFit | None, str]:
        realised = model.realise()
        radius = spectral_radius(realised)
        if not radius ** settle_within <= SETTLE_FRACTION:  # its slowest mode, also for an unstable or NaN refit
            return None, (f"the refit does not settle within {settle_within} steps (its slowest mode, spectral "
                          f"radius {radius:.4f}, is not within {SETTLE_FRACTION:g} of its end)")
        return LocalFit(model, realised, point, self, effective), ""


def settle_limit(ss: StateSpace) -> int:
    """Steps within which a refit of the identified model `ss` must settle (`LocalFitter.refit`):
    SETTLE_FACTOR x its settling horizon; 0 (every refit refused) when it does not settle itself."""
    settling = settling_steps(ss)
    return 0 if settling is None else SETTLE_FACTOR * settling


def window_points(stacked: Stacked, rows: np.ndarray, h: int, ends: np.ndarray) -> list[OperatingPoint]:
    """The operating point of each h-step window k of `rows`: midway from its first MVs and its CVs
    at k to the MVs of its last step and `ends[i]` (ny,), the CVs a model predicts there."""
    return [OperatingPoint.of_move(stacked.u[k], stacked.y[k], stacked.u[k + h - 1], ends[i])
            for i, k in enumerate(rows)]


def local_paths(fitter: LocalFitter, ss: StateSpace, stacked: Stacked, orders: Orders, rows: np.ndarray,
                identified: np.ndarray, window: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                     list[ArxModel]]:
    """Per window k of `rows`: the h-step open-loop prediction of y[k + 1 .. k + h] (n, h, ny) by the
    identified model `ss` and by the local procedure, whether the procedure used a refit (else the
    identified model's path: the refit was refused, `LocalFitter.refit` within `settle_limit(ss)`),
    and the refits it used, in window order (their gains: `local_gains`).
    `identified`: the identified model's own rollout of the windows (model.arx.rollout_windows, which
    the callers have already run for the measured values), h its length.
    With `window`, each holds its own disturbance fitted over the `window` rows before k (k must have
    them), as `current_state` holds it: the identified model's by model.arx.fit_disturbance, each
    refit's by `local_disturbances` (its rows weighted by its kernel); None: none held.
    The refit's operating point: the window's first MVs and its CVs at k, to the MVs of its last step
    and the identified model's end; the live solve's definition (pipeline), whose window is the plan
    up to its P-th step or a steady target (its end predicted with the held disturbance, which a
    window without `window` does not hold)."""
    h = identified.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        global_path = identified.copy()
        if window is not None:
            estimate = fit_disturbance(ss, stacked, orders, rows, window)  # (m, ny)
            global_path += np.einsum("jab,mb->mja", disturbance_step_gains(ss, h), estimate)
        local_path, used = global_path.copy(), np.zeros(rows.size, bool)
        points = window_points(stacked, rows, h, global_path[:, -1])
        fits = {i: fit for i, (fit, _) in enumerate(fitter.refits(points, settle_limit(ss))) if fit is not None}
        models = [fit.state_space for fit in fits.values()]
        used[list(fits)] = True
        if models:  # every refit's window rolled out by its own refit at once
            at = rows[used]
            steps = at[:, None] + np.arange(h)
            local_path[used] = rollout_each(models, states_at(stacked, orders, at), stacked.u[steps], stacked.d[steps])
            if window is not None:
                local_path[used] += held_each(list(fits.values()), fitter.bandwidth, stacked, orders, at, window, h)
    return global_path, local_path, used, [fit.model for fit in fits.values()]


def held_each(fits: Sequence[LocalFit], bandwidth: float, stacked: Stacked, orders: Orders, rows: np.ndarray,
              window: int, h: int) -> np.ndarray:
    """(m, h, ny): the response over h steps to the disturbance each refit of `fits` (kernel width
    `bandwidth`) holds at its row of `rows` (`local_disturbances` over the `window` rows before it)."""
    models = [fit.state_space for fit in fits]
    centres = np.array([fit.point.centre() for fit in fits])
    estimate = local_disturbances(models, centres, bandwidth, stacked, orders, rows, window)
    return np.einsum("mjab,mb->mja", disturbance_step_gains_each(models, h), estimate)


def local_disturbances(models: Sequence[StateSpace], centres: np.ndarray, bandwidth: float, stacked: Stacked,
                       orders: Orders, rows: np.ndarray, window: int, measured: np.ndarray | None = None) -> np.ndarray:
    """(m, ny): the disturbance each refit of `models`, centred at its row of `centres` (m, nu + ny), holds
    at its row k of `rows`: the mean of its one-step residuals (model.arx.one_step_residuals: y[t + 1]
    minus its prediction from the measured state x[t]) over the `window` rows t before k, each
    weighted by the refit's `kernel` (width `bandwidth`) at the MVs / CVs of row t, as the refit
    weighs its train rows: the held disturbance that best explains the rows near its point (in the
    realisation the disturbance enters the CVs' equations as the one-step residual does,
    statespace.rollout). One pass over the window's rows per refit: memory of the residuals, not of
    the states.

    Not the identified model's multi-step fit (model.arx.fit_disturbance): a refit describes the plant
    near its operating point, and a rollout from far from it (a live run that moved there in its last
    samples) carries the refit's error there into every later row; a one-step residual depends on
    its own row's measured state alone. `measured` (window, ny), of y[k - window + 1 .. k] for every row k:
    a residual whose CV value was filled in by cleaning (False) is left out of its CV's mean."""
    starts = rows - window
    steps = starts[:, None] + np.arange(window)  # (m, window)
    residual = np.stack([one_step_residuals(ss, stacked, orders, int(start), int(start) + window)
                         for ss, start in zip(models, starts)])  # (m, window, ny)
    before = np.concatenate([stacked.u[steps], stacked.y[steps]], axis=2)  # (m, window, nu + ny)
    weights = kernel(np.sum((before - centres[:, None]) ** 2, axis=2), bandwidth)[..., None]  # (m, window, 1)
    if measured is not None:
        weights = weights * np.asarray(measured, float)
    return np.einsum("mja,mja->ma", weights, residual) / weights.sum(axis=1)


def local_gains(refits: Sequence[ArxModel], ny: int, nv: int) -> np.ndarray:
    """The steady-state gains [G, Gd] (m, ny, nv = nu + nd) of the ARX `refits` (normalised units):
    (I - sum A)^-1 [sum B, sum D], what statespace.steady_state gives of their realisations (a refit
    is kept only when it settles, `LocalFitter.refit`, so I - sum A is regular). An integrating CV's
    row of I - sum A is 0 (its AR coefficients sum to 1, model/fit.py): its settled rate per step r
    then solves (sum_l l A_l) r = [sum B, sum D] in that row (a ramp y[t] = y0 + r t in its equation)."""
    if not refits:
        return np.zeros((0, ny, nv))
    ar = np.stack([np.eye(ny) - model.A.sum(axis=0) for model in refits])
    ramp = np.stack([np.tensordot(np.arange(1, len(model.A) + 1), model.A, axes=1) for model in refits])
    integrating = np.all(np.abs(ar) < INTEGRATOR_TOL, axis=2, keepdims=True)
    exo = np.stack([np.hstack([model.B.sum(axis=0), model.D.sum(axis=0)]) for model in refits])
    return np.linalg.solve(np.where(integrating, ramp, ar), exo)


def best_bandwidth(local_errors: Mapping[float, float]) -> float:
    """The kernel width with the lowest settled NRMSE (a non-finite one counts as infinite)."""
    return min(local_errors, key=lambda b: local_errors[b] if np.isfinite(local_errors[b]) else np.inf)


def steady_model_record(procedure: str, global_error: float | None = None,
                        local_errors: Mapping[float, float] | None = None, windows: int = 0, refits: int = 0,
                        note: str = "") -> Mapping[str, Any]:
    """What identification records of the choice (artifact.selection["steady_model"]): `local_errors`
    holds the local procedure's settled NRMSE per kernel width, the recorded bandwidth is the best
    (`best_bandwidth`; LOCAL_BANDWIDTH without any) and `refits` the windows it refitted."""
    def finite(value: float | None) -> float | None:
        return float(value) if value is not None and np.isfinite(value) else None

    errors = dict(local_errors or {})
    bandwidth = best_bandwidth(errors) if errors else LOCAL_BANDWIDTH
    record = {"procedure": procedure, "bandwidth": float(bandwidth),
              "rule": "the local procedure at the kernel width (of " + ", ".join(f"{b:g}" for b in BANDWIDTHS)
                      + ") whose settled NRMSE on the held-out windows (open-loop from the measured state, no "
                        "disturbance held: the models' own prediction) is lowest, when that is below the "
                        "identified model's",
              "settled_nrmse": {GLOBAL: finite(global_error), LOCAL: finite(errors.get(bandwidth))},
              "settled_nrmse_by_bandwidth": {f"{b:g}": finite(e) for b, e in errors.items()},
              "windows": int(windows), "refits": int(refits)}
    return {**record, "note": note} if note else record
