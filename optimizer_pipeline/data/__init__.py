"""Plant history: ingest and validation, cleaning onto the sample grid, and the run split.

Typical use: `prepare_history(read_history(path, binding), binding, seed)` -> HistorySplit.
"""

from dataclasses import replace

import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, HistorySplit
from optimizer_pipeline.data.clean import clean_runs
from optimizer_pipeline.data.ingest import HistoryError, read_history, validate_history_frame
from optimizer_pipeline.data.split import split_runs
from optimizer_pipeline.model.artifact import window_lag

__all__ = ["HistoryError", "read_history", "validate_history_frame", "clean_runs", "split_runs",
           "prepare_history", "default_min_length"]


def default_min_length(binding: BindingSpec) -> int:
    """One model window (samples): the largest ARX lag the binding's model may have + horizon P + 1."""
    return window_lag(binding) + binding.model.horizon + 1


def prepare_history(frame: pd.DataFrame, binding: BindingSpec, seed: int = 0,
                    min_length: int | None = None) -> HistorySplit:
    """Clean a validated history frame and split it; the cleaning report is report["cleaning"].

    report["warnings"] collects the cleaning and split warnings, plus one when the live run does not
    reach the history's latest sample (its newest samples were dropped in cleaning, so "now" is
    older than the file says); report["live_behind_s"] is that lag (0 up to grid snapping) and
    report["live_tail_dropped"] whether it happened (None / False without a live run).
    """
    runs, cleaning = clean_runs(frame, binding, default_min_length(binding) if min_length is None else min_length)
    split = split_runs(runs, binding, seed=seed)
    warnings = list(cleaning["warnings"]) + list(split.report["warnings"])
    latest = cleaning["latest_timestamp_s"]
    behind = None if split.live is None else float(latest - split.live.t[-1])
    # Grid snapping moves a sample by at most half a period; anything more is lost data.
    dropped = behind is not None and behind > binding.sample_period_s / 2
    if dropped:
        warnings.append(f"the live run {split.live.run_id!r} ends at {split.live.t[-1]:.3f} s but the history's "
                        f"latest sample is at {latest:.3f} s: the newest samples were dropped in cleaning")
    return replace(split, report={**split.report, "warnings": warnings, "cleaning": cleaning, "live_behind_s": behind,
                                  "live_tail_dropped": dropped})
