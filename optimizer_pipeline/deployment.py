"""The home's Dagster instance configuration (`<home>/dagster/dagster.yaml`) for each deployment shape.

Embedded default: SQLite storage under the home (its event log writing a batch of events in one
transaction per database: assets/compat.py `BatchedSqliteEventLogStorage`), runs in process. Several
hosts (`dagster.postgres_url`, `dagster.run_launcher: celery`): the instance's storage on PostgreSQL
(scheme `postgresql+psycopg2`: SQLAlchemy 2.1 maps a plain `postgresql://` URL to psycopg 3, with
which dagster-postgres' NOTIFY fails), runs queued for `dagster-daemon` and launched onto Celery
workers (dagster-celery's CeleryRunLauncher, Redis broker and result backend; fair dispatch:
prefetch 1, late acks; queued runs launched every second), run monitoring on (a run whose worker
died ends failed), no compute-log files (hosts share nothing but the servers). Telemetry and the
first-visit dialog are always off.
"""

import sys
from pathlib import Path
from typing import Any

import yaml

from optimizer_pipeline.settings import Settings

CODE_LOCATION = ("-m", "optimizer_pipeline.definitions")  # how the Dagster processes load this code location
WORKER_ENV = "OPTIMIZER_WORKER_NAME"  # set by `optimizer-pipeline worker`: where a run ran (ledger runs' context)
RUN_QUEUE = "dagster"  # the Celery queue of run tasks (a worker's default --queue)
# run monitoring: how often the daemon asks a run's worker for its health, and how long a run may
# take to start on a worker before it is failed
MONITOR_POLL_S = 5
MONITOR_START_TIMEOUT_S = 300
# how often the daemon launches queued runs (Dagster's default 5 s was most of a run's wait in the queue)
DEQUEUE_INTERVAL_S = 1


def dagster_yaml(settings: Settings, instance_dir: Path) -> str:
    """The dagster.yaml text for `settings` (written by the CLI before it starts Dagster) of the
    instance in `instance_dir` (the embedded home's event log names its directory: an instance is also
    opened from its directory alone, DagsterInstance.from_config, with no DAGSTER_HOME to read)."""
    doc: dict[str, Any] = {"telemetry": {"enabled": False}, "nux": {"enabled": False}}
    if settings.dagster_postgres_url:
        doc["storage"] = {"postgres": {"postgres_url": psycopg2_url(settings.dagster_postgres_url)}}
        doc["compute_logs"] = {"module": "dagster._core.storage.noop_compute_log_manager",
                               "class": "NoOpComputeLogManager"}
    else:
        doc["event_log_storage"] = {"module": "optimizer_pipeline.assets.compat",
                                    "class": "BatchedSqliteEventLogStorage",
                                    "config": {"base_dir": str(instance_dir)}}
    if settings.dagster_run_launcher == "celery":
        doc["run_launcher"] = {"module": "dagster_celery.launcher", "class": "CeleryRunLauncher", "config": {
            "broker": settings.dagster_broker, "backend": settings.dagster_broker, "default_queue": RUN_QUEUE,
            "config_source": celery_config(settings)}}
        doc["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator",
                                  "config": {"dequeue_interval_seconds": DEQUEUE_INTERVAL_S}}
        doc["run_monitoring"] = {"enabled": True, "poll_interval_seconds": MONITOR_POLL_S,
                                 "start_timeout_seconds": MONITOR_START_TIMEOUT_S, "max_resume_run_attempts": 0}
    return yaml.safe_dump(doc, sort_keys=False)


def psycopg2_url(url: str) -> str:
    """`postgresql://…` as `postgresql+psycopg2://…` (dagster-postgres' NOTIFY needs psycopg2)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg2://{rest}" if scheme in ("postgresql", "postgres") else url


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings shared by the launcher (daemon) and the workers: fair dispatch, so an idle
    worker takes the next run; results in Redis so run monitoring can ask a task's state."""
    return {"broker_url": settings.dagster_broker, "result_backend": settings.dagster_broker,
            "worker_prefetch_multiplier": 1, "task_acks_late": True, "task_track_started": True,
            "result_extended": True, "broker_connection_retry_on_startup": True}


CELERY_CONFIG_MODULE = "dagster_celery_config"  # the module dagster_celery.app imports when it exists


def write_celery_config(dagster_dir: Path, settings: Settings) -> Path:
    """Write `<dagster_dir>/celery/dagster_celery_config.py` (what a worker's Celery app reads) and
    return its folder, for the worker's PYTHONPATH."""
    folder = Path(dagster_dir) / "celery"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} = {value!r}" for key, value in celery_config(settings).items()]
    (folder / f"{CELERY_CONFIG_MODULE}.py").write_text(
        "# written by optimizer-pipeline from the home's settings\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return folder


def broker_problem(url: str, timeout_s: float = 3.0) -> str | None:
    """Why the Redis broker at `url` cannot be reached (None when a TCP connection succeeds)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 6379), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def webserver_command(host: str, port: int) -> list[str]:
    """dagster-webserver for the code location, as `ui` runs it (beside the daemon)."""
    return [sys.executable, "-m", "dagster_webserver", *CODE_LOCATION, "-h", host, "-p", str(port)]


def daemon_command() -> list[str]:
    """dagster-daemon for the code location (queued runs, schedules, sensors, run monitoring)."""
    return [str(Path(sys.executable).with_name("dagster-daemon")), "run", *CODE_LOCATION]
