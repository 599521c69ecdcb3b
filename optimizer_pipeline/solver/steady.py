"""steady_response@1: the steady-state target QP on the model's steady-state gain (normalised units).

Variables z = [u (nu), s (ny)]; with c = Gd d + y0 (DVs held; y0, the compiled `steady_offset`,
holds the disturbance: ProblemIR),

    minimise  sum_j w_j (y_j - target_j)^2 + STEADY_MOVE_SCALE * move_weight * ||u - u_prev||^2
              + slack_weight * sum_j (s_j + s_j^2)
    y = G u + c
    u_lo <= u <= u_hi                          (hard)
    |u - u_prev| <= horizon * du_max           (hard: the target is reachable within the profile
                                                horizon at the max move rate; horizon 1 = one move)
    lo - s <= y <= hi + s,  s >= 0             (soft CV limits, same penalty form as mpc.py)

The movement term only picks among MV combinations that reach the targets equally well (a
non-square or ill-conditioned G); scaled by STEADY_MOVE_SCALE it biases a reachable target by
about 1 % of the distance moved for move_weight ~ 1 and unit gains, instead of ~10 %.
A candidate has one row: controls (1, nu) is the steady MV target, predicted (1, ny) the CVs at it.
"""

from typing import Hashable

import numpy as np
import scipy.sparse as sparse

from optimizer_pipeline.contracts import ProblemIR, Template

STEADY_MOVE_SCALE = 0.01


def move_limit(problem: ProblemIR) -> np.ndarray:
    """Largest allowed |u - u_prev| per MV (normalised, (nu,)) of a steady target."""
    return problem.horizon * np.asarray(problem.du_max, float)


def structure_key(problem: ProblemIR) -> Hashable:
    """Everything that enters P or A (a new value needs a new factorisation)."""
    return (Template.STEADY_RESPONSE.value, problem.steady_gain, problem.y_weight, problem.move_weight,
            problem.slack_weight)


def matrices(problem: ProblemIR) -> tuple[sparse.csc_matrix, sparse.csc_matrix]:
    """(P, A): full symmetric Hessian; rows MV bounds, MV move, CV low, CV high, slack sign."""
    G = np.asarray(problem.steady_gain, float)
    ny, nu = G.shape
    W = np.diag(problem.y_weight)
    mws = STEADY_MOVE_SCALE * problem.move_weight
    P = sparse.block_diag([2 * (G.T @ W @ G + mws * np.eye(nu)), 2 * problem.slack_weight * sparse.eye(ny)],
                          format="csc")
    Iu, Is, Gs = sparse.eye(nu), sparse.eye(ny), sparse.csc_matrix(G)
    A = sparse.bmat([
        [Iu, None],    # MV bounds
        [Iu, None],    # MV move from u_prev
        [Gs, Is],      # G u + s >= lo - c
        [Gs, -Is],     # G u - s <= hi - c
        [None, Is],    # s >= 0
    ], format="csc")
    return P, A


def _offset(problem: ProblemIR) -> np.ndarray:
    """c = Gd d + y0 (ny,): the part of the steady CVs the MVs do not move."""
    Gd = np.asarray(problem.steady_dv_gain, float).reshape(len(problem.cv_tags), len(problem.dv_tags))
    return Gd @ np.asarray(problem.d) + np.asarray(problem.steady_offset)


def vectors(problem: ProblemIR, y_lo: np.ndarray, y_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(q, l, u, constant) for CV limits y_lo / y_hi (normalised, (ny,))."""
    G = np.asarray(problem.steady_gain, float)
    ny = G.shape[0]
    u_prev, w, sw = np.asarray(problem.u_prev), np.asarray(problem.y_weight), problem.slack_weight
    mws = STEADY_MOVE_SCALE * problem.move_weight
    c = _offset(problem)
    offset = c - np.asarray(problem.y_target)  # y - target = G u + offset
    q = np.concatenate([2 * G.T @ (w * offset) - 2 * mws * u_prev, np.full(ny, sw)])
    constant = float(w @ offset ** 2) + mws * float(u_prev @ u_prev)
    move, inf = move_limit(problem), np.full(ny, np.inf)
    l = np.concatenate([problem.u_lo, u_prev - move, y_lo - c, -inf, np.zeros(ny)])
    u = np.concatenate([problem.u_hi, u_prev + move, inf, y_hi - c, inf])
    return q, l, u, constant


def with_cv_limits(problem: ProblemIR, l: np.ndarray, u: np.ndarray, y_lo: np.ndarray,
                   y_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(l, u) of `vectors` for other CV limits y_lo / y_hi (normalised, (ny,)): copies with the soft CV
    limit rows (lo - c, hi - c) replaced (nothing else, nor q or the constant, depends on the limits)."""
    nu, ny = len(problem.mv_tags), len(problem.cv_tags)
    c = _offset(problem)
    l, u = l.copy(), u.copy()
    l[2 * nu:2 * nu + ny], u[2 * nu + ny:2 * nu + 2 * ny] = y_lo - c, y_hi - c
    return l, u


def plan(problem: ProblemIR, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split z into (u (1, nu), y (1, ny), s (1, ny)), normalised."""
    nu = len(problem.mv_tags)
    u = z[:nu]
    y = np.asarray(problem.steady_gain, float) @ u + _offset(problem)
    return u[None, :], y[None, :], z[nu:][None, :]


def hold_point(problem: ProblemIR, A: sparse.csc_matrix, l: np.ndarray, y_lo: np.ndarray,
               y_hi: np.ndarray, memo: dict) -> np.ndarray:
    """z of the baseline "stay at u_prev", slacks at their smallest admissible value."""
    u = np.asarray(problem.u_prev, float)
    y = np.asarray(problem.steady_gain, float) @ u + _offset(problem)
    s = np.maximum(0.0, np.maximum(y_lo - y, y - y_hi))
    return np.concatenate([u, s])
