"""Jobs, the recalibration schedule and the sensors of the pipeline (Dagster layer)."""

import json
from datetime import timedelta
from typing import Sequence

from dagster import (
    AssetSelection,
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
from optimizer_pipeline.assets.partitions import BINDINGS, CALIBRATION_GROUP, RECOMMENDATION_GROUP
from optimizer_pipeline.contracts import parse_iso_utc, utc_now
from optimizer_pipeline.outcomes import drift_finding
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.assets.compat import range_tags
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


def binding_changes_sensor():
    """Fires on a new binding or a new revision of one (cursor: binding -> revision seen).

    A new binding adds its partition; a new or changed revision without a recommendation yet
    requests `refresh` for that partition with run key `<binding>@r<revision>`, so one change
    gives exactly one run. No change, no request.
    """

    @sensor(name="binding_changes", job=refresh_job, minimum_interval_seconds=15,
            default_status=DefaultSensorStatus.RUNNING)
    def binding_changes(context: SensorEvaluationContext, ledger: LedgerResource):
        seen = json.loads(context.cursor) if context.cursor else {}
        store = ledger.ledger()
        stored = store.list_bindings()
        known = set(context.instance.get_dynamic_partitions(BINDINGS.name))
        new_keys = [b.spec.id for b in stored if b.spec.id not in known]
        requests = []
        for b in stored:
            if seen.get(b.spec.id) == b.revision:
                continue
            latest = store.latest_recommendation(b.spec.id)
            if latest is not None and latest.binding_revision == b.revision:
                continue  # already solved for this revision (e.g. by the CLI)
            requests.append(RunRequest(partition_key=b.spec.id, run_key=f"{b.spec.id}@r{b.revision}",
                                       tags={"optimizer/reason": f"binding {b.spec.id} at revision {b.revision}"}))
        cursor = json.dumps({b.spec.id: b.revision for b in stored}, sort_keys=True)
        if not requests and not new_keys:
            return SensorResult(skip_reason=SkipReason("no binding changed"), cursor=cursor)
        return SensorResult(run_requests=requests, cursor=cursor,
                            dynamic_partitions_requests=[BINDINGS.build_add_request(new_keys)] if new_keys else [])

    return binding_changes


def uq_freshness_sensor():
    """Fires when a binding's newest calibration is older than `uq.fresh_days`; requests
    `recalibrate` for that partition, once per stale calibration: the cursor (binding -> stale
    calibration id already requested) keeps the next ticks quiet, and the run key
    `<binding>@<calibration id>` lets Dagster drop a repeat if the cursor is lost."""

    @sensor(name="uq_freshness", job=recalibrate_job, minimum_interval_seconds=300,
            default_status=DefaultSensorStatus.RUNNING)
    def uq_freshness(context: SensorEvaluationContext, ledger: LedgerResource, settings: SettingsResource):
        fresh_for = timedelta(days=settings.get().uq_fresh_days)
        now = utc_now()
        requested = json.loads(context.cursor) if context.cursor else {}
        known = set(context.instance.get_dynamic_partitions(BINDINGS.name))
        requests, pending = [], {}
        for calibration in ledger.ledger().latest_calibrations():
            binding_id = calibration.binding_id
            age = now - parse_iso_utc(calibration.calibrated_at)
            if binding_id not in known or age <= fresh_for:
                continue
            pending[binding_id] = calibration.id
            if requested.get(binding_id) == calibration.id:
                continue  # requested by an earlier tick
            requests.append(RunRequest(partition_key=binding_id, run_key=f"{binding_id}@{calibration.id}",
                                       tags={"optimizer/reason": f"calibration {calibration.id} is "
                                             f"{age.total_seconds() / 86400:.1f} days old"}))
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
    promised one (outcomes.drift_finding). Requests `recalibrate` for that partition, once per
    triggering outcome (run key `<binding>@<outcome id>`), with the reason in the run's tags."""

    @sensor(name="outcome_drift", job=recalibrate_job, minimum_interval_seconds=60,
            default_status=DefaultSensorStatus.RUNNING)
    def outcome_drift(context: SensorEvaluationContext, ledger: LedgerResource):
        store = ledger.ledger()
        requests = []
        for binding_id in context.instance.get_dynamic_partitions(BINDINGS.name):
            calibration = store.latest_calibration(binding_id)
            finding = drift_finding(binding_id, store.list_outcomes(binding_id),
                                    None if calibration is None else calibration.calibrated_at)
            if finding is None:
                continue
            context.log.info(f"outcome_drift: requesting recalibrate of {binding_id}: {finding.reason}")
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
    """Daily recalibration of every binding partition in one run (cron and time zone from the
    settings): one run over the whole partition range, not one run per binding."""

    @schedule(name="daily_recalibration", job=recalibrate_job, cron_schedule=settings.schedule_cron,
              execution_timezone=settings.schedule_timezone, default_status=DefaultScheduleStatus.RUNNING)
    def daily_recalibration(context: ScheduleEvaluationContext):
        keys = context.instance.get_dynamic_partitions(BINDINGS.name)
        if not keys:
            return SkipReason("no binding partitions yet")
        stamp = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
        return RunRequest(run_key=f"all@{stamp}", tags=range_tags(keys[0], keys[-1]))

    return daily_recalibration
