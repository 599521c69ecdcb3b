"""Storing plant history in the ledger, from the CLI (`ingest`) and from the historian drop folder
(`<home>/inbox/<binding_id>/`): one code path, the same checks, nothing partial.

The inbox: a historian export writes a history file (CSV or Parquet, the history format) into the
binding's folder under a temporary name (starting with `.`, or ending in `.part` / `.tmp`) and
renames it when done. The `history_inbox` sensor ingests every finished file in name order: an
ingested file moves to `done/`, a refused one (unknown binding, bad file) to `rejected/` with
`<name>.error.txt` holding the one-line reason, and the ledger is unchanged for it. A file is not
refused for the ledger's state: while the ledger stays busy past its bound (LedgerBusyError: locked
by other processes, no PostgreSQL connection free) the file waits in the inbox for the next tick,
and so do the files after it (the sensor stops at the first). A file that cannot be moved (the
folder not writable) stays where it is and is read again next tick, its samples stored once (a
refused one refused again); the files after it are not held up.
"""

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, ContractError
from optimizer_pipeline.data.clean import clean_runs
from optimizer_pipeline.data.ingest import read_history
from optimizer_pipeline.ledger import Ledger, LedgerBusyError, LedgerError, NotFoundError

INBOX = "inbox"
DONE, REJECTED = "done", "rejected"
IGNORED_SUFFIXES = (".part", ".tmp")
HISTORY_SUFFIXES = (".csv", ".parquet", ".pq")


def ingest_history(ledger_of: Callable[[], Ledger], spec: BindingSpec, path: str | Path, source: str,
                   store_binding: bool = True) -> dict[str, Any]:
    """Read and validate `path` for `spec` (samples from the future refused), then open the ledger
    (`ledger_of()`: only once the file is good, so a refused file leaves no ledger behind) and store
    it in one transaction: with `store_binding` the spec too (a changed spec bumps the revision and
    expires the binding's open recommendations; a changed OPC UA wiring alone does neither), else only
    the samples. Returns the summary; its `flagged` counts the file's samples the cleaning rules flag, per
    tag and rule (data/flags.py: judged on the file's own samples; the next recalibration judges them
    with the whole history), its `warnings` what cleaning warns of (a CV repeating its value more often
    than not, a history sampled slower than the binding's period)."""
    frame = read_history(path, spec, now_s=time.time())
    cleaning = clean_runs(frame, spec, 1)[1]
    ledger = ledger_of()
    if store_binding:
        upsert, rows = ledger.ingest(spec, frame, source)
        summary = {"binding_id": spec.id, "revision": upsert.revision, "created": upsert.created,
                   "changed": upsert.changed, "expired_recommendations": upsert.expired,
                   "wiring_changed": upsert.wiring_changed}
    else:
        rows = ledger.append_samples(spec.id, frame, spec.tags, source)
        summary = {"binding_id": spec.id}
    return {**summary, "runs": int(frame["run_id"].nunique()), "rows_read": len(frame), "samples_added": rows,
            "source": source, "flagged": cleaning["totals"]["flagged"], "warnings": cleaning["warnings"]}


@dataclass(frozen=True)
class InboxResult:
    binding_id: str
    file: str  # the name it arrived with
    ingested: bool
    detail: str  # samples added, the one-line reason it was refused, or why it waits
    waiting: bool = False  # the ledger was busy: left in the inbox for the next tick (module docstring)


def inbox_folder(home: Path) -> Path:
    return Path(home) / INBOX


def waiting_files(home: Path) -> list[Path]:
    """Finished history files in `<home>/inbox/<binding>/`, by binding then name."""
    root = inbox_folder(home)
    if not root.is_dir():
        return []
    # scandir: the entries' types come with the listing (the live service lists every binding's folder
    # five times a second; a stat per entry made that ~3x dearer)
    with os.scandir(root) as folders:
        bindings = [entry.path for entry in folders if entry.is_dir()]
    found = []
    for folder in bindings:
        with os.scandir(folder) as entries:
            found += [Path(e.path) for e in entries
                      if e.is_file() and not e.name.startswith(".") and not e.name.endswith(IGNORED_SUFFIXES)]
    return sorted(found)


