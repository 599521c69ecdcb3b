"""One binding as the live service keeps it warm: its stored spec, model, calibration, the split the
model was calibrated on, the settled evidence of that calibration, the judged outcomes, and the live
run's newest raw samples (the live window), plus what it does per new sample: re-solve and decide.

Everything but the live window is read from the ledger (and what depends on it only computed: the
settled evidence, the local refit's train regression) once per change of the binding's model
`Fingerprint` (a new revision, artifact, calibration, split or verdict), never per sample: a new
sample changes the current state only (data.with_live_run), and a re-solve goes through the same
`pipeline.solve_and_decide` as a Dagster solve.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import pandas as pd

from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import (
    Calibration,
    EvidenceSource,
    HistorySplit,
    ModelArtifact,
    ProblemIR,
    SolveResult,
    StoredBinding,
)
from optimizer_pipeline.data.prepare import default_min_length
from optimizer_pipeline.ledger import Ledger, Publication, VerdictRecord
from optimizer_pipeline.ledger.live_rows import Fingerprint
from optimizer_pipeline.model.artifact import local_fitter
from optimizer_pipeline.model.window import held_window
from optimizer_pipeline.model.local import LOCAL, LocalFitter, steady_procedure
from optimizer_pipeline.settings import Settings

# Raw samples of the live run kept per binding, at least: the live state is cleaned from them. The
# model's own need (its lags + the held disturbance's window + the outlier filter's half window) is
# added on top, so a run no longer than this is cleaned whole, as a Dagster solve cleans it.
LIVE_WINDOW_ROWS = 2000


def window_rows(artifact: ModelArtifact, binding_min_length: int) -> int:
    """The live window's length for this model (see LIVE_WINDOW_ROWS)."""
    need = binding_min_length + held_window(artifact) + 8
    return max(LIVE_WINDOW_ROWS, need)


@dataclass
class Served:
    """A binding the service re-solves: its model inputs (read per Fingerprint) and its live window."""

    stored: StoredBinding
    fingerprint: Fingerprint
    artifact: ModelArtifact
    calibration: Calibration
    split: HistorySplit
    settled: pipeline.Settled
    fitter: LocalFitter | None  # the local refit's train regression (an artifact whose steady procedure is local)
    outcomes: list[VerdictRecord]
    source: str
    window: pd.DataFrame  # raw samples of the live run, time order: run_id, timestamp, tags
    rows: int  # the window's length bound
    solved_t: float | None = None  # the newest sample time it was last solved from
    _newest: float | None = field(default=None, repr=False, compare=False)
    _newest_of: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def binding_id(self) -> str:
        return self.stored.spec.id

    @property
    def newest_t(self) -> float | None:
        # read once per window (a new frame each time it changes): the loop asks every binding each wake-up
        if self._newest_of is not self.window:
            self._newest = None if self.window.empty else float(self.window["timestamp"].iloc[-1])
            self._newest_of = self.window
        return self._newest

    def wants_solve(self) -> bool:
        """Samples newer than the last solve's (or no solve yet); a solve's live time is on the sample
        grid, so a raw time up to half a period later is the same sample (as the new_samples sensor
        judges it)."""
        newest = self.newest_t
        return newest is not None and (self.solved_t is None or
                                       newest > self.solved_t + self.stored.spec.sample_period_s / 2)

    def add(self, frames: list[pd.DataFrame]) -> int:
        """Put samples just stored (validated frames, as a source stored them) into the window; returns
        how many rows were added. A frame of a newer run starts the window anew (the live run now); rows
        of an older run, or not after the window's newest, are left out (a re-sent file adds nothing)."""
        added = 0
        for frame in frames:
            frame = frame.sort_values("timestamp", kind="stable")
            current = None if self.window.empty else self.window["run_id"].iloc[-1]
            newest_run = frame.loc[frame["timestamp"].idxmax(), "run_id"]
            newest = self.newest_t
            if newest_run != current and (newest is None or float(frame["timestamp"].max()) > newest):
                self.window = frame[frame["run_id"] == newest_run].tail(self.rows).reset_index(drop=True)
                added += len(self.window)
                continue
            fresh = frame[(frame["run_id"] == current) & (frame["timestamp"] > newest)]
            if len(fresh):
                self.window = pd.concat([self.window, fresh], ignore_index=True).tail(self.rows).reset_index(drop=True)
                added += len(fresh)
        return added

    def extend(self, ledger: Ledger) -> int:
        """Read the samples stored after the window's newest into it (`add`; of a newer run, that run's
        newest stored samples: it is the live run now); returns how many rows were added."""
        spec = self.stored.spec
        fresh = ledger.recent_samples(spec.id, spec.tags, after_ts=self.newest_t)
        if fresh.empty:
            return 0
        newest_run = fresh.loc[fresh["timestamp"].idxmax(), "run_id"]
        if self.window.empty or newest_run != self.window["run_id"].iloc[-1]:
            fresh = ledger.recent_samples(spec.id, spec.tags, run_id=newest_run, rows=self.rows)
        return self.add([fresh])


def load(ledger: Ledger, binding_id: str, fingerprint: Fingerprint, settings: Settings, now: datetime) -> Served:
    """Read a binding's model inputs and live window from the ledger (MissingInputError when its
    revision has no split, artifact or calibration yet)."""
    stored = ledger.get_binding(binding_id)
    split = pipeline.load_split(ledger, stored)
    artifact = pipeline.load_artifact(ledger, stored)
    calibration = pipeline.load_calibration(ledger, artifact)
    settled = pipeline.settled_evidence(stored.spec, artifact, split, settings, now)
    fitter = local_fitter(artifact, pipeline.artifact_runs(artifact, split, "train")) \
        if steady_procedure(artifact) == LOCAL else None
    rows = window_rows(artifact, default_min_length(stored.spec))
    run = ledger.newest_run(binding_id)
    window = ledger.recent_samples(binding_id, stored.spec.tags, run_id=run, rows=rows)
    return Served(stored, fingerprint, artifact, calibration, split, settled, fitter, ledger.list_verdicts(binding_id),
                  ledger.sample_source(binding_id) or EvidenceSource.REAL.value, window, rows)


def resolve(served: Served, split: HistorySplit, solve: Callable[[ProblemIR], SolveResult], settings: Settings,
            now: datetime) -> tuple[Publication, pipeline.Solved]:
    """Re-solve the binding from `split`'s live state and decide (pipeline.solve_and_decide), ready to
    publish under its key (binding, revision, calibration, newest sample time: the window's newest the
    solve covers, `solved_t`, which is not the live state's time while the samples since a gap warm up),
    and the solve itself. Writes nothing."""
    solved = pipeline.solve_and_decide(served.stored.spec, served.stored, served.artifact, split, served.calibration,
                                       solve, settings, served.source, now, outcomes=served.outcomes,
                                       settled=served.settled, fitter=served.fitter)
    record = pipeline.solve_record(solved, served.artifact)
    publication = Publication(binding_id=served.binding_id, binding_revision=served.stored.revision,
                              calibration_id=served.calibration.calibration_id,
                              live_t=float(split.live.t[-1]) if served.solved_t is None else served.solved_t,
                              **record)
    return publication, solved
