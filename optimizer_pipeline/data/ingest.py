"""History ingest: read a CSV / Parquet history file (docs/ARCHITECTURE.md, "History file") and validate it.

The validated frame has the columns `run_id` (str), `timestamp` (float seconds since the epoch,
UTC), then one float column per tag in `binding.tags` order; extra columns of the file are
dropped. Every user mistake raises `HistoryError` with a one-line message that names the source
and, where it applies, the column, the run and the row.

Row numbers are 1-based data rows as in the file; for CSV the text line (header = line 1) is
given too, e.g. "row 17 (line 18)". Blank CSV lines count as rows and are skipped.

Size limits of one file (docs/history.md, "Limits"): at most MAX_HISTORY_BYTES on disk (checked before
reading) and MAX_HISTORY_ROWS data rows (CSV: parsing stops one row past it; Parquet: from the file's
metadata, before reading). A longer history is ingested as several files: ingest appends.

Refused values (docs/ARCHITECTURE.md, "History file"): an infinite tag value (`inf`, `-inf`; an
empty cell or NaN stays a missing value), a CV value at or beyond its transform's limits (unless the
caller says otherwise: an observed outcome), and, when the caller gives the clock (`now_s`, as the
`ingest` command does), a timestamp more than CLOCK_SKEW_ALLOWANCE_S after it: a sample from the
future would make a stale live state look current.
"""

import csv
import io
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, ContractError, iso_from_seconds
from optimizer_pipeline.validation import closest

log = logging.getLogger(__name__)

RUN_ID = "run_id"
TIMESTAMP = "timestamp"
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
# A timestamp may be this far ahead of our clock (historian and host clocks disagree a little); further
# ahead it is refused as a sample from the future.
CLOCK_SKEW_ALLOWANCE_S = 300.0
# ~256 MiB is ~2.5 million rows of a 10-tag CSV; the validated frame and the ledger insert hold a few
# copies of it in memory. 2 million rows is 230 days of 10 s samples.
MAX_HISTORY_BYTES = 256 * 1024 * 1024
MAX_HISTORY_ROWS = 2_000_000
# A CSV file up to this size is first read by `_read_plain_csv` (e.g. the live service's inbox files of
# one sample period each: pandas' fixed cost per call is ~15 ms for such a file, ~40x the reading).
PLAIN_CSV_BYTES = 64 * 1024
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# Delimiters people use by mistake (spreadsheet exports in many locales write ';').
_OTHER_DELIMITERS = {";": "';'", "\t": "tab", "|": "'|'"}


class HistoryError(ContractError):
    """A history file or frame breaks the history contract; the message names file / column / run / row."""


def read_history(path: str | Path, binding: BindingSpec, now_s: float | None = None,
                 transform_limits: bool = True) -> pd.DataFrame:
    """Read and validate a history file for `binding` (format by suffix: .csv, .parquet, .pq).

    now_s: the clock (seconds since the epoch); timestamps more than CLOCK_SKEW_ALLOWANCE_S after it
    are refused. None skips that check. transform_limits: refuse a CV value at or beyond its
    transform's limits (False for an observed outcome: judged in engineering units, where such a value
    is what it shows).
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise HistoryError(f"{source}: history file not found" if not path.exists()
                           else f"{source}: not a file")
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        raise HistoryError(f"{source}: unknown history file type {path.suffix!r} (use .csv, .parquet or .pq)")
    size = path.stat().st_size
    if size > MAX_HISTORY_BYTES:
        raise HistoryError(f"{source}: history file is {size} bytes, over the limit of {MAX_HISTORY_BYTES} bytes "
                           f"(MAX_HISTORY_BYTES, {MAX_HISTORY_BYTES >> 20} MiB); split it into several files "
                           f"and ingest each")
    result = _read_plain_csv(path, binding, now_s, transform_limits) \
        if suffix in CSV_SUFFIXES and size <= PLAIN_CSV_BYTES else None
    if result is None:
        lines = suffix in CSV_SUFFIXES
        frame = _read_csv(path, binding) if lines else _read_parquet(path, binding)
        result = _validate(frame, binding, source, lines=lines, now_s=now_s, transform_limits=transform_limits)
    log.debug("read %s: %d rows", source, len(result))
    return result


def validate_history_frame(frame: pd.DataFrame, binding: BindingSpec, source: str) -> pd.DataFrame:
    """Validate a frame that did not come from a file (stored samples, observed outcomes).

    Rows are numbered 1-based in the frame's current order. Returns the same normalised frame as
    `read_history`.
    """
    if not isinstance(frame, pd.DataFrame):
        raise HistoryError(f"{source}: expected a table of samples, got {type(frame).__name__}")
    return _validate(_required_columns(frame, binding, source).reset_index(drop=True), binding, source, lines=False)


def _required(binding: BindingSpec) -> tuple[str, ...]:
    """The columns a history of `binding` must have: run id, timestamp and one per tag."""
    return (RUN_ID, TIMESTAMP, *binding.tags)


def _required_columns(frame: pd.DataFrame, binding: BindingSpec, source: str) -> pd.DataFrame:
    """The frame's run id, timestamp and tag columns (`_check_columns`)."""
    _check_columns(list(frame.columns), binding, source)
    return frame.loc[:, frame.columns.isin(_required(binding))]


