"""The regularised FIR of one CV: its steady gains with standard errors that can be trusted, the
independent cross-check of an identified model's gains (issue 55).

Model (engineering units, per CV, MISO, every run r on its own): with x_i[t] = u_i[t] - u_ri[0], each
input's deviation from the run's first sample, and the FIR g_i[k] of input i,

    y[t] - y_r[0] = sum_i sum_{k=f..f+n-1} g_i[k] x_i[t-k] + c_r + e[t]

an offset c_r per run (flat prior, marginalised: each run's rows are centred before the fit, so a
jump between runs biases nothing). The steady gain of input i is K_i = sum_k g_i[k]. The first lag f
(`first_lag`) is 1 by default: in the product's sampling convention (model/arx.py: u[k] is held from
t[k], y[k] is measured at t[k]) an input moves the CV one sample later at the earliest, and a tap at
lag 0 would only pick up the noise of a measurement the input was set from (a level controller in
a closed-loop step test); 0 for data sampled otherwise.

Coordinates (`coordinates`):

* ``"step"`` (default): the same FIR written with its step response S_i[k] = sum_{j<=k} g_i[j] =
  K_i + d_i[k]: y[t] - y_r[0] = sum_i (K_i x_i[t] + sum_k d_i[k] (x_i[t-k] - x_i[t-k-1])) + c_r + e[t]
  (summation by parts). The kernel prior is on d_i, the step response's distance from its final
  value, which dies out; the gain K_i has a flat prior (marginalised like the offsets in the
  marginal likelihood; its posterior is the least-squares fit of what the shape leaves). A prior on
  every tap shrinks their sum toward 0: measured on a two-input plant (tests/test_fir.py's) the taps'
  sum came out 0.5 se low at noise 0.1 and 1.0 se low at noise 0.02, and a response longer than the
  FIR lost its tail from the sum; in step coordinates the bias is under 0.35 se in both.
* ``"taps"``: the prior on the taps g_i themselves and K_i their sum (the textbook form).

The tail (`tail`, default on): a response that has not died out within n samples keeps going as
the kernel expects it to: the last coefficient of each input stands for a geometric tail, d_i[n-1]
(or g_i[n-1]) times p_i^j for j = 0, 1, ..., p_i = sqrt(lambda_i) (the decay of the prior's standard
deviation per sample), lambda_i from a first TC fit without it. On tests/test_fir.py's plant with a
time constant of 15 samples and 60 taps, the taps' sum without the tail was 7 se off; with the tail
in step coordinates 1.1 se. Keep n past the slowest channel's settling anyway (`taps_for`).

An integrating CV (`integrating=True`, a level): the FIR is that of its rate, y[t] - y[t-1] = sum_i
sum_k g_i[k] x_i[t-k] + c_r, c_r the run's rate at its start, and the gains are rates, CV units per
sample per unit of the input. Which noise is white (`integrating_noise`):

* ``"level"`` (default): the level's measurement noise. The same FIR is fitted to the level,
  y[t] - y_r[0] = sum_i sum_k g_i[k] X_i[t-k] + c_r t + o_r with X_i the running sum of x_i (the
  level's change is the sum of its rates), an offset and a rate per run.
* ``"increment"``: the increments y[t] - y[t-1] are the target and their noise is white (a level
  driven by an unmeasured random flow). Measurement noise differenced is negatively correlated (lag-1
  correlation -0.5); its white-noise se is then ~3x the true spread (measured: 100 % of the truths
  within 1 se), where the level form's covers 67 % / 94 % within 1 / 2 se.

Before a run (`pre_run`):

* ``"held"`` (default): the inputs are taken as held at the run's first sample before it, so every
  sample of the run is a regression row. Right for step tests that start from a plant at rest; a
  plant still moving from earlier moves at a run's start leaves a transient no regressor explains
  (its residuals are then correlated, and the autocorrelation correction widens the se).
* ``"skip"``: a run's rows start once its own samples hold every regressor (t >= n - 1; t >= n in
  step coordinates, which read increments): nothing is assumed before it but in the tail, at the
  cost of n rows per run.

No regressor reaches into another run in either case.

Prior (empirical Bayes, Pillonetto, Chen & Ljung's kernel methods): the shape coefficients of input
i (d_i, or g_i) are Gaussian, N(0, c_i K_i), independent across inputs, with the TC kernel K[k, l] =
lambda^max(k, l) or the DC kernel K[k, l] = lambda^((k + l) / 2) rho^|k - l| (the TC kernel is the DC
kernel with rho = sqrt(lambda)). The hyperparameters (c_i, lambda_i[, rho_i]) and the noise variance
maximise the marginal likelihood of the centred rows (L-BFGS-B on log c, logit lambda and atanh rho,
with its analytic gradient; the noise variance is profiled out). TC is fitted from a few starts, DC
from TC's optimum; DC is kept only when its log marginal likelihood is higher by more than one per
hyperparameter it adds (Akaike's penalty: DC nests TC, so it never fits worse).

Standard errors: the gains' posterior covariance under the fitted prior and noise (Sigma_post of the
shape carried into K, plus K's own least-squares part in step coordinates), plus the spread the
hyperparameters' own uncertainty gives them (Laplace: the marginal likelihood's curvature at its
optimum, `_Evidence.hyper_spread`; leaving it out, the se were ~20 % small on a gain whose shape the
data pin down poorly). Measured (tests/test_fir.py's plant, 150-200 noise draws): 0.67-0.72 of the
truths within 1 se and 0.95-0.99 within 2 se at noise 0.1 and 0.02.

Noise model: e white, Gaussian, one variance per CV. Coloured noise (an unmeasured drift, a level's
differenced measurement noise) is not covered by it: the posterior then misstates the gains' spread,
mostly too small (positively correlated noise puts its variance at the low frequencies a steady gain
is made of). With `autocorrelation=True` (default) the variance is inflated by the long-run factor
f_i = w_i' Omega w_i / (gamma(0) w_i' w_i): w_i the weights of the rows in gain i's estimate, Omega
the covariance of an AR(p) model of the residuals (Yule-Walker, p <= AR_MAX_ORDER by BIC, p = 0
white), f_i at least 1 (a negative correlation is not taken to make the gain better known than the
white model says). Measured under AR(1) noise of pole 0.8 (tests/test_fir.py): within 2 se 0.48 of
the truths without it, 0.875 with it (within 1 se 0.23 / 0.56): close to nominal, not at it (the
residuals' AR model sees the pole a little low, and hyperparameters fitted under the white-noise
likelihood add spread). `se_white` holds the se before the factor. What stays uncovered: a model
error beyond the FIR (non-linearity, a tail the geometric one misstates), a noise correlated with
the inputs (closed loop with an unmodelled noise path), and a drift slower than the runs.

Cost: forming the normal equations (rows x (n_inputs n)^2, twice with the tail), then per
marginal-likelihood evaluation a Cholesky factor and a triangular solve of the (n_inputs n)^2
matrix; no evaluation touches the rows. `time_budget_s` stops the search (a running optimisation at
its best point) when the time spent plus the Laplace step's evaluations would exceed it;
`FirGains.budget_spent` says so. Measured on one core: 4 inputs x 80 taps x 5000 rows in ~1.0 s with
the default 1 s budget (the first TC fit, TC and DC with the tail, the Laplace step), ~2.5 s without
a budget.
"""

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.linalg import cholesky, solve_toeplitz, solve_triangular
from scipy.optimize import minimize
from scipy.signal import lfilter

