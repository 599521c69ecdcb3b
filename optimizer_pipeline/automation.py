"""Jobs, the recalibration schedule and the sensors of the pipeline (Dagster layer)."""

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from dagster import (
    AssetSelection,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    schedule,
    sensor,
)

from optimizer_pipeline.assets.outcomes import OUTCOMES_GROUP
from optimizer_pipeline.assets.overview import overview_materialization
from optimizer_pipeline.assets.partitions import BINDINGS, CALIBRATION_GROUP, RECOMMENDATION_GROUP
from optimizer_pipeline.contracts import utc_now
from optimizer_pipeline.deployment import CODE_LOCATION
from optimizer_pipeline.ledger import LedgerBusyError
from optimizer_pipeline.outcomes import drift_finding
from optimizer_pipeline.recommendation_text import duration
from optimizer_pipeline.launch import prepare_dagster_home, require_broker
from optimizer_pipeline.settings import Settings, load_settings
from optimizer_pipeline.assets.compat import job_submitter, range_tags
from optimizer_pipeline.resources.ledger import LedgerResource, SettingsResource


def partition_ranges(ordered_keys: Sequence[str], wanted: Sequence[str]) -> list[tuple[str, str]]:
    """The maximal stretches (first, last) of `wanted` in the instance's order of the binding
    partitions: one run covers one stretch (a dynamic partition range is a stretch of that order)."""
    wanted_set = set(wanted)
    ranges, start, last = [], None, None
    for key in ordered_keys:
        if key in wanted_set:
            start, last = start or key, key
        elif start is not None:
            ranges.append((start, last))
            start = None
    if start is not None:
        ranges.append((start, last))
    return ranges


recalibrate_job = define_asset_job(
    "recalibrate", selection=AssetSelection.groups(CALIBRATION_GROUP),
    description="History -> model artifact -> UQ block scores -> calibration, for the run's binding partitions.")
# plant_history is re-read so that a solve starts from the newest live sample, not the one of the
# last calibration; the model and its calibration are reused
solve_job = define_asset_job(
    "solve", selection=AssetSelection.groups(RECOMMENDATION_GROUP) | AssetSelection.assets("plant_history"),
    description="Re-read the history, then compile, solve, verify and publish the recommendation of each binding "
                "partition of the run with the current model and calibration.")
refresh_job = define_asset_job(
    "refresh", selection=AssetSelection.groups(CALIBRATION_GROUP, RECOMMENDATION_GROUP),
    description="Recalibrate and re-solve the run's binding partitions (one, or a range in one run).")
outcomes_job = define_asset_job(
    "outcomes", selection=AssetSelection.groups(OUTCOMES_GROUP),
    description="Judge the observations recorded after applying the binding's recommendations.")


SOLVED = "solved"  # binding_changes' cursor mark of a revision with a recommendation


