"""The judge's references for identification (issue 55): steady gains and their standard errors
fitted to the same runs as the product, the floor its gains are compared with.

Data, for every reference: `runs`, a sequence of (u (T, n_inputs), y (T, ny)) per run in engineering
units (the MVs, then the DVs, as inputs), each run from its own first sample; nothing crosses a run.
Every reference takes a run's plant to be at rest at its first inputs before it (the zoo's runs start
from the steady state of their first inputs, bench/zoo.py): inputs enter as deviations from the run's
first sample, held at it before the run. A CV flagged `integrating` (a level) gets a rate per sample
per unit input as its gain, and per run an offset and an initial rate as nuisance parameters;
otherwise an offset per run.

* `regularised_fir`: model/fir.py's regularised FIR (TC / DC kernel, hyperparameters by marginal
  likelihood; an integrating CV's FIR is that of its rate) for each CV; se as model/fir.py reports it
  (white-noise posterior, inflated for autocorrelated residuals unless `autocorrelation=False`).
* `miso_output_error`: per CV, per input channel K (1 + tz s) e^{-theta s} / ((1 + tau1 s)(1 + tau2 s))
  (times 1 / s for an integrating CV), discretised with a zero-order hold at the sample period (the
  exponential of the augmented matrix, as scipy.signal.cont2discrete's "zoh"; times in samples),
  fitted to the simulated output (not the one-step prediction) by scipy.optimize.least_squares. The
  gains and the nuisance parameters enter linearly and are solved for at every evaluation (variable
  projection), so the search runs over the time constants, zeros and dead times only. Dead times:
  fitted as continuous, the response at a fractional theta = d + f taken as (1 - f) times the
  response delayed d samples plus f times it delayed d + 1 (linear interpolation between whole-sample
  delays), then rounded to the nearest whole sample and the other parameters refitted with the delays
  fixed. Starts (MISO_STARTS): from the regularised FIR's step response per channel: the dead time
  where it first leaves 5 % of its final value, the lag from where it reaches 63 %, a right-half-plane
  zero where it first moves the other way by more than 10 %: as one lag, as two equal lags, as a
  slower lag. The best start's fit is kept.
* `oracle`: the same output-error fit with each channel's TRUE structure (number of lags, a zero or
  not, integrating or not, the whole-sample dead time, fixed), started from the true time constants
  and zero and from them halved and doubled. A channel without lag that does not integrate (the zoo's
  absent channels, gain 0) is a static gain behind its dead time.

Output-error standard errors: the Gauss-Newton covariance at the optimum, sigma^2 (J' J)^-1 over the
gains, time constants and zeros with the nuisance parameters projected out, sigma^2 = RSS / (rows -
parameters): it assumes white output noise (a drift makes it too small) and takes the rounded dead
times as known.

Each returns an `Estimate`: gains (ny, n_inputs), se (ny, n_inputs), seconds, and per CV its detail.
"""

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.linalg import expm
from scipy.optimize import least_squares
from scipy.signal import lfilter

from optimizer_pipeline.model.fir import FirGains, fit_fir, taps_for

MIN_TAU = 0.1  # samples: time constants below this are indistinguishable from none at one sample
MAX_TAU_RUNS = 5.0  # time constants up to this many times the longest run
MAX_ZERO_RUNS = 5.0  # |tz| likewise
LEAVE_FRACTION = 0.05  # the FIR step response has left zero at this fraction of its final value
RISE_FRACTION = 1.0 - math.exp(-1.0)  # 63 %: one time constant after the dead time
INVERSE_FRACTION = 0.10  # an initial move the other way beyond this fraction: a right-half-plane zero
MISO_STARTS = ("one lag", "two equal lags", "slower lag")
# The judge's FIR may be longer and searched further than model/fir.py's defaults (400 taps over the
# inputs, 150 evaluations): 600 taps over the inputs (a 4-input plant settling in 150 samples), 400
# evaluations per CV (~0.05 s each at 600 taps on one core)
FIR_MAX_COEFFICIENTS = 600
FIR_MAX_EVALUATIONS = 400
FIR_SETTLING_DEFAULT = None  # no settling guess: the FIR as long as `taps_for` allows for the shortest run
DERIVATIVE_STEP = 1e-4  # central differences of the responses for the Gauss-Newton covariance
START_NFEV, POLISH_NFEV = 30, 150  # least_squares evaluations per start, and for the best start's polish
LSQ_TOL = 1e-7  # least_squares' ftol / xtol / gtol: cost changes this small move a gain far less than its se


