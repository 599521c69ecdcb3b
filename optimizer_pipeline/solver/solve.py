"""Solve a ProblemIR: the template's QP on OSQP (cached per structure, warm-started) -> verified candidates.

Public API (used by the solver worker, which receives `ProblemIR.to_dict()` JSON and may load it
with `optimizer_pipeline.problem.problem_from_dict`):

    SolverCache(max_entries=32)       OSQP objects keyed by problem structure
    solve_problem(problem, cache, time_limit_s=None, should_cancel=None) -> SolveResult

Candidates: seq 0 HOLD (current MVs held; same cost function), seq 1 NOMINAL optimum, seq 2 ROBUST
optimum with CV limits tightened by the UQ band (only when the problem has a band). A QP whose
OSQP status is not "solved" gives a candidate with its status, empty controls / predicted and
cost None (on infeasibility OSQP's x is garbage). Every candidate is verified before return.

Errors are results, not exceptions: an invalid problem gives ok=False with error_code
BAD_REQUEST (message naming the field), a cancel (should_cancel() true, checked before each QP)
CANCELLED; both codes from solver/errors.py.

Note for callers owning stdout: OSQP 1.1.3's C code prints "Polishing not needed ..." to the
process's stdout (fd 1) even with verbose=False.
"""

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Hashable

import numpy as np
import osqp
import scipy.sparse as sparse

from optimizer_pipeline.contracts import CandidateKind, ProblemIR, SolveCandidate, SolveResult, Template
from optimizer_pipeline.problem import ProblemError, robust_limits, validate_problem
from optimizer_pipeline.solver import errors, mpc, steady
from optimizer_pipeline.solver.verify import verify_candidates

log = logging.getLogger(__name__)

TIME_LIMIT_REACHED = "time limit reached"  # status of a QP not started because the deadline had passed

# eps 1e-5 with polishing: a first MV move exact to well below the 0.01 % of range the judge allows
# (docs/ARCHITECTURE.md, "OSQP 1.x": eps 1e-3 moved it by up to 1 % of range).
# max_iter above OSQP's 4000: a cold start of an active soft-limit problem can need a few thousand
# iterations (~0.006 ms each at quadruple-tank size); the request deadline bounds the time anyway.
OSQP_SETTINGS = {"eps_abs": 1e-5, "eps_rel": 1e-5, "polishing": True, "warm_starting": True, "verbose": False,
                 "max_iter": 20000}
# a template's own tolerances over these: solver/steady.py solves its few variables to 1e-7
NO_TIME_LIMIT_S = 1e10  # OSQP's own default "no limit"
FEASIBILITY_TOL = 1e-6  # a nominal optimum counts as meeting the robust bounds within this (normalised units)

TEMPLATES: dict[Template, ModuleType] = {Template.LINEAR_MPC: mpc, Template.STEADY_RESPONSE: steady}


@dataclass
class _Entry:
    solver: osqp.OSQP
    P: sparse.csc_matrix  # full symmetric Hessian (OSQP gets its upper triangle)
    A: sparse.csc_matrix
    memo: dict = field(default_factory=dict)  # per-structure helpers of the template (hold-point factors)


class SolverCache:
    """OSQP objects keyed by problem structure (template, horizon, and every value in P or A).

    A problem with a known structure reuses the factorised solver: only q, l, u are updated and
    OSQP warm-starts from its previous solution. Least recently used entries beyond
    `max_entries` are dropped. `setups` counts OSQP setups (factorisations) since creation.
    """

    def __init__(self, max_entries: int = 32) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.setups = 0
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, problem: ProblemIR, q: np.ndarray, l: np.ndarray, u: np.ndarray) -> tuple[_Entry, bool]:
        """(entry, hit) for the problem's structure; a miss builds P, A and sets OSQP up with q, l, u."""
        builder = TEMPLATES[problem.template]
        key = builder.structure_key(problem)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found, True
        P, A = builder.matrices(problem)
        solver = osqp.OSQP()
        solver.setup(P=sparse.triu(P, format="csc"), q=q, A=A, l=l, u=u, **{**OSQP_SETTINGS, **builder.OSQP_TOLERANCES})
        self.setups += 1
        entry = _Entry(solver, P, A)
        self._entries[key] = entry
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        log.debug("osqp setup for %s (n=%d, m=%d), cache size %d", problem.template.value, A.shape[1], A.shape[0],
                  len(self._entries))
        return entry, False


