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
* cost agreement: |cost - independent| <= 1e-6 + 1e-4 * max(|cost|, |independent|); the cost
  includes a steered plan's MV target term and a steady target's economics.
* a steady target's row of an integrating CV is its drift over the horizon (problem.py), limits 0: allowed
  1e-3 of the CV's std beyond holding the current MVs.
* a move plan with an integrating CV ends balanced: its settled rate under the last MVs held, from
  `steady_state`, drifts it by at most the CV allowance over the horizon (not the HOLD baseline). Where
  the QP found no plan, the reason names each integrating CV that no MVs within reach balance, with the
  rates they can reach (`_unbalanceable`).
`verified` = feasible, predictions agree and costs agree; every failed condition is listed in
verify_report["reasons"].
"""

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from optimizer_pipeline.contracts import CandidateKind, ProblemIR, SolveCandidate, SolveResult, Template
from optimizer_pipeline.model.statespace import balance_rows, integrating_outputs, rollout
from optimizer_pipeline.problem import robust_limits, settled_map
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
    return _Reference(problem, Tolerances()).cost(u, y, np.asarray(y_lo), np.asarray(y_hi))


def _simulate(problem: ProblemIR, u: np.ndarray) -> np.ndarray:
    """CVs (m, rows, ny) of the plans u (m, rows, nu), normalised, re-simulated from the model in one batch."""
    d = np.asarray(problem.d, float)
    if problem.template is Template.STEADY_RESPONSE:
        G, offset = settled_map(problem)
        settled = u[:, :1] @ G.T + offset
        return settled * balance_rows(problem.model, problem.horizon)  # an integrating CV's drift: its balance
    m, rows = u.shape[:2]
    x0 = np.tile(np.asarray(problem.x0, float), (m, 1))
    return rollout(problem.model, x0, u, np.tile(d, (m, rows, 1)), disturbance=np.asarray(problem.bias, float))


def _rows(problem: ProblemIR) -> int:
    """Rows of a plan: one per step, a single steady-state row for steady_response@1."""
    return 1 if problem.template is Template.STEADY_RESPONSE else problem.horizon


def _values(array: np.ndarray) -> list[float | None]:
    """A float array's values, None where not finite (JSON has no NaN / inf)."""
    return [v if math.isfinite(v) else None for v in np.asarray(array, float).reshape(-1).tolist()]


def _rows_values(array: np.ndarray) -> list[list[float | None]]:
    """_values of each row of a 2-D float array."""
    return [[v if math.isfinite(v) else None for v in row] for row in array.tolist()]


@lru_cache(maxsize=16)
def _tolerance_items(tolerances: Tolerances) -> dict[str, float]:
    return asdict(tolerances)  # copied into each report


