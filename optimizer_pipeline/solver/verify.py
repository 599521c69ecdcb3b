"""Independent verifier of solve candidates: re-simulation, constraint report and cost recomputation.

Separate code path from the QP builders: the plan (engineering units) is mapped back to
normalised units, re-simulated with model/statespace.py (`rollout` for the MPC template,
`steady_state` for the steady-state template), and its cost recomputed with a plain loop over
steps and tags. Nothing of P, q, A, l, u is used.

Tolerances (documented defaults of `Tolerances`):
* MV bound and rate violation: 1e-4 of the MV range (hi - lo, engineering); the judge allows 1e-4
  (0.01 %) of range, so a plan passing here passes there.
* CV limit violation: 1e-3 of the CV range (engineering). CV limits are soft in the QP; any
  violation is reported per CV, and a plan is `feasible` only when every MV bound / rate holds
  and, at every step, no CV violates a limit by more than holding the current MVs would (plus
  this tolerance): a plant already outside a limit gets a plan that brings it back, not a refusal.
* predicted CVs vs re-simulation: 1e-3 normalised units (0.1 % of a CV's train std).
* cost agreement: |cost - independent| <= 1e-6 + 1e-4 * max(|cost|, |independent|).
`verified` = feasible, predictions agree and costs agree; every failed condition is listed in
verify_report["reasons"].
"""

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from optimizer_pipeline.contracts import CandidateKind, ProblemIR, SolveCandidate, SolveResult, Template
from optimizer_pipeline.model.statespace import rollout, steady_state
from optimizer_pipeline.problem import robust_limits
from optimizer_pipeline.solver.steady import STEADY_MOVE_SCALE, move_limit


@dataclass(frozen=True)
class Tolerances:
    mv_rel: float = 1e-4  # MV bound / rate violation, fraction of the MV range (engineering)
    cv_rel: float = 1e-3  # CV limit violation, fraction of the CV range (engineering)
    prediction_abs: float = 1e-3  # predicted vs re-simulated CVs, normalised units
    cost_rel: float = 1e-4
    cost_abs: float = 1e-6


def independent_cost(problem: ProblemIR, u: np.ndarray, y: np.ndarray, y_lo: np.ndarray, y_hi: np.ndarray) -> float:
    """The template's cost of a plan, term by term (normalised units).

    u (rows, nu), y (rows, ny): MVs held and CVs predicted per step; y_lo / y_hi the CV limits the
    slack penalty is measured against; the slack is the smallest admissible one per step and CV.
    """
    w, target = np.asarray(problem.y_weight), np.asarray(problem.y_target)
    move_weight = problem.move_weight * (STEADY_MOVE_SCALE if problem.template is Template.STEADY_RESPONSE else 1.0)
    tracking = np.sum(w * (y - target) ** 2)
    moves = np.diff(np.vstack([np.asarray(problem.u_prev), u]), axis=0)
    slack = np.maximum(0.0, np.maximum(np.asarray(y_lo) - y, y - np.asarray(y_hi)))
    return float(tracking + move_weight * np.sum(moves ** 2) + problem.slack_weight * np.sum(slack + slack ** 2))


def _simulate(problem: ProblemIR, u: np.ndarray) -> np.ndarray:
    """CVs (m, rows, ny) of the plans u (m, rows, nu), normalised, re-simulated from the model in one batch."""
    d = np.asarray(problem.d, float)
    bias = np.asarray(problem.bias, float)
    if problem.template is Template.STEADY_RESPONSE:
        G, Gd, y0 = steady_state(problem.model)
        return (u[:, :1] @ G.T + Gd @ d + y0 + bias)
    m, rows = u.shape[:2]
    x0 = np.tile(np.asarray(problem.x0, float), (m, 1))
    return rollout(problem.model, x0, u, np.tile(d, (m, rows, 1))) + bias