TC, DC = "TC", "DC"
PRE_RUN = ("held", "skip")
COORDINATES = ("step", "taps")
INTEGRATING_NOISE = ("level", "increment")
AR_MAX_ORDER = 10  # the residuals' AR model for the autocorrelation correction, order chosen by BIC
# the AR model's autocovariance is summed to this many lags at most (and to the longest run)
LONG_RUN_LAGS = 2000
# Number of taps (`taps_for`): past the settling guess by this factor, at most the shortest run, at
# most TAP_ROWS_SHARE of the rows per tap coefficient, at most MAX_COEFFICIENTS taps over all inputs
SETTLING_MARGIN = 1.25
TAP_ROWS_SHARE = 2
MAX_COEFFICIENTS = 400
# hyperparameter bounds (optimiser coordinates): lambda in [1e-3, 1 - 1e-6], rho in tanh(+-5)
LOG_C_BOUNDS = (-25.0, 25.0)
LOGIT_LAMBDA_BOUNDS = (math.log(1e-3 / (1 - 1e-3)), math.log((1 - 1e-6) / 1e-6))
ATANH_RHO_BOUNDS = (-5.0, 5.0)
# TC starts: prior impulse responses decaying with these time constants, as fractions of n
TC_START_DECAYS = (0.25, 0.08)
DC_PENALTY_PER_HYPER = 1.0  # Akaike: log marginal likelihood a DC fit must gain per added hyperparameter
DEFAULT_TIME_BUDGET_S = 1.0
# the hyperparameters' uncertainty (`_Evidence.hyper_spread`): forward-difference step in the optimiser
# coordinates, and how close to a bound a coordinate counts as on it
HYPER_STEP = 1e-4
# L-BFGS-B's relative tolerance on -2 log p (values of thousands: 1e-10 is ~1e-6 in log p), and the looser
# one of the fit that only gives the tail its decay
SEARCH_FTOL = 1e-10
TAIL_FTOL = 1e-6
HYPER_BOUND_MARGIN = 1e-3


@dataclass(frozen=True)
class FirGains:
    """A regularised FIR fit of one CV (module docstring), engineering units.

    gains (n_inputs,): the steady gains, CV units per unit of each input (integrating: the rate, per
    sample); se (n_inputs,): their standard errors in the same units, with the autocorrelation
    correction when the fit asked for it; se_white: without it (white noise: the posterior's and the
    hyperparameters' spread); inflation (n_inputs,): se^2 / se_white^2 (1 without the correction);
    cov (n_inputs, n_inputs): the gains' covariance under white noise (se_white^2 on its diagonal);
    step (n_inputs, n): the posterior mean step response, step[i, k] the CV's change k + first_lag
    samples after a unit step of input i held from sample 0 (with first_lag 1, model/step_response.py's
    `response[k]`; its rate for an integrating CV); taps (n_inputs, n): its increments, the FIR,
    taps[i, k] multiplying input i k + first_lag samples back (the tail beyond adds gains - step[:, -1]);
    tail (n_inputs,): the tail's decay per sample (0: none); kernel "TC" or "DC"; coordinates "step" or
    "taps"; first_lag: the lag of step[:, 0] and taps[:, 0]; hyper: per input `c<i>` (the prior's
    variance scale, (CV per input unit)^2), `lambda<i>`, `rho<i>` (DC) and `tail<i>`; noise_std: the
    fitted white-noise std (CV units; of the level or of its increments for an integrating CV, as
    `integrating_noise` says);
    log_marginal: the log marginal likelihood of the centred rows; noise_ar: the residuals' AR
    coefficients (empty: white); rows: regression rows; log_marginals: per kernel tried; budget_spent:
    the time budget stopped the search; seconds: wall time of the fit.
    """

    gains: np.ndarray
    se: np.ndarray
    taps: np.ndarray
    kernel: str
    hyper: dict[str, float]
    noise_std: float
    log_marginal: float
    se_white: np.ndarray
    inflation: np.ndarray
    cov: np.ndarray
    integrating: bool
    step: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0))
    coordinates: str = "step"
    first_lag: int = 1
    noise_ar: tuple[float, ...] = ()
    rows: int = 0
    log_marginals: dict[str, float] = field(default_factory=dict)
    budget_spent: bool = False
    seconds: float = 0.0


