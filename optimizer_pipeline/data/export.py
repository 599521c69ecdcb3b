"""History export: stored samples written as a history file that `ingest` reads back unchanged
(docs/ARCHITECTURE.md, "History file"), CSV or Parquet by the file's suffix.

Timestamps are written as ISO 8601 text in UTC (CSV) or UTC datetimes (Parquet), to the microsecond
where that parses back to the very float the ledger holds and to the nanosecond where only that does
(a time computed in floating point, e.g. 10:03:39.877000093); CSV values are written with
Python's shortest round-trip form and a missing value as an empty cell. The file is written beside
its final name and renamed into place: an interrupted export leaves no partial file.
"""

import os
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import iso_from_seconds
from optimizer_pipeline.data.ingest import (CSV_SUFFIXES, PARQUET_SUFFIXES, RUN_ID, TIMESTAMP, HistoryError,
                                            epoch_seconds)


def window(frame: pd.DataFrame, since: datetime | None, until: datetime | None) -> pd.DataFrame:
    """The rows of a history frame (float `timestamp` seconds since the epoch) with
    since <= timestamp <= until (aware datetimes); None leaves that end open."""
    lo = -np.inf if since is None else epoch_seconds(pd.Series([pd.Timestamp(since)]))[0]
    hi = np.inf if until is None else epoch_seconds(pd.Series([pd.Timestamp(until)]))[0]
    return frame[(frame[TIMESTAMP] >= lo) & (frame[TIMESTAMP] <= hi)].reset_index(drop=True)


def export_history(stored: pd.DataFrame, path: str | Path, since: datetime | None, until: datetime | None,
                   what: str) -> dict:
    """Write the rows of the history frame `stored` in the window to `path` (`write_history`); returns
    the runs, rows and the first and last sample time written. HistoryError naming `what` when the
    window holds no sample (nothing is written)."""
    frame = window(stored, since, until)
    if frame.empty:
        times = stored[TIMESTAMP]
        span = "no samples are stored" if stored.empty else \
            f"its samples span {iso_from_seconds(times.min())} to {iso_from_seconds(times.max())}"
        raise HistoryError(f"{what} has no samples in that window; {span}")
    write_history(frame, path)
    return {"runs": int(frame[RUN_ID].nunique()), "rows": len(frame),
            "first": iso_from_seconds(frame[TIMESTAMP].min()), "last": iso_from_seconds(frame[TIMESTAMP].max())}


def _exact_moments(seconds: pd.Series) -> pd.Series:
    """UTC datetimes of float seconds since the epoch, each rounded to the microsecond when that
    converts back to the same float, else kept to the nanosecond."""
    moments = pd.to_datetime(seconds, unit="s", utc=True)
    rounded = moments.dt.round("us")
    exact = epoch_seconds(rounded) == seconds.to_numpy()
    return rounded.where(exact, moments)


def write_history(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a history frame (run_id, float timestamp, one column per tag) to `path`; HistoryError
    naming the file for an unknown suffix or a folder that does not exist."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        raise HistoryError(f"{path}: unknown history file type {path.suffix!r} (use .csv, .parquet or .pq)")
    if not path.parent.is_dir():
        raise HistoryError(f"{path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise HistoryError(f"{path}: is a folder; give a file name")
    out = frame.copy()
    moments = _exact_moments(out[TIMESTAMP])
    out[TIMESTAMP] = moments.map(pd.Timestamp.isoformat) if suffix in CSV_SUFFIXES else moments
    out[RUN_ID] = out[RUN_ID].astype(str)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(handle)
    try:
        if suffix in CSV_SUFFIXES:
            out.to_csv(temporary, index=False)
        else:
            out.to_parquet(temporary, index=False)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