@dataclass(frozen=True)
class Estimate:
    """A reference's steady gains (ny, n_inputs) and standard errors (same units: CV per input unit,
    an integrating CV's per sample), the wall time of the fit, and what each CV's fit recorded."""

    gains: np.ndarray
    se: np.ndarray
    seconds: float
    detail: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ChannelForm:
    """The transfer function of one channel: `lags` first-order lags, a numerator (1 + tz s) or not,
    1 / s or not; `delay` a whole number of samples, or None to fit it."""

    lags: int
    zero: bool
    integrating: bool
    delay: int | None = None

    def n_free(self) -> int:
        return self.lags + int(self.zero) + int(self.delay is None)


# --------------------------------------------------------------------------- data


def runs_of(frame: Any, inputs: Sequence[str], outputs: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The runs of a history frame (the ingest format: `run_id`, `timestamp`, a column per tag; e.g.
    bench/zoo.py's `history(seed).frame`) as (u (T, inputs), y (T, outputs)), in the order the runs
    first appear, each sorted by time."""
    runs = []
    for _, run in frame.groupby("run_id", sort=False):
        run = run.sort_values("timestamp")
        runs.append((run[list(inputs)].to_numpy(float), run[list(outputs)].to_numpy(float)))
    return runs


def _validated(runs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(runs) == 0:
        raise ValueError("runs: expected at least one (u, y) run, got none")
    out, width = [], None
    for r, (u, y) in enumerate(runs):
        u, y = np.asarray(u, float), np.asarray(y, float)
        u = u[:, None] if u.ndim == 1 else u
        y = y[:, None] if y.ndim == 1 else y
        if u.ndim != 2 or y.ndim != 2 or u.shape[0] != y.shape[0]:
            raise ValueError(f"run {r}: expected u (T, n_inputs) and y (T, ny), got {u.shape} and {y.shape}")
        if width is None:
            width = (u.shape[1], y.shape[1])
        if (u.shape[1], y.shape[1]) != width:
            raise ValueError(f"run {r}: {u.shape[1]} inputs and {y.shape[1]} CVs, expected {width} as in run 0")
        if not (np.all(np.isfinite(u)) and np.all(np.isfinite(y))):
            raise ValueError(f"run {r}: non-finite values (NaN or inf)")
        out.append((u, y))
    return out


def _flags(integrating: Sequence[bool] | None, ny: int) -> tuple[bool, ...]:
    flags = (False,) * ny if integrating is None else tuple(bool(f) for f in integrating)
    if len(flags) != ny:
        raise ValueError(f"integrating: expected {ny} flags (one per CV), got {len(flags)}")
    return flags


class _Runs:
    """The runs of one CV padded to the longest: inputs as deviations from each run's first sample
    (R, n, m), zero after a run's end; y (R, n) likewise; `valid` (R, n); the nuisance basis per run
    (offset, and for an integrating CV an initial rate), orthonormal over the run's samples."""

    def __init__(self, runs: list[tuple[np.ndarray, np.ndarray]], cv: int, integrating: bool):
        lengths = np.array([len(u) for u, _ in runs])
        R, n, m = len(runs), int(lengths.max()), runs[0][0].shape[1]
        self.u, self.y, self.valid = np.zeros((R, n, m)), np.zeros((R, n)), np.zeros((R, n), bool)
        for r, (u, y) in enumerate(runs):
            self.u[r, :len(u)] = u - u[0]
            self.y[r, :len(u)] = y[:, cv] - y[0, cv]
            self.valid[r, :len(u)] = True
        t = np.arange(n, dtype=float)
        columns = [np.ones((R, n))] + ([np.broadcast_to(t, (R, n)).copy()] if integrating else [])
        basis = np.stack(columns, axis=2) * self.valid[:, :, None]
        self.basis = np.stack([_orthonormal(basis[r], lengths[r]) for r in range(R)])
        self.lengths, self.n_inputs, self.n_nuisance = lengths, m, R * basis.shape[2]
        self.rows = int(lengths.sum())
        self.target = self.project(self.y)
        self.longest = n

    def project(self, values: np.ndarray) -> np.ndarray:
        """`values` (R, n[, k]) with each run's nuisance part removed, zero outside the runs."""
        squeeze = values.ndim == 2
        v = values[:, :, None] if squeeze else values
        v = v * self.valid[:, :, None]
        v = v - np.einsum("rnb,rbk->rnk", self.basis, np.einsum("rnb,rnk->rbk", self.basis, v))
        return v[:, :, 0] if squeeze else v


def _orthonormal(basis: np.ndarray, length: int) -> np.ndarray:
    q = np.zeros_like(basis)
    q[:length] = np.linalg.qr(basis[:length])[0]
    return q


# --------------------------------------------------------------------------- channel responses


def _unit_response(form: ChannelForm, params: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The channel's response of unit gain to the deviations u (R, n), zero-order hold, sample period 1:
    params = log taus (form.lags), tz (form.zero), theta (delay not fixed)."""
    taus = np.exp(params[:form.lags])
    at = form.lags
    tz = float(params[at]) if form.zero else 0.0
    at += int(form.zero)
    theta = float(params[at]) if form.delay is None else float(form.delay)
    den = np.array([1.0])
    for tau in taus:
        den = np.polymul(den, [tau, 1.0])
    if form.integrating:
        den = np.polymul(den, [1.0, 0.0])
    num = np.array([tz, 1.0]) if form.zero else np.array([1.0])
    if den.size == 1:  # a static gain: the sample after the input, as a lag's first response
        base = np.concatenate([np.zeros((u.shape[0], 1)), u[:, :-1]], axis=1)
    else:
        base = lfilter(*_zoh(num, den), u, axis=1)
    d = int(math.floor(theta))
    f = theta - d
    shifted = _shift(base, d)
    return shifted if f < 1e-12 else (1.0 - f) * shifted + f * _shift(base, d + 1)


def _zoh(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zero-order-hold discretisation (sample period 1) of the strictly proper num / den as
    lfilter's (b, a): of its controllable canonical form, computed as scipy.signal.cont2discrete's
    "zoh" does (the exponential of the augmented matrix, without its conversions: this runs once per
    channel and evaluation), the transfer function read back as b(z) = det(zI - Phi + Gamma C) -
    det(zI - Phi) (single input and output, D = 0)."""
    lead = float(den[0])
    den, num = np.asarray(den, float) / lead, np.asarray(num, float) / lead
    order = den.size - 1
    A = np.zeros((order, order))
    A[0] = -den[1:]
    A[1:, :-1] = np.eye(order - 1)
    B = np.zeros((order, 1))
    B[0, 0] = 1.0
    C = np.zeros((1, order))
    C[0, order - num.size:] = num  # descending powers, right-aligned
    block = np.zeros((order + 1, order + 1))  # cont2discrete's "zoh": expm([[A, B], [0, 0]] x period)
    block[:order, :order], block[:order, order:] = A, B
    held = expm(block)
    Phi, Gamma = held[:order, :order], held[:order, order:]
    a = _charpoly(Phi)
    return _charpoly(Phi - Gamma @ C) - a, a


def _charpoly(M: np.ndarray) -> np.ndarray:
    """det(zI - M)'s coefficients, highest power first (Faddeev-LeVerrier: a small M, no eigenvalues)."""
    n = M.shape[0]
    coefficients, power = [1.0], np.zeros_like(M)
    for k in range(1, n + 1):
        power = M @ (power + coefficients[-1] * np.eye(n)) if k > 1 else M.copy()
        coefficients.append(-float(np.trace(power)) / k)
    return np.array(coefficients)


def _shift(x: np.ndarray, d: int) -> np.ndarray:
    if d <= 0:
        return x
    out = np.zeros_like(x)
    out[:, d:] = x[:, :-d]
    return out


class _OutputError:
    """The output-error fit of one CV with a ChannelForm per input (module docstring): `residuals(q)`
    of the free parameters q (per channel in order: log taus, tz, theta) with the gains and nuisance
    solved by least squares."""

    def __init__(self, data: _Runs, forms: Sequence[ChannelForm]):
        self.data, self.forms = data, list(forms)
        self.sizes = [f.n_free() for f in self.forms]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)

    def parts(self, q: np.ndarray) -> list[np.ndarray]:
        return [q[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def responses(self, q: np.ndarray) -> np.ndarray:
        """(R, n, m): each channel's unit-gain response, nuisance projected out."""
        x = np.stack([_unit_response(form, part, self.data.u[:, :, i])
                      for i, (form, part) in enumerate(zip(self.forms, self.parts(q)))], axis=2)
        return self.data.project(x)

    def gains(self, x: np.ndarray) -> np.ndarray:
        X = x[self.data.valid]
        return np.linalg.lstsq(X, self.data.target[self.data.valid], rcond=None)[0]

    def residuals(self, q: np.ndarray) -> np.ndarray:
        x = self.responses(q)
        X, y = x[self.data.valid], self.data.target[self.data.valid]
        if not np.all(np.isfinite(X)):
            return np.full(y.size, 1e6)
        return y - X @ np.linalg.lstsq(X, y, rcond=None)[0]

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """d residuals / dq with the gains and nuisance held at their least-squares values (Kaufman's
        approximation of the variable projection's Jacobian): column (i, j) is -K_i times channel i's
        response derivative (forward differences, that channel alone re-simulated) with the part the
        other channels' responses explain removed."""
        x = self.responses(q)
        valid = self.data.valid
        X = x[valid]
        K = np.linalg.lstsq(X, self.data.target[valid], rcond=None)[0]
        basis = np.linalg.qr(X)[0]
        columns = []
        for i, (form, part) in enumerate(zip(self.forms, self.parts(q))):
            lo, hi = self.bounds_of(form)
            for j in range(part.size):
                step = 1e-6 * max(1.0, abs(part[j]))
                moved = part.copy()
                moved[j] = part[j] + step if part[j] + step <= hi[j] else part[j] - step
                dx = (self._one(i, form, moved)[valid] - X[:, i]) / (moved[j] - part[j])
                columns.append(-K[i] * (dx - basis @ (basis.T @ dx)))
        return np.stack(columns, axis=1)

    def bounds_of(self, form: ChannelForm) -> tuple[list[float], list[float]]:
        longest = float(self.data.longest)
        lo = [math.log(MIN_TAU)] * form.lags + ([-MAX_ZERO_RUNS * longest] if form.zero else []) + \
            ([0.0] if form.delay is None else [])
        hi = [math.log(MAX_TAU_RUNS * longest)] * form.lags + ([MAX_ZERO_RUNS * longest] if form.zero else []) + \
            ([max(longest / 2.0, 1.0)] if form.delay is None else [])
        return lo, hi

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = [], []
        for form in self.forms:
            a, b = self.bounds_of(form)
            lo += a
            hi += b
        return np.array(lo), np.array(hi)

    def fit(self, start: np.ndarray, max_nfev: int | None = None) -> Any:
        lo, hi = self.bounds()
        x0 = np.clip(start, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        if x0.size == 0:  # only linear parameters: a least-squares solve
            return _Solution(x0, 0.5 * float(np.sum(self.residuals(x0) ** 2)))
        return least_squares(self.residuals, x0, jac=self.jacobian, bounds=(lo, hi), method="trf", x_scale="jac",
                             ftol=LSQ_TOL, xtol=LSQ_TOL, gtol=LSQ_TOL, max_nfev=max_nfev)

    def covariance(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Gains (m,), their Gauss-Newton standard errors (m,) and the residual std at q (module
        docstring); every delay must be fixed."""
        x = self.responses(q)
        valid, y = self.data.valid, self.data.target[self.data.valid]
        K = self.gains(x)
        columns = [x[valid][:, i] for i in range(len(self.forms))]
        for i, (form, part) in enumerate(zip(self.forms, self.parts(q))):
            for j in range(part.size):
                step = np.zeros_like(part)
                step[j] = DERIVATIVE_STEP * max(1.0, abs(part[j]))
                up = self._one(i, form, part + step)
                down = self._one(i, form, part - step)
                columns.append(K[i] * (up - down)[valid] / (2.0 * step[j]))
        J = np.stack(columns, axis=1)
        resid = y - x[valid] @ K
        dof = max(self.data.rows - self.data.n_nuisance - J.shape[1], 1)
        sigma2 = float(resid @ resid) / dof
        cov = sigma2 * np.linalg.pinv(J.T @ J, rcond=1e-12, hermitian=True)
        return K, np.sqrt(np.maximum(np.diag(cov)[:len(self.forms)], 0.0)), math.sqrt(sigma2)

    def _one(self, i: int, form: ChannelForm, part: np.ndarray) -> np.ndarray:
        return self.data.project(_unit_response(form, part, self.data.u[:, :, i]))


@dataclass(frozen=True)
class _Solution:
    x: np.ndarray
    cost: float


def _fit_from_starts(problem: _OutputError, starts: Sequence[np.ndarray]) -> tuple[np.ndarray, float, int]:
    """The best least-squares solution over `starts`: (q, cost, index of its start). With several
    starts, each runs START_NFEV evaluations and the best goes on to convergence (POLISH_NFEV): an
    over-parametrised channel (two lags and a zero for a first-order one) crawls along a flat valley
    where the gains no longer move."""
    best, cost, which = None, math.inf, -1
    for k, start in enumerate(starts):
        sol = problem.fit(np.asarray(start, float), START_NFEV if len(starts) > 1 else POLISH_NFEV)
        if np.isfinite(sol.cost) and sol.cost < cost:
            best, cost, which = np.asarray(sol.x, float), float(sol.cost), k
    if best is None:
        raise ValueError("no output-error start gave a finite fit")
    if len(starts) > 1:
        sol = problem.fit(best, POLISH_NFEV)
        if np.isfinite(sol.cost) and sol.cost <= cost:
            best, cost = np.asarray(sol.x, float), float(sol.cost)
    return best, cost, which


# --------------------------------------------------------------------------- the references


def regularised_fir(runs: Sequence[tuple[np.ndarray, np.ndarray]], integrating: Sequence[bool] | None = None, *,
                    n_taps: int | None = None, settling: int | None = FIR_SETTLING_DEFAULT,
                    max_coefficients: int = FIR_MAX_COEFFICIENTS, autocorrelation: bool = True,
                    max_evaluations: int | None = FIR_MAX_EVALUATIONS) -> Estimate:
    """model/fir.py's fit for each CV (module docstring). Taps: `n_taps`, else `taps_for(settling)`
    with the settling guess, else as many as the shortest run and `taps_for`'s other caps allow, with
    `max_coefficients` taps over the inputs (the FIR's cost grows as its cube). `max_evaluations` per CV."""
    started = time.perf_counter()
    runs = _validated(runs)
    ny = runs[0][1].shape[1]
    flags = _flags(integrating, ny)
    if n_taps is None:
        guess = settling if settling is not None else min(len(u) for u, _ in runs)
        n_taps = taps_for(guess, [(u, y[:, 0]) for u, y in runs], max_coefficients)
    fits: list[FirGains] = []
    for cv in range(ny):
        fits.append(fit_fir([(u, y[:, cv]) for u, y in runs], n_taps, flags[cv], autocorrelation=autocorrelation,
                            max_evaluations=max_evaluations))
    return Estimate(np.array([f.gains for f in fits]), np.array([f.se for f in fits]),
                    time.perf_counter() - started, tuple(fits))


def _fir_starts(fir: FirGains) -> list[dict[str, float]]:
    """Per input, from the FIR's step response (module docstring): theta, tau, tz (0: none)."""
    out = []
    for step, final in zip(fir.step, fir.gains):
        n = step.size
        if final == 0.0 or not np.isfinite(final):  # the gain: its final value, the tail beyond n included
            out.append({"theta": 0.0, "tau": max(n / 4.0, 1.0), "tz": 0.0})
            continue
        share = step / final
        # step[k] is the change k + first_lag samples after the step; a dead time theta shows first at theta + 1
        left = np.flatnonzero(np.abs(share) >= LEAVE_FRACTION)  # either way: an inverse response leaves first
        t_left = (int(left[0]) if left.size else 0) + fir.first_lag
        risen = np.flatnonzero(share >= RISE_FRACTION)
        t_rise = (int(risen[0]) if risen.size else n - 1) + fir.first_lag
        theta = float(max(t_left - 1, 0))
        tau = float(max(t_rise - 1 - theta, 0.5))
        before = share[:max(t_rise - fir.first_lag, 1)]
        tz = -0.5 * tau if before.size and before.min() < -INVERSE_FRACTION else 0.0
        out.append({"theta": theta, "tau": tau, "tz": tz})
    return out


def miso_output_error(runs: Sequence[tuple[np.ndarray, np.ndarray]], integrating: Sequence[bool] | None = None, *,
                      fir: Estimate | None = None, n_taps: int | None = None,
                      settling: int | None = FIR_SETTLING_DEFAULT) -> Estimate:
    """Per CV the output-error fit of module docstring's second reference. `fir`: the regularised FIR
    of the same runs for the starts (fitted here when not given, with `n_taps` / `settling`)."""
    started = time.perf_counter()
    runs = _validated(runs)
    ny, m = runs[0][1].shape[1], runs[0][0].shape[1]
    flags = _flags(integrating, ny)
    if fir is None:
        fir = regularised_fir(runs, flags, n_taps=n_taps, settling=settling)
    gains, se, detail = np.zeros((ny, m)), np.zeros((ny, m)), []
    for cv in range(ny):
        data = _Runs(runs, cv, flags[cv])
        guesses = _fir_starts(fir.detail[cv])
        forms = [ChannelForm(2, True, flags[cv]) for _ in range(m)]
        problem = _OutputError(data, forms)
        starts = []
        for name in MISO_STARTS:
            q = []
            for g in guesses:
                tau = g["tau"]
                taus = {"one lag": (tau, MIN_TAU * 2), "two equal lags": (tau / 2.0, tau / 2.0),
                        "slower lag": (2.0 * tau, MIN_TAU * 2)}[name]
                q += [math.log(max(taus[0], MIN_TAU * 2)), math.log(max(taus[1], MIN_TAU * 2)), g["tz"], g["theta"]]
            starts.append(np.array(q))
        q, cost, which = _fit_from_starts(problem, starts)
        delays = [int(round(part[-1])) for part in problem.parts(q)]
        fixed = _OutputError(data, [ChannelForm(2, True, flags[cv], d) for d in delays])
        q_fixed = np.concatenate([part[:-1] for part in problem.parts(q)])
        q_fixed, cost_fixed, _ = _fit_from_starts(fixed, [q_fixed])
        K, s, noise = fixed.covariance(q_fixed)
        gains[cv], se[cv] = K, s
        detail.append({"start": MISO_STARTS[which], "delays": delays, "cost": cost_fixed, "noise_std": noise,
                       "params": q_fixed.tolist()})
    return Estimate(gains, se, time.perf_counter() - started, tuple(detail))


def oracle(runs: Sequence[tuple[np.ndarray, np.ndarray]], structure: Sequence[Sequence[Any]]) -> Estimate:
    """The output-error fit of the true structure (module docstring): structure[cv][input] with
    `taus`, `delay`, `zero` and `integrating` (bench/zoo.py's ChannelTruth; its gain is not used)."""
    started = time.perf_counter()
    runs = _validated(runs)
    ny, m = runs[0][1].shape[1], runs[0][0].shape[1]
    if len(structure) != ny or any(len(row) != m for row in structure):
        raise ValueError(f"structure: expected {ny} rows of {m} channels, got "
                         f"{[len(row) for row in structure]}")
    gains, se, detail = np.zeros((ny, m)), np.zeros((ny, m)), []
    for cv, row in enumerate(structure):
        data = _Runs(runs, cv, any(bool(ch.integrating) for ch in row))
        forms = [ChannelForm(len(ch.taus), ch.zero is not None, bool(ch.integrating), int(ch.delay)) for ch in row]
        problem = _OutputError(data, forms)
        starts = []
        for factor in (1.0, 0.5, 2.0):
            q = []
            for ch in row:
                q += [math.log(max(factor * tau, MIN_TAU * 2)) for tau in ch.taus]
                if ch.zero is not None:
                    q.append(float(ch.zero))
            starts.append(np.array(q))
        q, cost, which = _fit_from_starts(problem, starts)
        K, s, noise = problem.covariance(q)
        gains[cv], se[cv] = K, s
        detail.append({"start": (1.0, 0.5, 2.0)[which], "cost": cost, "noise_std": noise, "params": q.tolist()})
    return Estimate(gains, se, time.perf_counter() - started, tuple(detail))
