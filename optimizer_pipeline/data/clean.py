"""Cleaning: turn a validated history frame into RunSeries on the binding's sample grid.

Per run, in this order:
1. non-finite tag values become missing;
2. flagged samples become missing (data/flags.py: spikes and stuck values of CVs and DVs, values pinned
   at a transmitter range's end, slices excluded by hand); MVs are exempt from all but exclusions;
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
Every flag (as spans: tag, run, rule, start, end, samples), split, trim and drop is recorded in the
JSON-able report.
"""

import logging
from typing import Any, Sequence

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, Exclusion, RunSeries
from optimizer_pipeline.data.flags import (PIN_FRACTION, SPIKE_SIGMAS, STUCK_CHANCE, STUCK_MAX_REPEAT,
                                           STUCK_MIN_SAMPLES, TagRules, JUMP, flag_run, flag_spans, jump_sigmas,
                                           tag_rules, true_spans)
from optimizer_pipeline.data.ingest import RUN_ID, TIMESTAMP

log = logging.getLogger(__name__)

MAX_GAP_SAMPLES = 3


def clean_runs(frame: pd.DataFrame, binding: BindingSpec, min_length: int,
               exclusions: Sequence[Exclusion] = ()) -> tuple[list[RunSeries], dict[str, Any]]:
    """Clean every run of a validated history frame (see module docstring).

    frame: columns run_id, timestamp (s, UTC), binding.tags (as from read_history / validate_history_frame);
    exclusions: the slices excluded by hand (the ledger's, not revoked).
    Returns the cleaned RunSeries ordered by start time (engineering units, u / y / d in
    binding.mv_tags / cv_tags / dv_tags order) and the report:
    {"runs": [{"run_id", "rows_in", "rows_out", "flagged", "flagged_by_tag", "flags", "action", "reason", ...}],
     "dropped": [{"run_id", "reason"}], "flags": [every run's flag spans], "settings": {...}, "totals": {...}}.
    `action` is "kept", "trimmed" (edge samples cut), "split" or "dropped".
    """
    if min_length < 1:
        raise ValueError(f"min_length must be >= 1, got {min_length}")
    tags = binding.tags
    cv_columns = np.array([tag in binding.cv_tags for tag in tags])
    period = float(binding.sample_period_s)

    starts = frame.groupby(RUN_ID, sort=False)[TIMESTAMP].transform("min")
    ordered = frame.assign(_start=starts).sort_values(["_start", RUN_ID, TIMESTAMP], kind="stable")
    rules = tag_rules(binding, {tag: ordered[tag].to_numpy(float) for tag in tags}, exclusions)

    series: list[RunSeries] = []
    newest_flagged: dict[str, str] = {}
    runs_report: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    ends = ordered.groupby(RUN_ID, sort=False)[TIMESTAMP].max()
    newest = max(zip(ends.to_numpy(float), map(str, ends.index)))[1] if len(ends) else None
    for run_id, run in ordered.groupby(RUN_ID, sort=False):
        pieces, entry, run_dropped = _clean_run(str(run_id), run[TIMESTAMP].to_numpy(float),
                                                run[list(tags)].to_numpy(float), rules, cv_columns, period,
                                                min_length, keep_end=str(run_id) == newest)
        runs_report.append(entry)
        dropped.extend(run_dropped)
        newest_flagged = entry.pop("newest_flagged", newest_flagged)
        for name, t, values, filled in pieces:
            series.append(_run_series(name, t, values, filled, binding, str(run_id) if name != str(run_id) else ""))

    spans = [span for r in runs_report for span in r["flags"]]
    report = {
        "runs": runs_report,
        "dropped": dropped,
        "flags": spans,
        "newest_flagged": newest_flagged,
        "settings": {"sample_period_s": period, "min_length": int(min_length), "max_gap_samples": MAX_GAP_SAMPLES,
                     "flags": {"spike_sigmas": SPIKE_SIGMAS, "stuck_min_samples": STUCK_MIN_SAMPLES,
                               "stuck_chance": STUCK_CHANCE, "pin_fraction": PIN_FRACTION,
                               "tags": [t for t, m in zip(tags, rules.measured) if m],
                               "ranges": {t: list(r) for t, r in rules.ranges.items()},
                               "exclusions": [e.exclusion_id for e in rules.exclusions]}},
        "totals": {"runs_in": len(runs_report), "series_out": len(series),
                   "rows_in": int(sum(r["rows_in"] for r in runs_report)),
                   "rows_out": int(sum(len(s) for s in series)),
                   "flagged": flag_counts(spans),
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
    for tag, repeats in zip(tags, rules.repeats):
        if tag in binding.cv_tags and repeats > STUCK_MAX_REPEAT:
            report["warnings"].append(
                f"CV {tag!r} repeats its previous value in {repeats:.0%} of its samples (a dead transmitter, an "
                f"analyzer holding between updates, the historian's compression or a coarse quantization): the "
                f"stuck rule does not judge it; exclude a dead slice by hand (optimizer-pipeline exclude)")
            log.warning("%s", report["warnings"][-1])
    log.info("cleaned %d runs into %d series (%d dropped, flagged %s)", len(runs_report), len(series),
             len(dropped), report["totals"]["flagged"] or "none")
    return series, report


def flag_counts(spans: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Flagged samples per tag and rule ({tag: {rule: samples}}) of flag spans."""
    counts: dict[str, dict[str, int]] = {}
    for span in spans:
        per_rule = counts.setdefault(span["tag"], {})
        per_rule[span["rule"]] = per_rule.get(span["rule"], 0) + span["samples"]
    return counts


def clean_newest_run(frame: pd.DataFrame, binding: BindingSpec, min_length: int,
                     exclusions: Sequence[Exclusion] = ()) -> tuple[list[RunSeries], dict[str, str]]:
    """The pieces of one run, the history's newest (its end kept as clean_runs keeps the newest run's),
    cleaned as clean_runs cleans it, and its newest sample's flags (`_newest_flagged`), without the
    report: frame holds that run's rows in time order (run_id, timestamp, binding.tags), e.g. the live
    service's window of the live run (the rules' noise and repeat frequencies are the window's own)."""
    if frame.empty:
        return [], {}
    tags = binding.tags
    cv_columns = np.array([tag in binding.cv_tags for tag in tags])
    run_id = str(frame[RUN_ID].iloc[-1])
    values = frame[list(tags)].to_numpy(float)
    rules = tag_rules(binding, dict(zip(tags, values.T)), exclusions)
    pieces, entry, _ = _clean_run(run_id, frame[TIMESTAMP].to_numpy(float), values, rules, cv_columns,
                                  float(binding.sample_period_s), min_length, keep_end=True)
    return ([_run_series(name, t, values, filled, binding, run_id if name != run_id else "")
             for name, t, values, filled in pieces], entry["newest_flagged"])


def _clean_run(run_id: str, t: np.ndarray, values: np.ndarray, rules: TagRules, cv_columns: np.ndarray, period: float,
               min_length: int,
               keep_end: bool = False) -> tuple[list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], dict, list[dict]]:
    """One run: t (n,) seconds, values (n, n_tags); keep_end: the newest run, whose last CV values missing
    are held (module docstring) and whose entry has `newest_flagged`. Returns the kept pieces (name, t,
    values, the values filled in), the run's report entry and its dropped runs / pieces with reasons."""
    tags = rules.tags
    values = np.where(np.isfinite(values), values, np.nan)
    non_finite = int(np.isnan(values).sum())
    flags = flag_run(t, values, rules, period, open_end=keep_end)
    flagged_spans = flag_spans(run_id, t, flags, tags)
    newest = _newest_flagged(t, values, flags, rules, cv_columns, period) if keep_end else None
    flagged = np.logical_or.reduce(list(flags.values())) if flags else np.zeros(values.shape, bool)
    values[flagged] = np.nan

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
        starts, ends = true_spans(~np.isnan(filled).any(axis=1))
        spans += [(t_grid[a:b], filled[a:b], np.isnan(grid[a:b])) for a, b in zip(starts.tolist(), ends.tolist())]
        grid_samples += grid.shape[0]
        interpolated += n_filled

    entry: dict[str, Any] = {"run_id": run_id, "rows_in": int(t.size), "rows_out": 0,
                             "flagged": int(flagged.sum()), "flagged_by_tag": flag_counts(flagged_spans),
                             "flags": flagged_spans, **({} if newest is None else {"newest_flagged": newest}),
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


def _newest_flagged(t: np.ndarray, values: np.ndarray, flags: dict[str, np.ndarray], rules: TagRules,
                    cv_columns: np.ndarray, period: float) -> dict[str, str]:
    """{tag: rule} for the MVs and CVs whose value in the run's last sample a rule flags, or, for a CV, that
    lies more than SPIKE_SIGMAS off its trend ("jump", flags.jump_sigmas: a spike or a step, which only the
    samples after it tell apart; judged when the last three samples hold no time gap): a plan must not
    start from a glitch (pipeline.flagged_newest)."""
    judged = ~rules.measured | cv_columns  # the MVs and CVs
    found = {rules.tags[j]: rule for rule, mask in flags.items() for j in np.flatnonzero(mask[-1] & judged)}
    if len(t) >= 3 and t[-1] - t[-3] <= 2.5 * period:
        jumps = jump_sigmas(values[-3:], rules.noise)
        for j in np.flatnonzero(cv_columns & (jumps > SPIKE_SIGMAS)):
            found.setdefault(rules.tags[j], JUMP)
    return found


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
        starts, ends = true_spans(missing)
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