def _rows(problem: ProblemIR) -> int:
    """Rows of a plan: one per step, a single steady-state row for steady_response@1."""
    return 1 if problem.template is Template.STEADY_RESPONSE else problem.horizon


def _hold_plan(problem: ProblemIR) -> np.ndarray:
    """The current MVs held over the plan's rows (normalised), (rows, nu)."""
    return np.tile(np.asarray(problem.u_prev, float), (_rows(problem), 1))


def _values(array: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in np.asarray(array, float).reshape(-1)]


def verify_candidate(problem: ProblemIR, candidate: SolveCandidate, tolerances: Tolerances = Tolerances(),
                     simulated: tuple[np.ndarray, np.ndarray] | None = None) -> SolveCandidate:
    """The candidate with feasible, verified, independent_cost and verify_report filled (see module doc).

    simulated: (y of this plan, y of holding the current MVs), normalised (rows, ny), when the caller
    re-simulated them already (`verify_candidates` does it for all candidates in one rollout).
    """
    report: dict[str, Any] = {"tolerances": asdict(tolerances)}
    reasons: list[str] = []
    report["reasons"] = reasons

    def rejected(reason: str) -> SolveCandidate:
        reasons.append(reason)
        return replace(candidate, feasible=False, verified=False, independent_cost=None, verify_report=report)

    if not candidate.controls:
        return rejected(f"no plan (solver status {candidate.solver_status!r})")
    rows = _rows(problem)
    nu, ny = len(problem.mv_tags), len(problem.cv_tags)
    try:
        controls = np.asarray(candidate.controls, float)
        predicted = np.asarray(candidate.predicted, float)
    except ValueError:
        return rejected("controls / predicted are not rectangular tables of numbers")
    if controls.shape != (rows, nu) or predicted.shape != (rows, ny):
        return rejected(f"shape: controls {controls.shape} / predicted {predicted.shape}, expected ({rows}, {nu}) / "
                        f"({rows}, {ny})")
    if not (np.all(np.isfinite(controls)) and np.all(np.isfinite(predicted))):
        return rejected("controls / predicted contain non-finite values")

    u_mean, u_std = np.asarray(problem.u_mean), np.asarray(problem.u_std)
    y_mean, y_std = np.asarray(problem.y_mean), np.asarray(problem.y_std)
    u = (controls - u_mean) / u_std
    if simulated is None:
        y, y_hold_norm = _simulate(problem, np.stack([u, _hold_plan(problem)]))
    else:
        y, y_hold_norm = simulated
    if not np.all(np.isfinite(y)):
        return rejected("re-simulated CVs are not finite (unstable model?)")

    # MV bounds and rates, engineering units.
    lo, hi = u_mean + u_std * np.asarray(problem.u_lo), u_mean + u_std * np.asarray(problem.u_hi)
    mv_allowed = tolerances.mv_rel * (hi - lo)
    bound = np.maximum(0.0, np.maximum(lo - controls, controls - hi)).max(axis=0)
    max_move = u_std * (move_limit(problem) if problem.template is Template.STEADY_RESPONSE
                        else np.asarray(problem.du_max))
    moves = np.diff(np.vstack([u_mean + u_std * np.asarray(problem.u_prev), controls]), axis=0)
    rate = np.maximum(0.0, np.abs(moves) - max_move).max(axis=0)
    report.update(mv_bound_violation=_values(bound), mv_rate_violation=_values(rate), mv_allowed=_values(mv_allowed),
                  max_move=_values(max_move))
    for name, violation in (("bound", bound), ("rate", rate)):
        for i in np.flatnonzero(violation > mv_allowed):
            reasons.append(f"MV {problem.mv_tags[i]} {name} violated by {violation[i]:.6g} "
                           f"(allowed {mv_allowed[i]:.3g})")

    # CV limits (nominal), engineering units, on the re-simulated CVs.
    y_eng = y_mean + y_std * y
    cv_lo, cv_hi = y_mean + y_std * np.asarray(problem.y_lo), y_mean + y_std * np.asarray(problem.y_hi)
    cv_allowed = tolerances.cv_rel * (cv_hi - cv_lo)
    per_step = np.maximum(0.0, np.maximum(cv_lo - y_eng, y_eng - cv_hi))
    # A plant already outside a CV limit cannot be brought back at once: the plan may violate a
    # limit by as much as holding the current MVs would at the same step, never by more.
    y_hold = y_mean + y_std * y_hold_norm
    hold_step = np.maximum(0.0, np.maximum(cv_lo - y_hold, y_hold - cv_hi))
    excess = np.maximum(0.0, per_step - hold_step).max(axis=0)
    cv_violation = per_step.max(axis=0)
    report.update(cv_limit_violation=_values(cv_violation), cv_violation_beyond_hold=_values(excess),
                  cv_allowed=_values(cv_allowed))
    for j in np.flatnonzero(excess > cv_allowed):
        reasons.append(f"CV {problem.cv_tags[j]} limit violated by {cv_violation[j]:.6g}, {excess[j]:.6g} more than "
                       f"holding the current MVs (allowed {cv_allowed[j]:.3g})")
    feasible = not reasons

    mismatch = float(np.max(np.abs((predicted - y_eng) / y_std)))
    report["prediction_mismatch"] = mismatch
    if mismatch > tolerances.prediction_abs:
        reasons.append(f"predicted CVs differ from the re-simulation by {mismatch:.3g} normalised units "
                       f"(allowed {tolerances.prediction_abs:g})")

    if candidate.kind is CandidateKind.ROBUST:
        cost_lo, cost_hi = robust_limits(problem)
    else:
        cost_lo, cost_hi = np.asarray(problem.y_lo), np.asarray(problem.y_hi)
    report["cost_limits"] = "robust" if candidate.kind is CandidateKind.ROBUST else "nominal"
    recomputed = independent_cost(problem, u, y, cost_lo, cost_hi)
    if candidate.cost is None:
        reasons.append("solver reported no cost")
    else:
        diff = abs(candidate.cost - recomputed)
        allowed = tolerances.cost_abs + tolerances.cost_rel * max(abs(candidate.cost), abs(recomputed))
        report.update(cost_abs_diff=diff, cost_allowed=allowed)
        if not diff <= allowed:
            reasons.append(f"solver cost {candidate.cost:.9g} disagrees with the independent cost {recomputed:.9g} "
                           f"(|diff| {diff:.3g} > {allowed:.3g})")
    return replace(candidate, feasible=feasible, verified=not reasons, independent_cost=recomputed,
                   verify_report=report)


def verify_candidates(problem: ProblemIR, candidates: Sequence[SolveCandidate],
                      tolerances: Tolerances = Tolerances()) -> tuple[SolveCandidate, ...]:
    """Every candidate verified; the well-formed plans and the hold plan re-simulated in one rollout."""
    shape = (_rows(problem), len(problem.mv_tags))
    plans, index = [], {}
    u_mean, u_std = np.asarray(problem.u_mean), np.asarray(problem.u_std)
    for i, c in enumerate(candidates):
        try:
            controls = np.asarray(c.controls, float)
        except ValueError:
            continue
        if controls.shape == shape and np.all(np.isfinite(controls)):
            index[i] = len(plans)
            plans.append((controls - u_mean) / u_std)
    y = _simulate(problem, np.stack([*plans, _hold_plan(problem)]))
    return tuple(verify_candidate(problem, c, tolerances, None if i not in index else (y[index[i]], y[-1]))
                 for i, c in enumerate(candidates))


def verify_all(problem: ProblemIR, result: SolveResult,
               tolerances: Tolerances = Tolerances()) -> SolveResult:
    """The result with every candidate verified."""
    return replace(result, candidates=verify_candidates(problem, result.candidates, tolerances))