class _Reference:
    """What every plan of one problem is checked against, computed once per problem: scalings,
    MV / CV limits and allowances (engineering units), cost weights and limits (normalised)."""

    def __init__(self, problem: ProblemIR, tolerances: Tolerances) -> None:
        self.problem, self.tolerances = problem, tolerances
        self.rows, self.nu, self.ny = _rows(problem), len(problem.mv_tags), len(problem.cv_tags)
        steady = problem.template is Template.STEADY_RESPONSE
        self.u_mean, self.u_std = np.asarray(problem.u_mean), np.asarray(problem.u_std)
        self.y_std = np.asarray(problem.y_std)
        self.u_prev = np.asarray(problem.u_prev)
        self.hold_plan = np.tile(np.asarray(problem.u_prev, float), (self.rows, 1))  # current MVs held (rows, nu)
        self.mv_lo = self.u_mean + self.u_std * np.asarray(problem.u_lo)
        self.mv_hi = self.u_mean + self.u_std * np.asarray(problem.u_hi)
        self.mv_allowed = tolerances.mv_rel * (self.mv_hi - self.mv_lo)
        self.max_move = self.u_std * (move_limit(problem) if steady else np.asarray(problem.du_max))
        self.u_now = self.u_mean + self.u_std * self.u_prev  # engineering, (nu,)
        self.y_lo, self.y_hi = np.asarray(problem.y_lo), np.asarray(problem.y_hi)
        self.cv_lo, self.cv_hi = problem.cv_engineering(self.y_lo), problem.cv_engineering(self.y_hi)
        self.cv_allowed = tolerances.cv_rel * (self.cv_hi - self.cv_lo)
        # a steady target's balance rows (an integrating CV's drift over the horizon, limits 0): the allowance
        # of a drift, a fraction of the CV's std (its limits are not in the row)
        self.balance = integrating_outputs(problem.model) if steady else np.zeros(self.ny, bool)
        self.cv_allowed[self.balance] = tolerances.cv_rel * self.y_std[self.balance]
        self.robust = robust_limits(problem)
        self.w, self.target = np.asarray(problem.y_weight), np.asarray(problem.y_target)
        self.move_weight = problem.move_weight * (STEADY_MOVE_SCALE if steady else 1.0)
        # an integrating CV's settled rate per step under the plan's last MVs held: G_rate u + offset
        self.ramps = np.zeros(self.ny, bool) if steady else integrating_outputs(problem.model)
        if self.ramps.any():
            G, offset = settled_map(problem)
            self.rate_gain, self.rate_offset = G[self.ramps], offset[self.ramps]
        self.report = {"tolerances": _tolerance_items(tolerances), "mv_allowed": _values(self.mv_allowed),
                       "max_move": _values(self.max_move), "cv_allowed": _values(self.cv_allowed)}

    def hold_violation(self, y_hold_norm: np.ndarray) -> np.ndarray:
        """(rows, ny) CV limit violation of holding the current MVs, engineering units."""
        y_hold = self.problem.cv_engineering(y_hold_norm)
        return np.maximum(0.0, np.maximum(self.cv_lo - y_hold, y_hold - self.cv_hi))

    def cost(self, u: np.ndarray, y: np.ndarray, y_lo: np.ndarray, y_hi: np.ndarray) -> float:
        """independent_cost's formula (see there)."""
        tracking = (self.w * (y - self.target) ** 2).sum()  # ndarray.sum: np.sum's reduction, less dispatch
        moves = np.empty(u.shape)  # du_k = u_k - u_{k-1}, u_{-1} = u_prev
        moves[0] = u[0] - self.u_prev
        moves[1:] = u[1:] - u[:-1]
        slack = np.maximum(0.0, np.maximum(y_lo - y, y - y_hi))
        total = float(tracking + self.move_weight * (moves ** 2).sum()
                      + self.problem.slack_weight * (slack + slack ** 2).sum())
        p = self.problem
        if p.u_target is not None:  # a plan steered to the steady-state layer's MV target
            total += p.u_target_weight * float(((u - np.asarray(p.u_target)) ** 2).sum())
        if p.economic:  # the steady target's costs, term by term
            for j, (a, b) in enumerate(zip(p.econ_y, p.econ_yy)):
                total += float((a * y[:, j] + b * y[:, j] ** 2).sum())
            for i, (a, b) in enumerate(zip(p.econ_u, p.econ_uu)):
                total += float((a * u[:, i] + b * u[:, i] ** 2).sum())
        return total


def verify_candidate(problem: ProblemIR, candidate: SolveCandidate, tolerances: Tolerances = Tolerances(),
                     simulated: tuple[np.ndarray, np.ndarray] | None = None) -> SolveCandidate:
    """The candidate with feasible, verified, independent_cost and verify_report filled (see module doc).

    simulated: (y of this plan, y of holding the current MVs), normalised (rows, ny), when the caller
    re-simulated them already (`verify_candidates` does it for all candidates in one rollout).
    """
    if simulated is None:
        return verify_candidates(problem, (candidate,), tolerances)[0]
    return _verify(_Reference(problem, tolerances), (candidate,), [simulated[0]], simulated[1])[0]


