"""Dagster resource owning the solver worker pool for one run (per step process under multiprocess).

The pool starts when the resource is initialised and is shut down when the run (step) ends, also
when it fails: `yield_for_execution` wraps the run in try / finally, and a failed start shuts down
whatever it had started before raising, so no worker process outlives the run either way
(DAGSTER-NOTES.md: teardown runs when the step fails, not when setup failed).
Inside `solver.shared.kept_alive()` (the CLI running many partitions in one process) the pool is
shared by the runs and stopped when that block ends instead.
"""

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from optimizer_pipeline.contracts import ProblemIR
from optimizer_pipeline.solver.errors import SOLVER_UNAVAILABLE, SolverError
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.shared import acquire


class SolverPoolResource(ConfigurableResource):
    """Long-lived OSQP workers (DESIGN.md "Solver worker protocol") behind `solve(problem)`."""

    pool_size: int = Field(default=2, description="Worker processes, 1-4; one solve in flight per worker.")
    request_timeout_ms: int = Field(default=10_000, description="Hard timeout per solve; the worker is killed after it.")
    threads: int = Field(default=1, description="BLAS / OpenMP threads per worker, 1-16.")

    _pool: Optional[SolverPool] = PrivateAttr(default=None)

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator["SolverPoolResource"]:
        # on a failed start the pool has already stopped every worker it started
        pool, owned = acquire(self.pool_size, self.request_timeout_ms, self.threads)
        self._pool = pool
        stats = pool.stats()
        context.log.info(f"solver pool {'started' if owned else 'shared (kept alive across runs)'}: "
                         f"{stats['ready']} of {stats['size']} workers, pids {stats['pids']}, "
                         f"ready in {stats['ready_ms']} ms, probe {pool.probe_report}")
        try:
            yield self
        finally:
            stats = pool.stats()
            self._pool = None
            if owned:
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
        if self._pool is None:
            raise SolverError(SOLVER_UNAVAILABLE, "the solver pool runs only while the resource is initialised for a run")
        return self._pool
