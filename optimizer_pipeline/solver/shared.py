"""Keep-alive registry: one started SolverPool per settings, shared by the runs of one process.

Users: the Dagster resource (resources/solver.py) takes its pool from `acquire` for every run; the
CLI (automation.py `run_partitions`) and bench/bench_pipeline.py wrap many runs in `kept_alive()`; a
Celery worker of `optimizer-pipeline worker` keeps its pools for its life (`keep_for_process`). It lives
here, beside the pool, not in resources/solver.py: it needs nothing from Dagster and is not the
resource's internals (the CLI and the benchmark enter it themselves, and would otherwise reach into
a Dagster resource module for process-wide state), so the resource stays a thin adapter, the pool
stays free of process-wide state, and the domain library keeps its no-dagster rule.
"""

import atexit
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.process import DEFAULT_CACHE_ENTRIES

_shared_lock = threading.Lock()
_keepers = 0
_kept_for_process = False
_shared: dict[tuple[int, int, int, int], SolverPool] = {}


@contextmanager
def kept_alive() -> Iterator[None]:
    """While inside, a pool from `acquire` outlives the run that started it and serves the next run
    with the same settings (the CLI and benchmarks run many partitions in one process; a pool start
    costs ~0.6 s). On leaving the outermost block every shared pool is shut down."""
    global _keepers
    with _shared_lock:
        _keepers += 1
    try:
        yield
    finally:
        with _shared_lock:
            _keepers -= 1
            pools = list(_shared.values()) if _keepers == 0 else []
            if _keepers == 0:
                _shared.clear()
        for pool in pools:
            pool.shutdown()


def keep_for_process() -> None:
    """From now on pools from `acquire` are shared and outlive their runs until this process exits: a
    Celery worker's runs follow one another in one process, and each would otherwise start its pool
    again (~0.6 s). Idempotent; the pools are shut down at exit (a worker killed outright takes its
    pool's workers with it: they end at their stdin's EOF)."""
    global _keepers, _kept_for_process
    with _shared_lock:
        if _kept_for_process:
            return
        _kept_for_process = True
        _keepers += 1
    atexit.register(_shutdown_shared)


def _shutdown_shared() -> None:
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for pool in pools:
        pool.shutdown()


def acquire(size: int, request_timeout_ms: int, threads: int,
            cache_entries: int = DEFAULT_CACHE_ENTRIES) -> tuple[SolverPool, bool]:
    """A started pool and whether the caller owns it (and must shut it down).

    Outside `kept_alive` every call starts a pool of its own. Inside, pools are shared by settings;
    a shared pool left degraded by an earlier run is reset, since a new run is a new start."""
    key = (size, request_timeout_ms, threads, cache_entries)
    with _shared_lock:
        shared = _keepers > 0
        pool = _shared.get(key) if shared else None
    if pool is not None and pool.stats()["state"] == "running":
        if pool.stats()["degraded"]:
            pool.reset()
        return pool, False
    pool = SolverPool(size=size, request_timeout_ms=request_timeout_ms, threads=threads,
                      cache_entries=cache_entries).start()
    if not shared:
        return pool, True
    with _shared_lock:
        _shared[key] = pool
    return pool, False
