"""Cleaning: turn a validated history frame into RunSeries on the binding's sample grid.

Per run, in this order:
1. non-finite tag values become missing;
2. Hampel filter on the CV and DV tags: |x - median| > 3 * sigma over a centred window of 7, with
   sigma = max(1.4826 * MAD of the window, the tag's noise level in the run); outliers become
   missing. The noise floor (1.4826 * median |x[k+1] - x[k]| / sqrt 2, the sigma of white noise)
   is ours: a 7-sample MAD is so noisy that the plain rule flags 4.7 % of pure Gaussian noise
   samples (measured), which would shave the noise tails the UQ band must cover; with the floor
   it flags 0.26 % (the nominal 3-sigma rate is 0.27 %). MVs are exempt: they are commanded
   values, and a Hampel filter would erase short legitimate moves (a 1-3 sample pulse of a step
   test) that the identification needs. In the newest run (the latest last timestamp, the live
   run's rule in data/split.py) a sample flagged within its last 3 (half the window) is kept when
   every sample after it stays within half its jump from the window's median of it: a level that
   holds to the end is a step the window cannot see yet (no samples after it), and the newest
   samples are the plant's current state (a DV step in them, flagged and cut at the run's end, left
   the plan starting from the MVs of a sample before "now"); the samples that arrive next judge
   them again. A spike with normal samples after it is still removed, and so is the end of a
   finished run;
3. grid alignment: t_k = t0 + k * sample_period_s with t0 = the run's first timestamp; each sample
   goes to the nearest grid point and a grid point takes the mean of its samples;
4. gaps (missing grid values of a tag) of at most MAX_GAP_SAMPLES are linearly interpolated;
   in the newest run, up to MAX_GAP_SAMPLES grid points at its end missing CV values only (every MV
   and DV there) hold the CVs' last values in their place, marked unmeasured for the live state to
   predict or refuse (pipeline.live_run: the setting live.predict_missing); grid points still
   missing a value (longer gaps, or gaps at the start / end of the run) are cut
   out, which splits the run into pieces `<run_id>#1`, `<run_id>#2`, ... in time order. Every value
   filled in is marked in the piece's RunSeries.unmeasured (CVs): a value cleaning made is not a
   measurement, and the live state's disturbance fit leaves it out;
5. pieces shorter than `min_length` samples are dropped.
Every outlier, split, trim and drop is recorded in the JSON-able report.
"""

import logging
import warnings
from typing import Any

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, RunSeries
from optimizer_pipeline.data.ingest import RUN_ID, TIMESTAMP

log = logging.getLogger(__name__)

HAMPEL_WINDOW = 7
HAMPEL_N_SIGMA = 3.0
MAD_TO_SIGMA = 1.4826  # sigma of a normal distribution per unit MAD
# A local MAD and a noise level of exactly 0 (noise-free data) would flag float round-off as
# outliers: sigma is also floored at this fraction of the tag's range in the run.
HAMPEL_RANGE_FLOOR = 1e-6
MAX_GAP_SAMPLES = 3


