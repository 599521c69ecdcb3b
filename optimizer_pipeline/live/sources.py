"""Where the live service learns of new samples: sources behind one small interface. A source stores
what it receives in the ledger (the one store; a restart resumes from it) and says which bindings
have new samples; the service then reads them into the binding's live window.

* InboxSource: history files dropped into `<home>/inbox/<binding>/`, ingested by the same code as
  `optimizer-pipeline ingest` and the `history_inbox` sensor (optimizer_pipeline/inbox.py): a good
  file moves to done/, a refused one to rejected/ with its one-line reason beside it.
* LedgerSource: samples appended to the ledger by anyone (`ingest` from the CLI, another source),
  found by their ingestion time; the ledger is opened only when its samples stamp changed
  (Ledger.samples_stamp: an idle service does not open the embedded ledger every second).
"""

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Protocol

import pandas as pd

from optimizer_pipeline.contracts import BindingSpec
from optimizer_pipeline.inbox import ingest_inbox_batch, waiting_files
from optimizer_pipeline.ledger import Ledger

log = logging.getLogger(__name__)

MAX_BATCH_FILES = 500  # inbox files ingested per transaction (a backlog is worked off in several)


class SampleSource(Protocol):
    """A source of samples: `ready` says (cheaply, without the ledger) whether a poll is due, `due_at`
    when it may next say so (the service sleeps until then); `poll` stores what arrived and returns the
    bindings with new samples, each with the frames it stored (validated: run_id, timestamp, the
    binding's tags), or with the newest sample time stored when the service must read them from the
    ledger."""

    name: str

    def ready(self, now_m: float) -> bool:
        ...

    def due_at(self) -> float:
        """The monotonic time (s) from which `ready` may answer True."""
        ...

    def poll(self, ledger: Ledger) -> dict[str, list[pd.DataFrame] | float]:
        ...


class InboxSource:
    """History files in the home's inbox folders of the bindings the service takes (`takes`), looked for
    at most every `interval_s` and ingested together in one transaction per poll
    (inbox.ingest_inbox_batch); `spec_of` gives a binding's spec."""

    name = "inbox"

    def __init__(self, home: Path, takes: Callable[[str], bool], spec_of: Callable[[str], BindingSpec | None],
                 interval_s: float = 0.2):
        self.home, self.takes, self.spec_of, self.interval_s = Path(home), takes, spec_of, interval_s
        self._next, self._found = 0.0, []

    def _files(self) -> list[Path]:
        return [path for path in waiting_files(self.home) if self.takes(path.parent.name)]

    def ready(self, now_m: float) -> bool:
        """Files are waiting (the folders listed at most every interval_s: a listing of every binding's
        folder per tick of the loop cost the service ~2 ms of CPU per re-solve at 1000 a minute)."""
        if now_m >= self._next:
            self._next, self._found = now_m + self.interval_s, self._files()
        return bool(self._found)

    def due_at(self) -> float:
        return 0.0 if self._found else self._next

    def poll(self, ledger: Ledger) -> dict[str, list[pd.DataFrame] | float]:
        found, self._found = self._found or self._files(), []
        results, frames = ingest_inbox_batch(ledger, found[:MAX_BATCH_FILES], self.spec_of)
        for result in results:
            if result.waiting:
                log.warning("inbox %s/%s: %s", result.binding_id, result.file, result.detail)
            elif not result.ingested:
                log.warning("inbox %s/%s refused: %s", result.binding_id, result.file, result.detail)
        return dict(frames)


class LedgerSource:
    """Samples stored in `ledger` since the last poll (by their ingestion time), looked for every
    `interval_s` when its samples stamp changed since the last poll; the service reads them (a
    binding whose window already holds them is skipped)."""

    name = "ledger"

    def __init__(self, ledger: Ledger, interval_s: float = 1.0) -> None:
        self.ledger, self.interval_s = ledger, interval_s
        self.since: datetime | None = None
        self._next = 0.0
        self._seen: str | None = None  # the samples stamp read at the last poll (None: none yet, or no stamps)

    def ready(self, now_m: float) -> bool:
        if now_m < self._next:
            return False
        if self._seen is not None and self.ledger.samples_stamp() == self._seen:
            self._next = now_m + self.interval_s
            return False
        return True

    def due_at(self) -> float:
        return self._next

    def poll(self, ledger: Ledger) -> dict[str, list[pd.DataFrame] | float]:
        self._next = time.monotonic() + self.interval_s
        self._seen = ledger.samples_stamp()  # under the lock: any append after it changes the stamp
        newest, self.since = ledger.samples_ingested_since(self.since)
        return dict(newest)