def verify_candidates(problem: ProblemIR, candidates: Sequence[SolveCandidate],
                      tolerances: Tolerances = Tolerances()) -> tuple[SolveCandidate, ...]:
    """Every candidate verified; the well-formed plans and the hold plan re-simulated in one rollout."""
    ref = _Reference(problem, tolerances)
    shape = (ref.rows, ref.nu)
    plans, index, tables = [], {}, []  # index: candidate -> its row in plans; tables: controls as arrays
    for i, c in enumerate(candidates):
        try:
            controls = np.asarray(c.controls, float)
        except ValueError:
            tables.append(None)
            continue
        tables.append(controls)
        if controls.shape == shape and np.isfinite(controls).all():
            index[i] = len(plans)
            plans.append((controls - ref.u_mean) / ref.u_std)
    y = _simulate(problem, np.stack([*plans, ref.hold_plan]))
    simulated = [None if i not in index else y[index[i]] for i in range(len(candidates))]
    return _verify(ref, candidates, simulated, y[-1], tables)


def _limit_reasons(problem: ProblemIR, reasons: list[str], bound: list[float], rate: list[float],
                   cv_violation: list[float], excess: list[float], mv_allowed: list[float],
                   cv_allowed: list[float], balance: np.ndarray) -> None:
    """Append a reason per MV bound / rate and CV limit (a balance row's where `balance`) violated beyond what
    is allowed (one plan)."""
    for name, violation in (("bound", bound), ("rate", rate)):
        for j, (value, allowed) in enumerate(zip(violation, mv_allowed)):
            if value > allowed:
                reasons.append(f"MV {problem.mv_tags[j]} {name} violated by {value:.6g} (allowed {allowed:.3g})")
    for j, (value, allowed) in enumerate(zip(excess, cv_allowed)):
        if value > allowed and balance[j]:
            reasons.append(f"CV {problem.cv_tags[j]} is not balanced: it drifts {cv_violation[j]:.6g} over the "
                           f"{problem.horizon} samples, {value:.6g} more than holding the current MVs (allowed "
                           f"{allowed:.3g})")
        elif value > allowed:
            reasons.append(f"CV {problem.cv_tags[j]} limit violated by {cv_violation[j]:.6g}, {value:.6g} "
                           f"more than holding the current MVs (allowed {allowed:.3g})")