def _check_columns(names: list, binding: BindingSpec, source: str, where: str = "") -> None:
    """HistoryError when the run id, the timestamp or a tag column appears twice among the column
    `names`, or is missing: then each missing name with the extra column it was most likely meant
    to be ("the file has 'T_OUT': column names are case-sensitive", "did you mean 't_out1'?").
    Extra columns are ignored, also when their names repeat or are blank."""
    required = _required(binding)
    twice = [name for name, n in Counter(names).items() if n > 1 and name in required]
    if twice:
        raise HistoryError(f"{source}: duplicate column(s) {_names(twice)}{where}")
    missing = [name for name in required if name not in names]
    if missing:
        extra = [name for name in names if name not in required]
        raise HistoryError(f"{source}: missing required column(s) "
                           f"{', '.join(repr(name) + _near(name, extra) for name in missing)}")


def _near(name: str, extra: list) -> str:
    """The hint after a missing column `name`: the extra column closest to it, if any."""
    match = closest(name, extra)
    if match is None:
        return ""
    if match.lower() == name.lower():
        return f" (the file has {match!r}: column names are case-sensitive)"
    return f" (did you mean {match!r}?)"


# --------------------------------------------------------------------------- file readers


def _read_csv(path: Path, binding: BindingSpec) -> pd.DataFrame:
    source = str(path)
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            header_line = handle.readline()
    except UnicodeDecodeError:
        raise HistoryError(f"{source}: cannot read history file (not UTF-8 text)") from None
    except OSError as exc:
        raise HistoryError(f"{source}: cannot read history file ({exc.strerror or exc})") from None
    if not header_line.strip():
        raise HistoryError(f"{source}: empty file (no header and no data rows)")

    # Check the header ourselves: pandas would silently rename a duplicate 'x' to 'x.1'.
    header = [name.strip() for name in next(csv.reader([header_line], skipinitialspace=True))]
    required = _required(binding)
    if not set(required) <= set(header):
        counts = {label: header_line.count(d) for d, label in _OTHER_DELIMITERS.items()}
        label, count = max(counts.items(), key=lambda item: item[1])
        if count > 0 and count >= len(header) - 1:
            raise HistoryError(f"{source}: the header looks like {label}-delimited "
                               f"({len(header)} column(s) when split on ','); use ','")
    _check_columns(header, binding, source, " in the header")

    try:
        frame = pd.read_csv(path, encoding="utf-8-sig", skipinitialspace=True, skip_blank_lines=False, low_memory=False,
                            dtype={RUN_ID: str, TIMESTAMP: str}, usecols=lambda c: c.strip() in required,
                            nrows=MAX_HISTORY_ROWS + 1)
    except UnicodeDecodeError:
        raise HistoryError(f"{source}: cannot read history file (not UTF-8 text)") from None
    except (pd.errors.ParserError, ValueError, OSError) as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise HistoryError(f"{source}: cannot parse CSV ({detail})") from None
    if len(frame) > MAX_HISTORY_ROWS:
        raise _too_many_rows(source)
    frame.columns = [c.strip() for c in frame.columns]
    # Blank lines read as all-missing rows: drop them but keep the index = data row number - 1.
    return frame[frame.notna().any(axis=1)]