def binding_changes_sensor():
    """Fires on a new binding or a new revision of one (cursor: binding -> [revision, SOLVED] once the
    revision has a recommendation, else [revision, the number of runs stored when its refresh was
    requested]; the runs are counted only while some revision waits for its recommendation).

    A new binding adds its partition; a new or changed revision without a recommendation yet
    requests `refresh` for that partition with run key `<binding>@r<revision>`, so one change
    gives exactly one run. No change, no request. A binding that a queued or running `refresh`
    already covers (e.g. one `materialize` submitted) is left to it, and looked at again next tick.
    A revision still without a recommendation once its refresh ran (it failed: e.g. too few runs
    for a split, or for val / test evidence) is refreshed again when the history holds a new run (runs,
    not rows, are what the split and the evidence count: more samples of the same run would fail
    the same way at every export), run key `<binding>@r<revision>@n<runs>`, and once more after an
    upgrade from a cursor that did not count runs: new_samples re-solves only bindings with a
    recommendation of their current revision.
    """

    @sensor(name="binding_changes", job=refresh_job, minimum_interval_seconds=15,
            default_status=DefaultSensorStatus.RUNNING)
    def binding_changes(context: SensorEvaluationContext, ledger: LedgerResource):
        seen = json.loads(context.cursor) if context.cursor else {}
        store = ledger.ledger()
        stored = store.list_bindings()
        known = set(context.instance.get_dynamic_partitions(BINDINGS.name))
        new_keys = [b.spec.id for b in stored if b.spec.id not in known]
        requests, busy = [], in_flight(context.instance, refresh_job.name)
        run_counts = None  # read once a revision still waits for its recommendation
        for b in stored:
            mark = seen.get(b.spec.id)
            revision, runs_seen = mark if isinstance(mark, list) else (mark, None)  # an int: before runs were counted
            again = revision == b.revision  # its refresh was requested: again only with a new run
            if again and runs_seen == SOLVED:
                continue
            if b.spec.id in busy:
                continue  # a refresh of it is queued or running; not marked seen: looked at again
            latest = store.latest_recommendation(b.spec.id)
            if latest is not None and latest.binding_revision == b.revision:
                seen[b.spec.id] = [b.revision, SOLVED]
                continue  # solved for this revision (by its refresh, or e.g. by the CLI)
            run_counts = store.run_counts() if run_counts is None else run_counts
            runs = run_counts.get(b.spec.id, 0)
            if again and runs_seen is not None and runs <= runs_seen:
                continue
            seen[b.spec.id] = [b.revision, runs]
            key, why = f"{b.spec.id}@r{b.revision}", f"binding {b.spec.id} at revision {b.revision}"
            if again:
                key, why = f"{key}@n{runs}", f"{why} has no recommendation; the history now holds {runs} run(s)"
            requests.append(RunRequest(partition_key=b.spec.id, run_key=key, tags={"optimizer/reason": why}))
        cursor = json.dumps(seen, sort_keys=True)
        if not requests and not new_keys:
            return SensorResult(skip_reason=SkipReason("no binding changed"), cursor=cursor)
        return SensorResult(run_requests=requests, cursor=cursor,
                            dynamic_partitions_requests=[BINDINGS.build_add_request(new_keys)] if new_keys else [])

    return binding_changes


def new_samples_sensor():
    """Fires when a binding's newest stored sample is newer than the live state its latest
    recommendation was solved from (new history from `ingest` or the inbox), or the binding was
    recalibrated since (re_solve_requests): requests `solve` for that partition, so the open
    recommendation starts from recent data and its newest calibration. One run per binding at a
    time (none while a `solve` of it is queued or running), and one per newest sample time (run key
    `<binding>@t<newest>`): a burst of files before a tick gives one re-solve. Bindings without a
    recommendation are left to binding_changes."""

    @sensor(name="new_samples", job=solve_job, minimum_interval_seconds=15, default_status=DefaultSensorStatus.RUNNING)
    def new_samples(context: SensorEvaluationContext, ledger: LedgerResource):
        return (re_solve_requests(context, ledger.ledger())
                or SkipReason("no binding has samples newer than its recommendation's live state, nor a newer "
                              "calibration"))

    return new_samples