def clean_runs(frame: pd.DataFrame, binding: BindingSpec, min_length: int) -> tuple[list[RunSeries], dict[str, Any]]:
    """Clean every run of a validated history frame (see module docstring).

    frame: columns run_id, timestamp (s, UTC), binding.tags (as from read_history / validate_history_frame).
    Returns the cleaned RunSeries ordered by start time (engineering units, u / y / d in
    binding.mv_tags / cv_tags / dv_tags order) and the report:
    {"runs": [{"run_id", "rows_in", "rows_out", "outliers", "action", "reason", ...}],
     "dropped": [{"run_id", "reason"}], "settings": {...}, "totals": {...}}.
    `action` is "kept", "trimmed" (edge samples cut), "split" or "dropped".
    """
    if min_length < 1:
        raise ValueError(f"min_length must be >= 1, got {min_length}")
    tags = binding.tags
    hampel_tags = binding.cv_tags + binding.dv_tags
    hampel_columns = np.array([tag in hampel_tags for tag in tags])
    cv_columns = np.array([tag in binding.cv_tags for tag in tags])
    period = float(binding.sample_period_s)

    starts = frame.groupby(RUN_ID, sort=False)[TIMESTAMP].transform("min")
    ordered = frame.assign(_start=starts).sort_values(["_start", RUN_ID, TIMESTAMP], kind="stable")

    series: list[RunSeries] = []
    runs_report: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    ends = ordered.groupby(RUN_ID, sort=False)[TIMESTAMP].max()
    newest = max(zip(ends.to_numpy(float), map(str, ends.index)))[1] if len(ends) else None
    for run_id, run in ordered.groupby(RUN_ID, sort=False):
        pieces, entry, run_dropped = _clean_run(str(run_id), run[TIMESTAMP].to_numpy(float),
                                                run[list(tags)].to_numpy(float), tags, hampel_columns,
                                                cv_columns, period, min_length, keep_end=str(run_id) == newest)
        runs_report.append(entry)
        dropped.extend(run_dropped)
        for name, t, values, filled in pieces:
            series.append(_run_series(name, t, values, filled, binding, str(run_id) if name != str(run_id) else ""))

    report = {
        "runs": runs_report,
        "dropped": dropped,
        "settings": {"sample_period_s": period, "min_length": int(min_length), "max_gap_samples": MAX_GAP_SAMPLES,
                     "hampel": {"window": HAMPEL_WINDOW, "n_sigma": HAMPEL_N_SIGMA, "tags": list(hampel_tags)}},
        "totals": {"runs_in": len(runs_report), "series_out": len(series),
                   "rows_in": int(sum(r["rows_in"] for r in runs_report)),
                   "rows_out": int(sum(len(s) for s in series)),
                   "outliers": int(sum(r["outliers"] for r in runs_report)),
                   "dropped": len(dropped)},
        "latest_timestamp_s": float(frame[TIMESTAMP].max()) if len(frame) else None,
        "warnings": [],
    }
    interval = float(ordered.groupby(RUN_ID, sort=False)[TIMESTAMP].diff().median()) if len(frame) > 1 else period
    if interval > 1.5 * period:
        report["warnings"].append(f"the history is sampled every {interval:g} s (median), slower than the binding's "
                                  f"sample_period_s {period:g} s: grid points without samples are interpolated "
                                  f"(gaps <= {MAX_GAP_SAMPLES}) or split the runs")
        log.warning("%s", report["warnings"][-1])
    log.info("cleaned %d runs into %d series (%d dropped, %d outliers)", len(runs_report), len(series),
             len(dropped), report["totals"]["outliers"])
    return series, report


def clean_newest_run(frame: pd.DataFrame, binding: BindingSpec, min_length: int) -> list[RunSeries]:
    """The pieces of one run, the history's newest (its end kept as clean_runs keeps the newest run's),
    cleaned as clean_runs cleans it, without its report: frame holds that run's rows in time order
    (run_id, timestamp, binding.tags), e.g. the live service's window of the live run."""
    if frame.empty:
        return []
    tags = binding.tags
    hampel_columns = np.array([tag in binding.cv_tags + binding.dv_tags for tag in tags])
    cv_columns = np.array([tag in binding.cv_tags for tag in tags])
    run_id = str(frame[RUN_ID].iloc[-1])
    pieces, _, _ = _clean_run(run_id, frame[TIMESTAMP].to_numpy(float), frame[list(tags)].to_numpy(float), tags,
                              hampel_columns, cv_columns, float(binding.sample_period_s), min_length, keep_end=True)
    return [_run_series(name, t, values, filled, binding, run_id if name != run_id else "")
            for name, t, values, filled in pieces]


