"""Running the live service for a home (what `optimizer-pipeline live` does, less the Dagster
reporter the CLI wires in): one service per home, the solver pool started once, SIGTERM / SIGINT
turned into a clean stop, the pool stopped whatever happens."""

import logging
import signal
from pathlib import Path
from typing import Callable, Sequence

from filelock import FileLock, Timeout

from optimizer_pipeline.contracts import ContractError
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.live.service import LiveService, Reporter
from optimizer_pipeline.live.sources import InboxSource, LedgerSource
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver.pool import SolverPool

log = logging.getLogger(__name__)

LOCK_FILE = "live.lock"


class AlreadyServed(ContractError):
    """Another live service runs on this home."""


def serve(home: Path, ledger: Ledger, settings: Settings, bindings: Sequence[str] | None = None,
          reporter: Reporter | None = None, on_ready: Callable[[LiveService], None] | None = None) -> LiveService:
    """Serve until SIGTERM / SIGINT (`on_ready` is called once the bindings are loaded). AlreadyServed
    when a live service already runs on this home (its lock file `<home>/live.lock` is held). Returns
    the stopped service."""
    lock = FileLock(str(Path(home) / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise AlreadyServed(f"home {home}: a live service already runs on it (lock {lock.lock_file} is held); "
                            f"stop it first, or serve other bindings from another home") from None
    try:
        with SolverPool(size=settings.solver_pool_size, request_timeout_ms=settings.solver_request_timeout_ms,
                        threads=settings.solver_threads, cache_entries=settings.solver_cache_entries) as pool:
            inbox = InboxSource(home, lambda b: service.ingests(b), lambda b: service.spec_of(b))
            service = LiveService(ledger, settings, pool.solve, [inbox, LedgerSource()], bindings=bindings,
                                  reporter=reporter, threads=settings.solver_pool_size)
            previous = {sig: signal.signal(sig, lambda *_: service.request_stop())
                        for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                service.run(on_serving=on_ready)
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return service
    finally:
        lock.release()
