"""ARX models in normalised units: layout, realisation, stacked runs and their windows, rollouts and
their NRMSE, and the measured state of a run with the disturbance held over its prediction. The
regression and the multi-step refinement live in model/fit.py.

ARX convention (fixed; the MPC, the verifier and the UQ scores rely on it), normalised units:

    y[t] = sum_{i=1..na} A[i-1] y[t-i] + sum_{j=0..nb-1} (B[j] u[t-delay-j] + D[j] d[t-delay-j]) + c

with delay >= 1. RunSeries row k holds u[k] (held from t[k] to t[k+1]) and y[k] measured at t[k].

State-space realisation (contracts.StateSpace, x+ = A x + B u + E d + f, y = C x). With
L = delay + nb - 2 (the number of past inputs the future outputs still need; u[t] itself enters
through B when delay = 1) the state at row t, before u[t] is applied, is

    x[t] = [y[t], y[t-1], ..., y[t-na+1],  u[t-1], ..., u[t-L],  d[t-1], ..., d[t-L]]

(each entry a block of ny / nu / nd values in tag order), so y[t] = C x[t] and
statespace.rollout(ss, x[t], u[t..t+k-1], d[t..t+k-1]) returns y[t+1..t+k]. The first row of a run
with a complete state is `Orders.first_state_row` = max(na - 1, L).
"""

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from optimizer_pipeline.contracts import MIN_STD, ContractError, Normalisation, RunSeries, StateSpace
from optimizer_pipeline.model.statespace import disturbance_step_gains, integrators, rollout, settling_steps

log = logging.getLogger(__name__)

LAYOUT = ("y[t] = sum_{i=1..na} A[i-1] y[t-i] + sum_{j=0..nb-1} (B[j] u[t-delay-j] + D[j] d[t-delay-j]) + c; "
          "normalised units; A (na, ny, ny), B (nb, ny, nu), D (nb, ny, nd), c (ny,)")


# --------------------------------------------------------------------------- orders and coefficients


@dataclass(frozen=True)
class Orders:
    na: int
    nb: int
    delay: int

    @property
    def n_past(self) -> int:
        """L: past input rows kept in the state (u[t-1] .. u[t-L])."""
        return self.delay + self.nb - 2

    @property
    def first_state_row(self) -> int:
        """First row of a run whose state is fully measured."""
        return max(self.na - 1, self.n_past)

    @property
    def max_lag(self) -> int:
        """Largest lag of any regressor: a fitted target row needs this many rows before it."""
        return max(self.na, self.delay + self.nb - 1)

    def n_params(self, ny: int, nu: int, nd: int) -> int:
        return (self.na * ny + self.nb * (nu + nd) + 1) * ny


