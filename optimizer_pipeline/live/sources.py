"""Where the live service learns of new samples: sources behind one small interface. A source stores
what it receives in the ledger (the one store; a restart resumes from it) and says which bindings
have new samples; the service then reads them into the binding's live window.

* InboxSource: history files dropped into `<home>/inbox/<binding>/`, ingested by the same code as
  `optimizer-pipeline ingest` and the `history_inbox` sensor (optimizer_pipeline/inbox.py): a good
  file moves to done/, a refused one to rejected/ with its one-line reason beside it.
* LedgerSource: samples appended to the ledger by anyone (`ingest` from the CLI, another source),
  found by their ingestion time.
"""

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Protocol

from optimizer_pipeline.inbox import ingest_inbox_file, waiting_files
from optimizer_pipeline.ledger import Ledger

log = logging.getLogger(__name__)


class SampleSource(Protocol):
    """A source of samples: `ready` says (cheaply, without the ledger) whether a poll is due; `poll`
    stores what arrived and returns the bindings with new samples."""

    name: str

    def ready(self, now_m: float) -> bool:
        ...

    def poll(self, ledger: Ledger) -> set[str]:
        ...


class InboxSource:
    """History files in the home's inbox folders of the bindings the service serves."""

    name = "inbox"

    def __init__(self, home: Path, serves: Callable[[str], bool]):
        self.home, self.serves = Path(home), serves

    def ready(self, now_m: float) -> bool:
        return any(self.serves(path.parent.name) for path in waiting_files(self.home))

    def poll(self, ledger: Ledger) -> set[str]:
        ingested = set()
        for path in waiting_files(self.home):
            if not self.serves(path.parent.name):
                continue
            result = ingest_inbox_file(ledger, path)
            if result.waiting:
                log.warning("inbox %s/%s: %s", result.binding_id, result.file, result.detail)
                break  # the ledger is busy: the files after it wait too
            if result.ingested:
                ingested.add(result.binding_id)
                log.info("inbox %s/%s: %s", result.binding_id, result.file, result.detail)
            else:
                log.warning("inbox %s/%s refused: %s", result.binding_id, result.file, result.detail)
        return ingested


class LedgerSource:
    """Samples stored in the ledger since the last poll (by their ingestion time), looked for every
    `interval_s`."""

    name = "ledger"

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.since: datetime | None = None
        self._next = 0.0

    def ready(self, now_m: float) -> bool:
        return now_m >= self._next

    def poll(self, ledger: Ledger) -> set[str]:
        self._next = time.monotonic() + self.interval_s
        newest, self.since = ledger.samples_ingested_since(self.since)
        return set(newest)