def re_solve_requests(context: SensorEvaluationContext, store, only: set[str] | None = None) -> list[RunRequest]:
    """`solve` requests for the bindings (all, or those in `only`) whose newest stored sample is newer
    than the live state of their latest recommendation (run key `<binding>@t<newest>`), or whose
    newest calibration of the binding's revision is not the one that recommendation was solved with
    (a recalibration ends with a re-solve, whichever way it ran: the `recalibrate` job, a partial
    materialization in the UI; run key `<binding>@<calibration id>`): none while a solve or refresh of
    the binding is queued or running, none without a recommendation of the binding's current
    revision (binding_changes refreshes a new revision), and none while a live service serves it
    (it re-solves new samples and recalibrations itself: one re-solve per sample batch)."""

    known = set(context.instance.get_dynamic_partitions(BINDINGS.name))
    busy = in_flight(context.instance, solve_job.name) | in_flight(context.instance, refresh_job.name)
    live = served_live(store)
    requests, stored = [], {b.spec.id: b for b in store.list_bindings()}
    for binding_id, newest in sorted(store.newest_samples().items()):
        if (only is not None and binding_id not in only) or live(binding_id):
            continue
        rec = store.latest_recommendation(binding_id)
        if (binding_id not in known or binding_id in busy or binding_id not in stored or rec is None
                or rec.binding_revision != stored[binding_id].revision):
            continue
        solved = store.get_run(rec.run_id).context
        # a live service's summarised publications follow that run: the newest of them is what was solved
        solved_from = max((float(t) for t in (solved.get("live_t"), store.live_published_up_to(
            binding_id, rec.binding_revision, solved.get("calibration_id"), rec.created_at))
            if t is not None), default=None)
        # the solve's live time is on the sample grid: a raw time up to half a period later is the same sample
        if solved_from is None or newest > float(solved_from) + stored[binding_id].spec.sample_period_s / 2:
            requests.append(RunRequest(partition_key=binding_id, run_key=f"{binding_id}@t{newest:.3f}",
                                       tags={"optimizer/reason": f"new samples of {binding_id} up to "
                                                                 f"t={newest:.3f}, solved from t={solved_from}"}))
            continue
        calibration = store.latest_calibration(binding_id, binding_revision=stored[binding_id].revision)
        if calibration is not None and calibration.id != solved.get("calibration_id"):
            requests.append(RunRequest(partition_key=binding_id, run_key=f"{binding_id}@{calibration.id}",
                                       tags={"optimizer/reason": f"{binding_id} recalibrated ({calibration.id}) "
                                                                 f"after its recommendation {rec.id} was solved"}))
    return requests


def served_live(store) -> Callable[[str], bool]:
    """Whether a live service serves a binding: holds its lease (renewed with its heartbeat; a dead
    service's lease expires after live.LEASE_S, and the sensors take its bindings over)."""
    leased = store.live_leases()
    return lambda binding_id: binding_id in leased


def history_inbox_sensor():
    """Ingests the history files a historian export dropped into `<home>/inbox/<binding_id>/`
    (optimizer_pipeline/inbox.py: the same code as `optimizer-pipeline ingest`); finished files
    only, each moved to done/ or, refused with its reason, to rejected/. The new samples then
    re-solve their binding in the same tick (the requests of new_samples, for the bindings whose
    files were ingested: one sensor interval less between a file and its recommendation than
    waiting for new_samples, which still catches samples ingested from the CLI)."""

    @sensor(name="history_inbox", job=solve_job, minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING)
    def history_inbox(context: SensorEvaluationContext, ledger: LedgerResource):
        from optimizer_pipeline.inbox import ingest_inbox_file, waiting_files

        files = waiting_files(Path(ledger.home))
        if not files:
            return SkipReason("no history file waiting in the inbox")
        store, results = ledger.ledger(), []
        try:
            live = served_live(store)  # a live service ingests its bindings' files itself
        except LedgerBusyError:  # then the files wait for the ledger below, whoever serves them
            live = lambda binding_id: False  # noqa: E731
        files = [path for path in files if not live(path.parent.name)]
        if not files:
            return SkipReason("the history files waiting in the inbox are a live service's")
        for path in files:
            results.append(ingest_inbox_file(store, path))
            if results[-1].waiting:
                break  # the ledger is busy: the files after it wait too
        for r in results:
            log = context.log.info if r.ingested else context.log.warning
            what = "ingested, " if r.ingested else ("" if r.waiting else "rejected: ")
            log(f"inbox {r.binding_id}/{r.file}: {what}{r.detail}")
        ingested, waiting = sum(r.ingested for r in results), sum(r.waiting for r in results)
        left = len(files) - len(results) + waiting
        counts = (f"inbox: {ingested} file(s) ingested, {len(results) - ingested - waiting} rejected"
                  + (f", {left} left in the inbox for the next tick" if left else ""))
        try:
            requests = re_solve_requests(context, store, {r.binding_id for r in results if r.ingested})
        except LedgerBusyError as exc:  # new_samples re-solves them once the ledger is free
            return SkipReason(f"{counts}; the ledger is busy ({str(exc).splitlines()[0]})")
        return requests or SkipReason(f"{counts}; nothing to re-solve (no recommendation yet, a solve in flight, or "
                                      f"no newer sample)")

    return history_inbox


