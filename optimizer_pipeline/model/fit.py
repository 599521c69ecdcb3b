"""ARX regression with a structure per CV equation: which past CVs, and which lags of each MV and DV,
the equation of each CV has (one delay for every channel, or a delay per input-output channel);
ridge least squares on the train runs, with the normal equations kept per run so that a run can be
left out (the jackknife of the steady-state gain); and the multi-step (simulation-error) refinement
of the coefficients the structure leaves free.

A structure is realised as an ArxModel (model/arx.py layout) whose coefficients outside the
structure are zero: delay = the smallest channel delay, nb = the span of lags any channel uses.
"""

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimizer_pipeline.model.arx import ArxModel, Orders, Stacked, stride_for, window_rows

# A tiny floor keeps collinear regressors (e.g. a constant MV) solvable without changing the fit.
SOLVE_FLOOR = 1e-12
MIN_WEIGHT = 1e-12  # a fit's total row weight is at least this (no rows: the ridge alone decides)
WEIGHTED_BLOCK_VALUES = 1 << 22  # RidgeProblem.weighted_fits forms its products this many floats (32 MiB) at a time


@dataclass(frozen=True)
class Structure:
    """The regressors of each CV equation. na past values (of every CV, or with `own_ar` of its own
    only: the CVs' equations are then decoupled, MISO), nb lags of each input starting at that
    channel's delay: delays[i][v] for CV i and input v (the MVs, then the DVs), each >= 1.

    `integrating[i]`: CV i integrates its inputs (a level): its equation reads its own past only, and its
    AR coefficients sum to 1, a pole at 1 (`increments`): it is fitted as the increment y[t] - y[t-1]
    on the past na - 1 increments and the inputs. No other CV's equation reads its past: one that did
    would ramp with it (statespace.integrating_outputs) on the strength of whatever coupling the ridge
    fit. Empty: none does."""

    na: int
    nb: int
    delays: tuple[tuple[int, ...], ...]
    own_ar: bool = False
    integrating: tuple[bool, ...] = ()

    @staticmethod
    def common(orders: Orders, ny: int, nv: int, integrating: tuple[bool, ...] = ()) -> "Structure":
        """One delay for every channel and every CV's past in every equation (the plain ARX orders)."""
        return Structure(orders.na, orders.nb, ((orders.delay,) * nv,) * ny, integrating=integrating)

    def integrates(self, i: int) -> bool:
        return bool(self.integrating) and self.integrating[i]

    @property
    def orders(self) -> Orders:
        """Orders of the realisation: the smallest delay and the span of lags the channels use."""
        low, high = min(map(min, self.delays)), max(map(max, self.delays))
        return Orders(self.na, high - low + self.nb, low)

    @property
    def per_channel(self) -> bool:
        return len({d for row in self.delays for d in row}) > 1 or self.own_ar

    def n_params(self) -> int:
        return sum((self.na - 1 if self.integrates(i) else self.na * len(self.past_read(i))) + self.nb * len(row)
                   + 1 for i, row in enumerate(self.delays))

    def past_read(self, i: int) -> list[int]:
        """The CVs whose past the equation of CV i reads (`integrating`, `own_ar`)."""
        if self.own_ar or self.integrates(i):
            return [i]
        return [k for k in range(len(self.delays)) if not self.integrates(k)]

    def record(self) -> dict[str, Any]:
        record = {"na": self.na, "nb": self.nb, "delays": [list(row) for row in self.delays], "own_ar": self.own_ar}
        if any(self.integrating):
            record["integrating"] = list(self.integrating)
        return record


def _lagged(stacked: Stacked, rows: np.ndarray, na: int, lag: int) -> np.ndarray:
    """Regressors of target rows: [y lag 1..na, u lag 1..lag, d lag 1..lag, 1] (m, p_full)."""
    m = rows.size
    ylags = rows[:, None] - 1 - np.arange(na)
    ulags = rows[:, None] - 1 - np.arange(lag)
    return np.hstack([stacked.y[ylags].reshape(m, -1), stacked.u[ulags].reshape(m, -1),
                      stacked.d[ulags].reshape(m, -1), np.ones((m, 1))])