def _objective(entry: _Entry, q: np.ndarray, constant: float, z: np.ndarray) -> float:
    """The QP's cost at z including its constant terms: 1/2 z'Pz + q'z + constant."""
    return float(0.5 * z @ (entry.P @ z) + q @ z + constant)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _run_qp(entry: _Entry, q: np.ndarray, l: np.ndarray, u: np.ndarray,
            deadline: float | None) -> tuple[str, np.ndarray | None, dict[str, Any]]:
    """(status text, z or None unless solved, info) of one OSQP solve under the deadline."""
    remaining = NO_TIME_LIMIT_S if deadline is None else deadline - time.perf_counter()
    if remaining <= 0:
        return TIME_LIMIT_REACHED, None, {}
    solver = entry.solver
    solver.update(q=q, l=l, u=u)
    solver.update_settings(time_limit=remaining)
    result = solver.solve(raise_error=False)
    info = result.info
    report = {"osqp_status": info.status, "iterations": int(info.iter), "status_polish": int(info.status_polish),
              "prim_res": _finite(info.prim_res), "dual_res": _finite(info.dual_res),
              "solve_time_s": _finite(info.run_time), "osqp_obj_val": _finite(info.obj_val)}  # without the constant terms
    if osqp.SolverStatus(info.status_val) == osqp.SolverStatus.OSQP_SOLVED:
        return info.status, np.array(result.x, dtype=float), report
    # x / y are garbage after a failed solve: do not warm-start the next problem from them.
    solver.warm_start(x=np.zeros(entry.A.shape[1]), y=np.zeros(entry.A.shape[0]))
    return info.status, None, report


def _still_optimal(entry: _Entry, z: np.ndarray, q: np.ndarray, constant: float, q_k: np.ndarray, constant_k: float,
                   l_k: np.ndarray, u_k: np.ndarray) -> bool:
    """Whether z (optimal for (q, constant) on a feasible set containing the new one) is optimal for
    (q_k, constant_k, l_k, u_k): same objective and z satisfies the new constraint bounds."""
    if constant_k != constant or not (q_k is q or np.array_equal(q_k, q)):
        return False
    Az = entry.A @ z
    return bool(np.all(Az >= l_k - FEASIBILITY_TOL) and np.all(Az <= u_k + FEASIBILITY_TOL))


@dataclass(frozen=True)
class _Plan:
    """A QP point z in candidate form: controls (N, nu) / predicted (N, ny) rows in engineering units, slack totals."""

    controls: tuple[tuple[float, ...], ...]
    predicted: tuple[tuple[float, ...], ...]
    slack_max: float
    slack_sum: float


def _plan(problem: ProblemIR, scales: tuple[np.ndarray, ...], z: np.ndarray) -> _Plan:
    """z's plan; scales: the problem's (u_mean, u_std) as arrays; its CVs through `cv_engineering`."""
    u, y, s = TEMPLATES[problem.template].plan(problem, z)
    u_mean, u_std = scales
    controls = u_mean + u_std * u
    predicted = problem.cv_engineering(y)
    return _Plan(tuple(map(tuple, controls.tolist())), tuple(map(tuple, predicted.tolist())), float(s.max()),
                 float(s.sum()))


def _candidate(seq: int, kind: CandidateKind, status: str, plan: _Plan | None, cost: float | None, y_lo: np.ndarray,
               y_hi: np.ndarray, report: dict[str, Any]) -> SolveCandidate:
    """Candidate of a QP point's plan (None: no plan)."""
    constraints = dict(report, y_lo=y_lo.tolist(), y_hi=y_hi.tolist())
    if plan is None:
        return SolveCandidate(seq, kind, status, (), (), None, constraints)
    constraints.update(slack_max=plan.slack_max, slack_sum=plan.slack_sum)
    return SolveCandidate(seq, kind, status, plan.controls, plan.predicted, cost, constraints)


