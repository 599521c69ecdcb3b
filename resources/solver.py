"""Dagster solver resources: the worker pool (real) and an in-process solver (a fake for tests whose
subject is not the worker process), side by side behind `solve(problem)`.

The pool starts on the first solve of a run (a recalibration run, which solves nothing, starts no
worker) and is shut down when the run (step) ends, also when it fails: `yield_for_execution` wraps
the run in try / finally, and a failed start shuts down whatever it had started before raising, so
no worker process outlives the run either way (docs/ARCHITECTURE.md, "Dagster resources and step
processes": teardown runs when the step fails, not when setup failed). Inside
`solver.shared.kept_alive()` (the CLI running many partitions in one process) the pool is shared
by the runs and stopped when that block ends instead; in a Celery worker started by
`optimizer-pipeline worker` (its runs follow one another in one process) it is kept for the worker's
life (`solver.shared.keep_for_process`).
"""

import os
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from optimizer_pipeline.contracts import ProblemIR
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.process import DEFAULT_CACHE_ENTRIES
from optimizer_pipeline.deployment import WORKER_ENV
from optimizer_pipeline.solver.shared import acquire, keep_for_process


class SolverResource(ConfigurableResource):
    """What the recommendation stage needs: the SolveResult JSON dict of a problem."""

    def solve(self, problem: ProblemIR | Mapping[str, Any], timeout_ms: Optional[int] = None) -> dict[str, Any]:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError


class SolverPoolResource(SolverResource):
    """Long-lived OSQP workers (docs/ARCHITECTURE.md, "Solver pool rules") behind `solve(problem)`."""

    pool_size: int = Field(default=2, description="Worker processes, 1-4; one solve in flight per worker.")
    request_timeout_ms: int = Field(default=10_000, description="Hard timeout per solve; the worker is killed after it.")
    threads: int = Field(default=1, description="BLAS / OpenMP threads per worker, 1-16.")
    cache_entries: int = Field(default=DEFAULT_CACHE_ENTRIES,
                               description="Problem structures each worker keeps factorised (warm starts).")

    _pool: Optional[SolverPool] = PrivateAttr(default=None)

    _owned: bool = PrivateAttr(default=False)
    _context: Optional[InitResourceContext] = PrivateAttr(default=None)

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator["SolverPoolResource"]:
        if os.environ.get(WORKER_ENV):
            keep_for_process()
        self._context = context
        try:
            yield self
        finally:
            pool, self._pool, self._context = self._pool, None, None
            if pool is not None and self._owned:
                stats = pool.stats()
                exits = pool.shutdown()
                context.log.info(f"solver pool stopped: consecutive_failures {stats['consecutive_failures']}, "
                                 f"degraded {stats['degraded']}; worker exit codes {exits}")

    def solve(self, problem: ProblemIR | Mapping[str, Any], timeout_ms: Optional[int] = None) -> dict[str, Any]:
        """The SolveResult JSON dict of `problem` (SolverError with a stable code otherwise)."""
        return self._running().solve(problem, timeout_ms=timeout_ms)

    def stats(self) -> dict[str, Any]:
        """The pool's size / ready / busy / degraded / pids / consecutive_failures."""
        return self._running().stats()

    def _running(self) -> SolverPool:
        """The run's pool, started (or taken from the keep-alive registry) on first use."""
        if self._pool is None:
            # on a failed start the pool has already stopped every worker it started
            self._pool, self._owned = acquire(self.pool_size, self.request_timeout_ms, self.threads, self.cache_entries)
            stats = self._pool.stats()
            if self._context is not None:
                self._context.log.info(
                    f"solver pool {'started' if self._owned else 'shared (kept alive across runs)'}: "
                    f"{stats['ready']} of {stats['size']} workers, pids {stats['pids']}, "
                    f"ready in {stats['ready_ms']} ms, probe {self._pool.probe_report}")
        return self._pool


class InProcessSolverResource(SolverResource):
    """FAKE for tests whose subject is not the worker process: `solve_problem` in this process (same
    QPs, same verifier, same result document), no pool, no worker protocol, no timeouts."""

    _solves: int = PrivateAttr(default=0)

    def solve(self, problem: ProblemIR | Mapping[str, Any], timeout_ms: Optional[int] = None) -> dict[str, Any]:
        from optimizer_pipeline.problem import problem_from_dict
        from optimizer_pipeline.solver import codec
        from optimizer_pipeline.solver.solve import SolverCache, solve_problem

        doc = problem if isinstance(problem, ProblemIR) else problem_from_dict(problem)
        self._solves += 1
        return codec.decode(codec.encode(solve_problem(doc, SolverCache())))  # the document the worker sends

    def stats(self) -> dict[str, Any]:
        return {"in_process": True, "solves": self._solves}