def layout(structure: Structure, dims: tuple[int, int, int], na_full: int,
           lag_full: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per CV i: (columns of the full lag matrix of `_lagged(na_full, lag_full)`, rows of the realised
    Theta (ArxModel.theta of `structure.orders`)) of its regressors, in the same order."""
    ny, nu, nd = dims
    orders = structure.orders
    out = []
    for i, delays in enumerate(structure.delays):
        cols = [lag * ny + k for lag in range(structure.na) for k in structure.past_read(i)]
        rows = list(cols)
        for v, delay in enumerate(delays):
            for lag in range(delay, delay + structure.nb):  # 1-based lag of the input
                q = lag - orders.delay  # its place in the realised numerator
                if v < nu:
                    cols.append(na_full * ny + (lag - 1) * nu + v)
                    rows.append(orders.na * ny + q * nu + v)
                else:
                    cols.append(na_full * ny + lag_full * nu + (lag - 1) * nd + v - nu)
                    rows.append(orders.na * ny + orders.nb * nu + q * nd + v - nu)
        cols.append(na_full * ny + lag_full * (nu + nd))
        rows.append(orders.na * ny + orders.nb * (nu + nd))
        out.append((np.asarray(cols, np.int64), np.asarray(rows, np.int64)))
    return out


def free_mask(structure: Structure, dims: tuple[int, int, int]) -> np.ndarray:
    """(p, ny) bool: the realised Theta entries the structure leaves free (the rest stay zero; an
    integrating CV's AR coefficients stay as fitted, their sum 1)."""
    orders = structure.orders
    ny, nu, nd = dims
    mask = np.zeros((orders.n_params(ny, nu, nd) // ny, ny), bool)
    for i, (_, rows) in enumerate(layout(structure, dims, structure.na, orders.delay + orders.nb - 1)):
        mask[rows[structure.na:] if structure.integrates(i) else rows, i] = True
    return mask


def increments(na: int, n_cols: int) -> np.ndarray:
    """T (n_cols, n_cols - 1): an integrating CV's coefficients over its regressors (its own y lags 1..na
    first, then the inputs and the intercept) are T beta + e_1, beta those of its increment
    y[t] - y[t-1] on the increments at lags 1..na-1 and the inputs: y lag 1 gets 1 + beta_1, lag j
    beta_j - beta_(j-1), lag na -beta_(na-1); the AR coefficients sum to 1 (`Structure.integrating`)."""
    T = np.zeros((n_cols, n_cols - 1))
    for j in range(na - 1):
        T[j, j], T[j + 1, j] = 1.0, -1.0
    T[na:, na - 1:] = np.eye(n_cols - na)
    return T


class RidgeProblem:
    """Normal equations of the one-step ARX regression on the train rows, shared by every structure
    whose lags fit in (na_full, lag_full), summed per train run (per run of the plant: the pieces of
    a run cut at a gap are one run here, for the jackknife that leaves a run out).

    Target rows start after the largest lag so every structure sees the same rows; regressors never
    cross run boundaries. Objective per CV: mean squared one-step error + ridge * ||theta without
    intercept||^2 (normalised units, so one ridge scale fits every tag). `weighted` gives the same
    problem with the mean weighted per target row (model/local.py: a fit around an operating point);
    run_rows then holds each run's total weight.
    """

    def __init__(self, train: Stacked, na_full: int, lag_full: int):
        self.na_full, self.lag_full = na_full, lag_full
        self.rows, which = window_rows(train, max(na_full, lag_full), 0, 1)  # every target row with its lags
        self.n_rows = self.rows.size
        self.dims = train.y.shape[1], train.u.shape[1], train.d.shape[1]
        self._phi, self._target = _lagged(train, self.rows, na_full, lag_full), train.y[self.rows]
        starts = np.flatnonzero(np.diff(which, prepend=-1))  # window_rows keeps each run's rows together
        groups: dict[str, list[slice]] = {}  # the rows of each run of the plant, its pieces together
        for a, b in zip(starts, [*starts[1:], self.n_rows]):
            groups.setdefault(train.plant_runs[which[a]], []).append(slice(a, b))
        self._groups = list(groups.values())
        self._accumulate(np.ones(self.n_rows))

    def _accumulate(self, w: np.ndarray) -> None:
        phi, weighted, groups = self._phi, self._phi * w[:, None], self._groups
        self.run_rows = np.array([sum(w[span].sum() for span in group) for group in groups])
        self.run_gram = np.stack([sum(weighted[span].T @ phi[span] for span in group) for group in groups]) \
            if groups else np.zeros((0, phi.shape[1], phi.shape[1]))
        self.run_cross = np.stack([sum(weighted[span].T @ self._target[span] for span in group) for group in groups]) \
            if groups else np.zeros((0, phi.shape[1], self.dims[0]))

    def weighted(self, weights: np.ndarray) -> "RidgeProblem":
        """The same regression with target row i (of `rows`) weighted by weights[i] >= 0."""
        problem = copy.copy(self)
        problem._accumulate(np.asarray(weights, float))
        return problem

    @staticmethod
    def for_orders(train: Stacked, candidates: list[Orders]) -> "RidgeProblem":
        return RidgeProblem(train, max(o.na for o in candidates), max(o.max_lag for o in candidates))

    @property
    def n_runs(self) -> int:
        return len(self.run_rows)

    def fit(self, structure: Structure | Orders, ridge: float, without: int | None = None) -> ArxModel:
        """The ridge fit of `structure` (Orders: the common structure); `without`: leave that train
        run of the plant (index among the runs with rows, pieces together) out."""
        if isinstance(structure, Orders):
            structure = Structure.common(structure, self.dims[0], self.dims[1] + self.dims[2])
        keep = np.ones(self.n_runs, bool)
        if without is not None:
            keep[without] = False
        n = max(float(self.run_rows[keep].sum()), MIN_WEIGHT)
        return self._solve(structure, ridge, self.run_gram[keep].sum(axis=0) / n, self.run_cross[keep].sum(axis=0) / n)

    def effective_params(self, structure: Structure, ridge: float) -> float:
        """The fit's effective degrees of freedom: per CV the trace of its ridge hat matrix,
        tr(G (G + R)^-1), G the mean normal matrix of its regressors and R the ridge (the intercept not
        shrunk), summed over the CVs. A least-squares fit has as many as it has coefficients; the ridge
        takes away the directions the rows hardly determine."""
        gram = self.run_gram.sum(axis=0) / max(float(self.run_rows.sum()), MIN_WEIGHT)
        total = 0.0
        for i, (cols, _) in enumerate(layout(structure, self.dims, self.na_full, self.lag_full)):
            T = increments(structure.na, cols.size) if structure.integrates(i) else np.eye(cols.size)
            penalty = np.full(T.shape[1], ridge)
            penalty[-1] = 0.0
            block = T.T @ gram[np.ix_(cols, cols)] @ T
            total += float(np.trace(np.linalg.solve(block + np.diag(penalty + SOLVE_FLOOR), block)))
        return total

    def weighted_fits(self, structure: Structure, ridge: float, weights: np.ndarray) -> list[ArxModel]:
        """`weighted(weights[k]).fit(structure, ridge)` for every row k of `weights` (m, n_rows), the
        weighted normal equations of all of them from one product per block of target rows (as many as
        keep the block's products within WEIGHTED_BLOCK_VALUES floats)."""
        phi, target = self._phi, self._target
        p, ny = phi.shape[1], target.shape[1]
        weights = np.atleast_2d(np.asarray(weights, float))
        if not weights.size:
            return []
        gram, cross = np.zeros((len(weights), p * p)), np.zeros((len(weights), p * ny))
        rows = max(1, WEIGHTED_BLOCK_VALUES // (p * p + p * ny))
        for start in range(0, self.n_rows, rows):
            block = slice(start, start + rows)
            gram += weights[:, block] @ (phi[block, :, None] * phi[block, None, :]).reshape(-1, p * p)
            cross += weights[:, block] @ (phi[block, :, None] * target[block, None, :]).reshape(-1, p * ny)
        total = np.maximum(weights.sum(axis=1), MIN_WEIGHT)[:, None]
        gram, cross = (gram / total).reshape(-1, p, p), (cross / total).reshape(-1, p, ny)
        return [self._solve(structure, ridge, g, c) for g, c in zip(gram, cross)]

    def _solve(self, structure: Structure, ridge: float, gram: np.ndarray, cross: np.ndarray) -> ArxModel:
        """The ridge solution of `structure` from the mean normal equations (gram (p, p), cross (p, ny))."""
        ny, nu, nd = self.dims
        orders = structure.orders
        theta = np.zeros((orders.n_params(ny, nu, nd) // ny, ny))
        for i, (cols, rows) in enumerate(layout(structure, self.dims, self.na_full, self.lag_full)):
            block, target = gram[np.ix_(cols, cols)], cross[cols, i]
            if structure.integrates(i):  # the increment y[t] - y[t-1] (y lag 1 is cols[0]) on T's regressors
                T = increments(structure.na, cols.size)
                block, target = T.T @ block @ T, T.T @ (target - block[:, 0])
            penalty = np.full(block.shape[0], ridge)
            penalty[-1] = 0.0  # the intercept is not shrunk
            coefficients = np.linalg.solve(block + np.diag(penalty + SOLVE_FLOOR), target)
            if structure.integrates(i):
                coefficients = T @ coefficients
                coefficients[0] += 1.0
            theta[rows, i] = coefficients
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


def refine_multistep(model: ArxModel, train: Stacked, h: int, ridge: float, free: np.ndarray | None = None,
                     max_windows: int = 300, max_nfev: int = 30) -> tuple[ArxModel, dict[str, Any]]:
    """Minimise the h-step open-loop simulation error on train windows, started at `model`, over the
    coefficients `free` marks ((p, ny) bool over Theta; None = all; the others keep their values).

    Objective: mean squared rollout residual over windows, steps and CVs + ridge * ||free theta
    without intercept||^2 (scipy least_squares, Levenberg-Marquardt with analytic sensitivities).
    """
    orders = model.orders
    ny, nu, nd = model.dims
    first = orders.first_state_row
    rows, _ = window_rows(train, first, h, stride_for(train, first, h, max_windows))
    theta0 = model.theta()
    p = theta0.shape[0]
    free = np.ones(theta0.shape, bool) if free is None else np.asarray(free, bool)
    free_flat = free.ravel()
    if rows.size * h * ny < free_flat.sum():
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
    shrink_flat = math.sqrt(ridge) * shrink.ravel()[free_flat]

    def full(vec: np.ndarray) -> np.ndarray:
        theta = theta0.ravel().copy()
        theta[free_flat] = vec
        return theta.reshape(p, ny)

    def residuals(vec: np.ndarray) -> np.ndarray:
        yhat, _ = _simulate(full(vec), orders, y_hist, exo, False)
        return np.concatenate([((yhat - measured) * scale).ravel(), shrink_flat * vec])

    def jacobian(vec: np.ndarray) -> np.ndarray:
        _, jac = _simulate(full(vec), orders, y_hist, exo, True)
        return np.vstack([jac.reshape(-1, p * ny)[:, free_flat] * scale, np.diag(shrink_flat)])

    start = theta0.ravel()[free_flat]
    from scipy.optimize import least_squares  # here: ~0.4 s of import the processes that never fit need not pay

    started = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        sol = least_squares(residuals, start, jac=jacobian, method="lm", max_nfev=max_nfev)
    info = {"tried": True, "windows": int(rows.size), "horizon": int(h), "nfev": int(sol.nfev),
            "status": int(sol.status), "cost_before": float(0.5 * np.sum(residuals(start) ** 2)),
            "cost_after": float(sol.cost) if np.isfinite(sol.cost) else None,
            "seconds": round(time.perf_counter() - started, 4)}
    if not np.all(np.isfinite(sol.x)):
        return model, {**info, "reason": "non-finite parameters"}
    return ArxModel.from_theta(orders, full(sol.x), nu, nd), info
