"""A validated history frame made ready for identification: cleaned onto the sample grid (the
exclusions counted as missing), split into train / val / test / live runs, with the report on the
live run's newest samples; and a live run cleaned anew when new samples arrive.

Typical use: `prepare_history(read_history(path, binding), binding, seed)` -> HistorySplit.
"""

from dataclasses import replace
from typing import Sequence

import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, Exclusion, HistorySplit, RunSeries
from optimizer_pipeline.data.clean import clean_newest_run, clean_runs
from optimizer_pipeline.data.split import split_runs
from optimizer_pipeline.model.artifact import window_lag


def default_min_length(binding: BindingSpec) -> int:
    """One model window (samples): the largest ARX lag the binding's model may have + horizon P + 1."""
    return window_lag(binding) + binding.model.horizon + 1


def prepare_history(frame: pd.DataFrame, binding: BindingSpec, seed: int = 0, min_length: int | None = None,
                    exclusions: Sequence[Exclusion] = ()) -> HistorySplit:
    """Clean a validated history frame (the slices `exclusions` count as missing) and split it; the
    cleaning report is report["cleaning"].

    report["warnings"] collects the cleaning and split warnings, plus one when the live run does not
    reach the history's latest sample (its newest samples were dropped in cleaning, so "now" is
    older than the file says); report["live_behind_s"] is that lag (0 up to grid snapping) and
    report["live_tail_dropped"] whether it happened (None / False without a live run);
    report["live_missing"] the MV and CV tags without a value in the newest sample (`newest_missing`);
    report["live_flagged"] those whose newest value a cleaning rule flags, or a CV's off its trend
    (clean.py `_newest_flagged`);
    report["live_warming_up"] how far the newest samples are from a live state (`warming_up`).
    """
    need = default_min_length(binding) if min_length is None else min_length
    runs, cleaning = clean_runs(frame, binding, need, exclusions)
    split = split_runs(runs, binding, seed=seed)
    warnings = list(cleaning["warnings"]) + list(split.report["warnings"])
    tail = _live_tail(split.live, cleaning["latest_timestamp_s"], binding)
    return replace(split, report={**split.report, "warnings": warnings + tail.pop("warnings"), "cleaning": cleaning,
                                  **tail, "live_missing": newest_missing(frame, binding),
                                  "live_flagged": cleaning["newest_flagged"],
                                  "live_warming_up": warming_up(frame, binding, need) if tail["live_tail_dropped"]
                                  else None})


def with_live_run(split: HistorySplit, frame: pd.DataFrame, binding: BindingSpec,
                  min_length: int | None = None) -> HistorySplit | None:
    """`split` with its live run cleaned anew from `frame`, the live run's newest samples (validated,
    in time order, as from Ledger.recent_samples), as prepare_history cleans it (clean_newest_run: a
    run is cleaned on its own, the newest run's end kept): what a new sample changes of a split.
    The live report (report["live"], "live_behind_s", "live_tail_dropped", "live_missing", "live_flagged",
    "live_warming_up") is rebuilt; the train /
    val / test runs, the normalisation and the data hash are the split's. None when cleaning leaves
    no piece of the run long enough (then prepare the whole history: its live run is an older one)."""
    need = default_min_length(binding) if min_length is None else min_length
    runs, flagged = clean_newest_run(frame, binding, need)
    if not runs:
        return None
    live = max(runs, key=lambda r: (float(r.t[-1]), r.run_id))
    tail = _live_tail(live, float(frame["timestamp"].max()), binding)
    base = [w for w in split.report.get("warnings", []) if "newest samples were dropped" not in w]
    report = {**split.report, "warnings": base + tail.pop("warnings"), **tail,
              "live_missing": newest_missing(frame, binding), "live_flagged": flagged,
              "live_warming_up": warming_up(frame, binding, need) if tail["live_tail_dropped"] else None,
              "live": {"run_id": live.run_id, "start_s": float(live.t[0]), "end_s": float(live.t[-1]),
                       "samples": len(live)},
              "runs": {**split.report.get("runs", {}), "live": [live.run_id]}}
    return replace(split, live=live, report=report)


def newest_missing(frame: pd.DataFrame, binding: BindingSpec) -> list[str]:
    """The MV and CV tags whose value is missing (NaN: absent from the file, or refused by its source as
    bad) in the frame's newest sample: a plan must not start from a state it does not know."""
    if frame.empty:
        return []
    newest = frame.loc[frame["timestamp"].idxmax()]
    return [tag for tag in binding.mv_tags + binding.cv_tags if pd.isna(newest[tag])]


def warming_up(frame: pd.DataFrame, binding: BindingSpec, need: int) -> dict | None:
    """When the newest run's last piece (after a gap cleaning cuts it at) holds fewer samples after
    cleaning than the model's window `need`, it cannot be a live state yet (cleaning drops it):
    {"samples": how many, "needed": need, "since": the piece's first time (s)}; else None."""
    if frame.empty:
        return None
    newest = frame[frame["run_id"] == frame.loc[frame["timestamp"].idxmax(), "run_id"]].sort_values("timestamp")
    pieces, _ = clean_newest_run(newest, binding, 1)  # every piece, however short
    if not pieces:
        return None
    piece = max(pieces, key=lambda run: float(run.t[-1]))
    return {"samples": len(piece), "needed": int(need), "since": float(piece.t[0])} if len(piece) < need else None


def _live_tail(live: RunSeries | None, latest: float, binding: BindingSpec) -> dict:
    """live_behind_s (the newest sample's time minus the live run's end) and live_tail_dropped (more
    than half a period: grid snapping moves a sample by at most that, anything more is lost data),
    with the warning it gives."""
    behind = None if live is None else float(latest - live.t[-1])
    dropped = behind is not None and behind > binding.sample_period_s / 2
    warnings = [f"the live run {live.run_id!r} ends at {live.t[-1]:.3f} s but the history's latest sample is at "
                f"{latest:.3f} s: the newest samples were dropped in cleaning"] if dropped else []
    return {"live_behind_s": behind, "live_tail_dropped": dropped, "warnings": warnings}