def ingest_inbox_file(ledger: Ledger, path: Path, source: str = "real") -> InboxResult:
    """Ingest one inbox file of the binding named by its folder into that binding's latest spec,
    and move it to done/ or rejected/ (with its reason beside it)."""
    binding_id = path.parent.name
    try:
        if path.suffix.lower() not in HISTORY_SUFFIXES:
            raise ContractError(f"{path.name}: not a history file (expected {', '.join(HISTORY_SUFFIXES)})")
        try:
            spec = ledger.get_binding(binding_id).spec
        except NotFoundError:
            raise ContractError(f"{path.name}: binding {binding_id!r} is not in the ledger; ingest its binding "
                                f"file first (optimizer-pipeline ingest BINDING_FILE HISTORY_FILE)") from None
        summary = ingest_history(lambda: ledger, spec, path, source, store_binding=False)
    except LedgerBusyError as exc:  # the ledger's state, not the file's fault
        return InboxResult(binding_id, path.name, False, "waits for the next tick: " + str(exc).splitlines()[0],
                           waiting=True)
    except (ContractError, LedgerError) as exc:
        return _refused(path, str(exc).splitlines()[0])
    detail = f"{summary['samples_added']} samples added"
    moved = _move(path, DONE)
    return InboxResult(binding_id, path.name, True, f"{detail}; {moved}" if moved else detail)


def ingest_inbox_batch(ledger: Ledger, paths: list[Path], spec_of: Callable[[str], BindingSpec | None],
                       source: str = "real") -> tuple[list[InboxResult], dict[str, list[pd.DataFrame]]]:
    """Ingest several inbox files in ONE ledger transaction (the live service's path: a transaction per
    one-sample file would cost more than the re-solve). Each file is read and validated on its own,
    as `ingest_inbox_file` does it: a refused one moves to rejected/ with its reason and nothing of it is
    stored. The samples of the good ones are stored together; then they move to done/. When the ledger
    is busy or fails, none is stored and all stay in the inbox for the next try. `spec_of(binding)`:
    the binding's spec (None: not in the ledger). Returns the results and the frames stored, by binding."""
    results, good = [], []
    for path in paths:
        binding_id = path.parent.name
        try:
            if path.suffix.lower() not in HISTORY_SUFFIXES:
                raise ContractError(f"{path.name}: not a history file (expected {', '.join(HISTORY_SUFFIXES)})")
            spec = spec_of(binding_id)
            if spec is None:
                raise ContractError(f"{path.name}: binding {binding_id!r} is not in the ledger; ingest its binding "
                                    f"file first (optimizer-pipeline ingest BINDING_FILE HISTORY_FILE)")
            good.append((path, spec, read_history(path, spec, now_s=time.time())))
        except ContractError as exc:
            results.append(_refused(path, str(exc).splitlines()[0]))
    frames: dict[str, list[pd.DataFrame]] = {}
    if not good:
        return results, frames
    try:
        added = ledger.append_samples_many([(spec.id, frame, spec.tags) for _, spec, frame in good], source)
    except LedgerError as exc:  # the ledger's state, not the files' fault: all wait for the next try
        detail = "waits for the next tick: " + str(exc).splitlines()[0]
        return results + [InboxResult(p.parent.name, p.name, False, detail, waiting=True) for p, _, _ in good], frames
    for path, spec, frame in good:
        frames.setdefault(spec.id, []).append(frame)
        moved = _move(path, DONE)
        detail = f"{len(frame)} rows read ({added} new samples in a batch of {len(good)} file(s))"
        results.append(InboxResult(spec.id, path.name, True, f"{detail}; {moved}" if moved else detail))
    return results, frames


def _refused(path: Path, reason: str) -> InboxResult:
    """A refused file moved to rejected/ with its reason beside it (or, when it cannot be moved, the
    reason written there and the file left where it is)."""
    moved = _move(path, REJECTED)
    if moved:
        return InboxResult(path.parent.name, path.name, False, f"{reason}; {moved}")
    (path.parent / REJECTED / f"{path.name}.error.txt").write_text(reason + "\n", encoding="utf-8")
    return InboxResult(path.parent.name, path.name, False, reason)


def _move(path: Path, where: str) -> str:
    """Move `path` into its folder's `where`/; "" when done, else why not (it stays in the inbox)."""
    target = path.parent / where
    try:
        target.mkdir(exist_ok=True)
        shutil.move(str(path), str(target / path.name))
    except OSError as exc:
        return f"cannot move it to {where}/ ({exc.strerror or exc}), so it stays in the inbox and is read again next tick"
    return ""
