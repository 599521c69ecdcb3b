"""Test helpers for the model and UQ tests: a plain ARX plant recursion (the independent reference),
bindings, run series and history splits built directly in code."""

import numpy as np

from optimizer_pipeline.contracts import BindingSpec, HistorySplit, Normalisation, RunSeries, binding_from_dict


def binding(n_mv: int = 2, n_cv: int = 2, n_dv: int = 0, na: int | None = 2, nb: int | None = 2,
            delay: int | None = 1, horizon: int = 10) -> BindingSpec:
    model = {"horizon": horizon}
    model.update({k: v for k, v in (("na", na), ("nb", nb), ("delay", delay)) if v is not None})
    return binding_from_dict({
        "id": "arx-test", "sample_period_s": 1,
        "mvs": [{"tag": f"u{i}", "lo": -100, "hi": 100, "max_move": 10} for i in range(n_mv)],
        "cvs": [{"tag": f"y{i}", "lo": -100, "hi": 100, "target": 0} for i in range(n_cv)],
        "dvs": [{"tag": f"d{i}"} for i in range(n_dv)],
        "model": model,
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
    })


def simulate_arx(A: np.ndarray, B: np.ndarray, D: np.ndarray, c: np.ndarray, delay: int, u: np.ndarray,
                 d: np.ndarray, noise: np.ndarray, y_init: np.ndarray | None = None) -> np.ndarray:
    """Plain ARX recursion for a batch of runs (engineering units).

    y[t] = sum_i A[i-1] y[t-i] + sum_j (B[j] u[t-delay-j] + D[j] d[t-delay-j]) + c + noise[t]
    for t >= max lag; earlier rows are y_init (default noise only). u (R, n, nu), d (R, n, nd),
    noise (R, n, ny) -> y (R, n, ny).
    """
    runs, n, _ = u.shape
    na, nb = A.shape[0], B.shape[0]
    start = max(na, delay + nb - 1)
    y = np.zeros((runs, n, A.shape[1]))
    y[:, :start] = noise[:, :start] if y_init is None else y_init
    for t in range(start, n):
        acc = c + noise[:, t]
        for i in range(1, na + 1):
            acc = acc + y[:, t - i] @ A[i - 1].T
        for j in range(nb):
            acc = acc + u[:, t - delay - j] @ B[j].T + d[:, t - delay - j] @ D[j].T
        y[:, t] = acc
    return y


def excitation(rng: np.random.Generator, runs: int, n: int, width: int, hold: int = 8) -> np.ndarray:
    """Piecewise-constant random steps plus a little white noise: (runs, n, width)."""
    steps = np.repeat(rng.normal(size=(runs, n // hold + 1, width)), hold, axis=1)[:, :n]
    return steps + 0.2 * rng.normal(size=(runs, n, width))


def run_series(prefix: str, u: np.ndarray, y: np.ndarray, d: np.ndarray) -> list[RunSeries]:
    return [RunSeries(f"{prefix}{i}", np.arange(u.shape[1], dtype=float), u[i], y[i], d[i])
            for i in range(u.shape[0])]


def normalisation(spec: BindingSpec, runs: list[RunSeries]) -> Normalisation:
    """Train statistics of `runs` in binding tag order (MVs, CVs, DVs)."""
    u = np.concatenate([r.u for r in runs])
    y = np.concatenate([r.y for r in runs])
    d = np.concatenate([r.d for r in runs]) if spec.dv_tags else np.empty((len(u), 0))
    data = np.hstack([u, y, d])
    return Normalisation(spec.tags, tuple(data.mean(axis=0)), tuple(data.std(axis=0)))


def unit_normalisation(spec: BindingSpec) -> Normalisation:
    """mean 0, std 1: normalised units equal engineering units."""
    return Normalisation(spec.tags, (0.0,) * len(spec.tags), (1.0,) * len(spec.tags))


def split_of(spec: BindingSpec, runs: list[RunSeries], n_train: int, n_val: int, n_test: int,
             norm: Normalisation | None = None) -> HistorySplit:
    """train / val / test in order, the next run (if any) is live."""
    train = runs[:n_train]
    val = runs[n_train:n_train + n_val]
    test = runs[n_train + n_val:n_train + n_val + n_test]
    rest = runs[n_train + n_val + n_test:]
    return HistorySplit(tuple(train), tuple(val), tuple(test), rest[0] if rest else None,
                        norm or normalisation(spec, train), {}, "data-hash-for-tests")
