"""Benchmark: the Dagster event log's growth per live-service report (issue 34), on SQLite (the
embedded default instance) and PostgreSQL (dagster-postgres on a throwaway server, tests/servers.py).

Usage:
    .venv/bin/python bench/bench_live_eventlog.py [--reports 300] [--metadata-bytes 3000]

A report is what assets/live_report.py writes for one publication without the plan figure: a runless
materialization of the `recommendation` partition (METADATA_BYTES of text metadata, the size of a
tanks report's tables and numbers) and its check evaluation, filed under one run id per service (as
the reporter does) or, for comparison, under a run id per publication (the SQLite event log keeps a
file per run id). Printed: bytes and seconds per report, and the growth per day at 1000 bindings
reported every `live.report_interval_s` (300 s: 288 reports a binding a day).
"""

import argparse
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _report(instance, reports: int, metadata_bytes: int, run_id_per_report: bool) -> float:
    from dagster import (AssetCheckEvaluation, AssetCheckSeverity, AssetKey, AssetMaterialization, DagsterEvent,
                         DagsterEventType)

    key, service = AssetKey("recommendation"), f"live-{uuid.uuid4().hex[:12]}"
    start = time.perf_counter()
    for i in range(reports):
        partition = f"tanks-{i % 100:04d}"
        instance.report_runless_asset_event(AssetMaterialization(
            asset_key=key, partition=partition, metadata={"status": "verified", "tables": "x" * metadata_bytes}))
        evaluation = AssetCheckEvaluation(asset_key=key, check_name="conditions", passed=True,
                                          metadata={"reason": "y" * 200}, severity=AssetCheckSeverity.WARN,
                                          partition=partition)
        instance.report_dagster_event(
            DagsterEvent(event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION.value,
                         event_specific_data=evaluation, job_name="optimizer_live"),
            run_id=f"or-{uuid.uuid4().hex[:20]}" if run_id_per_report else service)
    return (time.perf_counter() - start) / reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=300)
    parser.add_argument("--metadata-bytes", type=int, default=3000)
    args = parser.parse_args()
    from dagster import instance_for_test
    from optimizer_pipeline.deployment import psycopg2_url
    from servers import postgres_server

    day = 1000 * 24 * 3600 / 300
    for storage in ("sqlite", "postgres"):
        for per_report in (False, True):
            with ExitStack() as stack:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                overrides = None
                if storage == "postgres":
                    url = stack.enter_context(postgres_server()).new_database()
                    overrides = {"storage": {"postgres": {"postgres_url": psycopg2_url(url)}}}
                instance = stack.enter_context(instance_for_test(temp_dir=str(tmp), overrides=overrides))

                def size() -> int:
                    if storage == "sqlite":
                        return _du(tmp)
                    with instance.event_log_storage.index_connection() as conn:
                        return int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar())

                _report(instance, 5, args.metadata_bytes, per_report)  # tables and first pages made
                before = size()
                seconds = _report(instance, args.reports, args.metadata_bytes, per_report)
                per = (size() - before) / args.reports
            label = "a run id per report" if per_report else "one run id per service"
            print(f"{storage:8s} {label:23s}: {per / 1024:6.1f} kB and {seconds * 1000:5.0f} ms per report; "
                  f"{per * day / 1e9:5.1f} GB/day at 1000 bindings x 1 report / 300 s")


if __name__ == "__main__":
    main()