def live_service_sensor():
    """Shows in the UI whether the live services are alive: a tick fails (red) while a service that
    has not stopped has a heartbeat older than HEARTBEAT_STALE_S (killed, or its host is gone: the
    sensors then re-solve its bindings themselves), and otherwise says which services serve what."""

    @sensor(name="live_service", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING)
    def live_service(context: SensorEvaluationContext, ledger: LedgerResource):
        from optimizer_pipeline.live import HEARTBEAT_STALE_S

        now = utc_now()
        services = [s for s in ledger.ledger().live_services() if s.state != "stopped"]
        stale = [s for s in services if (now.replace(tzinfo=None) - s.heartbeat_at).total_seconds() > HEARTBEAT_STALE_S]
        if stale:
            raise Exception("; ".join(f"live service {s.id} on {s.host} (pid {s.pid}) has not sent a heartbeat for "
                                      f"{(now.replace(tzinfo=None) - s.heartbeat_at).total_seconds():.0f} s: "
                                      f"its bindings are re-solved by the sensors" for s in stale))
        if not services:
            return SkipReason("no live service is running: the sensors re-solve new samples (a run each)")
        return SkipReason("; ".join(f"live service {s.id} on {s.host} (pid {s.pid}) {s.state}, serving "
                                    f"{'every binding' if s.bindings is None else ', '.join(s.bindings)}"
                                    for s in services))

    return live_service


def site_overview_sensor():
    """Materializes the site_overview asset (assets/overview.py) without a run whenever a binding's
    status, first reason or revision changed since its last report; a tick otherwise skips."""

    @sensor(name="site_overview", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING)
    def site_overview(context: SensorEvaluationContext, ledger: LedgerResource):
        from optimizer_pipeline.overview import counts, overview_lines

        now = utc_now()
        lines = overview_lines(ledger.ledger().site_overview(), now)
        state = json.dumps([[line.binding_id, line.revision, line.status, line.reason] for line in lines])
        if state == context.cursor:
            return SkipReason(f"no status changed since the last report ({counts(lines)})")
        return SensorResult(asset_events=[overview_materialization(lines, now)], cursor=state)

    return site_overview


def in_flight(instance, job_name: str) -> set[str]:
    """The binding partitions covered by queued or running runs of `job_name` (one partition or a range)."""
    from dagster import DagsterRunStatus, RunsFilter

    from optimizer_pipeline.assets.compat import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    active = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
              DagsterRunStatus.STARTED]
    runs = instance.get_runs(filters=RunsFilter(job_name=job_name, statuses=active))
    if not runs:
        return set()
    ordered = instance.get_dynamic_partitions(BINDINGS.name)
    covered = set()
    for run in runs:
        first, last = run.tags.get(ASSET_PARTITION_RANGE_START_TAG), run.tags.get(ASSET_PARTITION_RANGE_END_TAG)
        if first in ordered and last in ordered:
            covered.update(ordered[ordered.index(first):ordered.index(last) + 1])
        elif run.tags.get("dagster/partition"):
            covered.add(run.tags["dagster/partition"])
    return covered