def _verify(ref: _Reference, candidates: Sequence[SolveCandidate], simulated: list[np.ndarray | None],
            y_hold_norm: np.ndarray, tables: list[np.ndarray | None] | None = None) -> tuple[SolveCandidate, ...]:
    """Every candidate checked (module doc) against one problem's reference.

    simulated[i]: the re-simulated CVs (rows, ny, normalised) of candidate i's plan, None when its
    controls are not a finite (rows, nu) table; y_hold_norm those of holding the current MVs;
    tables[i]: candidate i's controls as a float array when the caller converted them. The
    checks of the well-formed plans run on their stack (element-wise and max: the same numbers as
    one by one); costs and reports are per candidate.
    """
    problem, tolerances = ref.problem, ref.tolerances
    rows, nu, ny = ref.rows, ref.nu, ref.ny
    out: list[SolveCandidate | None] = [None] * len(candidates)
    reports: list[dict[str, Any]] = []
    plans: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # (candidate, controls, predicted, y)

    for i, candidate in enumerate(candidates):
        report: dict[str, Any] = {"tolerances": dict(ref.report["tolerances"]), "reasons": []}
        reports.append(report)
        reason = None
        if not candidate.controls:
            reason = f"no plan (solver status {candidate.solver_status!r})"
            if ref.ramps.any() and candidate.kind is not CandidateKind.HOLD:
                reason = "; ".join([reason, *_unbalanceable(ref)])
        else:
            try:
                controls = tables[i] if tables and tables[i] is not None else np.asarray(candidate.controls, float)
                predicted = np.asarray(candidate.predicted, float)
            except ValueError:
                reason = "controls / predicted are not rectangular tables of numbers"
            else:
                if controls.shape != (rows, nu) or predicted.shape != (rows, ny):
                    reason = (f"shape: controls {controls.shape} / predicted {predicted.shape}, expected ({rows}, "
                              f"{nu}) / ({rows}, {ny})")
                elif not (np.isfinite(controls).all() and np.isfinite(predicted).all()):
                    reason = "controls / predicted contain non-finite values"
                elif not np.isfinite(simulated[i]).all():
                    reason = "re-simulated CVs are not finite (unstable model?)"
        if reason is None:
            plans.append((i, controls, predicted, simulated[i]))
        else:
            report["reasons"].append(reason)
            out[i] = replace(candidate, feasible=False, verified=False, independent_cost=None, verify_report=report)
    if not plans:
        return tuple(out)

    controls = np.stack([p[1] for p in plans])  # (plans, rows, nu), engineering
    predicted = np.stack([p[2] for p in plans])  # (plans, rows, ny), engineering
    y = np.stack([p[3] for p in plans])  # (plans, rows, ny), normalised
    u = (controls - ref.u_mean) / ref.u_std

    # MV bounds and rates, engineering units.
    bound = np.maximum(0.0, np.maximum(ref.mv_lo - controls, controls - ref.mv_hi)).max(axis=1)
    moves = np.empty(controls.shape)  # step k: u_k - u_{k-1}, from the current MVs at k = 0
    moves[:, 0] = controls[:, 0] - ref.u_now
    moves[:, 1:] = controls[:, 1:] - controls[:, :-1]
    rate = np.maximum(0.0, np.abs(moves) - ref.max_move).max(axis=1)

    # CV limits (nominal), engineering units, on the re-simulated CVs.
    y_eng = ref.problem.cv_engineering(y)
    per_step = np.maximum(0.0, np.maximum(ref.cv_lo - y_eng, y_eng - ref.cv_hi))
    # A plant already outside a CV limit cannot be brought back at once: the plan may violate a
    # limit by as much as holding the current MVs would at the same step, never by more.
    excess = np.maximum(0.0, per_step - ref.hold_violation(y_hold_norm)).max(axis=1)
    cv_violation = per_step.max(axis=1)
    mismatch = np.abs((predicted - y_eng) / ref.y_std).max(axis=(1, 2))

    # Python lists from here on: one conversion per table instead of one per candidate and number
    bound_v, rate_v, cv_v, excess_v = (_rows_values(a) for a in (bound, rate, cv_violation, excess))
    flagged = ((bound > ref.mv_allowed).any(axis=1) | (rate > ref.mv_allowed).any(axis=1)
               | (excess > ref.cv_allowed).any(axis=1)).tolist()
    mv_allowed, cv_allowed = ref.mv_allowed.tolist(), ref.cv_allowed.tolist()
    for k, (i, *_) in enumerate(plans):
        candidate, report = candidates[i], reports[i]
        reasons = report["reasons"]
        report.update(mv_bound_violation=bound_v[k], mv_rate_violation=rate_v[k],
                      mv_allowed=list(ref.report["mv_allowed"]), max_move=list(ref.report["max_move"]))
        if flagged[k]:
            _limit_reasons(problem, reasons, bound[k].tolist(), rate[k].tolist(), cv_violation[k].tolist(),
                           excess[k].tolist(), mv_allowed, cv_allowed, ref.balance)
        if ref.ramps.any() and candidate.kind is not CandidateKind.HOLD:
            _balance_reasons(ref, reasons, report, u[k][-1])
        report.update(cv_limit_violation=cv_v[k], cv_violation_beyond_hold=excess_v[k],
                      cv_allowed=list(ref.report["cv_allowed"]))
        feasible = not reasons

        report["prediction_mismatch"] = mismatch_k = float(mismatch[k])
        if mismatch_k > tolerances.prediction_abs:
            reasons.append(f"predicted CVs differ from the re-simulation by {mismatch_k:.3g} normalised units "
                           f"(allowed {tolerances.prediction_abs:g})")

        robust = candidate.kind is CandidateKind.ROBUST
        cost_lo, cost_hi = ref.robust if robust else (ref.y_lo, ref.y_hi)
        report["cost_limits"] = "robust" if robust else "nominal"
        recomputed = ref.cost(u[k], y[k], cost_lo, cost_hi)
        if candidate.cost is None:
            reasons.append("solver reported no cost")
        else:
            diff = abs(candidate.cost - recomputed)
            allowed = tolerances.cost_abs + tolerances.cost_rel * max(abs(candidate.cost), abs(recomputed))
            report.update(cost_abs_diff=diff, cost_allowed=allowed)
            if not diff <= allowed:
                reasons.append(f"solver cost {candidate.cost:.9g} disagrees with the independent cost "
                               f"{recomputed:.9g} (|diff| {diff:.3g} > {allowed:.3g})")
        out[i] = replace(candidate, feasible=feasible, verified=not reasons, independent_cost=recomputed,
                         verify_report=report)
    return tuple(out)


