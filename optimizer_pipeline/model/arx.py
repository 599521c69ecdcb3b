"""ARX models in normalised units: layout, realisation, regressors, ridge fit, order / ridge selection
by validation rollout, multi-step (simulation-error) refinement and the measured state of a run.

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
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from optimizer_pipeline.contracts import MIN_STD, ContractError, Normalisation, RunSeries, StateSpace
from optimizer_pipeline.model.statespace import rollout

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
    return float(np.max(np.abs(np.linalg.eigvals(ss.arrays()[0])))) if ss.A else 0.0


# --------------------------------------------------------------------------- stacked runs


@dataclass(frozen=True, eq=False)
class Stacked:
    """Runs concatenated row-wise in normalised units: y (N, ny), u (N, nu), d (N, nd).

    Run r occupies rows offsets[r] : offsets[r] + lengths[r]; windows never cross a run boundary.
    """

    run_ids: tuple[str, ...]
    offsets: np.ndarray
    lengths: np.ndarray
    y: np.ndarray
    u: np.ndarray
    d: np.ndarray


def stack_runs(runs: Sequence[RunSeries], normalisation: Normalisation, mv_tags: Sequence[str],
               cv_tags: Sequence[str], dv_tags: Sequence[str]) -> Stacked:
    """Validate run shapes against the tags and normalise with the train statistics."""
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
    for part, width, (mean, std) in zip(parts, widths, stats):
        stacked = np.concatenate(part) if part else np.empty((0, width))
        stacked -= mean  # in place: block scoring stacks ~1e6 rows and is timed
        stacked /= std
        arrays.append(stacked)
    return Stacked(tuple(r.run_id for r in runs), offsets, lengths, *arrays)


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


# --------------------------------------------------------------------------- regression


def _lagged(stacked: Stacked, rows: np.ndarray, na: int, lag: int) -> np.ndarray:
    """Regressors of target rows: [y lag 1..na, u lag 1..lag, d lag 1..lag, 1] (m, p_full)."""
    m = rows.size
    ylags = rows[:, None] - 1 - np.arange(na)
    ulags = rows[:, None] - 1 - np.arange(lag)
    return np.hstack([stacked.y[ylags].reshape(m, -1), stacked.u[ulags].reshape(m, -1),
                      stacked.d[ulags].reshape(m, -1), np.ones((m, 1))])


def _columns(orders: Orders, na_full: int, lag_full: int, ny: int, nu: int, nd: int) -> np.ndarray:
    """Columns of the full lag matrix that form the regressors of `orders` (Theta row order)."""
    y_cols = np.arange(orders.na * ny)
    lags = np.arange(orders.delay - 1, orders.delay - 1 + orders.nb)  # zero-based lag index
    u_cols = na_full * ny + (lags[:, None] * nu + np.arange(nu)).ravel()
    d_cols = na_full * ny + lag_full * nu + (lags[:, None] * nd + np.arange(nd)).ravel()
    return np.concatenate([y_cols, u_cols, d_cols, [na_full * ny + lag_full * (nu + nd)]]).astype(np.int64)


class RidgeProblem:
    """Normal equations of the one-step ARX regression on train rows shared by every candidate.

    Target rows start after the largest lag of all candidates so every candidate sees the same rows;
    regressors never cross run boundaries. Objective per CV: mean squared one-step error + ridge *
    ||theta without intercept||^2 (normalised units, so one ridge scale fits every tag).
    """

    def __init__(self, train: Stacked, candidates: Sequence[Orders]):
        self.na_full = max(o.na for o in candidates)
        self.lag_full = max(o.delay + o.nb - 1 for o in candidates)
        first = max(o.max_lag for o in candidates)
        rows, _ = window_rows(train, first, 0, 1)  # every target row with all its lags in the run
        self.n_rows = rows.size
        phi = _lagged(train, rows, self.na_full, self.lag_full)
        self.gram = phi.T @ phi / max(rows.size, 1)
        self.cross = phi.T @ train.y[rows] / max(rows.size, 1)
        self.dims = train.y.shape[1], train.u.shape[1], train.d.shape[1]

    def fit(self, orders: Orders, ridge: float) -> ArxModel:
        ny, nu, nd = self.dims
        cols = _columns(orders, self.na_full, self.lag_full, ny, nu, nd)
        gram = self.gram[np.ix_(cols, cols)]
        penalty = np.full(cols.size, ridge)
        penalty[-1] = 0.0  # the intercept is not shrunk
        # A tiny floor keeps collinear regressors (e.g. a constant MV) solvable without changing the fit.
        theta = np.linalg.solve(gram + np.diag(penalty + 1e-12), self.cross[cols])
        return ArxModel.from_theta(orders, theta, nu, nd)


# --------------------------------------------------------------------------- multi-step refinement


def _simulate(theta: np.ndarray, orders: Orders, y_hist: np.ndarray, exo: np.ndarray,
              want_jac: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """ARX simulation (and its parameter sensitivities) over windows; the refinement's objective.

    y_hist (m, na, ny) measured y[k-na+1 .. k] (oldest first); exo (m, h, q) input regressors
    [u lags, d lags, 1] of the targets y[k+1 .. k+h]. Returns yhat (m, h, ny) and, when wanted,
    d yhat / d Theta (m, h, ny, p, ny). Statespace.rollout is the product's simulation path; this
    copy exists because the refinement needs the sensitivities alongside the outputs.
    """
    m, h, _ = exo.shape
    na, ny = orders.na, y_hist.shape[2]
    p = theta.shape[0]
    a_blocks = [theta[i * ny:(i + 1) * ny].T for i in range(na)]  # A_i (ny, ny)
    exo_part = exo @ theta[na * ny:]
    sims = [y_hist[:, i] for i in range(na)]  # index na-1 = y[k]
    sens: list[np.ndarray | None] = [None] * na
    eye = np.eye(ny)
    yhat = np.empty((m, h, ny))
    jac = np.empty((m, h, ny, p, ny)) if want_jac else None
    for s in range(h):
        phi_y = np.concatenate([sims[-1 - i] for i in range(na)], axis=1)  # [y(s-1), y(s-2), ...]
        y_now = phi_y @ theta[:na * ny] + exo_part[:, s]
        if want_jac:
            phi = np.concatenate([phi_y, exo[:, s]], axis=1)  # (m, p)
            j_now = phi[:, None, :, None] * eye[None, :, None, :]
            for i in range(na):
                if sens[-1 - i] is not None:
                    j_now = j_now + np.einsum("ab,mbrc->marc", a_blocks[i], sens[-1 - i])
            sens.append(j_now)
            jac[:, s] = j_now
        sims.append(y_now)
        yhat[:, s] = y_now
    return yhat, jac


def refine_multistep(model: ArxModel, train: Stacked, h: int, ridge: float, max_windows: int = 300,
                     max_nfev: int = 30) -> tuple[ArxModel, dict[str, Any]]:
    """Minimise the h-step open-loop simulation error on train windows, started at `model`.

    Objective: mean squared rollout residual over windows, steps and CVs + ridge * ||theta without
    intercept||^2 (scipy least_squares, Levenberg-Marquardt with analytic sensitivities).
    """
    orders = model.orders
    ny, nu, nd = model.dims
    first = orders.first_state_row
    rows, _ = window_rows(train, first, h, stride_for(train, first, h, max_windows))
    theta0 = model.theta()
    p = theta0.shape[0]
    if rows.size * h * ny < theta0.size:
        return model, {"tried": False, "reason": f"{rows.size} train windows are too few"}
    y_hist = train.y[rows[:, None] - np.arange(orders.na)[::-1]]
    target_rows = rows[:, None] + np.arange(1, h + 1)
    lags = orders.delay + np.arange(orders.nb)
    in_rows = target_rows[:, :, None] - lags  # (m, h, nb)
    exo = np.concatenate([train.u[in_rows].reshape(rows.size, h, -1), train.d[in_rows].reshape(rows.size, h, -1),
                          np.ones((rows.size, h, 1))], axis=2)
    measured = train.y[target_rows]
    scale = 1.0 / math.sqrt(rows.size * h)
    shrink = np.ones((p, ny))
    shrink[-1] = 0.0
    shrink_flat = math.sqrt(ridge) * shrink.ravel()

    def residuals(vec: np.ndarray) -> np.ndarray:
        yhat, _ = _simulate(vec.reshape(p, ny), orders, y_hist, exo, False)
        return np.concatenate([((yhat - measured) * scale).ravel(), shrink_flat * vec])

    def jacobian(vec: np.ndarray) -> np.ndarray:
        _, jac = _simulate(vec.reshape(p, ny), orders, y_hist, exo, True)
        return np.vstack([jac.reshape(-1, p * ny) * scale, np.diag(shrink_flat)])

    started = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        sol = least_squares(residuals, theta0.ravel(), jac=jacobian, method="lm", max_nfev=max_nfev)
    info = {"tried": True, "windows": int(rows.size), "nfev": int(sol.nfev), "status": int(sol.status),
            "cost_before": float(0.5 * np.sum(residuals(theta0.ravel()) ** 2)),
            "cost_after": float(sol.cost) if np.isfinite(sol.cost) else None,
            "seconds": round(time.perf_counter() - started, 4)}
    if not np.all(np.isfinite(sol.x)):
        return model, {**info, "reason": "non-finite parameters"}
    return ArxModel.from_theta(orders, sol.x.reshape(p, ny), nu, nd), info


# --------------------------------------------------------------------------- measured state of a run


def state_and_bias(ss: StateSpace, orders: Orders, stacked_run: Stacked, bias_window: int) -> tuple[np.ndarray, np.ndarray]:
    """x0 (nx,) at the run's last row and the output bias (ny,), normalised units.

    bias = mean of (measured - one-step predicted) y over the last min(bias_window, available)
    rows that have a one-step prediction; zeros when none has one (logged).
    """
    n = int(stacked_run.lengths[0])
    first = orders.first_state_row
    if n < first + 1:
        raise ContractError(f"run {stacked_run.run_ids[0]}: {n} rows are too few for the model state "
                            f"(na={orders.na}, nb={orders.nb}, delay={orders.delay} needs >= {first + 1})")
    x0 = states_at(stacked_run, orders, np.array([n - 1]))[0]
    available = n - 1 - first
    window = min(bias_window, available)
    if window <= 0:
        log.warning("run %s: no row with a one-step prediction; output bias set to 0", stacked_run.run_ids[0])
        return x0, np.zeros(stacked_run.y.shape[1])
    rows = np.arange(n - 1 - window, n - 1)
    predicted, measured = rollout_windows(ss, stacked_run, orders, rows, 1)
    return x0, np.mean(measured[:, 0] - predicted[:, 0], axis=0)
