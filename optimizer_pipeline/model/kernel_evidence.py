"""The marginal likelihood of a kernel-regularised linear regression (empirical Bayes, Pillonetto, Chen
& Ljung's kernel methods), the engine of model/fir.py's regularised FIR.

The coefficients theta of each input's block (n of them) are Gaussian, N(0, c K), independent across
blocks, with the TC kernel K[k, l] = lambda^max(k, l) or the DC kernel K[k, l] = lambda^((k + l) / 2)
rho^|k - l| (TC is DC with rho = sqrt(lambda)). `Evidence` evaluates -2 log p(y) and its analytic
gradient over the optimiser coordinates (log c, logit lambda, atanh rho per block; the noise variance
profiled out) from the normal equations alone, so no evaluation touches the rows; `maximise` runs
L-BFGS-B on it under a `Budget`; `Evidence.posterior` gives the coefficients' posterior and
`Evidence.hyper_spread` the spread the hyperparameters' own uncertainty adds to linear functionals of
them (Laplace).
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cholesky, solve_triangular
from scipy.optimize import minimize

TC, DC = "TC", "DC"
# hyperparameter bounds (optimiser coordinates): lambda in [1e-3, 1 - 1e-6], rho in tanh(+-5)
LOG_C_BOUNDS = (-25.0, 25.0)
LOGIT_LAMBDA_BOUNDS = (math.log(1e-3 / (1 - 1e-3)), math.log((1 - 1e-6) / 1e-6))
ATANH_RHO_BOUNDS = (-5.0, 5.0)
# the hyperparameters' uncertainty (`Evidence.hyper_spread`): forward-difference step in the optimiser
# coordinates, and how close to a bound a coordinate counts as on it
HYPER_STEP = 1e-4
HYPER_BOUND_MARGIN = 1e-3
# L-BFGS-B's relative tolerance on -2 log p (values of thousands: 1e-10 is ~1e-6 in log p)
SEARCH_FTOL = 1e-10


def kernel_factor(kernel: str, n: int, c: float, lam: float, rho: float = 0.0) -> np.ndarray:
    """L (n, n) with c K = L L' (model/fir.py's module docstring), closed form: TC as the sum of independent increments
    from the FIR's end, x_k = sum_{j >= k} w_j; DC as lambda^(k/2) times an AR(1) of coefficient rho."""
    k = np.arange(n)
    if kernel == TC:
        powers = lam ** k
        increments = np.append(powers[:-1] - powers[1:], powers[-1])  # var w_j
        return np.triu(np.ones((n, n))) * np.sqrt(c * np.maximum(increments, 0.0))
    lower = np.tril(rho ** np.maximum(k[:, None] - k[None, :], 0).astype(float))
    lower[1:, 1:] *= math.sqrt(max(1.0 - rho * rho, 0.0))
    return math.sqrt(c) * lam ** (k / 2.0)[:, None] * lower


def kernel_grads(kernel: str, n: int, c: float, lam: float, rho: float = 0.0) -> list[np.ndarray]:
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
class Posterior:
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


class Budget:
    """The search's budget of objective evaluations (None: unbounded): spent once `evaluations`
    reach it. Counted, not timed, so that a fit comes out the same on a fast machine and a loaded one."""

    def __init__(self, evaluations: int | None):
        self.limit, self.evaluations = evaluations, 0

    def count(self) -> None:
        self.evaluations += 1

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.evaluations >= self.limit


class _Spent(Exception):
    pass


class Evidence:
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
            L[block, block] = kernel_factor(kernel, self.n, c, lam, rho)
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
            grad += [sigma2 * float(np.sum(M * d)) for d in kernel_grads(kernel, self.n, c, lam, rho)]
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

    def posterior(self, kernel: str, eta: np.ndarray, noise: float | None = None) -> Posterior:
        """The coefficients' posterior: prior covariance noise x L L'; `noise` the profiled variance
        unless given."""
        _, L, _, R, z, Q = self._solve(kernel, eta)
        mean = L @ solve_triangular(R, z, check_finite=False)
        return Posterior(mean, Q / self.m if noise is None else float(noise), L, R)

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


def maximise(problem: Evidence, kernel: str, start: np.ndarray, budget: Budget,
              ftol: float = SEARCH_FTOL) -> tuple[np.ndarray, float]:
    """L-BFGS-B on the objective from `start`; on the budget's end, the best point evaluated so far."""
    best = [start, math.inf]

    def fun(eta: np.ndarray) -> tuple[float, np.ndarray]:
        if budget.spent and np.isfinite(best[1]):
            raise _Spent
        value, grad = problem.objective(kernel, eta)
        budget.count()
        if value < best[1]:
            best[0], best[1] = eta.copy(), value
        return value, grad

    try:
        minimize(fun, start, jac=True, method="L-BFGS-B", bounds=problem.bounds(kernel),
                 options={"maxiter": 200, "ftol": ftol, "gtol": 1e-6})
    except _Spent:
        pass
    return best[0], best[1]