def taps_for(settling: int, runs: Sequence[tuple[np.ndarray, np.ndarray]],
             max_coefficients: int = MAX_COEFFICIENTS) -> int:
    """The number of taps for a settling-time guess (samples after which every channel has settled,
    e.g. statespace.settling_steps of an identified model): SETTLING_MARGIN x settling, so the FIR's
    end sees the settled response (taps cut short bias the gain by the response's missing tail), capped
    by the data: the shortest run (a run shorter than the FIR cannot show it settled), TAP_ROWS_SHARE
    rows per tap coefficient (the prior carries the rest; the cap keeps it from carrying all) and
    `max_coefficients` (MAX_COEFFICIENTS) over the inputs (the fit's cost grows as their cube). At least 1."""
    if int(settling) < 1:
        raise ValueError(f"settling must be at least 1 sample, got {settling!r}")
    lengths = [np.shape(y)[0] for _, y in runs]
    if not lengths:
        raise ValueError("runs: expected at least one (u, y) run, got none")
    n_inputs = np.atleast_2d(np.asarray(runs[0][0], float).T).shape[0]
    wanted = math.ceil(SETTLING_MARGIN * int(settling))
    cap = min(min(lengths), sum(lengths) // (TAP_ROWS_SHARE * n_inputs), int(max_coefficients) // n_inputs)
    return max(1, min(wanted, cap))


def fit_fir(runs: Sequence[tuple[np.ndarray, np.ndarray]], n_taps: int, integrating: bool = False, *,
            pre_run: str = "held", integrating_noise: str = "level", coordinates: str = "step",
            tail: bool = True, first_lag: int = 1, kernels: Sequence[str] = (TC, DC), autocorrelation: bool = True,
            hyper: Mapping[str, float] | None = None,
            time_budget_s: float | None = DEFAULT_TIME_BUDGET_S) -> FirGains:
    """The regularised FIR of one CV from `runs`, each (u (T, n_inputs), y (T,)) in engineering units,
    with `n_taps` taps per input (`taps_for`); module docstring for the model, the prior, the noise
    model, `pre_run`, `integrating_noise`, `coordinates`, `tail` and `first_lag`. `hyper`: a fixed
    prior and noise instead of the marginal-likelihood search, keyed as FirGains.hyper (DC when it has
    `rho<i>`) plus `noise_std`. ValueError on bad input, naming the run or argument and what is wrong."""
    started = time.perf_counter()
    if coordinates not in COORDINATES:
        raise ValueError(f"coordinates: expected one of {', '.join(COORDINATES)}, got {coordinates!r}")
    if integrating_noise not in INTEGRATING_NOISE:
        raise ValueError(f"integrating_noise: expected one of {', '.join(INTEGRATING_NOISE)}, "
                         f"got {integrating_noise!r}")
    if first_lag not in (0, 1):
        raise ValueError(f"first_lag: expected 0 or 1, got {first_lag!r}")
    step, level = coordinates == "step", integrating_noise == "level"
    us, ys = _validated(runs, n_taps, integrating, pre_run, kernels,
                        _first_row(n_taps, pre_run, step, integrating and not level, first_lag))
    n_inputs = us[0].shape[1]
    shared = (us, ys, n_taps, integrating, pre_run, level, step)
    design = _Design(*shared, np.zeros(n_inputs), first_lag)
    clock = _Budget(started, time_budget_s, reserve=3 * n_inputs + 1)  # the Laplace step's evaluations
    if hyper is not None:
        kernel, eta, noise_var = _fixed(hyper, n_inputs, design.phi_scale, design.y_scale)
        if tail:
            poles = _tail_poles([float(hyper[f"lambda{i}"]) for i in range(n_inputs)], n_taps)
            poles = np.array([float(hyper.get(f"tail{i}", pole)) for i, pole in enumerate(poles)])
            design = _Design(*shared, poles, first_lag)
            eta = _fixed(hyper, n_inputs, design.phi_scale, design.y_scale)[1]
        post = design.problem.posterior(kernel, eta, noise_var)
        log_marginals = {kernel: design.problem.log_marginal_at(kernel, eta, noise_var)}
    else:
        starts = [design.problem.tc_start(decay) for decay in TC_START_DECAYS]
        if tail:  # the tail's decay from a first TC fit without it (module docstring)
            first, _ = _maximise(design.problem, TC, starts[0], clock, TAIL_FTOL)
            lambdas = [lam for _, lam, _ in design.problem.unpack(TC, first)]
            design = _Design(*shared, _tail_poles(lambdas, n_taps), first_lag)
            starts = [first, *starts[1:]]
        kernel, eta, log_marginals = _search(design.problem, kernels, clock, starts)
        post = design.problem.posterior(kernel, eta)
    gains, cov, response, weights, residuals = design.estimate(post)
    if hyper is None:
        unit = design.y_scale / design.level_scale
        cov = cov + design.problem.hyper_spread(kernel, eta, design.functional) * np.outer(unit, unit)
    se_white = np.sqrt(np.diag(cov))
    inflation, noise_ar = np.ones(n_inputs), ()
    if autocorrelation:
        inflation, noise_ar = _inflation(weights, residuals, design.run_of, design.n_runs)
    offset = design.problem.log_scale(design.y_scale)
    log_marginals = {k: v + offset for k, v in log_marginals.items()}
    return FirGains(gains=gains, se=se_white * np.sqrt(inflation), taps=np.diff(response, axis=1, prepend=0.0),
                    kernel=kernel, hyper={**design.problem.hyper_record(kernel, eta, post.noise_var, design.phi_scale,
                                                                       design.y_scale),
                                          **{f"tail{i}": float(p) for i, p in enumerate(design.tail) if p > 0}},
                    noise_std=float(math.sqrt(post.noise_var) * design.y_scale), log_marginal=log_marginals[kernel],
                    se_white=se_white, inflation=inflation, cov=cov, integrating=bool(integrating),
                    step=response, tail=design.tail, coordinates=coordinates, first_lag=first_lag, noise_ar=noise_ar,
                    rows=design.rows,
                    log_marginals=log_marginals, budget_spent=clock.spent, seconds=time.perf_counter() - started)


class _Design:
    """The regression of one fit in normalised units (module docstring), nuisance parameters (and in
    step coordinates the gains) marginalised into the marginal-likelihood problem `problem`; `estimate`
    turns a posterior of the shape coefficients into gains in engineering units."""

    def __init__(self, us: list[np.ndarray], ys: list[np.ndarray], n: int, integrating: bool, pre_run: str,
                 level: bool, step: bool, tail: np.ndarray, first_lag: int):
        levels, phi, target, self.run_of, times = _regression(us, ys, n, integrating, pre_run, level, step, tail,
                                                              first_lag)
        self.rows, self.n_runs, self.n_inputs, self.n, self.step, self.tail = (
            target.size, int(self.run_of.max()) + 1, us[0].shape[1], n, step, tail)
        rate = bool(integrating and level)
        nuisance = self.n_runs * (2 if rate else 1) + (self.n_inputs if step else 0)
        if self.rows - nuisance < 2:
            raise ValueError(f"runs: {self.rows} regression rows in {self.n_runs} runs leave fewer than 2 rows beyond "
                             f"the runs' {'offsets and rates' if rate else 'offsets'}"
                             f"{' and the gains' if step else ''}; longer runs are needed")
        levels, phi, target = (_nuisance_free(v, self.run_of, times, self.n_runs, rate)
                               for v in (levels, phi, target[:, None]))
        blocks = [slice(i * n, (i + 1) * n) for i in range(self.n_inputs)]
        moving = np.array([np.any(phi[:, block] != 0.0) for block in blocks])
        if not moving.all():
            raise ValueError(f"runs: input(s) {', '.join(map(str, np.flatnonzero(~moving)))} never move within a "
                             f"run; their gains cannot be identified")
        # normalised units: each input's regressors and the target of mean square 1 (one prior scale for all)
        self.phi_scale = np.sqrt(np.array([np.mean(phi[:, block] ** 2) for block in blocks]))
        self.level_scale = np.sqrt(np.mean(levels ** 2, axis=0)) if step else self.phi_scale
        self.y_scale = float(np.sqrt(np.mean(target ** 2))) or 1.0
        self.phi_n, self.t_n = phi * np.repeat(1.0 / self.phi_scale, n), target[:, 0] / self.y_scale
        gram, cross, yy = self.phi_n.T @ self.phi_n, self.phi_n.T @ self.t_n, float(self.t_n @ self.t_n)
        if step:  # the gains' flat prior marginalised: every product with the levels projected out
            self.x_n = levels / self.level_scale
            self.xx_inv = np.linalg.inv(self.x_n.T @ self.x_n)
            self.xp, self.xt = self.x_n.T @ self.phi_n, self.x_n.T @ self.t_n
            gram = gram - self.xp.T @ self.xx_inv @ self.xp
            cross = cross - self.xp.T @ self.xx_inv @ self.xt
            yy = yy - float(self.xt @ self.xx_inv @ self.xt)
            self.functional = -self.xp.T @ self.xx_inv  # gain = xx_inv (xt - xp theta): its shape part
        else:
            self.functional = np.zeros((self.n_inputs * n, self.n_inputs))
            for i, block in enumerate(blocks):  # gain = the sum of the taps, the tail's as 1 / (1 - pole)
                self.functional[block, i] = 1.0
                self.functional[block.stop - 1, i] = 1.0 / (1.0 - tail[i])
        self.problem = _Evidence(gram, cross, yy, self.rows - nuisance, self.n_inputs, n)

    def estimate(self, post: "_Posterior") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Gains (n_inputs,) and their covariance (engineering units), the step responses (n_inputs, n),
        the rows' weights in the gains (rows, n_inputs: gains_n = weights' t_n) and the residuals
        (normalised)."""
        theta = post.mean
        cov_n, spread = post.functional(self.functional)  # E' Sigma_theta E and H E
        if self.step:
            gains_n = self.xx_inv @ (self.xt - self.xp @ theta)
            cov_n = cov_n + post.noise_var * self.xx_inv
            residuals = self.t_n - self.x_n @ gains_n - self.phi_n @ theta
            weights = self.x_n @ self.xx_inv + (self.phi_n - self.x_n @ (self.xx_inv @ self.xp)) @ spread
        else:
            gains_n = self.functional.T @ theta
            residuals = self.t_n - self.phi_n @ theta
            weights = self.phi_n @ spread
        unit = self.y_scale / self.level_scale  # normalised -> engineering gains, per input
        shape = theta.reshape(self.n_inputs, self.n) * (self.y_scale / self.phi_scale)[:, None]
        response = gains_n[:, None] * unit[:, None] + shape if self.step else np.cumsum(shape, axis=1)
        return gains_n * unit, cov_n * np.outer(unit, unit), response, weights, residuals


def _tail_poles(lambdas: Sequence[float], n: int) -> np.ndarray:
    """Per input the decay per sample of the FIR's tail beyond its last tap: sqrt(lambda), the decay of
    the prior's standard deviation (the kernel's own expectation of how the response dies out), at
    most exp(-1 / n): a tail slower than the FIR is long is one the data cannot tell (and a pole near
    1 would make the tail's sum, 1 / (1 - pole) times its first coefficient, blow up)."""
    return np.minimum(np.sqrt(np.asarray(lambdas, float)), math.exp(-1.0 / n))


def _search(problem: "_Evidence", kernels: Sequence[str], clock: "_Budget",
            starts: Sequence[np.ndarray]) -> tuple[str, np.ndarray, dict[str, float]]:
    """The kernel and hyperparameters of the highest marginal likelihood (module docstring): TC from
    each of `starts`, DC from the best TC optimum so far whenever it improves (the first start's DC fit
    comes before the second start: under a tight budget DC matters more than a second TC start), DC
    kept when it gains more than DC_PENALTY_PER_HYPER per added hyperparameter. The log marginal
    likelihood of each kernel fitted (normalised rows)."""
    results: dict[str, tuple[np.ndarray, float]] = {}
    for start in starts:  # TC is fitted for DC's start even when only DC is asked for
        if clock.spent and TC in results:
            break
        eta, value = _maximise(problem, TC, start, clock)
        if TC in results and value >= results[TC][1] - 1e-6 * abs(results[TC][1]):
            continue
        results[TC] = (eta, value)
        if DC in kernels and not clock.spent:
            dc = _maximise(problem, DC, problem.dc_from_tc(eta), clock)
            if DC not in results or dc[1] < results[DC][1]:
                results[DC] = dc
    log_marginals = {name: problem.log_marginal(value) for name, (_, value) in results.items()}
    if DC not in results:
        kernel = TC
    elif TC not in kernels:
        kernel = DC
    else:
        added = problem.n_inputs  # one rho per input
        kernel = DC if log_marginals[DC] - log_marginals[TC] > DC_PENALTY_PER_HYPER * added else TC
    return kernel, results[kernel][0], log_marginals


def _fixed(hyper: Mapping[str, float], n_inputs: int, u_scale: np.ndarray,
           y_scale: float) -> tuple[str, np.ndarray, float]:
    """The optimiser coordinates and normalised noise variance of a fixed `hyper` (fit_fir)."""
    kernel = DC if any(str(key).startswith("rho") for key in hyper) else TC
    keys = ["noise_std"] + [f"{name}{i}" for i in range(n_inputs)
                            for name in (("c", "lambda", "rho") if kernel == DC else ("c", "lambda"))]
    missing = [key for key in keys if key not in hyper]
    if missing:
        raise ValueError(f"hyper: missing {', '.join(missing)} (expected {', '.join(keys)})")
    noise = float(hyper["noise_std"])
    if not noise > 0:
        raise ValueError(f"hyper: noise_std must be > 0, got {hyper['noise_std']!r}")
    eta = []
    for i in range(n_inputs):
        c, lam = float(hyper[f"c{i}"]), float(hyper[f"lambda{i}"])
        if not (c > 0 and 0 < lam < 1):
            raise ValueError(f"hyper: c{i} must be > 0 and lambda{i} in (0, 1), got {c!r}, {lam!r}")
        eta += [math.log(c * u_scale[i] ** 2 / noise ** 2), math.log(lam / (1.0 - lam))]
        if kernel == DC:
            rho = float(hyper[f"rho{i}"])
            if not -1 < rho < 1:
                raise ValueError(f"hyper: rho{i} must be in (-1, 1), got {rho!r}")
            eta.append(math.atanh(rho))
    return kernel, np.array(eta), (noise / y_scale) ** 2


# --------------------------------------------------------------------------- data


def _first_row(n: int, pre_run: str, step: bool, increments: bool, first_lag: int) -> int:
    """A run's first regression row: 0 with the inputs held before the run; else the first whose
    regressors all lie in the run (an increment of the inputs needs the sample before it)."""
    first = 0 if pre_run == "held" else (n if step else n - 1) + first_lag
    return max(first, 1) if increments else first


def _validated(runs, n_taps, integrating, pre_run, kernels, first) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if isinstance(n_taps, bool) or not isinstance(n_taps, (int, np.integer)) or n_taps < 1:
        raise ValueError(f"n_taps: expected an integer >= 1, got {n_taps!r}")
    if pre_run not in PRE_RUN:
        raise ValueError(f"pre_run: expected one of {', '.join(PRE_RUN)}, got {pre_run!r}")
    unknown = [k for k in kernels if k not in (TC, DC)]
    if unknown or not kernels:
        raise ValueError(f"kernels: expected a non-empty selection of {TC!r}, {DC!r}, got {list(kernels)!r}")
    if len(runs) == 0:
        raise ValueError("runs: expected at least one (u, y) run, got none")
    us, ys, width = [], [], None
    need = max(n_taps, first + 1)
    for r, run in enumerate(runs):
        if len(run) != 2:
            raise ValueError(f"run {r}: expected a pair (u, y), got {len(run)} item(s)")
        u, y = np.asarray(run[0], float), np.asarray(run[1], float)
        u = u[:, None] if u.ndim == 1 else u
        y = y[:, 0] if y.ndim == 2 and y.shape[1] == 1 else y
        if u.ndim != 2 or y.ndim != 1 or u.shape[0] != y.shape[0]:
            raise ValueError(f"run {r}: expected u (T, n_inputs) and y (T,), got {np.shape(run[0])} and "
                             f"{np.shape(run[1])}")
        if width is None:
            width = u.shape[1]
        if u.shape[1] != width or width == 0:
            raise ValueError(f"run {r}: u has {u.shape[1]} input column(s), expected {width} as in run 0")
        if y.size < need:
            raise ValueError(f"run {r}: {y.size} samples, fewer than "
                             + (f"n_taps = {n_taps}" if need == n_taps else f"{need} (n_taps = {n_taps}, pre_run "
                                                                            f"{pre_run!r})")
                             + "; use fewer taps or leave the run out")
        for name, values in (("u", u), ("y", y)):
            bad = ~np.isfinite(values)
            if bad.any():
                raise ValueError(f"run {r}: {name} has {int(bad.sum())} non-finite value(s) (NaN or inf), the "
                                 f"first at sample {int(np.argwhere(bad)[0][0])}; clean or split the run there")
        us.append(u)
        ys.append(y)
    return us, ys


def _regression(us: list[np.ndarray], ys: list[np.ndarray], n: int, integrating: bool, pre_run: str, level: bool,
                step: bool, tail: np.ndarray,
                first_lag: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of every run (module docstring): the inputs' levels (rows, n_inputs; `step` only, else
    (rows, 0)), the shape regressors (rows, n_inputs n) [input i's lags 0..n-1: of its increments with
    `step`, of itself otherwise], the target, each row's run and its sample in the run. The inputs are
    their deviations from the run's first sample, or for an integrating CV with `level` their running
    sums (the level's change up to t is the sum of its rates). With tail[i] > 0 the last lag of input i
    carries the geometric tail beyond it: sum_j tail^j x[t - (n - 1) - j] (before the run: 0, "held")."""
    levels, phis, targets, which, times = [], [], [], [], []
    first = _first_row(n, pre_run, step, integrating and not level, first_lag)
    for r, (u, y) in enumerate(zip(us, ys)):
        deviation = u - u[0]
        if integrating and level:
            deviation = np.cumsum(deviation, axis=0)
        if first_lag:  # the regressors of row t start at x[t - first_lag]
            deviation = np.vstack([np.zeros((first_lag, u.shape[1])), deviation[:len(deviation) - first_lag]])
        series = np.diff(deviation, axis=0, prepend=0.0) if step else deviation  # 0 before the run: "held"
        padded = np.vstack([np.zeros((n - 1, u.shape[1])), series])
        lagged = sliding_window_view(padded, n, axis=0)[:, :, ::-1].copy()  # (T, n_inputs, n): lag 0 first
        for i in np.flatnonzero(tail > 0.0):
            lagged[:, i, -1] = lfilter([1.0], [1.0, -tail[i]], padded[:, i])[:len(series)]
        target = (y[1:] - y[:-1])[first - 1:] if integrating and not level else (y - y[0])[first:]
        phis.append(lagged[first:].reshape(len(target), -1))
        levels.append(deviation[first:] if step else np.zeros((len(target), 0)))
        targets.append(target)
        which.append(np.full(len(target), r))
        times.append(np.arange(first, first + len(target), dtype=float))
    return (np.vstack(levels), np.vstack(phis), np.concatenate(targets), np.concatenate(which),
            np.concatenate(times))


def _nuisance_free(values: np.ndarray, run_of: np.ndarray, times: np.ndarray, n_runs: int, rate: bool) -> np.ndarray:
    """`values` (rows, k) with each run's offset (and with `rate` its trend in time) removed by least
    squares: the nuisance parameters' flat prior marginalised."""
    out = np.empty_like(values)
    for r in range(n_runs):
        rows = run_of == r
        basis = np.ones((int(rows.sum()), 2 if rate else 1))
        if rate:
            basis[:, 1] = times[rows] - times[rows].mean()
        q = np.linalg.qr(basis)[0]
        block = values[rows]
        out[rows] = block - q @ (q.T @ block)
    return out


# --------------------------------------------------------------------------- kernels


def _kernel_factor(kernel: str, n: int, c: float, lam: float, rho: float = 0.0) -> np.ndarray:
    """L (n, n) with c K = L L' (module docstring), closed form: TC as the sum of independent increments
    from the FIR's end, x_k = sum_{j >= k} w_j; DC as lambda^(k/2) times an AR(1) of coefficient rho."""
    k = np.arange(n)
    if kernel == TC:
        powers = lam ** k
        increments = np.append(powers[:-1] - powers[1:], powers[-1])  # var w_j
        return np.triu(np.ones((n, n))) * np.sqrt(c * np.maximum(increments, 0.0))
    lower = np.tril(rho ** np.maximum(k[:, None] - k[None, :], 0).astype(float))
    lower[1:, 1:] *= math.sqrt(max(1.0 - rho * rho, 0.0))
    return math.sqrt(c) * lam ** (k / 2.0)[:, None] * lower


def _kernel_grads(kernel: str, n: int, c: float, lam: float, rho: float = 0.0) -> list[np.ndarray]:
    """d(c K)/d(optimiser coordinates): log c, logit lambda[, atanh rho]."""
    k = np.arange(n)
    if kernel == TC:
        top = np.maximum(k[:, None], k[None, :])
        P = c * lam ** top
        return [P, P * top * (1.0 - lam)]
    gap = np.abs(k[:, None] - k[None, :])
    base = c * lam ** ((k[:, None] + k[None, :]) / 2.0)
    P = base * rho ** gap
    d_rho = base * gap * np.where(gap > 0, rho ** np.maximum(gap - 1, 0), 0.0) * (1.0 - rho * rho)
    return [P, P * (k[:, None] + k[None, :]) / 2.0 * (1.0 - lam), d_rho]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


@dataclass(frozen=True)
class _Posterior:
    """The posterior of the shape coefficients theta (normalised units): mean, the noise variance, and
    its covariance noise_var x L B^-1 L' through L and R (B = I + L' G L = R' R)."""

    mean: np.ndarray  # (p,)
    noise_var: float
    factor: np.ndarray  # L (p, p): prior covariance / noise variance = L L'
    chol: np.ndarray  # R, upper triangular

    def functional(self, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the linear functionals E' theta (E (p, k)): their posterior covariance (k, k) and H E,
        H = L B^-1 L' (the posterior mean is H g)."""
        S = solve_triangular(self.chol, self.factor.T @ E, trans="T", check_finite=False)  # R^-T L' E
        return self.noise_var * S.T @ S, self.factor @ solve_triangular(self.chol, S, check_finite=False)


class _Budget:
    """The fit's time budget: spent once the time so far plus `reserve` more evaluations of the
    objective (at their mean time so far: the hyperparameters' uncertainty after the search) exceed it."""

    def __init__(self, started: float, budget: float | None, reserve: int = 0):
        self.started, self.budget, self.reserve = started, budget, reserve
        self.evaluations, self.evaluating = 0, 0.0

    def timed(self, seconds: float) -> None:
        self.evaluations += 1
        self.evaluating += seconds

    @property
    def spent(self) -> bool:
        if self.budget is None:
            return False
        ahead = self.reserve * self.evaluating / self.evaluations if self.evaluations else 0.0
        return time.perf_counter() - self.started + ahead > self.budget


class _OutOfTime(Exception):
    pass


class _Evidence:
    """The marginal likelihood of the centred, normalised rows as a function of the kernel's
    hyperparameters, from the normal equations alone: G = Phi' Phi (p, p), g = Phi' y, yy = y' y, m
    rows beyond the offsets. With the prior covariance sigma^2 L L' (sigma^2 the noise variance,
    profiled out) and B = I + L' G L = R' R: Q = yy - b' B^-1 b (b = L' g), sigma^2 = Q / m and
    -2 log p(y) = m log(2 pi Q / m) + m + log det B."""

    def __init__(self, gram: np.ndarray, cross: np.ndarray, yy: float, m: int, n_inputs: int, n: int):
        self.gram, self.cross, self.yy, self.m, self.n_inputs, self.n = gram, cross, yy, m, n_inputs, n
        self.blocks = [slice(i * n, (i + 1) * n) for i in range(n_inputs)]

    def width(self, kernel: str) -> int:
        return 2 if kernel == TC else 3

    def unpack(self, kernel: str, eta: np.ndarray) -> list[tuple[float, float, float]]:
        w = self.width(kernel)
        out = []
        for i in range(self.n_inputs):
            part = eta[i * w:(i + 1) * w]
            rho = math.tanh(part[2]) if kernel == DC else 0.0
            out.append((math.exp(part[0]), _sigmoid(part[1]), rho))
        return out

    def bounds(self, kernel: str) -> list[tuple[float, float]]:
        per = [LOG_C_BOUNDS, LOGIT_LAMBDA_BOUNDS] + ([ATANH_RHO_BOUNDS] if kernel == DC else [])
        return per * self.n_inputs

    def tc_start(self, decay: float) -> np.ndarray:
        """Prior impulse responses decaying with time constant decay x n (std lambda^(k/2)); c such that
        the prior explains ~10x the noise over the inputs together."""
        lam = min(max(math.exp(-2.0 / max(decay * self.n, 0.5)), 1e-3), 1 - 1e-6)
        c = 10.0 * (1.0 - lam) / self.n_inputs
        return np.tile([math.log(c), math.log(lam / (1.0 - lam))], self.n_inputs)

    def dc_from_tc(self, eta: np.ndarray) -> np.ndarray:
        """DC at TC's optimum: the same c and lambda, rho = sqrt(lambda) (the kernels then agree)."""
        out = []
        for c, lam, _ in self.unpack(TC, eta):
            rho = min(math.sqrt(lam), math.tanh(ATANH_RHO_BOUNDS[1]))
            out += [math.log(c), math.log(lam / (1.0 - lam)), math.atanh(rho)]
        return np.array(out)

    def _factor(self, kernel: str, hyper) -> np.ndarray:
        p = self.n * self.n_inputs
        L = np.zeros((p, p))
        for block, (c, lam, rho) in zip(self.blocks, hyper):
            L[block, block] = _kernel_factor(kernel, self.n, c, lam, rho)
        return L

    def _solve(self, kernel: str, eta: np.ndarray):
        hyper = self.unpack(kernel, eta)
        L = self._factor(kernel, hyper)
        LG, B = np.empty_like(self.gram), np.empty_like(self.gram)  # L' G and L' G L, block by block (L is
        for block in self.blocks:  # block diagonal)
            LG[block] = L[block, block].T @ self.gram[block]
        for block in self.blocks:
            B[:, block] = LG[:, block] @ L[block, block]
        B[np.diag_indices_from(B)] += 1.0
        R = cholesky(B, lower=False, check_finite=False)
        b = L.T @ self.cross
        z = solve_triangular(R, b, trans="T", check_finite=False)  # R^-T b
        Q = max(self.yy - float(z @ z), 1e-300)
        return hyper, L, LG, R, z, Q

    def objective(self, kernel: str, eta: np.ndarray) -> tuple[float, np.ndarray]:
        """-2 log p(y) up to constants, and its gradient over the optimiser coordinates (the noise
        variance at its profile optimum: by the envelope theorem its own derivative is 0). With
        Sigma = sigma^2 (I + Phi L L' Phi'), d(-2 log p)/dP = W - alpha alpha' where W = Phi' Sigma^-1 Phi
        = (G - V' V) / sigma^2, V = R^-T L' G, alpha = (g - G theta) / sigma^2; P = sigma^2 c K."""
        value, grad, _ = self.objective_and_mean(kernel, eta)
        return value, grad

    def objective_and_mean(self, kernel: str, eta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """`objective` and the posterior mean of the coefficients at `eta`."""
        try:
            hyper, L, LG, R, z, Q = self._solve(kernel, eta)
        except np.linalg.LinAlgError:
            return 1e300, np.zeros_like(eta), np.full(self.gram.shape[0], np.nan)
        sigma2 = Q / self.m
        value = self.m * math.log(Q) + 2.0 * float(np.sum(np.log(np.diag(R))))
        V = solve_triangular(R, LG, trans="T", check_finite=False)
        theta = L @ solve_triangular(R, z, check_finite=False)
        alpha = (self.cross - self.gram @ theta) / sigma2
        grad = []
        for block, (c, lam, rho) in zip(self.blocks, hyper):
            Vb = V[:, block]
            M = (self.gram[block, block] - Vb.T @ Vb) / sigma2 - np.outer(alpha[block], alpha[block])
            grad += [sigma2 * float(np.sum(M * d)) for d in _kernel_grads(kernel, self.n, c, lam, rho)]
        return value, np.array(grad), theta

    def hyper_spread(self, kernel: str, eta: np.ndarray, functional: np.ndarray) -> np.ndarray:
        """The covariance (k, k) the hyperparameters' uncertainty adds to the functionals E' theta
        (E = `functional` (p, k)) of the posterior mean (Laplace): J' C J, C the inverse of the Hessian
        of -log p(y) over the optimiser coordinates at `eta` (its posterior under a flat prior there), J
        the functionals' derivatives; both by forward differences of the analytic gradient and of the
        posterior mean (HYPER_STEP). A coordinate at its bound (lambda near 1, rho near +-1) is left
        out, and so are the Hessian's non-positive directions."""
        lo, hi = (np.array(b) for b in zip(*self.bounds(kernel)))
        free = np.flatnonzero((eta > lo + HYPER_BOUND_MARGIN) & (eta < hi - HYPER_BOUND_MARGIN))
        _, grad, theta = self.objective_and_mean(kernel, eta)
        hessian, slopes = np.zeros((free.size, free.size)), np.zeros((free.size, functional.shape[1]))
        for a, j in enumerate(free):
            moved = eta.copy()
            moved[j] += HYPER_STEP
            _, grad_j, theta_j = self.objective_and_mean(kernel, moved)
            hessian[:, a] = 0.5 * (grad_j - grad)[free] / HYPER_STEP  # of -log p = objective / 2
            slopes[a] = functional.T @ (theta_j - theta) / HYPER_STEP
        if not free.size or not np.all(np.isfinite(hessian)) or not np.all(np.isfinite(slopes)):
            return np.zeros((functional.shape[1], functional.shape[1]))
        values, vectors = np.linalg.eigh(0.5 * (hessian + hessian.T))
        keep = values > 1e-9 * max(float(values.max(initial=0.0)), 1e-300)
        projected = slopes.T @ vectors[:, keep]
        return (projected / values[keep]) @ projected.T

    def log_marginal(self, value: float) -> float:
        """log p(y) of the normalised rows from an objective value (module docstring of the class)."""
        return -0.5 * (value + self.m * (math.log(2.0 * math.pi / self.m) + 1.0))

    def log_scale(self, y_scale: float) -> float:
        """log p of the rows in engineering units from that of the normalised ones (the Jacobian)."""
        return -self.m * math.log(y_scale)

    def posterior(self, kernel: str, eta: np.ndarray, noise: float | None = None) -> _Posterior:
        """The coefficients' posterior: prior covariance noise x L L'; `noise` the profiled variance
        unless given."""
        _, L, _, R, z, Q = self._solve(kernel, eta)
        mean = L @ solve_triangular(R, z, check_finite=False)
        return _Posterior(mean, Q / self.m if noise is None else float(noise), L, R)

    def log_marginal_at(self, kernel: str, eta: np.ndarray, noise: float) -> float:
        """log p(y) with the noise variance given: -2 log p = m log(2 pi noise) + log det B + Q / noise."""
        _, _, _, R, _, Q = self._solve(kernel, eta)
        return -0.5 * (self.m * math.log(2.0 * math.pi * noise) + 2.0 * float(np.sum(np.log(np.diag(R)))) + Q / noise)

    def hyper_record(self, kernel: str, eta: np.ndarray, noise_var: float, u_scale: np.ndarray,
                     y_scale: float) -> dict[str, float]:
        """Per input c (prior variance scale of its taps in (CV per input unit)^2, the prior being
        noise variance x c' K in normalised units), lambda and rho (DC)."""
        record = {}
        for i, (c, lam, rho) in enumerate(self.unpack(kernel, eta)):
            record[f"c{i}"] = float(c * noise_var * (y_scale / u_scale[i]) ** 2)
            record[f"lambda{i}"] = float(lam)
            if kernel == DC:
                record[f"rho{i}"] = float(rho)
        return record


def _maximise(problem: _Evidence, kernel: str, start: np.ndarray, clock: _Budget,
              ftol: float = SEARCH_FTOL) -> tuple[np.ndarray, float]:
    """L-BFGS-B on the objective from `start`; on the budget's end, the best point evaluated so far."""
    best = [start, math.inf]

    def fun(eta: np.ndarray) -> tuple[float, np.ndarray]:
        if clock.spent and np.isfinite(best[1]):
            raise _OutOfTime
        began = time.perf_counter()
        value, grad = problem.objective(kernel, eta)
        clock.timed(time.perf_counter() - began)
        if value < best[1]:
            best[0], best[1] = eta.copy(), value
        return value, grad

    try:
        minimize(fun, start, jac=True, method="L-BFGS-B", bounds=problem.bounds(kernel),
                 options={"maxiter": 200, "ftol": ftol, "gtol": 1e-6})
    except _OutOfTime:
        pass
    return best[0], best[1]


# --------------------------------------------------------------------------- coloured noise


def _inflation(weights: np.ndarray, residuals: np.ndarray, run_of: np.ndarray,
               n_runs: int) -> tuple[np.ndarray, tuple[float, ...]]:
    """Per gain the long-run factor f_i (module docstring) and the residuals' AR coefficients. The gain
    estimates are weights' y (weights (rows, n_inputs)); under noise of autocovariance gamma their
    variance is sum_t sum_s w_t w_s gamma(t - s) within runs, gamma(0) w' w under white noise."""
    runs = [residuals[run_of == r] for r in range(n_runs)]
    longest = max(len(v) for v in runs)
    order_cap = min(AR_MAX_ORDER, max(longest // 4, 0))
    acov = _pooled_autocovariance(runs, order_cap)
    coefficients = _ar_by_bic(acov, residuals.size, order_cap)
    if not coefficients.size or acov[0] <= 0:
        return np.ones(weights.shape[1]), ()
    gamma = _ar_autocorrelation(coefficients, min(longest, LONG_RUN_LAGS))
    white = np.sum(weights ** 2, axis=0)
    coloured = sum(_weighted_sum(weights[run_of == r], gamma) for r in range(n_runs))
    factor = np.where(white > 0, coloured / np.maximum(white, np.finfo(float).tiny), 1.0)
    return np.maximum(factor, 1.0), tuple(float(a) for a in coefficients)


def _pooled_autocovariance(runs: list[np.ndarray], lags: int) -> np.ndarray:
    """gamma(0..lags) of the residuals pooled over runs (within each run, divided by all residuals)."""
    total = sum(len(v) for v in runs)
    return np.array([sum(float(v[:len(v) - k] @ v[k:]) for v in runs if len(v) > k) / total
                     for k in range(lags + 1)])


def _ar_by_bic(acov: np.ndarray, n: int, max_order: int) -> np.ndarray:
    """Yule-Walker AR coefficients a (y_t = sum a_k y_{t-k} + e_t) of the order 0..max_order with the
    lowest BIC, n log(innovation variance) + p log n; empty for white."""
    if acov[0] <= 0:
        return np.zeros(0)
    best, best_bic = np.zeros(0), n * math.log(acov[0])
    for p in range(1, max_order + 1):
        try:
            a = solve_toeplitz(acov[:p], acov[1:p + 1])
        except np.linalg.LinAlgError:
            break
        innovation = acov[0] - float(a @ acov[1:p + 1])
        if not innovation > 0:
            break
        bic = n * math.log(innovation) + p * math.log(n)
        if bic < best_bic:
            best, best_bic = a, bic
    return best


def _ar_autocorrelation(a: np.ndarray, lags: int) -> np.ndarray:
    """rho(0..lags-1) of the AR process with coefficients a: the autocorrelation of its impulse response."""
    psi = lfilter([1.0], np.concatenate([[1.0], -a]), np.eye(1, 2 * lags + 200)[0])
    n = psi.size
    spectrum = np.fft.rfft(psi, 2 * n)
    auto = np.fft.irfft(spectrum * np.conj(spectrum), 2 * n)[:lags]
    return auto / auto[0]


def _weighted_sum(w: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """Per column of w (T, k): sum_t sum_s w_t w_s gamma(|t - s|), gamma (lags,), 0 beyond."""
    T = w.shape[0]
    size = 1 << int(math.ceil(math.log2(max(2 * T, 2))))
    spectrum = np.fft.rfft(w, size, axis=0)
    auto = np.fft.irfft(spectrum * np.conj(spectrum), size, axis=0)[:T]  # sum_t w_t w_{t+k}
    k = min(T, gamma.size)
    return auto[0] * gamma[0] + 2.0 * gamma[1:k] @ auto[1:k]
