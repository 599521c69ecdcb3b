"""State-space arithmetic on the contract StateSpace: batched open-loop rollout and steady state.

This is the one simulation path of the linear model; the QP builders use their own matrices and
the verifier re-simulates with this module.
"""

import numpy as np

from optimizer_pipeline.contracts import StateSpace


def rollout(ss: StateSpace, x0: np.ndarray, u: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
    """Open-loop outputs of many start points at once, normalised units.

    x0 (m, nx); u (m, k, nu); d (m, k, nd) or None (zeros). Returns y (m, k, ny) where y[:, j] is
    the output at the end of step j (u[:, j] held during step j). Loops over the k steps only.
    """
    A, B, E, f, C = ss.arrays()
    x = np.asarray(x0, float)
    u = np.asarray(u, float)
    m, k, _ = u.shape
    if d is None or E.shape[1] == 0:
        drive = u @ B.T + f
    else:
        drive = u @ B.T + np.asarray(d, float) @ E.T + f
    y = np.empty((m, k, C.shape[0]))
    At, Ct = A.T, C.T
    for j in range(k):
        x = x @ At + drive[:, j]
        y[:, j] = x @ Ct
    return y


def steady_state(ss: StateSpace, rcond: float = 1e-8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steady-state map y_ss = G u + Gd d + y0 (normalised units).

    G = C (I - A)^-1 B (ny, nu), Gd = C (I - A)^-1 E (ny, nd), y0 = C (I - A)^-1 f (ny,).
    A (near-)integrating model makes I - A singular: the least-squares solution with `rcond`
    keeps the map finite instead of inventing huge gains.
    """
    A, B, E, f, C = ss.arrays()
    lhs = np.eye(A.shape[0]) - A
    rhs = np.hstack([B, E, f[:, None]])
    sol = np.linalg.lstsq(lhs, rhs, rcond=rcond)[0]
    mapped = C @ sol
    nu, nd = B.shape[1], E.shape[1]
    return mapped[:, :nu], mapped[:, nu:nu + nd], mapped[:, nu + nd]