def uq_freshness_sensor():
    """Fires when a binding's newest calibration is older than `uq.fresh_days`; requests `refresh`
    (recalibrate, then re-solve: a new calibration is never left without the plan it supports) for
    that partition, once per stale calibration: the cursor (binding -> stale
    calibration id already requested) keeps the next ticks quiet, and the run key
    `<binding>@<calibration id>` lets Dagster drop a repeat if the cursor is lost."""

    @sensor(name="uq_freshness", job=refresh_job, minimum_interval_seconds=300,
            default_status=DefaultSensorStatus.RUNNING)
    def uq_freshness(context: SensorEvaluationContext, ledger: LedgerResource, settings: SettingsResource):
        fresh_for = timedelta(days=settings.get().uq_fresh_days)
        now = utc_now()
        requested = json.loads(context.cursor) if context.cursor else {}
        known = set(context.instance.get_dynamic_partitions(BINDINGS.name))
        requests, pending = [], {}
        for calibration in ledger.ledger().latest_calibrations():
            binding_id = calibration.binding_id
            age = now - calibration.calibrated_at
            if binding_id not in known or age <= fresh_for:
                continue
            pending[binding_id] = calibration.id
            if requested.get(binding_id) == calibration.id:
                continue  # requested by an earlier tick
            requests.append(RunRequest(partition_key=binding_id, run_key=f"{binding_id}@{calibration.id}",
                                       tags={"optimizer/reason": f"calibration {calibration.id} is "
                                             f"{duration(age.total_seconds())} old"}))
        cursor = json.dumps(pending, sort_keys=True)
        if not requests:
            reason = (f"stale calibration(s) of {', '.join(sorted(pending))} already requested" if pending
                      else "every calibration is fresh")
            return SensorResult(skip_reason=SkipReason(reason), cursor=cursor)
        return SensorResult(run_requests=requests, cursor=cursor)

    return uq_freshness


def outcome_drift_sensor():
    """Fires when the recent outcomes of a binding (under its current calibration) show deviation:
    `deviated` in >= 2 of the last 3 conclusive verdicts, or a band-hit rate significantly below the
    promised one (outcomes.drift_finding). Requests `refresh` (recalibrate, then re-solve) for that
    partition, once per triggering outcome (run key `<binding>@<outcome id>`), with the reason in the run's tags."""

    @sensor(name="outcome_drift", job=refresh_job, minimum_interval_seconds=60,
            default_status=DefaultSensorStatus.RUNNING)
    def outcome_drift(context: SensorEvaluationContext, ledger: LedgerResource):
        store = ledger.ledger()
        requests = []
        for binding_id in context.instance.get_dynamic_partitions(BINDINGS.name):
            calibration = store.latest_calibration(binding_id)
            finding = drift_finding(binding_id, store.list_verdicts(binding_id),
                                    None if calibration is None else calibration.calibrated_at)
            if finding is None:
                continue
            context.log.info(f"outcome_drift: requesting refresh of {binding_id}: {finding.reason}")
            requests.append(RunRequest(partition_key=binding_id, run_key=f"{binding_id}@{finding.outcome_id}",
                                       tags={"optimizer/reason": finding.reason}))
        return requests or SkipReason("no binding's recent outcomes deviate")

    return outcome_drift