def _failed(problem_hash: str, code: str, message: str, diagnostics: dict[str, Any]) -> SolveResult:
    return SolveResult(problem_hash, False, (), diagnostics, error_code=code, error_message=message)


def solve_problem(problem: ProblemIR, cache: SolverCache, time_limit_s: float | None = None,
                  should_cancel: Callable[[], bool] | None = None) -> SolveResult:
    """Verified candidates HOLD / NOMINAL / ROBUST of `problem` (see the module docstring).

    time_limit_s bounds the whole call (OSQP's time_limit is set to what remains before each QP);
    should_cancel is polled before each QP.
    """
    started = time.perf_counter()
    deadline = None if time_limit_s is None else started + time_limit_s
    diagnostics: dict[str, Any] = {"osqp_version": osqp.__version__}
    try:
        validate_problem(problem)
        problem_hash = problem.hash
    except ProblemError as exc:
        return _failed("", errors.BAD_REQUEST, str(exc), diagnostics)
    diagnostics["template"] = problem.template.value
    builder = TEMPLATES[problem.template]

    y_lo, y_hi = np.asarray(problem.y_lo, float), np.asarray(problem.y_hi, float)
    q, l, u, constant = builder.vectors(problem, y_lo, y_hi)
    entry, hit = cache.entry(problem, q, l, u)
    diagnostics.update(cache_hit=hit, cache_size=len(cache), osqp_setups=cache.setups)

    scales = (np.asarray(problem.u_mean), np.asarray(problem.u_std))
    hold = builder.hold_point(problem, entry.A, l, y_lo, y_hi, entry.memo)
    candidates = [_candidate(0, CandidateKind.HOLD, "hold", _plan(problem, scales, hold),
                             _objective(entry, q, constant, hold), y_lo, y_hi, {})]
    runs = [(1, CandidateKind.NOMINAL, y_lo, y_hi, (q, l, u, constant))]
    if problem.band is not None:
        r_lo, r_hi = robust_limits(problem)
        runs.append((2, CandidateKind.ROBUST, r_lo, r_hi, (q, *builder.with_cv_limits(problem, l, u, r_lo, r_hi),
                                                           constant)))
    solved: tuple[str, np.ndarray, dict[str, Any]] | None = None  # the nominal optimum, once known
    for seq, kind, lo, hi, (q_k, l_k, u_k, constant_k) in runs:
        if should_cancel is not None and should_cancel():
            diagnostics["elapsed_s"] = time.perf_counter() - started
            return _failed(problem_hash, errors.CANCELLED, f"solve of {problem_hash[:12]} cancelled before {kind.value}",
                           diagnostics)
        if solved is not None and _still_optimal(entry, solved[1], q, constant, q_k, constant_k, l_k, u_k):
            # The robust QP only tightens soft CV limits (its feasible set lies inside the nominal one,
            # same objective): a nominal optimum that already meets them (within FEASIBILITY_TOL) is
            # the robust optimum too, the same MVs and CVs; its slacks are settled against the robust
            # limits and its cost taken there (a plan riding a robust limit, as a steered economic
            # target does, meets it only to the tolerance: N * ny slacks of ~1e-7 at weight 1e3).
            status, z, report = solved[0], solved[1], dict(solved[2], shared_with_nominal=True)
        else:
            status, z, report = _run_qp(entry, q_k, l_k, u_k, deadline)
        z = None if z is None else builder.settle(problem, z, lo, hi)
        cost = None if z is None else _objective(entry, q_k, constant_k, z)
        plan = None if z is None else _plan(problem, scales, z)
        if kind is CandidateKind.NOMINAL and z is not None:
            solved = (status, z, report)
        candidates.append(_candidate(seq, kind, status, plan, cost, lo, hi, report))
        diagnostics.setdefault("qp", {})[kind.value] = {k: report.get(k) for k in ("osqp_status", "iterations",
                                                                                 "solve_time_s")}
    verified = verify_candidates(problem, candidates)
    diagnostics["elapsed_s"] = time.perf_counter() - started
    return SolveResult(problem_hash, True, verified, diagnostics)