def _clean_run(run_id: str, t: np.ndarray, values: np.ndarray, tags: tuple[str, ...], hampel_columns: np.ndarray,
               cv_columns: np.ndarray, period: float, min_length: int,
               keep_end: bool = False) -> tuple[list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], dict, list[dict]]:
    """One run: t (n,) seconds, values (n, n_tags); keep_end: the newest run, whose outliers ending it are
    kept and whose last CV values missing are held (module docstring). Returns the kept pieces (name, t,
    values, the values filled in), the run's report entry and its dropped runs / pieces with reasons."""
    values = np.where(np.isfinite(values), values, np.nan)
    non_finite = int(np.isnan(values).sum())
    outliers = _hampel_outliers(values, keep_end) & hampel_columns
    values[outliers] = np.nan

    # Grid index of every sample (nearest point of t0 + k * period). Stretches separated by more
    # than MAX_GAP_SAMPLES empty grid points are aligned separately, so a long shutdown inside a
    # run costs no memory for its empty grid.
    k = np.floor((t - t[0]) / period + 0.5).astype(np.int64)
    segments = np.split(np.arange(t.size), np.flatnonzero(np.diff(k) > MAX_GAP_SAMPLES + 1) + 1)
    spans, grid_samples, interpolated, held = [], 0, 0, 0  # spans: (t, values, the values filled in)
    for rows in segments:
        grid = _align(k[rows] - k[rows[0]], values[rows])
        filled, n_filled = _fill_short_gaps(grid)
        if keep_end and rows[-1] == t.size - 1:
            filled, n_held = _hold_newest(filled, cv_columns)
            held += n_held
        t_grid = t[0] + period * (k[rows[0]] + np.arange(grid.shape[0]))
        starts, ends = _true_spans(~np.isnan(filled).any(axis=1))
        spans += [(t_grid[a:b], filled[a:b], np.isnan(grid[a:b])) for a, b in zip(starts.tolist(), ends.tolist())]
        grid_samples += grid.shape[0]
        interpolated += n_filled

    entry: dict[str, Any] = {"run_id": run_id, "rows_in": int(t.size), "rows_out": 0,
                             "outliers": int(outliers.sum()),
                             "outliers_by_tag": {tag: int(n) for tag, n in zip(tags, outliers.sum(axis=0)) if n},
                             "non_finite": non_finite, "grid_samples": grid_samples,
                             "interpolated": interpolated, "held_newest": held, "pieces": []}
    dropped: list[dict[str, Any]] = []
    if not spans:
        empty_tags = [tag for j, tag in enumerate(tags) if np.isnan(values[:, j]).all()]
        reason = (f"no values of {', '.join(map(repr, empty_tags))} in this run" if empty_tags
                  else "no grid sample has every tag")
        entry.update(action="dropped", reason=reason)
        dropped.append({"run_id": run_id, "reason": reason})
        return [], entry, dropped

    names = [run_id] if len(spans) == 1 else [f"{run_id}#{i}" for i in range(1, len(spans) + 1)]
    kept, notes = [], []
    for name, (t_piece, piece, filled_in) in zip(names, spans):
        if t_piece.size < min_length:
            reason = f"{t_piece.size} samples after cleaning < min_length {min_length} (one model window)"
            dropped.append({"run_id": name, "reason": reason})
            notes.append(f"{name} dropped: {reason}")
            continue
        kept.append((name, t_piece, piece, filled_in))
        entry["pieces"].append(name)
    entry["rows_out"] = int(sum(p[1].size for p in kept))

    t_last = t[0] + period * k[-1]
    if len(spans) > 1:
        gaps = [_describe_gap(t, values, tags, before[0][-1], after[0][0], period)
                for before, after in zip(spans, spans[1:])]
        action, reasons = "split", [f"split into {len(spans)} pieces at {_first(gaps, '; ')}"]
    elif spans[0][0][0] != t[0] or spans[0][0][-1] != t_last:
        lead, trail = round((spans[0][0][0] - t[0]) / period), round((t_last - spans[0][0][-1]) / period)
        action, reasons = "trimmed", [f"cut {lead} leading and {trail} trailing grid samples with a tag "
                                      "missing (cannot interpolate at the run's edges)"]
    else:
        action, reasons = "kept", []
    if not kept:
        action = "dropped"
        if len(spans) == 1:  # the whole run is the one dropped piece: its reason is the run's reason
            notes = [dropped[0]["reason"]]
    entry.update(action=action, reason="; ".join(reasons + ([_first(notes, "; ")] if notes else [])))
    return kept, entry, dropped


