"""The Dagster side of the live service: its publications reported to the Dagster instance as runless
materializations of the `recommendation` asset's partition, with the same metadata and check
evaluation a run gives it (assets/recommendation.py, `recommendation_report`), so the asset page, its
checks, the Plots tab and the lineage show one history whichever loop solved.

The ledger keeps every publication; Dagster gets a binding's status change at once and otherwise at
most one publication per binding per `live.report_interval_s` (0: every one), the newest: 1000
bindings re-solved every minute are 1.4 M publications a day, more than an event log should hold.
The plan figure (a PNG in the metadata, most of a report's size, ~0.3 s of matplotlib) goes with a status
change only (against the binding's recommendation before, so a restart of the service does not draw
every binding again); the reports in between carry the tables and numbers.
Between two reports the asset page shows the last one reported (its metadata names its recommendation
and run; `optimizer-pipeline recommendation` and the ledger have the newest). The plan figure is drawn
for what is reported only, in background processes (plots.FigureQueue), so drawing takes no time
from the service's loop. Reporting runs on a thread of its own, so the loop never waits for the
instance either: a report that fails is logged and the next one goes on.
"""

import logging
import queue
import threading
import time
from typing import Sequence

from dagster import AssetCheckEvaluation, AssetKey, AssetMaterialization, DagsterEvent, DagsterEventType, DagsterInstance

from optimizer_pipeline import plots
from optimizer_pipeline.assets.batch import conditions_check, shown
from optimizer_pipeline.assets.recommendation import recommendation_report
from optimizer_pipeline.live import Published

log = logging.getLogger(__name__)

RECOMMENDATION = AssetKey("recommendation")
LIVE_JOB = "optimizer_live"  # the job name the check evaluations are filed under (no Dagster job runs them)


class DagsterReporter:
    """A live service's Reporter (optimizer_pipeline/live/service.py) for `instance`."""

    def __init__(self, instance: DagsterInstance, interval_s: float):
        self.instance, self.interval_s = instance, float(interval_s)
        self.reported = 0
        self._last: dict[str, float] = {}  # binding -> monotonic time last reported
        # binding -> the publications due, each with its figure or not: the newest only (a figure due for one
        # it replaces goes with it), or every one when the interval is 0
        self._pending: dict[str, list[tuple[Published, bool]]] = {}
        self._lock = threading.Lock()
        self._wake = queue.SimpleQueue()
        self._figures = plots.FigureQueue(plots.BACKGROUND_MIN_FIGURES)  # drawn in background processes
        self._thread = threading.Thread(target=self._run, name="live-report", daemon=True)
        self._thread.start()

    def report(self, published: Sequence[Published]) -> None:
        """Keep each binding's newest publication that is due (status changed, or interval passed)."""
        now = time.monotonic()
        with self._lock:
            for item in published:
                binding_id = item.served.binding_id
                last = self._last.get(binding_id)
                if item.status_changed or last is None or now - last >= self.interval_s:
                    due = self._pending.setdefault(binding_id, [])
                    if self.interval_s > 0 and due:
                        figure = item.status_changed or due[-1][1]
                        due[-1] = (item, figure)
                    else:
                        due.append((item, item.status_changed))
                    self._last[binding_id] = now
        self._wake.put(True)

    def close(self, timeout_s: float = 30.0) -> None:
        """Report what is pending, then stop the thread and the figure processes."""
        self._wake.put(None)
        self._thread.join(timeout_s)
        self._figures.__exit__(None, None, None)

    def _run(self) -> None:
        while True:
            more = self._wake.get()
            with self._lock:
                batch, self._pending = [due for each in self._pending.values() for due in each], {}
            described = [(item, self._describe(item, figure)) for item, figure in batch]  # figures queued at once
            for item, (metadata, check) in described:
                try:
                    self._report_one(item, metadata, check)
                except Exception as exc:  # noqa: BLE001 - a view of what the ledger holds; the loop goes on
                    log.warning("binding %s: report to Dagster failed: %s", item.served.binding_id, exc)
            if more is None:
                return

    def _describe(self, item: Published, figure: bool):
        served, solved = item.served, item.solved
        metadata, check_metadata = recommendation_report(
            served.stored.spec, item.split, served.artifact, served.calibration, solved.decision.recommendation,
            solved.decision.conditions, solved.result, solved.decision.chosen, self._figures if figure else None,
            extra={"published_by": "live service", "latency_ms": round(item.latency_s * 1000, 1),
                   "ledger": f"whole: run {item.run_id}" if item.whole else
                   f"summarised (status, reasons, advice in live_publications): follows run {item.run_id}"})
        return metadata, conditions_check("recommendation", served.binding_id, solved.decision.conditions,
                                          check_metadata)

    def _report_one(self, item: Published, metadata: dict, check) -> None:
        served = item.served
        metadata = shown(metadata)  # waits for the figure
        self.instance.report_runless_asset_event(
            AssetMaterialization(asset_key=RECOMMENDATION, partition=served.binding_id, metadata=metadata))
        # Not report_runless_asset_event: Dagster files a runless check evaluation under run id "" and its
        # unique index (asset key, check, run id, partition) refuses the second one of a partition
        # (dagster 1.13 sql_event_log._store_runless_asset_check_evaluation). Filed under the service's id
        # as its run id instead: Dagster updates the partition's execution row of that run in place (the
        # check shows the newest evaluation; the event log keeps each), and the SQLite event log keeps one
        # file per run id, so one id per service (a run id per publication: ~125 kB and 0.3 s a report,
        # bench/bench_live_eventlog.py).
        evaluation = AssetCheckEvaluation(
            asset_key=RECOMMENDATION, check_name=check.name, passed=check.passed, metadata=dict(check.metadata),
            severity=check.severity, partition=served.binding_id)
        self.instance.report_dagster_event(
            DagsterEvent(event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION.value,
                         event_specific_data=evaluation, job_name=LIVE_JOB), run_id=item.service_id)
        self.reported += 1
