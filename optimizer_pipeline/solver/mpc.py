"""linear_mpc_quadratic@1: the sparse OSQP formulation of the move-plan problem (states as variables).

Everything is in normalised model units. With horizon N, the QP variable is

    z = [x_1 .. x_N (N*nx),  u_0 .. u_{N-1} (N*nu),  s_1 .. s_N (N*ny)]

and the problem (minimise 1/2 z'Pz + q'z, plus the constant `constant`, subject to l <= A z <= u) is

    sum_k sum_j w_j (y_kj - target_j)^2  +  move_weight * sum_k ||du_k||^2  +  slack_weight * sum_kj (s_kj + s_kj^2)
    + u_target_weight * sum_k ||u_k - u_target||^2     (only a plan steered to a steady-state target)
    x_{k+1} = Ad x_k + Bd u_k + E d + f + C' bias   (x_0 = current state; d and the disturbance bias held:
    y_k     = C x_k                                    offset-free tracking, model/statespace.py)
    du_k    = u_k - u_{k-1},  u_{-1} = u_prev
    u_lo <= u_k <= u_hi,  |du_k| <= du_max   (hard)
    lo - s_k <= y_k <= hi + s_k,  s_k >= 0   (soft CV limits, one slack per step and CV)

The slack penalty is linear plus quadratic: the linear part makes it exact (no violation when the
limits can be met, for a large enough weight), the quadratic part keeps the Hessian definite in s
and spreads an unavoidable violation. P and A depend only on the structure (`structure_key`);
x0, u_prev, d, bias, limits and targets enter only q, l, u, so a receding-horizon re-solve
updates vectors and never refactorises; the CV limits enter only the soft-limit rows of l and u
(`with_cv_limits` swaps them for the robust candidate).
"""

from typing import Hashable

import numpy as np
import scipy.sparse as sparse
import scipy.sparse.linalg

from optimizer_pipeline.contracts import ProblemIR, StateSpace, Template
from optimizer_pipeline.model.statespace import integrators

OSQP_TOLERANCES: dict[str, float] = {}  # solver/solve.py's OSQP_SETTINGS as they are

# (model, its arrays) of the last model asked for: one solve needs them ~5 times (vectors twice,
# plans, hold point), ~8 us a conversion at 10 states. One tuple, swapped whole: thread safe.
_last_arrays: tuple[StateSpace | None, tuple[np.ndarray, ...]] = (None, ())