def _hampel_outliers(values: np.ndarray, keep_end: bool = False) -> np.ndarray:
    """(n, n_tags) bool: |x - rolling median| > 3 * sigma (module docstring; centred window, NaN ignored);
    keep_end: in the last half window, a flagged level that holds to the end is cleared (module docstring)."""
    half = HAMPEL_WINDOW // 2
    padded = np.pad(values, ((half, half), (0, 0)), constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(padded, HAMPEL_WINDOW, axis=0)  # (n, n_tags, window)
    median = _window_nanmedian(windows)
    mad = _window_nanmedian(np.abs(windows - median[..., None]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a tag with no values in the run gives NaN
        noise = MAD_TO_SIGMA * np.nanmedian(np.abs(np.diff(values, axis=0)), axis=0) / np.sqrt(2.0)
        spread = np.nanmax(values, axis=0) - np.nanmin(values, axis=0)
    floor = np.maximum(np.nan_to_num(noise), HAMPEL_RANGE_FLOOR * np.nan_to_num(spread))
    sigma = np.maximum(MAD_TO_SIGMA * mad, floor)
    outliers = np.abs(values - median) > HAMPEL_N_SIGMA * sigma  # NaN compares False: missing is not an outlier
    if keep_end:  # the newest run's last half window: a level that holds to its end is a step, kept
        tail = max(len(values) - half, 0)
        for k, j in zip(*np.nonzero(outliers[tail:])):
            k += tail
            after = values[k + 1:, j]
            jump = abs(values[k, j] - median[k, j])
            outliers[k, j] = not np.all(np.abs(after[~np.isnan(after)] - values[k, j]) <= jump / 2)
    return outliers


def _window_nanmedian(windows: np.ndarray) -> np.ndarray:
    """Median over the last axis ignoring NaN (NaN when all are NaN); np.nanmedian is ~20x slower here."""
    ordered = np.sort(windows, axis=-1)  # NaN sort last
    count = np.count_nonzero(~np.isnan(windows), axis=-1)[..., None]
    lo = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, axis=-1)
    hi = np.take_along_axis(ordered, count // 2, axis=-1)
    return ((lo + hi) / 2)[..., 0]


def _align(k: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Bucket means: row k of the result is the mean of the samples with grid index k; empty buckets are NaN."""
    m = int(k[-1]) + 1
    present = ~np.isnan(values)
    sums = np.column_stack([np.bincount(k, np.where(p, v, 0.0), m) for v, p in zip(values.T, present.T)])
    counts = np.column_stack([np.bincount(k, p, m) for p in present.T])
    with np.errstate(invalid="ignore"):
        return sums / counts  # 0 / 0 = NaN: an empty bucket


def _fill_short_gaps(grid: np.ndarray) -> tuple[np.ndarray, int]:
    """Linearly interpolate interior gaps of <= MAX_GAP_SAMPLES per column; returns (filled, cells filled)."""
    filled = grid.copy()
    n = grid.shape[0]
    index = np.arange(n)
    for j in range(grid.shape[1]):
        missing = np.isnan(grid[:, j])
        if not missing.any() or missing.all():
            continue
        starts, ends = _true_spans(missing)
        short = (starts > 0) & (ends < n) & (ends - starts <= MAX_GAP_SAMPLES)
        marks = np.zeros(n + 1, dtype=np.int64)
        np.add.at(marks, starts[short], 1)
        np.add.at(marks, ends[short], -1)
        fill = np.cumsum(marks[:-1]) > 0
        filled[fill, j] = np.interp(index[fill], index[~missing], grid[~missing, j])
    return filled, int((np.isnan(grid) & ~np.isnan(filled)).sum())


def _hold_newest(filled: np.ndarray, cv_columns: np.ndarray) -> tuple[np.ndarray, int]:
    """The newest run's last grid points missing CV values only (at most MAX_GAP_SAMPLES, after a complete
    point): each missing CV value holds the value of that complete point, a placeholder the live state
    replaces with the model's prediction or refuses (module docstring). Returns (values, cells held)."""
    missing = np.isnan(filled)
    n, count = len(filled), 0
    while count < min(MAX_GAP_SAMPLES, n - 1) and missing[n - 1 - count].any() \
            and not missing[n - 1 - count, ~cv_columns].any():
        count += 1
    if count == 0 or missing[n - 1 - count].any():  # nothing missing, or more than a few points, or no base
        return filled, 0
    held = filled.copy()
    tail = held[n - count:]
    tail[missing[n - count:]] = np.broadcast_to(held[n - 1 - count], tail.shape)[missing[n - count:]]
    return held, int(missing[n - count:].sum())


def _true_spans(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and (exclusive) ends of the stretches where mask is True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _describe_gap(t: np.ndarray, values: np.ndarray, tags: tuple[str, ...], end: float, start: float,
                  period: float) -> str:
    """The gap between two pieces: grid samples missing after time `end` up to `start`, and the tags without values."""
    n = round((start - end) / period) - 1
    inside = (t > end + period / 2) & (t < start - period / 2)
    missing = [tag for j, tag in enumerate(tags) if np.isnan(values[inside, j]).all()] or \
        [tag for j, tag in enumerate(tags) if np.isnan(values[inside, j]).any()]
    return (f"a gap of {n} samples ({n * period:g} s) in {', '.join(map(repr, missing))} "
            f"starting {end + period - t[0]:g} s into the run")


def _first(items: list[str], sep: str, shown: int = 3) -> str:
    """At most `shown` items joined, then how many more: a reason stays one readable line."""
    more = f"{sep}... and {len(items) - shown} more" if len(items) > shown else ""
    return sep.join(items[:shown]) + more


def _run_series(name: str, t: np.ndarray, values: np.ndarray, filled_in: np.ndarray, binding: BindingSpec,
                source_run: str) -> RunSeries:
    n_mv, n_cv = len(binding.mvs), len(binding.cvs)
    arrays = [np.ascontiguousarray(a, dtype=float) for a in
              (t, values[:, :n_mv], values[:, n_mv:n_mv + n_cv], values[:, n_mv + n_cv:])]
    unmeasured = np.ascontiguousarray(filled_in[:, n_mv:n_mv + n_cv]) if filled_in[:, n_mv:n_mv + n_cv].any() \
        else None
    for a in (*arrays, unmeasured):
        if a is not None:
            a.setflags(write=False)  # RunSeries is frozen; its arrays are shared by the splits
    return RunSeries(name, *arrays, source_run=source_run, unmeasured=unmeasured)