def recommendation_expiry_sensor():
    """Records in the ledger the expiry of every open recommendation past its `valid_until`."""

    @sensor(name="recommendation_expiry", minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
    def recommendation_expiry(context: SensorEvaluationContext, ledger: LedgerResource):
        expired = ledger.ledger().expire_past_valid_until()
        return SkipReason(f"expired {expired} recommendation(s) past valid_until")

    return recommendation_expiry


def recalibration_schedule(settings: Settings):
    """Daily recalibration of every binding partition, ending with the re-solve it supports (job
    `refresh`; cron and time zone from the settings): one run over the whole partition range, not
    one run per binding."""

    @schedule(name="daily_recalibration", job=refresh_job, cron_schedule=settings.schedule_cron,
              execution_timezone=settings.schedule_timezone, default_status=DefaultScheduleStatus.RUNNING)
    def daily_recalibration(context: ScheduleEvaluationContext):
        keys = context.instance.get_dynamic_partitions(BINDINGS.name)
        if not keys:
            return SkipReason("no binding partitions yet")
        stamp = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
        return RunRequest(run_key=f"all@{stamp}", tags=range_tags(keys[0], keys[-1]))

    return daily_recalibration


# ---------------------------------------------------------------------------- runs launched through the instance

TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")
CELERY_TASK_ID_TAG = "dagster-celery/task_id"  # the run tag dagster-celery's launcher sets
RUN_WAIT_S = 3600.0  # how long `materialize` waits for submitted runs


def chunks(ordered_keys: Sequence[str], wanted: Sequence[str], per_run: int) -> list[list[str]]:
    """The wanted partitions in runs of at most `per_run`, each a stretch of the instance's order."""
    out = []
    for first, last in partition_ranges(ordered_keys, wanted):
        stretch = list(ordered_keys[ordered_keys.index(first):ordered_keys.index(last) + 1])
        out += [stretch[i:i + per_run] for i in range(0, len(stretch), per_run)]
    return out


class BindingRun(NamedTuple):
    """How one binding fared in a CLI-launched run: ok, or the stage and reason it failed."""

    binding_id: str
    ok: bool
    dagster_run_id: str
    detail: str  # "" when ok, else "<stage>: <reason>"


def registered_partitions(instance: Any, binding_ids: Sequence[str]) -> list[str]:
    """The instance's binding partitions in its order, those of `binding_ids` it lacked added first."""
    known = set(instance.get_dynamic_partitions(BINDINGS.name))
    missing = [b for b in binding_ids if b not in known]
    if missing:
        instance.add_dynamic_partitions(BINDINGS.name, missing)
    return instance.get_dynamic_partitions(BINDINGS.name)


def binding_runs(ledger, run_id: str, keys: Sequence[str], run_error: str) -> list[BindingRun]:
    """How each binding of run `run_id` fared: the stage and reason the ledger recorded for it; without
    any binding's failure, `run_error` for all of them ("" when the run succeeded)."""
    failed = {f.binding_id: f"{f.stage}: {f.message}" for f in ledger.list_failures(dagster_run_id=run_id)}
    detail = {key: failed.get(key, "" if failed else run_error) for key in keys}
    return [BindingRun(key, not detail[key], run_id, detail[key]) for key in keys]


def submit_and_wait(home, ledger, binding_ids: Sequence[str], job_name: str, per_run: int,
                    wait: bool = True) -> list[BindingRun]:
    """Submit `job_name` over the bindings in runs of at most `per_run` partitions to the home's
    instance (queued; the daemon launches them onto Celery workers), all from this process through
    one code server (`assets.compat.job_submitter`); then, with `wait`, poll until every run ended.
    Returns how each binding fared, the detail from the ledger's failures."""
    from dagster import DagsterRunStatus

    with DagsterInstance.get() as instance:
        ordered = registered_partitions(instance, binding_ids)
        runs = {str(uuid.uuid4()): keys for keys in chunks(ordered, binding_ids, per_run)}
        with job_submitter(instance, CODE_LOCATION[-1], job_name) as submit:
            for run_id, keys in runs.items():
                submit(run_id, {"optimizer/launched_by": "cli", **range_tags(keys[0], keys[-1])})
        if not wait:
            return [BindingRun(b, True, run_id, "") for run_id, keys in runs.items() for b in keys if b in binding_ids]
        deadline, pending = time.monotonic() + RUN_WAIT_S, set(runs)
        while pending and time.monotonic() < deadline:
            for run_id in list(pending):
                run = instance.get_run_by_id(run_id)
                if run is not None and run.status.value in TERMINAL:
                    pending.discard(run_id)
            time.sleep(0.5)
        results = {}
        for run_id, keys in runs.items():
            run = instance.get_run_by_id(run_id)
            status = run.status if run is not None else None
            run_error = "" if status == DagsterRunStatus.SUCCESS else \
                f"run {run_id} ended {status.value if status else 'unknown'}"
            results.update((r.binding_id, r) for r in binding_runs(ledger, run_id, keys, run_error))
    return [results[b] for b in binding_ids]


def fail_runs_of_dead_worker(broker: str, name: str, code: int) -> list[str]:
    """The Celery worker `name` died under its `optimizer-pipeline worker` (killed, crashed): its Celery
    task stays STARTED forever, so nothing else would end its run. Report every run it was executing
    as failed, so Dagster shows it and the next refresh can run the bindings; the ledger holds no
    partial write of it (one transaction per binding), and the failure says which worker died.
    Returns the runs reported."""
    from celery import Celery
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    app = Celery(broker=broker, backend=broker)
    reported = []
    with DagsterInstance.get() as instance:
        for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED])):
            task_id = run.tags.get(CELERY_TASK_ID_TAG)
            info = app.AsyncResult(task_id).info if task_id else None
            if isinstance(info, dict) and str(info.get("hostname", "")).startswith(f"{name}@"):
                instance.report_run_failed(run, message=f"Celery worker {info['hostname']} died (exit code {code}) "
                                                        f"while running this run")
                reported.append(run.run_id)
    return reported