def _balance_reasons(ref: _Reference, reasons: list[str], report: dict[str, Any], u_last: np.ndarray) -> None:
    """A move plan ends balanced (solver/mpc.py): every integrating CV's settled rate under its last MVs held,
    recomputed from the model's steady state (statespace.steady_state), drifts it by no more than the CV
    allowance over the plan's horizon. Reported per integrating CV as `balance_drift`, engineering units."""
    horizon = ref.problem.horizon
    drift = np.abs(ref.rate_gain @ u_last + ref.rate_offset) * horizon * ref.y_std[ref.ramps]
    allowed = ref.cv_allowed[ref.ramps]
    tags = [tag for tag, ramp in zip(ref.problem.cv_tags, ref.ramps) if ramp]
    report["balance_drift"] = dict(zip(tags, drift.tolist()))
    reasons.extend(f"the plan does not end balanced: its last MVs held {horizon} samples, {tag} drifts {d:.3g} "
                   f"(allowed {a:.3g})" for tag, d, a in zip(tags, drift, allowed) if not d <= a)


def _unbalanceable(ref: _Reference) -> list[str]:
    """Why no plan can end balanced, per integrating CV whose settled rate (`settled_map`) no MVs the plan can
    reach zero (within their limits and the horizon's moves from the current ones, each MV's extreme taken
    alone: a CV that shares its MVs with another may still fail jointly, unnamed), the rates it can reach
    in engineering units per sample: a feed beyond what the MVs can take away, say."""
    problem = ref.problem
    reach = problem.horizon * np.asarray(problem.du_max, float)
    lo = np.maximum(np.asarray(problem.u_lo, float), ref.u_prev - reach)
    hi = np.minimum(np.asarray(problem.u_hi, float), ref.u_prev + reach)
    if (lo > hi).any():  # an MV further outside its limits than its moves reach: not a balance to name
        return []
    low = ref.rate_offset + np.minimum(ref.rate_gain * lo, ref.rate_gain * hi).sum(axis=1)
    high = ref.rate_offset + np.maximum(ref.rate_gain * lo, ref.rate_gain * hi).sum(axis=1)
    tolerance = ref.cv_allowed[ref.ramps] / (problem.horizon * ref.y_std[ref.ramps])  # _balance_reasons' allowance
    tags = [tag for tag, ramp in zip(problem.cv_tags, ref.ramps) if ramp]
    std = ref.y_std[ref.ramps]
    return [f"{tag} cannot end balanced: with the MVs within their limits and the moves of {problem.horizon} "
            f"samples, its rate stays between {a * k:.3g} and {b * k:.3g} per sample"
            for tag, a, b, k, t in zip(tags, low, high, std, tolerance) if a > t or b < -t]


def verify_all(problem: ProblemIR, result: SolveResult,
               tolerances: Tolerances = Tolerances()) -> SolveResult:
    """The result with every candidate verified."""
    return replace(result, candidates=verify_candidates(problem, result.candidates, tolerances))
