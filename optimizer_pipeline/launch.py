"""Launching work for the command line (and benches): the home's Dagster instance, runs of a job over
binding partitions in process or submitted to a Celery deployment, and what each binding's run came to;
and a what-if solved outside Dagster with a solver pool of its own. Dagster and the pool are imported
inside the functions that start them: the CLI imports this module on start.
"""

import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from optimizer_pipeline.settings import dagster_home, load_settings

# Dagster's console logger silenced: the CLI prints its own summary or one error line; the full
# log, tracebacks included, is in the run's event log (UI).
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


WRITTEN_BY = "# written by optimizer-pipeline from the home's settings; edit settings.yaml, not this file\n"


def prepare_dagster_home(home: Path) -> Path:
    """`<home>/dagster` (or $DAGSTER_HOME) with its dagster.yaml written from the settings
    (optimizer_pipeline/deployment.py: telemetry off; PostgreSQL storage, Celery runs when set);
    a dagster.yaml the user wrote (without our first line) is left alone. Exported for Dagster."""
    from optimizer_pipeline.deployment import dagster_yaml

    path = dagster_home(home)
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists() or config.read_text(encoding="utf-8").startswith(WRITTEN_BY):
        config.write_text(WRITTEN_BY + dagster_yaml(load_settings(home)), encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(path)
    os.environ["OPTIMIZER_HOME"] = str(home)
    return path


class BindingRun(NamedTuple):
    """How one binding fared in a CLI-launched run: ok, or the stage and reason it failed."""

    binding_id: str
    ok: bool
    dagster_run_id: str
    detail: str  # "" when ok, else "<stage>: <reason>"


def run_partitions(home: Path, binding_ids: Sequence[str], job_name: str = "refresh",
                   wait: bool = True) -> list[BindingRun]:
    """Run a job over the given binding partitions. Embedded default: in process on the home's
    instance, one run per stretch of them in the instance's partition order (all of them: one run).
    With `dagster.run_launcher: celery`: runs of at most `dagster.max_partitions_per_run` bindings
    submitted to the instance (the daemon launches them onto Celery workers), waited for unless
    `wait` is False. A binding that failed is named with its stage and reason from the ledger."""
    prepare_dagster_home(home)
    from dagster import DagsterInstance

    from optimizer_pipeline.assets.compat import range_tags
    from optimizer_pipeline.automation import partition_ranges, submit_and_wait
    from optimizer_pipeline.definitions import build_definitions
    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.solver.shared import kept_alive

    settings = load_settings(home)
    if settings.dagster_run_launcher == "celery":
        require_broker(settings)
        return [BindingRun(*outcome) for outcome in submit_and_wait(
            home, open_ledger(home, settings), binding_ids, job_name, settings.dagster_max_partitions_per_run, wait)]
    ledger = open_ledger(home)
    results = {}
    with DagsterInstance.get() as instance, kept_alive():
        # resolved inside the instance's scope: Dagster reads the definitions' state from the
        # instance that is current while it builds the repository
        job = build_definitions(home).resolve_job_def(job_name)
        known = set(instance.get_dynamic_partitions("bindings"))
        missing = [b for b in binding_ids if b not in known]
        if missing:
            instance.add_dynamic_partitions("bindings", missing)
        ordered = instance.get_dynamic_partitions("bindings")
        for first, last in partition_ranges(ordered, binding_ids):
            partition = {"partition_key": first} if first == last else {}
            result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET_RUN_CONFIG,
                                            tags={"optimizer/launched_by": "cli",
                                                  **({} if partition else range_tags(first, last))}, **partition)
            failed = {f.binding_id: f"{f.stage}: {f.message}"
                      for f in ledger.list_failures(dagster_run_id=result.run_id)}
            run_error = "" if result.success or failed else _failure(result)
            for key in ordered[ordered.index(first):ordered.index(last) + 1]:
                detail = failed.get(key, run_error)
                results[key] = BindingRun(key, not detail, result.run_id, detail)
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


def require_broker(settings: Any) -> None:
    """UserError when the Celery deployment's broker cannot be reached."""
    from optimizer_pipeline.deployment import broker_problem
    from optimizer_pipeline.settings import redact_url

    problem = broker_problem(settings.dagster_broker)
    if problem is not None:
        raise UserError(f"broker {redact_url(settings.dagster_broker)} cannot be reached ({problem}); start Redis "
                        f"or correct dagster.broker")


def solve_whatif(ledger: Any, stored: Any, overrides: Sequence[Any], settings: Any, now: Any, *,
                 requested_by: str) -> Any:
    """`whatif.solve_whatif` outside Dagster (the CLI): the split plant_history last recorded, the
    revision's model artifact and calibration from the ledger (MissingInputError names what to run
    first), and a solver pool of one worker, the same worker process and protocol as every solve,
    stopped after. Returns the WhatIfSolve."""
    from optimizer_pipeline import pipeline, whatif
    from optimizer_pipeline.contracts import EvidenceSource, SolveResult
    from optimizer_pipeline.solver.shared import acquire  # the worker pool, started only here

    artifact = pipeline.load_artifact(ledger, stored)
    split, calibration = pipeline.load_split(ledger, stored), pipeline.load_calibration(ledger, artifact)
    source = ledger.sample_source(stored.spec.id) or EvidenceSource.REAL.value
    pool, owned = acquire(1, settings.solver_request_timeout_ms, settings.solver_threads,
                          settings.solver_cache_entries)
    try:
        return whatif.solve_whatif(stored, overrides, artifact, split, calibration,
                                   lambda problem: SolveResult.from_dict(pool.solve(problem)), ledger, settings,
                                   source, now, requested_by=requested_by)
    finally:
        if owned:
            pool.shutdown()
