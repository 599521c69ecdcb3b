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

Economics (a binding with costs; ProblemIR.economic): the objective adds

    econ_u @ u + econ_uu @ u^2 + econ_y @ y + econ_yy @ y^2      (the costs, normalised and scaled)

and every CV with target_hold 1 is held exactly at y_target, a hard equality row G u = y_target - c.
Those y_target are what a first, targets-only stage reached (the same problem without costs,
solved first: solver/targets.py), so the two stages solve the priorities lexicographically:

Priorities, highest first, when not everything can be had:
1. MV limits and the move reach: hard, never relaxed.
2. CV limits: soft, exact penalty slack_weight (1e3): relaxed only when the MVs cannot hold them all,
   the violation shared by the penalty's quadratic part (both stages).
3. CV targets (CVs with a target and a weight > 0): the first stage gets as close as 1-2 allow
   (tracking weights); the second holds them there.
4. Economics: the costs, scaled to a largest gradient of 1 per normalised MV, spend the freedom
   1-3 leave (a CV without a target, more MVs than targets): an LP-like optimum at a limit. Against
   the CV limits they weigh as the exact penalty says: a limit gives way only if its multiplier
   would exceed 1e3, i.e. for a CV whose normalised gain is below ~1e-3 of the costs' gradient.
5. Movement: STEADY_MOVE_SCALE * move_weight * ||u - u_prev||^2 breaks ties (with quadratic costs
   it also pulls a little toward u_prev).
"""

from typing import Hashable

import numpy as np
import scipy.sparse as sparse

from optimizer_pipeline.contracts import ProblemIR, Template

STEADY_MOVE_SCALE = 0.01
# Over solve.py's OSQP_SETTINGS (1e-5): a steady target has nu + ny variables, so a tighter
# tolerance costs microseconds; along an ill-conditioned gain's weak direction 1e-5 left reachable
# targets 6e-4 of a CV's std off (polishing fails there), 1e-7 leaves 5e-6 (tests/test_economics.py,
# gain condition 320: 125 iterations for the targets, ~12 000 for the costs with both targets held;
# 1e-8 ran out of OSQP's 20 000 there).
OSQP_TOLERANCES = {"eps_abs": 1e-7, "eps_rel": 1e-7}


def move_limit(problem: ProblemIR) -> np.ndarray:
    """Largest allowed |u - u_prev| per MV (normalised, (nu,)) of a steady target."""
    return problem.horizon * np.asarray(problem.du_max, float)


def structure_key(problem: ProblemIR) -> Hashable:
    """Everything that enters P or A (a new value needs a new factorisation)."""
    return (Template.STEADY_RESPONSE.value, problem.steady_gain, problem.y_weight, problem.move_weight,
            problem.slack_weight, problem.econ_uu, problem.econ_yy)


def matrices(problem: ProblemIR) -> tuple[sparse.csc_matrix, sparse.csc_matrix]:
    """(P, A): full symmetric Hessian; rows MV bounds, MV move, CV low, CV high, slack sign, and with
    economics the held targets (an equality where target_hold is 1, free otherwise)."""
    G = np.asarray(problem.steady_gain, float)
    ny, nu = G.shape
    W = np.diag(problem.y_weight)
    mws = STEADY_MOVE_SCALE * problem.move_weight
    Puu = G.T @ W @ G + mws * np.eye(nu)
    if problem.economic:
        Puu = Puu + np.diag(problem.econ_uu) + G.T @ np.diag(problem.econ_yy) @ G
    P = sparse.block_diag([2 * Puu, 2 * problem.slack_weight * sparse.eye(ny)], format="csc")
    Iu, Is, Gs = sparse.eye(nu), sparse.eye(ny), sparse.csc_matrix(G)
    rows = [
        [Iu, None],    # MV bounds
        [Iu, None],    # MV move from u_prev
        [Gs, Is],      # G u + s >= lo - c
        [Gs, -Is],     # G u - s <= hi - c
        [None, Is],    # s >= 0
    ]
    if problem.economic:
        rows.append([Gs, None])  # G u = y_target - c where held
    return P, sparse.bmat(rows, format="csc")


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
    if problem.economic:
        # econ_y @ y + econ_yy @ y^2 with y = G u + c: linear G'(econ_y + 2 econ_yy c), constant at u = 0
        a_y, b_y = np.asarray(problem.econ_y), np.asarray(problem.econ_yy)
        q[:len(u_prev)] += np.asarray(problem.econ_u) + G.T @ (a_y + 2 * b_y * c)
        constant += float(a_y @ c + b_y @ c ** 2)
        hold = np.asarray(problem.target_hold) == 1.0
        to_target = np.asarray(problem.y_target) - c
        l = np.concatenate([l, np.where(hold, to_target, -inf)])
        u = np.concatenate([u, np.where(hold, to_target, inf)])
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


def settle(problem: ProblemIR, z: np.ndarray, y_lo: np.ndarray, y_hi: np.ndarray) -> np.ndarray:
    """z with its slacks at their least admissible values max(0, lo - y, y - hi) for CV limits
    y_lo / y_hi: OSQP leaves them up to its tolerance off (a slack of -8e-9 is -8e-6 of cost at
    weight 1e3), which the verifier's recomputed cost, taken at the least values, would see as a
    disagreement. Same u; cost not higher."""
    nu = len(problem.mv_tags)
    _, y, _ = plan(problem, z)
    z = z.copy()
    z[nu:] = np.maximum(0.0, np.maximum(y_lo - y[0], y[0] - y_hi))
    return z


def plan(problem: ProblemIR, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split z into (u (1, nu), y (1, ny), s (1, ny)), normalised."""
    nu = len(problem.mv_tags)
    u = z[:nu]
    y = np.asarray(problem.steady_gain, float) @ u + _offset(problem)
    return u[None, :], y[None, :], z[nu:][None, :]


def hold_point(problem: ProblemIR, A: sparse.csc_matrix, l: np.ndarray, y_lo: np.ndarray,
               y_hi: np.ndarray, memo: dict) -> np.ndarray:
    """z of the baseline "stay at u_prev", slacks at their smallest admissible value (a held target's
    equality is not met by holding: the baseline is priced, not solved)."""
    u = np.asarray(problem.u_prev, float)
    y = np.asarray(problem.steady_gain, float) @ u + _offset(problem)
    s = np.maximum(0.0, np.maximum(y_lo - y, y - y_hi))
    return np.concatenate([u, s])
