"""Solve a ProblemIR: build the template's QP, run OSQP (cached per structure), verify candidates.

Public API used by the solver worker:
    SolverCache()                                  OSQP objects keyed by problem structure
    solve_problem(problem, cache, time_limit_s=None, should_cancel=None) -> SolveResult
"""

from typing import Callable

from optimizer_pipeline.contracts import ProblemIR, SolveResult


class SolverCache:
    """OSQP objects keyed by problem structure (template, dims, horizon, P / A values)."""

    def __init__(self, max_entries: int = 32) -> None:
        self.max_entries = max_entries


def solve_problem(problem: ProblemIR, cache: SolverCache, time_limit_s: float | None = None,
                  should_cancel: Callable[[], bool] | None = None) -> SolveResult:
    """Candidates HOLD / NOMINAL / ROBUST of `problem`, already verified."""
    raise NotImplementedError("solve_problem: being written (issue 4)")
