"""State-space arithmetic on the contract StateSpace: batched open-loop rollout (of one model, or of
each window by its own), steady state, the response to a held disturbance and settling horizon.

The disturbance: a constant `e` (ny,) added to the state rows the outputs read (`C' e`: in the ARX
realisation of model/arx.py, to the equation of y[t+1] at every step) - the live state's disturbance
(model.arx.fit_disturbance), held over the prediction. Held this way, a prediction from a plant at rest
stays where the plant is measured, whatever the model's gain error, so a receding-horizon
controller has no steady-state offset (an output bias added to C x instead keeps an offset of
(1 - sum of the AR coefficients) of the gain error's effect).

This is the one simulation path of the linear model; the QP builders use their own matrices and
the verifier re-simulates with this module.
"""

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from optimizer_pipeline.contracts import StateSpace

SETTLE_FRACTION = 0.05  # settled: every step response within 5 % of its output's largest steady gain
INTEGRATOR_TOL = 1e-9  # a singular value of I - A below this (relative, at least absolute): an integrator
MAX_SETTLING_STEPS = 2000  # a model that has not settled by then has no settling horizon


def rollout(ss: StateSpace, x0: np.ndarray, u: np.ndarray, d: np.ndarray | None = None,
            disturbance: np.ndarray | None = None) -> np.ndarray:
    """Open-loop outputs of many start points at once, normalised units.

    x0 (m, nx); u (m, k, nu); d (m, k, nd) or None (zeros); disturbance (ny,) held, or None (the
    module docstring). Returns y (m, k, ny) where y[:, j] is the output at the end of step j
    (u[:, j] held during step j). Loops over the k steps only.
    """
    A, B, E, f, C = ss.arrays()
    if disturbance is not None:
        f = f + C.T @ np.asarray(disturbance, float)
    u = np.asarray(u, float)
    if d is None or E.shape[1] == 0:
        drive = u @ B.T + f
    else:
        drive = u @ B.T + np.asarray(d, float) @ E.T + f
    At, Ct = A.T, C.T
    return _simulate(np.asarray(x0, float), drive, lambda x: x @ At, lambda x: x @ Ct, C.shape[0])