def _read_plain_csv(path: Path, binding: BindingSpec, now_s: float | None,
                    transform_limits: bool) -> pd.DataFrame | None:
    """The validated frame of a small CSV file every cell of which is plain, as `_validate` makes it
    (the same values, without pandas): a header naming each required column once, at most
    MAX_HISTORY_ROWS rows of as many fields as the header, run ids not empty, timestamps as seconds
    since the epoch, tag values empty (missing) or plain decimal numbers, and nothing `_validate`
    refuses (an infinite or out-of-limits value, a tag without values, time not increasing in a run, a
    sample from the future). None for any other file: read_history then reads it with pandas and names
    what is wrong, so every message comes from one place."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    rows = list(csv.reader(io.StringIO(text, newline=""), skipinitialspace=True))
    header = [name.strip() for name in rows[0]] if rows else []
    required = _required(binding)
    if not 2 <= len(rows) <= MAX_HISTORY_ROWS + 1 or any(header.count(name) != 1 for name in required):
        return None
    width, at = len(header), [header.index(name) for name in required]
    run_ids, seconds, values = [], [], [[] for _ in binding.tags]
    for row in rows[1:]:
        if len(row) != width:
            return None
        run_id, stamp = row[at[0]].strip(), row[at[1]]
        if not run_id or not _PLAIN_NUMBER.fullmatch(stamp):
            return None
        run_ids.append(run_id)
        seconds.append(float(stamp))
        for column, j in zip(values, at[2:]):
            cell = row[j]
            if cell and not _PLAIN_NUMBER.fullmatch(cell):
                return None
            column.append(float(cell) if cell else np.nan)
    times = np.array(seconds)
    table = np.array(values, float)  # (tags, rows)
    transforms = {cv.tag: cv.transform for cv in binding.cvs if cv.transform is not None and transform_limits}
    if not (np.all(np.isfinite(times)) and not np.isinf(table).any() and not np.isnan(table).all(axis=1).any()) or \
            (now_s is not None and times.max() > now_s + CLOCK_SKEW_ALLOWANCE_S) or \
            any(transforms[tag].first_outside(column) is not None
                for tag, column in zip(binding.tags, table) if tag in transforms):
        return None
    newest: dict[str, float] = {}
    for run_id, t in zip(run_ids, seconds):
        if newest.get(run_id, -np.inf) >= t:
            return None
        newest[run_id] = t
    return pd.DataFrame({RUN_ID: np.array(run_ids, dtype=object), TIMESTAMP: times, **dict(zip(binding.tags, table))})


def _too_many_rows(source: str) -> HistoryError:
    return HistoryError(f"{source}: more than {MAX_HISTORY_ROWS} data rows, the limit of one history file "
                        f"(MAX_HISTORY_ROWS); split it into several files and ingest each")


def _read_parquet(path: Path, binding: BindingSpec) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        if pq.read_metadata(path).num_rows > MAX_HISTORY_ROWS:
            raise _too_many_rows(str(path))
        names = pq.read_schema(path).names
        _check_columns(names, binding, str(path))
        # only the columns the binding needs: extra ones are ignored, also when their names repeat
        frame = pd.read_parquet(path, columns=list(_required(binding)))
    except HistoryError:
        raise
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HistoryError(f"{path}: cannot read Parquet file ({detail})") from None
    return frame.reset_index(drop=True)


# --------------------------------------------------------------------------- validation


def _validate(frame: pd.DataFrame, binding: BindingSpec, source: str, *, lines: bool,
              now_s: float | None = None, transform_limits: bool = True) -> pd.DataFrame:
    """frame.index holds 0-based data row numbers (used in messages only)."""

    def where(position: int) -> str:
        row = int(frame.index[position]) + 1
        return f"row {row} (line {row + 1})" if lines else f"row {row}"

    if len(frame) == 0:
        raise HistoryError(f"{source}: empty file (no data rows; at least one run is needed)")

    run_ids = _run_ids(frame[RUN_ID], source, where)
    timestamps = _timestamps(frame[TIMESTAMP], source, where, run_ids, now_s)

    values = {}
    transforms = {cv.tag: cv.transform for cv in binding.cvs if cv.transform is not None and transform_limits}
    for tag in binding.tags:
        column = frame[tag]
        numbers = pd.to_numeric(column, errors="coerce") if not pd.api.types.is_bool_dtype(column) \
            else pd.Series(np.nan, index=column.index)
        bad = np.flatnonzero(numbers.isna().to_numpy() & column.notna().to_numpy())
        if bad.size:
            i = bad[0]
            raise HistoryError(f"{source}: column {tag!r}: non-numeric value {column.iloc[i]!r} "
                               f"in run {run_ids[i]!r} at {where(i)}")
        numbers = numbers.to_numpy(dtype=float)
        infinite = np.flatnonzero(np.isinf(numbers))
        if infinite.size:
            i = infinite[0]
            raise HistoryError(f"{source}: column {tag!r}: infinite value {float(numbers[i])!r} in run {run_ids[i]!r} "
                               f"at {where(i)} (inf / -inf are refused; leave the cell empty for a missing value)")
        if np.isnan(numbers).all():
            raise HistoryError(f"{source}: column {tag!r} has no values (all empty / NaN)")
        i = transforms[tag].first_outside(numbers) if tag in transforms else None
        if i is not None:
            raise HistoryError(f"{source}: column {tag!r}: {float(numbers[i])!r} in run {run_ids[i]!r} at {where(i)} "
                               f"is not inside the limits of the CV's transform ({transforms[tag].describe()})")
        values[tag] = numbers

    # Strictly increasing time inside each run, in the order the rows are given.
    ordered = pd.DataFrame({RUN_ID: run_ids, TIMESTAMP: timestamps})
    step = ordered.groupby(RUN_ID, sort=False)[TIMESTAMP].diff().to_numpy()
    bad = np.flatnonzero(step <= 0)
    if bad.size:
        i = bad[0]
        raise HistoryError(f"{source}: run {run_ids[i]!r}: timestamp at {where(i)} is not after the previous "
                           f"sample of the run (timestamps must be strictly increasing inside a run)")

    return pd.DataFrame({RUN_ID: run_ids, TIMESTAMP: timestamps, **values})


def epoch_seconds(moments: pd.Series) -> np.ndarray:
    """Float seconds since the epoch of UTC datetimes, as every stored sample time was converted
    (a time given again as text must compare equal to the stored one)."""
    return ((moments - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(dtype=float)


def _run_ids(column: pd.Series, source: str, where) -> np.ndarray:
    ids = column.astype("string").str.strip()
    empty = np.flatnonzero((ids.isna() | (ids == "")).to_numpy(dtype=bool))
    if empty.size:
        raise HistoryError(f"{source}: column 'run_id' is empty at {where(empty[0])}")
    return ids.to_numpy(dtype=object)  # Python str: messages show 'r1', not np.str_('r1')


def _timestamps(column: pd.Series, source: str, where, run_ids: np.ndarray, now_s: float | None) -> np.ndarray:
    """Seconds since the epoch (UTC) from numbers, ISO 8601 text (naive = UTC) or datetimes."""
    if isinstance(column.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(column):
        seconds = epoch_seconds(column.dt.tz_localize("UTC") if column.dt.tz is None else column.dt.tz_convert("UTC"))
    else:
        seconds = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, copy=True)
        text = np.isnan(seconds) & column.notna().to_numpy()
        if text.any():
            parsed = pd.to_datetime(column[text].astype(str).str.strip(), utc=True, format="ISO8601", errors="coerce")
            seconds[text] = epoch_seconds(parsed)
    bad = np.flatnonzero(~np.isfinite(seconds))
    if bad.size:
        i = bad[0]
        value = column.iloc[i]
        problem = f"is empty at {where(i)}" if pd.isna(value) else \
            f"{value!r} at {where(i)} is not ISO 8601 text or seconds since the epoch"
        raise HistoryError(f"{source}: run {run_ids[i]!r}: timestamp {problem}")
    future = np.flatnonzero(seconds > now_s + CLOCK_SKEW_ALLOWANCE_S) if now_s is not None else ()
    if len(future):
        i = future[0]
        raise HistoryError(f"{source}: run {run_ids[i]!r}: timestamp {iso_from_seconds(seconds[i])} at {where(i)} is in the future "
                           f"(more than {CLOCK_SKEW_ALLOWANCE_S:g} s after this host's clock, {iso_from_seconds(now_s)})")
    return seconds


def _names(names) -> str:
    return ", ".join(repr(str(n)) for n in names)
