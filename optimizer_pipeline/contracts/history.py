"""Plant history on the binding's sample grid: one run (RunSeries) and the runs of a binding split
for training (HistorySplit), engineering units; and a slice of it excluded by hand (Exclusion)."""

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from optimizer_pipeline.contracts.model import Normalisation


@dataclass(frozen=True, eq=False)
class RunSeries:
    """One run aligned to the binding's sample grid, engineering units.

    t: (n,) seconds since epoch; u: (n, n_mv); y: (n, n_cv); d: (n, n_dv) (n_dv may be 0).
    Row k holds the samples at t[k]; u[k] is the MV value held from t[k] to t[k+1].
    source_run: the history's run this series is a piece of, when cleaning split that run at a gap
    (data/clean.py); "" for a whole run.
    unmeasured: (n, n_cv) bool, the CV values cleaning filled in rather than measured: interpolated
    across a short gap of missing or flagged samples, or, at the newest run's end, held in place of
    missing values for the live state to predict (data/clean.py); None when every CV value was measured.
    """

    run_id: str
    t: np.ndarray
    u: np.ndarray
    y: np.ndarray
    d: np.ndarray
    source_run: str = ""
    unmeasured: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def first(self, n: int) -> "RunSeries":
        """The run's first n rows (n >= 1)."""
        unmeasured = None if self.unmeasured is None or not self.unmeasured[:n].any() else self.unmeasured[:n]
        return RunSeries(self.run_id, self.t[:n], self.u[:n], self.y[:n], self.d[:n], self.source_run, unmeasured)

    @property
    def newest_unmeasured(self) -> int:
        """How many of the run's last rows have a CV value cleaning filled in (the newest run's missing CV
        values held for the live state, data/clean.py): 0 when its newest row is measured."""
        if self.unmeasured is None:
            return 0
        measured = np.flatnonzero(~self.unmeasured.any(axis=1))
        return len(self) - 1 - int(measured[-1]) if measured.size else len(self)

    @property
    def plant_run(self) -> str:
        """The history's run this series comes from: the unit the split and the UQ run counts use (the
        pieces of one run are not independent of each other)."""
        return self.source_run or self.run_id


@dataclass(frozen=True, eq=False)
class HistorySplit:
    """Cleaned runs of one binding split by run (never by row); normalisation from train only.

    `live` is the run with the latest timestamp (excluded from train / val / test): its last row
    is "now". `report` lists every dropped / split run with its reason (shown in the UI).
    `data_hash` is a sha256 over the cleaned samples of every split (for the artifact).
    """

    train: tuple[RunSeries, ...]
    val: tuple[RunSeries, ...]
    test: tuple[RunSeries, ...]
    live: RunSeries | None
    normalisation: Normalisation
    report: Mapping[str, Any]
    data_hash: str


@dataclass(frozen=True)
class Exclusion:
    """A slice of a binding's history marked bad by hand (`optimizer-pipeline exclude`, the ledger's
    `exclusions`): samples with start_s <= t < end_s (seconds since the epoch) of `tags` (empty: every
    tag) count as missing in cleaning (data/flags.py)."""

    exclusion_id: str
    binding_id: str
    start_s: float
    end_s: float
    tags: tuple[str, ...]
    reason: str