# ------------------------------------------------------------------ runs launched by the CLI

# Dagster's console logger silenced: the CLI prints its own summary or one error line; the full
# log, tracebacks included, is in the run's event log (UI).
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def run_partitions(home: Path, binding_ids: Sequence[str], job_name: str = "refresh",
                   wait: bool = True) -> list[BindingRun]:
    """Run a job over the given binding partitions. Embedded default: in process on the home's
    instance, one run per stretch of them in the instance's partition order (all of them: one run).
    With `dagster.run_launcher: celery`: runs of at most `dagster.max_partitions_per_run` bindings
    submitted to the instance (the daemon launches them onto Celery workers), waited for unless
    `wait` is False. A binding that failed is named with its stage and reason from the ledger."""
    prepare_dagster_home(home)
    from optimizer_pipeline.definitions import build_definitions  # it imports this module
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.solver.shared import kept_alive

    settings = load_settings(home)
    if settings.dagster_run_launcher == "celery":
        require_broker(settings)
        return submit_and_wait(home, open_ledger(home, settings), binding_ids, job_name,
                               settings.dagster_max_partitions_per_run, wait)
    ledger = open_ledger(home)
    results = {}
    with DagsterInstance.get() as instance, kept_alive():
        # resolved inside the instance's scope: Dagster reads the definitions' state from the
        # instance that is current while it builds the repository
        job = build_definitions(home).resolve_job_def(job_name)
        ordered = registered_partitions(instance, binding_ids)
        for first, last in partition_ranges(ordered, binding_ids):
            partition = {"partition_key": first} if first == last else {}
            result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET_RUN_CONFIG,
                                            tags={"optimizer/launched_by": "cli",
                                                  **({} if partition else range_tags(first, last))}, **partition)
            keys = ordered[ordered.index(first):ordered.index(last) + 1]
            run_error = "" if result.success else _failure(result)
            results.update((r.binding_id, r) for r in binding_runs(ledger, result.run_id, keys, run_error))
    return [results[b] for b in binding_ids]


def _failure(result: Any) -> str:
    """The reason a run failed outside any binding's stages (e.g. a resource that could not start)."""
    for event in result.all_events:
        if event.is_step_failure:
            error = event.step_failure_data.error
            while error.cause is not None and error.cls_name.startswith("Dagster"):
                error = error.cause
            message = error.message.strip().splitlines()[0]
            prefix = f"{error.cls_name}: "
            if prefix in message:  # "package.module.HistoryError: text" -> "text"
                message = message.split(prefix, 1)[1]
            return f"step {event.step_key} failed: {message}"
    return "run failed"