@dataclass(frozen=True, eq=False)
class ArxModel:
    """ARX coefficients (see the module docstring): A (na, ny, ny), B (nb, ny, nu), D (nb, ny, nd), c (ny,)."""

    orders: Orders
    A: np.ndarray
    B: np.ndarray
    D: np.ndarray
    c: np.ndarray

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.A.shape[1], self.B.shape[2], self.D.shape[2]

    def theta(self) -> np.ndarray:
        """Regression matrix Theta (p, ny): rows y lag 1..na, u lag delay.., d lag delay.., intercept."""
        return np.vstack([self.A.transpose(0, 2, 1).reshape(-1, self.A.shape[1]),
                          self.B.transpose(0, 2, 1).reshape(-1, self.A.shape[1]),
                          self.D.transpose(0, 2, 1).reshape(-1, self.A.shape[1]),
                          self.c[None, :]])

    @staticmethod
    def from_theta(orders: Orders, theta: np.ndarray, nu: int, nd: int) -> "ArxModel":
        ny = theta.shape[1]
        na, nb = orders.na, orders.nb
        a_end, b_end = na * ny, na * ny + nb * nu
        return ArxModel(orders,
                        theta[:a_end].reshape(na, ny, ny).transpose(0, 2, 1).copy(),
                        theta[a_end:b_end].reshape(nb, nu, ny).transpose(0, 2, 1).copy(),
                        theta[b_end:b_end + nb * nd].reshape(nb, nd, ny).transpose(0, 2, 1).copy(),
                        theta[-1].copy())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able coefficients for ModelArtifact.coefficients."""
        return {"layout": LAYOUT, "A": self.A.tolist(), "B": self.B.tolist(), "D": self.D.tolist(),
                "c": self.c.tolist()}

    @staticmethod
    def from_dict(orders: Orders, doc: Mapping[str, Any], nu: int, nd: int) -> "ArxModel":
        ny = len(doc["c"])
        return ArxModel(orders, np.asarray(doc["A"], float).reshape(orders.na, ny, ny),
                        np.asarray(doc["B"], float).reshape(orders.nb, ny, nu),
                        np.asarray(doc["D"], float).reshape(orders.nb, ny, nd),
                        np.asarray(doc["c"], float).reshape(ny))

    def realise(self) -> StateSpace:
        """The state-space realisation with the state order of the module docstring."""
        ny, nu, nd = self.dims
        na, nb, delay, L = self.orders.na, self.orders.nb, self.orders.delay, self.orders.n_past
        nyx, nux = na * ny, L * nu
        nx = nyx + nux + L * nd
        A = np.zeros((nx, nx))
        B = np.zeros((nx, nu))
        E = np.zeros((nx, nd))
        for i in range(na):  # y[t+1] row block: A_i y[t+1-i] with y[t+1-i] in y-slot i-1
            A[:ny, i * ny:(i + 1) * ny] = self.A[i]
        for j in range(nb):  # u[t+1-delay-j] is lag l = delay+j-1 from t: the input when l = 0
            lag = delay + j - 1
            if lag == 0:
                B[:ny] = self.B[j]
                E[:ny] = self.D[j]
            else:
                A[:ny, nyx + (lag - 1) * nu:nyx + lag * nu] = self.B[j]
                A[:ny, nyx + nux + (lag - 1) * nd:nyx + nux + lag * nd] = self.D[j]
        A[ny:nyx, :nyx - ny] = np.eye(nyx - ny)  # shift y[t], ... one slot older
        if L:
            B[nyx:nyx + nu] = np.eye(nu)  # u[t] becomes u-slot 0
            A[nyx + nu:nyx + nux, nyx:nyx + nux - nu] = np.eye(nux - nu)
            E[nyx + nux:nyx + nux + nd] = np.eye(nd)
            A[nyx + nux + nd:, nyx + nux:nx - nd] = np.eye(L * nd - nd)
        f = np.zeros(nx)
        f[:ny] = self.c
        C = np.zeros((ny, nx))
        C[:, :ny] = np.eye(ny)
        return StateSpace.of(A, B, E, f, C)


def spectral_radius(ss: StateSpace) -> float:
    """The largest |eigenvalue| of A, leaving out the model's integrators (statespace.integrators: a pole
    exactly at 1 that identification fixed for an integrating CV is not an instability)."""
    if not ss.A:
        return 0.0
    eigenvalues = np.linalg.eigvals(ss.arrays()[0])
    fixed = integrators(ss)[0].shape[0]
    if fixed:
        eigenvalues = eigenvalues[np.argsort(np.abs(eigenvalues - 1.0))[fixed:]]
    return float(np.max(np.abs(eigenvalues), initial=0.0))


# --------------------------------------------------------------------------- stacked runs


@dataclass(frozen=True, eq=False)
class Stacked:
    """Runs concatenated row-wise in normalised units: y (N, ny), u (N, nu), d (N, nd).

    Run r occupies rows offsets[r] : offsets[r] + lengths[r]; windows never cross a run boundary.
    plant_runs[r]: the history's run that run r is (a piece of): RunSeries.plant_run.
    """

    run_ids: tuple[str, ...]
    offsets: np.ndarray
    lengths: np.ndarray
    y: np.ndarray
    u: np.ndarray
    d: np.ndarray
    plant_runs: tuple[str, ...]


def stack_runs(runs: Sequence[RunSeries], normalisation: Normalisation, mv_tags: Sequence[str],
               cv_tags: Sequence[str], dv_tags: Sequence[str]) -> Stacked:
    """Validate run shapes against the tags and normalise with the train statistics (a CV with a
    transform through it first: the model's units, contracts.transform)."""
    missing = [t for t in (*mv_tags, *cv_tags, *dv_tags) if t not in normalisation.tags]
    if missing:
        raise ContractError(f"normalisation: no train statistics for tag(s) {', '.join(missing)}")
    stats = [normalisation.of(tags) for tags in (cv_tags, mv_tags, dv_tags)]
    flat = [tag for tags, (_, std) in zip((cv_tags, mv_tags, dv_tags), stats)
            for tag, s in zip(tags, std) if not s >= MIN_STD]
    if flat:
        raise ContractError(f"normalisation: train std of {', '.join(flat)} is below {MIN_STD:g} (never moves in the "
                            f"train runs): the model cannot be identified or scored in normalised units")
    widths = (len(cv_tags), len(mv_tags), len(dv_tags))
    parts: list[list[np.ndarray]] = [[], [], []]
    for run in runs:
        n = len(run)
        for name, values, width, part in zip(("y", "u", "d"), (run.y, run.u, run.d), widths, parts):
            values = np.asarray(values, float)
            if values.size == 0 and width == 0:
                values = np.empty((n, 0))  # no DVs: any empty array will do
            if values.shape != (n, width):
                raise ContractError(f"run {run.run_id}: {name} has shape {values.shape}, expected ({n}, {width})")
            part.append(values)
    lengths = np.array([len(r) for r in runs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(runs) else lengths
    arrays = []
    transforms = (normalisation.transforms_of(cv_tags), (None,) * widths[1], (None,) * widths[2])
    for part, width, (mean, std), transform in zip(parts, widths, stats, transforms):
        stacked = np.concatenate(part) if part else np.empty((0, width))
        # in place, a column at a time: block scoring stacks ~1e6 rows and is timed, and numpy's broadcast of a
        # row of means over them is ~3x slower
        for column, (m, s, t) in enumerate(zip(mean, std, transform)):
            values = stacked[:, column]
            if t is not None:
                values[:] = t.forward(values)
            values -= m
            values /= s
        arrays.append(stacked)
    return Stacked(tuple(r.run_id for r in runs), offsets, lengths, *arrays, tuple(r.plant_run for r in runs))


def window_rows(stacked: Stacked, first_row: int, h: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Global start rows k (and their run index) with first_row <= local k <= n - 1 - h, every `stride` rows.

    A window from k covers outputs y[k+1 .. k+h] of the same run.
    """
    rows, which = [], []
    for r, (offset, n) in enumerate(zip(stacked.offsets, stacked.lengths)):
        local = np.arange(first_row, n - h, stride, dtype=np.int64)
        rows.append(offset + local)
        which.append(np.full(local.size, r, dtype=np.int64))
    if not rows:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(rows), np.concatenate(which)


def stride_for(stacked: Stacked, first_row: int, h: int, max_windows: int) -> int:
    """Smallest stride that keeps the number of windows at or below max_windows."""
    possible = int(np.maximum(stacked.lengths - h - first_row, 0).sum())
    return max(1, math.ceil(possible / max_windows))


def states_at(stacked: Stacked, orders: Orders, rows: np.ndarray) -> np.ndarray:
    """Measured states x[k] (m, nx) at global rows k (module docstring order); rows must be valid."""
    m = rows.size
    past = rows[:, None] - 1 - np.arange(orders.n_past)
    # np.take: ~10x faster than fancy indexing for these row gathers (block scoring is timed)
    return np.hstack([np.take(stacked.y, rows[:, None] - np.arange(orders.na), axis=0).reshape(m, -1),
                      np.take(stacked.u, past, axis=0).reshape(m, -1),
                      np.take(stacked.d, past, axis=0).reshape(m, -1)])


def rollout_windows(ss: StateSpace, stacked: Stacked, orders: Orders, rows: np.ndarray,
                    h: int) -> tuple[np.ndarray, np.ndarray]:
    """h-step open-loop rollouts from the measured states at `rows` with measured MVs / DVs.

    Returns (predicted, measured), both (m, h, ny) normalised: y[k+1 .. k+h] for each start k.
    """
    steps = rows[:, None] + np.arange(h)
    predicted = rollout(ss, states_at(stacked, orders, rows), np.take(stacked.u, steps, axis=0),
                        np.take(stacked.d, steps, axis=0))
    return predicted, np.take(stacked.y[1:], steps, axis=0)  # y[k+1 .. k+h]


def nrmse(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Per-CV RMSE / std of the measured values over all windows and steps: (..., ny) -> (ny,)."""
    ny = measured.shape[-1]
    resid = (predicted - measured).reshape(-1, ny)
    scale = np.maximum(measured.reshape(-1, ny).std(axis=0), 1e-9)
    with np.errstate(over="ignore", invalid="ignore"):
        value = np.sqrt(np.mean(resid ** 2, axis=0)) / scale
    return np.where(np.isfinite(value), value, np.inf)


def rollout_nrmse(model: ArxModel, stacked: Stacked, h: int, max_windows: int = 4000,
                  first_row: int | None = None) -> np.ndarray:
    """Per-CV NRMSE of h-step open-loop rollouts (all steps 1..h) from measured states; (ny,).

    Empty (no window fits) -> array of NaN.
    """
    first = model.orders.first_state_row if first_row is None else first_row
    rows, _ = window_rows(stacked, first, h, stride_for(stacked, first, h, max_windows))
    if rows.size == 0:
        return np.full(stacked.y.shape[1], np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        return nrmse(*rollout_windows(model.realise(), stacked, model.orders, rows, h))


# --------------------------------------------------------------------------- measured state of a run

# The held disturbance is fitted over this many settling horizons of the model (docs/ARCHITECTURE.md,
# "Offset-free prediction"): after one, a held disturbance has reached its settled effect, so over two
# most residuals see that effect (the fit measures what a settled prediction holds instead of
# extrapolating to it), and the measured start state's noise has died out in the first.
DISTURBANCE_SETTLING_HORIZONS = 2
# residual values gathered per chunk of windows (4 MiB) by the held disturbance's filter (`_filtered`)
WINDOW_CHUNK_VALUES = 1 << 19


def disturbance_window(ss: StateSpace, horizon: int) -> int:
    """Rows W the held disturbance is fitted over: DISTURBANCE_SETTLING_HORIZONS x the model's settling
    horizon (model.statespace.settling_steps), at least the training horizon P; P for a model that does
    not settle."""
    settling = settling_steps(ss)
    return max(int(horizon), DISTURBANCE_SETTLING_HORIZONS * settling) if settling is not None else int(horizon)


def fit_disturbance(ss: StateSpace, stacked: Stacked, orders: Orders, rows: np.ndarray, window: int) -> np.ndarray:
    """(m, ny): per global row k, the held disturbance e (normalised units) that best explains the open-loop
    prediction error of the `window` rows up to k: least squares of r_j = G_j e over j = 1..window, where r_j
    is y[k - window + j] minus the rollout from the measured state x[k - window] driven by the measured MVs /
    DVs, and G_j its response to a held disturbance (model.statespace.disturbance_step_gains). Each
    k - window must be a row of the same run with a measured state (callers' duty: `state_and_bias`,
    uq's block starts).

    Computed as a filter of the one-step residuals (`disturbance_filter`, built once per model and
    window), not by rolling out every window: the same numbers (tests/test_model_arx.py checks them
    against the rollout), at the cost of one one-step prediction per row and a product of each row k's
    `window` residuals with the filter, however many windows overlap.

    The mean one-step residual over the last P rows (the estimate before) sums to its end samples' noise
    divided by P and, held, reaches the settled prediction amplified by the disturbance's steady gain
    1 / (1 - sum of the AR coefficients); fitted on the multi-step error, the noise reaching the settled
    prediction falls as 1 / sqrt(window) (docs/benchmark-history.md, issue 15, "The judge, session 6").
    """
    ny = stacked.y.shape[1]
    if rows.size == 0:
        return np.empty((0, ny))
    first = int(rows.min()) - window
    return _filtered(disturbance_filter(ss, window), one_step_residuals(ss, stacked, orders, first, int(rows.max())),
                     rows - window - first)


def held_errors(ss: StateSpace, stacked: Stacked, orders: Orders, rows: np.ndarray, h: int,
                window: int) -> np.ndarray:
    """(m, h, ny): per global row k, the measured y[k + 1 .. k + h] minus the h-step open-loop rollout from the
    measured state x[k] driven by the measured MVs / DVs with `fit_disturbance`'s estimate over the `window`
    rows before k held (statespace.rollout's disturbance): what a prediction from row k gets wrong.

    From the one-step residuals v, like `fit_disturbance`: the rollout's error is the realisation's
    error recursion e[j] = sum_l A_l e[j - l] + v[k + j - 1] (A_l the blocks of C A that read y[t - l + 1]:
    the other state entries are measured inputs, without error), minus the held disturbance's response.
    One pass over the rows and h steps of m-row products, instead of a rollout of the full state; each
    step's m rows are contiguous (the result is a (m, h, ny) view of them)."""
    ny = stacked.y.shape[1]
    if rows.size == 0:
        return np.empty((0, h, ny))
    first = int(rows.min()) - window
    residuals = one_step_residuals(ss, stacked, orders, first, int(rows.max()) + h)
    held = _filtered(disturbance_filter(ss, window), residuals, rows - window - first)
    errors = _open_loop_errors(ss, orders, residuals, rows - first, h)
    errors -= held @ disturbance_step_gains(ss, h).transpose(0, 2, 1)  # step j: held @ G_j'
    return errors.transpose(1, 0, 2)


def _open_loop_errors(ss: StateSpace, orders: Orders, residuals: np.ndarray, starts: np.ndarray,
                      h: int) -> np.ndarray:
    """(h, m, ny): per start s of `starts` (rows of `residuals`, the one-step residuals v), the error of the
    open-loop rollout over h steps from the measured state at s: e[j] = sum_l A_l e[j - l] + v[s + j], with
    A_l the blocks of C A that read y[t - l + 1] (`held_errors`)."""
    A, _, _, _, C = ss.arrays()
    ny = C.shape[0]
    ar = (C @ A)[:, :orders.na * ny].reshape(ny, orders.na, ny).transpose(1, 0, 2)  # A_l, l = 1..na
    errors = np.empty((h, starts.size, ny))
    for j in range(h):
        step = np.take(residuals, starts + j, axis=0)
        for lag in range(1, min(orders.na, j) + 1):
            step += errors[j - lag] @ ar[lag - 1].T
        errors[j] = step
    return errors


def fit_disturbance_measured(ss: StateSpace, stacked: Stacked, orders: Orders, row: int, window: int,
                             measured: np.ndarray) -> np.ndarray:
    """(ny,): `fit_disturbance` at one global row k, with the CV values `measured` (window, ny: of y[k -
    window + 1 .. k]) False left out: the weighted least squares of r_j = G_j e over the measured values
    alone. r_j compares y[k - window + j] with a rollout from x[k - window] driven by the MVs / DVs, so a
    value left out enters no other term (only the start state's lags, before the window). All True:
    fit_disturbance's estimate."""
    residuals = one_step_residuals(ss, stacked, orders, row - window, row)
    errors = _open_loop_errors(ss, orders, residuals, np.array([0]), window)[:, 0]  # (window, ny): r_j
    gains = disturbance_step_gains(ss, window)
    weights = np.asarray(measured, float)
    normal = np.einsum("jab,ja,jac->bc", gains, weights, gains)
    return np.linalg.lstsq(normal, np.einsum("jab,ja,ja->b", gains, weights, errors), rcond=None)[0]


def _filtered(weights: np.ndarray, residuals: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(m, ny): sum_i weights[i] residuals[starts + i], i < len(weights) (`disturbance_filter`). Per chunk of
    starts, one product of their windows of residuals, each flattened row by row and gathered from a
    strided view of the residuals, WINDOW_CHUNK_VALUES values at a time (all windows of a block scoring
    at once would be ~1e8 bytes)."""
    window, ny = weights.shape[0], residuals.shape[1]
    flat = weights.transpose(0, 2, 1).reshape(window * ny, ny)  # [(i, b), a] = weights[i, a, b]
    windows = sliding_window_view(np.ascontiguousarray(residuals).reshape(-1), window * ny)[::ny]  # s: v[s:s + W]
    size = max(1, WINDOW_CHUNK_VALUES // (window * ny))
    estimate = np.empty((starts.size, ny))
    for begin in range(0, starts.size, size):
        np.matmul(windows[starts[begin:begin + size]], flat, out=estimate[begin:begin + size])
    return estimate


def one_step_residuals(ss: StateSpace, stacked: Stacked, orders: Orders, first: int, end: int) -> np.ndarray:
    """(end - first, ny): v[t] = y[t + 1] - C (A x[t] + B u[t] + E d[t] + f) for the global rows t = first ..
    end - 1, x[t] the measured state (`states_at`), first >= orders.first_state_row (a row whose lags reach
    into the run before gives a value no caller reads). C A x[t] is summed over the state's blocks of
    shifted rows, without building x."""
    A, B, E, f, C = ss.arrays()
    ny, nu, nd = C.shape[0], B.shape[1], E.shape[1]
    read = C @ A  # (ny, nx): the blocks y[t - l] (l < na), u[t - l] and d[t - l] (1 <= l <= L)
    predicted = stacked.u[first:end] @ (C @ B).T + C @ f
    if nd:
        predicted += stacked.d[first:end] @ (C @ E).T
    column = 0
    for series, width, lags in ((stacked.y, ny, range(orders.na)), (stacked.u, nu, range(1, orders.n_past + 1)),
                                (stacked.d, nd, range(1, orders.n_past + 1))):
        for lag in lags:
            if width:
                predicted += series[first - lag:end - lag] @ read[:, column:column + width].T
            column += width
    return stacked.y[first + 1:end + 1] - predicted


@lru_cache(maxsize=256)
def disturbance_filter(ss: StateSpace, window: int) -> np.ndarray:
    """(window, ny, ny): F_i with `fit_disturbance`'s estimate e = sum_i F_i v[k - window + i - 1], i = 1..window,
    v the one-step residuals (`one_step_residuals`).

    In the realisation of this module a one-step residual enters only the rows C reads (the other state
    rows are shifted measurements), so the open-loop error of a rollout from x[k - window] is
    r_j = sum_{i <= j} H_(j-i) v[k - window + i - 1] with H_n = C A^n C'; the least squares
    e = N^-1 sum_j G_j' r_j (N = sum_j G_j' G_j) is then sum_i F_i v[.] with
    F_i = N^-1 sum_{j >= i} G_j' H_(j-i) = N^-1 T_i C', with T_i = G_i' C + T_(i+1) A summed backwards
    (O(window nx^2): a window can be thousands of rows). Cached by value like
    statespace.settling_steps: one scoring asks it of the same model for every block.
    """
    A, _, _, _, C = ss.arrays()
    gains = disturbance_step_gains(ss, window)
    normal = np.einsum("jab,jac->bc", gains, gains)  # G_1 = C C' = I, so it is invertible
    summed, tail = np.empty((window, C.shape[0], A.shape[0])), np.zeros((C.shape[0], A.shape[0]))
    for i in range(window - 1, -1, -1):
        tail = gains[i].T @ C + tail @ A
        summed[i] = tail
    weights = np.linalg.solve(normal, summed @ C.T)
    weights.flags.writeable = False  # shared by every caller of the cache
    return weights


def state_and_bias(ss: StateSpace, orders: Orders, stacked_run: Stacked, horizon: int,
                   window: int | None = None,
                   estimate: Callable[[np.ndarray, int, np.ndarray | None], np.ndarray] | None = None,
                   unmeasured: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """x0 (nx,) at the run's last row and the held disturbance `bias` (ny,), normalised units.

    bias = `estimate(rows, W)` at the last row (`fit_disturbance` of `ss` unless given: a local refit
    weighs the window's rows, model.local.local_disturbances) over W = min(window, available) rows,
    window defaulting to disturbance_window(ss, horizon) (a local model passes its artifact's,
    model/local.py), available = the rows before it with a measured state; zeros when there is none
    (logged). uq's block scores hold the same estimate, fitted over the full W rows before each block.
    `unmeasured` (n, ny): the run's CV values cleaning filled in (RunSeries.unmeasured), left out of the
    fit (`fit_disturbance_measured`; `estimate` gets the window's measured values, else None).
    """
    n = int(stacked_run.lengths[0])
    first = orders.first_state_row
    if n < first + 1:
        raise ContractError(f"run {stacked_run.run_ids[0]}: {n} rows are too few for the model state "
                            f"(na={orders.na}, nb={orders.nb}, delay={orders.delay} needs >= {first + 1})")
    x0 = states_at(stacked_run, orders, np.array([n - 1]))[0]
    available = n - 1 - first
    window = min(disturbance_window(ss, horizon) if window is None else int(window), available)
    if window <= 0:
        log.warning("run %s: no row with a one-step prediction; disturbance bias set to 0", stacked_run.run_ids[0])
        return x0, np.zeros(stacked_run.y.shape[1])
    measured = None if unmeasured is None else ~np.asarray(unmeasured, bool)[n - window:n]  # y[k - W + 1 .. k]
    measured = None if measured is None or measured.all() else measured
    if estimate is not None:
        return x0, estimate(np.array([n - 1]), window, measured)[0]
    if measured is not None:
        return x0, fit_disturbance_measured(ss, stacked_run, orders, n - 1, window, measured)
    return x0, fit_disturbance(ss, stacked_run, orders, np.array([n - 1]), window)[0]
