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


class Reporters(list):
    """Several reporters as one: each gets every batch of publications."""

    def report(self, published) -> None:
        for reporter in self:
            reporter.report(published)


def _opcua(ledger: Ledger, settings: Settings, bindings: Sequence[str] | None,
           takes: Callable[[str], bool]) -> tuple[list, list]:
    """The OPC UA source of the served bindings wired to OPC UA, and its advisory writer when the host's
    settings allow writing (opcua.write_advice); none of either without such a binding (asyncua is then
    not even imported)."""
    specs = [stored.spec for stored in ledger.list_bindings()
             if stored.spec.opcua is not None and (bindings is None or stored.spec.id in bindings)]
    if not specs:
        return [], []
    from optimizer_pipeline.live.advice import AdvisoryWriter
    from optimizer_pipeline.live.opcua import OpcUaSource

    source = OpcUaSource(specs, accept_uncertain=settings.opcua_accept_uncertain, takes=takes,
                         security=settings.opcua_security)
    return [source], [AdvisoryWriter(source)] if settings.opcua_write_advice else []


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
            opcua, writers = _opcua(ledger, settings, bindings, lambda b: b in service.held)
            service = LiveService(ledger, settings, pool.solve, [inbox, LedgerSource(ledger), *opcua],
                                  bindings=bindings,
                                  reporter=Reporters([r for r in (reporter, *writers) if r is not None]),
                                  threads=settings.solver_pool_size)
            previous = {sig: signal.signal(sig, lambda *_: service.request_stop())
                        for sig in (signal.SIGTERM, signal.SIGINT)}
            for source in opcua:
                source.start()
            try:
                service.run(on_serving=on_ready)
            finally:
                for writer in writers:
                    writer.offline()
                for source in opcua:
                    source.stop()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return service
    finally:
        lock.release()
