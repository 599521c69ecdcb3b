"""The long-run variance of a linear estimate under coloured noise: how much an AR model of a fit's
residuals widens the standard errors a white-noise posterior gives (model/fir.py's autocorrelation
correction).

An estimate w' y (weights w over the rows) has variance gamma(0) w' w under white noise and sum_t sum_s
w_t w_s gamma(t - s) within runs under noise of autocovariance gamma. `inflation` returns the ratio per
estimate, gamma from an AR(p) model of the residuals (Yule-Walker, p <= AR_MAX_ORDER chosen by BIC, p = 0
white), at least 1: a negative correlation is not taken to make an estimate better known than the white
model says.
"""

import math

import numpy as np
from scipy.linalg import solve_toeplitz
from scipy.signal import lfilter

AR_MAX_ORDER = 10  # the residuals' AR model, order chosen by BIC
# the AR model's autocovariance is summed to this many lags at most (and to the longest run)
LONG_RUN_LAGS = 2000


def inflation(weights: np.ndarray, residuals: np.ndarray, run_of: np.ndarray,
               n_runs: int) -> tuple[np.ndarray, tuple[float, ...]]:
    """Per gain the long-run factor (module docstring) and the residuals' AR coefficients. The gain
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
