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
optimum, `Evidence.hyper_spread`; leaving it out, the se were ~20 % small on a gain whose shape the
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
matrix; no evaluation touches the rows. `max_evaluations` bounds the search's evaluations (a running
optimisation stops at its best point; the Laplace step's 2 n_inputs + 1 or so come after it);
`FirGains.budget_spent` says so. Counted, not timed: the same data give the same fit on any machine.
"""

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.signal import lfilter

from optimizer_pipeline.model.kernel_evidence import DC, TC, Budget, Evidence, Posterior, maximise
from optimizer_pipeline.model import long_run

PRE_RUN = ("held", "skip")
COORDINATES = ("step", "taps")
INTEGRATING_NOISE = ("level", "increment")
# Number of taps (`taps_for`): past the settling guess by this factor, at most the shortest run, at
# most TAP_ROWS_SHARE of the rows per tap coefficient, at most MAX_COEFFICIENTS taps over all inputs
SETTLING_MARGIN = 1.25
TAP_ROWS_SHARE = 2
MAX_COEFFICIENTS = 400
# TC starts: prior impulse responses decaying with these time constants, as fractions of n
TC_START_DECAYS = (0.25, 0.08)
DC_PENALTY_PER_HYPER = 1.0  # Akaike: log marginal likelihood a DC fit must gain per added hyperparameter
# the search's objective evaluations (kernel_evidence.Budget): an unbounded search of tests/test_fir.py's plant
# takes ~85 (the tail's first TC fit, TC from two starts, DC from each TC optimum)
DEFAULT_MAX_EVALUATIONS = 150
# the looser tolerance of the fit that only gives the tail its decay (kernel_evidence.SEARCH_FTOL: the search's)
TAIL_FTOL = 1e-6


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
    the evaluation budget stopped the search; evaluations: the search's objective evaluations; seconds:
    wall time of the fit.
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
    evaluations: int = 0
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
            max_evaluations: int | None = DEFAULT_MAX_EVALUATIONS) -> FirGains:
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
    budget = Budget(max_evaluations)
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
            first, _ = maximise(design.problem, TC, starts[0], budget, TAIL_FTOL)
            lambdas = [lam for _, lam, _ in design.problem.unpack(TC, first)]
            design = _Design(*shared, _tail_poles(lambdas, n_taps), first_lag)
            starts = [first, *starts[1:]]
        kernel, eta, log_marginals = _search(design.problem, kernels, budget, starts)
        post = design.problem.posterior(kernel, eta)
    gains, cov, response, weights, residuals = design.estimate(post)
    if hyper is None:
        unit = design.y_scale / design.level_scale
        cov = cov + design.problem.hyper_spread(kernel, eta, design.functional) * np.outer(unit, unit)
    se_white = np.sqrt(np.diag(cov))
    inflation, noise_ar = np.ones(n_inputs), ()
    if autocorrelation:
        inflation, noise_ar = long_run.inflation(weights, residuals, design.run_of, design.n_runs)
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
                    log_marginals=log_marginals, budget_spent=budget.spent, evaluations=budget.evaluations,
                    seconds=time.perf_counter() - started)


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
        self.problem = Evidence(gram, cross, yy, self.rows - nuisance, self.n_inputs, n)

    def estimate(self, post: Posterior) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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


def _search(problem: Evidence, kernels: Sequence[str], budget: Budget,
            starts: Sequence[np.ndarray]) -> tuple[str, np.ndarray, dict[str, float]]:
    """The kernel and hyperparameters of the highest marginal likelihood (module docstring): TC from
    each of `starts`, DC from the best TC optimum so far whenever it improves (the first start's DC fit
    comes before the second start: under a tight budget DC matters more than a second TC start), DC
    kept when it gains more than DC_PENALTY_PER_HYPER per added hyperparameter. The log marginal
    likelihood of each kernel fitted (normalised rows)."""
    results: dict[str, tuple[np.ndarray, float]] = {}
    for start in starts:  # TC is fitted for DC's start even when only DC is asked for
        if budget.spent and TC in results:
            break
        eta, value = maximise(problem, TC, start, budget)
        if TC in results and value >= results[TC][1] - 1e-6 * abs(results[TC][1]):
            continue
        results[TC] = (eta, value)
        if DC in kernels and not budget.spent:
            dc = maximise(problem, DC, problem.dc_from_tc(eta), budget)
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