def _arrays(model: StateSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """model.arrays() (Ad, Bd, E, f, C), read-only, remembered for the last model object."""
    global _last_arrays
    last = _last_arrays
    if last[0] is not model:
        arrays = model.arrays()
        for a in arrays:
            a.setflags(write=False)
        last = _last_arrays = (model, arrays)
    return last[1]


def _tile(v: np.ndarray, n: int) -> np.ndarray:
    """np.tile(v, n) of a vector (n copies end to end), without np.tile's overhead (~3 us -> ~1 us)."""
    out = np.empty((n, v.shape[0]))
    out[:] = v
    return out.reshape(-1)


def structure_key(problem: ProblemIR) -> Hashable:
    """Everything that enters P or A (a new value needs a new factorisation)."""
    m = problem.model
    return (Template.LINEAR_MPC.value, problem.horizon, m.A, m.B, m.C, problem.y_weight,
            problem.move_weight, problem.slack_weight, problem.u_target_weight)


def _difference(N: int, nu: int) -> sparse.csc_matrix:
    """D (N*nu, N*nu) with D u = [u_0, u_1 - u_0, ..., u_{N-1} - u_{N-2}]; du = D u - e, e = [u_prev, 0..]."""
    return sparse.kron(sparse.eye(N) - sparse.eye(N, k=-1), sparse.eye(nu), format="csc")


def matrices(problem: ProblemIR) -> tuple[sparse.csc_matrix, sparse.csc_matrix]:
    """(P, A): the full symmetric Hessian and the constraint matrix (rows: dynamics, MV bounds,
    MV rates, CV low, CV high, slack sign)."""
    Ad, Bd, _, _, C = _arrays(problem.model)
    N, nx, nu, ny = problem.horizon, Ad.shape[0], Bd.shape[1], C.shape[0]
    W = np.diag(problem.y_weight)
    Q = C.T @ W @ C
    D = _difference(N, nu)
    IN = sparse.eye(N)
    Puu = 2 * problem.move_weight * (D.T @ D) + 2 * problem.u_target_weight * sparse.eye(N * nu)
    P = sparse.block_diag([sparse.kron(IN, 2 * Q), Puu, 2 * problem.slack_weight * sparse.eye(N * ny)], format="csc")

    Ax = sparse.kron(IN, -sparse.eye(nx)) + sparse.kron(sparse.eye(N, k=-1), Ad)
    Bu = sparse.kron(IN, Bd)
    Cx = sparse.kron(IN, C)
    Is = sparse.eye(N * ny)
    Iu = sparse.eye(N * nu)
    zx, zu, zs = (None,) * 3  # empty blocks of sparse.bmat
    blocks = [
        [Ax, Bu, zs],          # dynamics (equality)
        [zx, Iu, zs],          # MV bounds
        [zx, D, zs],           # MV rates
        [Cx, zu, Is],          # C x + s >= lo
        [Cx, zu, -Is],         # C x - s <= hi
        [zx, zu, Is],          # s >= 0
    ]
    W = integrators(problem.model)[0]
    if W.shape[0]:  # the plan ends balanced: W (B u_{N-1} + drive) = 0
        last = sparse.hstack([sparse.csc_matrix((W.shape[0], (N - 1) * nu)), sparse.csc_matrix(W @ Bd)])
        blocks.append([sparse.csc_matrix((W.shape[0], N * nx)), last, sparse.csc_matrix((W.shape[0], N * ny))])
    A = sparse.bmat(blocks, format="csc")
    return P, A


def vectors(problem: ProblemIR, y_lo: np.ndarray, y_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(q, l, u, constant) for CV limits y_lo / y_hi (normalised, (ny,)); constant makes the
    QP objective equal the full cost above."""
    Ad, Bd, E, f, C = _arrays(problem.model)
    N, nu, ny = problem.horizon, Bd.shape[1], C.shape[0]
    x0, u_prev, d = np.asarray(problem.x0), np.asarray(problem.u_prev), np.asarray(problem.d)
    bias, target, w = np.asarray(problem.bias), np.asarray(problem.y_target), np.asarray(problem.y_weight)
    mw, sw = problem.move_weight, problem.slack_weight
    drive = (E @ d + f if E.shape[1] else f) + C.T @ bias

    offset = -target  # y_k - target = C x_k + offset
    e = np.zeros(N * nu)
    e[:nu] = u_prev
    q = np.concatenate([_tile(2 * C.T @ (w * offset), N), -2 * mw * e, np.full(N * ny, sw)])
    # D'e = e for this D (only its first block column meets u_prev), hence -2 mw e above.
    constant = N * float(w @ offset ** 2) + mw * float(u_prev @ u_prev)
    if problem.u_target is not None:
        u_target, r = np.asarray(problem.u_target), problem.u_target_weight
        nx = Ad.shape[0]
        q[N * nx:N * (nx + nu)] -= _tile(2 * r * u_target, N)
        constant += N * r * float(u_target @ u_target)

    beq = -np.concatenate([Ad @ x0 + drive, _tile(drive, N - 1)])
    du = _tile(np.asarray(problem.du_max), N)
    inf = np.full(N * ny, np.inf)
    cv_lo, cv_hi = _cv_limit_rows(problem, y_lo, y_hi)
    balance = -integrators(problem.model)[0] @ drive
    l = np.concatenate([beq, _tile(np.asarray(problem.u_lo), N), e - du, cv_lo, -inf, np.zeros(N * ny), balance])
    u = np.concatenate([beq, _tile(np.asarray(problem.u_hi), N), e + du, inf, cv_hi, inf, balance])
    return q, l, u, constant


def _cv_limit_rows(problem: ProblemIR, y_lo: np.ndarray, y_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounds lo (rows "C x + s >= lo") and hi (rows "C x - s <= hi"), (N*ny,) each."""
    return _tile(np.asarray(y_lo, float), problem.horizon), _tile(np.asarray(y_hi, float), problem.horizon)


def with_cv_limits(problem: ProblemIR, l: np.ndarray, u: np.ndarray, y_lo: np.ndarray,
                   y_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(l, u) of `vectors` for other CV limits y_lo / y_hi (normalised, (ny,)): copies with the soft CV
    limit rows replaced (nothing else, nor q or the constant, depends on the limits)."""
    N, nx, nu, ny = problem.horizon, len(problem.x0), len(problem.mv_tags), len(problem.cv_tags)
    start = N * (nx + 2 * nu)  # after the dynamics, MV bound and MV rate rows
    l, u = l.copy(), u.copy()
    l[start:start + N * ny], u[start + N * ny:start + 2 * N * ny] = _cv_limit_rows(problem, y_lo, y_hi)
    return l, u


def settle(problem: ProblemIR, z: np.ndarray, y_lo: np.ndarray, y_hi: np.ndarray) -> np.ndarray:
    """z with its slacks at their least admissible values max(0, lo - y_k, y_k - hi) for CV limits
    y_lo / y_hi: OSQP leaves them up to its tolerance off, and a plan that rides a CV limit for many
    steps (a steered economic target sits on one) sums N such errors at weight slack_weight into a
    cost the verifier, taking the least values, would not agree with. Same x and u; cost not higher."""
    _, y, _ = plan(problem, z)
    z = z.copy()
    N, ny = problem.horizon, len(problem.cv_tags)
    z[len(z) - N * ny:] = np.maximum(0.0, np.maximum(y_lo - y, y - y_hi)).reshape(-1)
    return z


def plan(problem: ProblemIR, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split z into (u (N, nu), y (N, ny), s (N, ny)), normalised; y = C x."""
    _, Bd, _, _, C = _arrays(problem.model)
    N, nx, nu, ny = problem.horizon, C.shape[1], Bd.shape[1], C.shape[0]
    x = z[:N * nx].reshape(N, nx)
    u = z[N * nx:N * (nx + nu)].reshape(N, nu)
    s = z[N * (nx + nu):].reshape(N, ny)
    return u, x @ C.T, s


def hold_point(problem: ProblemIR, A: sparse.csc_matrix, l: np.ndarray, y_lo: np.ndarray,
               y_hi: np.ndarray, memo: dict) -> np.ndarray:
    """z of the baseline "hold u_prev over the horizon": states from the QP's own dynamics rows,
    slacks at their smallest admissible value (so the objective is the hold's cost).

    memo: a per-structure dict (the solver cache entry's) keeping the LU factors of the dynamics block.
    """
    _, Bd, _, _, C = _arrays(problem.model)
    N, nx, nu = problem.horizon, C.shape[1], Bd.shape[1]
    if "dynamics" not in memo:
        rows = A[:N * nx]
        # Ax is block lower-bidiagonal with -I on its diagonal: always invertible.
        memo["dynamics"] = (scipy.sparse.linalg.splu(rows[:, :N * nx].tocsc()), rows[:, N * nx:N * (nx + nu)].tocsr())
    Ax_lu, Bu = memo["dynamics"]
    u_hold = _tile(np.asarray(problem.u_prev, float), N)
    x = Ax_lu.solve(l[:N * nx] - Bu @ u_hold)
    y = x.reshape(N, nx) @ C.T
    s = np.maximum(0.0, np.maximum(y_lo - y, y - y_hi))
    return np.concatenate([x, u_hold, s.reshape(-1)])