def rollout_each(models: Sequence[StateSpace], x0: np.ndarray, u: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
    """`rollout` of every start point by its own model: start point i (row i of x0, u, d) by models[i],
    all of one state layout (the refits of one structure, model/local.py). No disturbance held.
    Returns y (m, k, ny); loops over the k steps only."""
    A, B, E, f, C = (np.stack(parts) for parts in zip(*(ss.arrays() for ss in models)))
    drive = np.einsum("mxa,mka->mkx", B, np.asarray(u, float)) + f[:, None]
    if d is not None and E.shape[2]:
        drive = drive + np.einsum("mxe,mke->mkx", E, np.asarray(d, float))
    return _simulate(np.asarray(x0, float), drive, lambda x: np.einsum("mxz,mz->mx", A, x),
                     lambda x: np.einsum("myx,mx->my", C, x), C.shape[1])


def _simulate(x: np.ndarray, drive: np.ndarray, advance: Callable[[np.ndarray], np.ndarray],
              read: Callable[[np.ndarray], np.ndarray], ny: int) -> np.ndarray:
    """The recurrence of both rollouts: x <- A x + drive[:, j], y[:, j] = C x (A x and C x as
    `advance` and `read` compute them for the one model or each window's own)."""
    m, k, _ = drive.shape
    y = np.empty((m, k, ny))
    for j in range(k):
        x = advance(x) + drive[:, j]
        y[:, j] = read(x)
    return y


@lru_cache(maxsize=256)
def integrators(ss: StateSpace) -> tuple[np.ndarray, np.ndarray]:
    """(W (k, nx), V (nx, k)), W V = I: the left and right null spaces of I - A, one row / column per
    integrator of the model: a pole exactly at 1, as identification fixes it for a CV declared
    integrating (model/fit.py, `Structure.integrating`); a pole fitted near 1 is no integrator.
    Held inputs b drive the state along V at V W b per step once the rest has settled: the ramp.
    Cached by value; the arrays are read-only."""
    A = ss.arrays()[0]
    nx = A.shape[0]
    W, V = np.zeros((0, nx)), np.zeros((nx, 0))
    if nx:
        left, sv, right = np.linalg.svd(np.eye(nx) - A)
        null = sv < INTEGRATOR_TOL * max(1.0, float(sv.max()))
        W0, V0 = left[:, null].T, right[null].T
        # a defective pole at 1 (a double integrator: its left and right null vectors are orthogonal, W0 V0
        # singular) is no integrator here: unstable, as any other pole on the unit circle
        if null.any() and np.linalg.svd(W0 @ V0, compute_uv=False).min() > INTEGRATOR_TOL:
            W, V = np.linalg.solve(W0 @ V0, W0), V0
    for a in (W, V):
        a.setflags(write=False)
    return W, V


@lru_cache(maxsize=256)
def integrating_outputs(ss: StateSpace) -> np.ndarray:
    """(ny,) bool, read-only: the outputs that read an integrator (`integrators`): they ramp under held
    inputs. Cached by value."""
    _, V = integrators(ss)
    C = ss.arrays()[4]
    ramps = np.abs(C @ V).max(axis=1, initial=0.0) > INTEGRATOR_TOL if V.size else np.zeros(C.shape[0], bool)
    ramps.setflags(write=False)
    return ramps


def _settled(ss: StateSpace, rhs: np.ndarray, rcond: float) -> np.ndarray:
    """C times the settled state of the columns of `rhs` held (C (I - A)^-1 rhs); for an output that reads
    an integrator, its settled rate per step instead: C V W rhs (`integrators`). The rest of the state
    settles at (I - A)^-1 (rhs - V W rhs), solved by least squares with `rcond` (a near-integrating
    model keeps a finite map instead of inventing huge gains)."""
    A, _, _, _, C = ss.arrays()
    W, V = integrators(ss)
    ramp = V @ (W @ rhs) if W.size else np.zeros_like(rhs)
    level = C @ np.linalg.lstsq(np.eye(A.shape[0]) - A, rhs - ramp, rcond=rcond)[0]
    return np.where(integrating_outputs(ss)[:, None], C @ ramp, level)


def steady_state(ss: StateSpace, rcond: float = 1e-8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steady-state map y_ss = G u + Gd d + y0 (normalised units).

    G = C (I - A)^-1 B (ny, nu), Gd = C (I - A)^-1 E (ny, nd), y0 = C (I - A)^-1 f (ny,); an integrating
    output's rows are its settled rate per step (`_settled`): 0 where the held inputs balance it.
    """
    A, B, E, f, C = ss.arrays()
    mapped = _settled(ss, np.hstack([B, E, f[:, None]]), rcond)
    nu, nd = B.shape[1], E.shape[1]
    return mapped[:, :nu], mapped[:, nu:nu + nd], mapped[:, nu + nd]


def balance_rows(ss: StateSpace, horizon: int) -> np.ndarray:
    """(ny,) the factor a steady target (steady_response@1, the steady-state layer) reads each output of
    `steady_state` by: 1 for a settling output (its settled value), `horizon` for an integrating one (its
    settled rate becomes its drift over the plan's horizon, a balance row held at 0: a drift in the units of
    the CV's limits, so the soft-limit penalty holds it as it holds any limit, where a rate per step could be
    too small a number to weigh)."""
    return np.where(integrating_outputs(ss), float(horizon), 1.0)


def disturbance_gain(ss: StateSpace, steps: int | None = None, rcond: float = 1e-8) -> np.ndarray:
    """(ny, ny): the outputs' response to a held disturbance (module docstring) of one unit per
    output, from rest: after `steps` steps (C (I + A + ... + A^(steps-1)) C'), or at steady state
    (None: C (I - A)^-1 C' as in `steady_state`, an integrating output's rate per step)."""
    if steps is not None:
        return disturbance_step_gains(ss, steps)[-1]
    return _settled(ss, ss.arrays()[4].T, rcond)


def disturbance_step_gains(ss: StateSpace, steps: int) -> np.ndarray:
    """(steps, ny, ny): G_j = C (I + A + ... + A^(j-1)) C', j = 1..steps: the outputs after j steps of a
    held disturbance of one unit per output, from rest (`disturbance_gain` for every j)."""
    return disturbance_step_gains_each([ss], steps)[0]


def disturbance_step_gains_each(models: Sequence[StateSpace], steps: int) -> np.ndarray:
    """(m, steps, ny, ny): `disturbance_step_gains` of each of `models` (one state layout), at once."""
    A, C = np.stack([ss.arrays()[0] for ss in models]), np.stack([ss.arrays()[4] for ss in models])
    x = np.transpose(C, (0, 2, 1))
    total = np.zeros_like(x)
    gains = np.empty((len(models), steps, C.shape[1], C.shape[1]))
    for j in range(steps):
        total = total + x
        x = A @ x
        gains[:, j] = C @ total
    return gains


@lru_cache(maxsize=256)
def settling_steps(ss: StateSpace, fraction: float = SETTLE_FRACTION, cap: int = MAX_SETTLING_STEPS) -> int | None:
    """The smallest H >= 1 such that, with every input (MVs and DVs) stepped by one unit and held,
    the response after H or more steps stays within `fraction` of its final value; the tolerance is
    taken per output as `fraction` times the output's largest |steady gain|. An integrating output
    (`integrating_outputs`) settles when its rate (the response's change per step) does. None when that
    has not happened within `cap` steps (slow or unstable model).

    Cached by value (StateSpace is frozen and hashable): the `cap` steps are a Python loop of ~35 ms,
    and one solve or scoring asks it of the same model several times (block rule, disturbance window,
    the local refit's settle limit). An unstable model's response overflows: it does not settle, and
    numpy is not asked to warn about it.
    """
    A, B, E, _, C = ss.arrays()
    inputs = np.hstack([B, E])
    G, Gd, _ = steady_state(ss)
    final = np.hstack([G, Gd])  # (ny, nu + nd)
    tol = fraction * np.max(np.abs(final), axis=1, initial=0.0)[:, None]
    x = np.zeros((inputs.shape[1], A.shape[0]))  # one state per input, unit step held from step 0
    ramps = integrating_outputs(ss)
    before = np.zeros((inputs.shape[1], C.shape[0]))
    last_outside = -1  # the last step whose response is outside (step k ends after k + 1 steps held)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(cap):
            x = x @ A.T + inputs.T
            y = x @ C.T  # (n_inputs, ny): row j = response to input j at the end of step k
            judged = np.where(ramps, y - before, y) if ramps.any() else y  # an integrating output: its rate
            before = y
            if np.any((np.abs(judged.T - final) > tol) | ~np.isfinite(judged.T)):
                last_outside = k
    return None if last_outside == cap - 1 else last_outside + 2
