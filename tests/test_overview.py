"""The site overview (issue 35, point 3): every binding's latest status, its age and first reason,
worst first — read from the ledger in one query (both backends), printed by `optimizer-pipeline status`
and reported to Dagster by the site_overview sensor as a non-partitioned asset's materialization."""

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from dagster import AssetKey, SensorResult, SkipReason, build_sensor_context, instance_for_test

from ledger_helpers import candidates, recommendation, run_row
from optimizer_pipeline.contracts import RecommendationStatus
from optimizer_pipeline.definitions import build_definitions
from optimizer_pipeline.ledger import BindingOverview, Ledger, Publication, new_id
from optimizer_pipeline.overview import counts, overview_lines, overview_text
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.resources.ledger import LedgerResource
from optimizer_pipeline.resources.solver import InProcessSolverResource
from optimizer_pipeline.settings import ledger_path

from test_cli import cli

UNVERIFIED, VERIFIED = RecommendationStatus.UNVERIFIED, RecommendationStatus.VERIFIED
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


def _solve(ledger: Ledger, binding_id: str, status=VERIFIED, reasons=()) -> str:
    run = replace(run_row(binding_id), id=new_id("or"))
    rec = replace(recommendation(run.id, binding_id, status=status), reasons=tuple(reasons))
    ledger.record_solve(run, candidates(), "m" * 64, rec, run_status="succeeded", independent_cost=2.0,
                        diagnostics={}, evidence_source="simulation")
    return rec.id


def _site(ledger: Ledger) -> dict[str, str]:
    """tanks-1 unverified (two reasons), heater-1 verified then a failed stage, blend-1 without a
    recommendation, blend-econ-1 verified and then re-solved by a live service (summarised)."""
    for name in ("tanks", "heater", "blend", "blend-econ"):
        ledger.upsert_binding(get_plant(name).spec)
    ids = {"tanks-1": _solve(ledger, "tanks-1", UNVERIFIED, ["live state is 2 h old", "coverage 0.7 < 0.8"]),
           "heater-1": _solve(ledger, "heater-1")}
    ledger.record_failure("heater-1", 1, "model_artifact", "IdentificationError", "no run long enough", None)
    run = replace(run_row("blend-econ-1"), id=new_id("or"))
    first = recommendation(run.id, "blend-econ-1")
    publish = lambda rec, run, live_t, follows=None: ledger.publish_live("live-a", [Publication(  # noqa: E731
        "blend-econ-1", 1, "cal-1", live_t, run, candidates(), "m" * 64, rec, "succeeded", 2.0, {}, "simulation",
        follows)])
    publish(first, run, 100.0)
    later = replace(run_row("blend-econ-1"), id=new_id("or"))
    publish(recommendation(later.id, "blend-econ-1"), later, 110.0, follows=first.id)
    ids["blend-econ-1"] = first.id
    return ids


def test_site_overview_reads_every_bindings_latest_status_reason_failure_and_live_confirmation(any_ledger):
    ids = _site(any_ledger)
    rows = {row.binding_id: row for row in any_ledger.site_overview()}
    assert sorted(rows) == ["blend-1", "blend-econ-1", "heater-1", "tanks-1"]
    tanks, heater, blend, econ = rows["tanks-1"], rows["heater-1"], rows["blend-1"], rows["blend-econ-1"]
    assert (tanks.status, tanks.first_reason, tanks.recommendation_id, tanks.failure) == \
        ("unverified", "live state is 2 h old", ids["tanks-1"], None)
    assert (heater.status, heater.first_reason, heater.failure) == \
        ("verified", None, "model_artifact: no run long enough")
    assert (blend.status, blend.recommendation_id, blend.updated_at, blend.failure) == (None, None, None, None)
    created = any_ledger.get_recommendation(ids["blend-econ-1"]).created_at
    published = any_ledger.latest_live_publication("blend-econ-1").published_at.replace(tzinfo=timezone.utc)
    assert econ.recommendation_id == ids["blend-econ-1"] and econ.updated_at == published > created


def test_an_expired_recommendation_shows_why_and_the_new_revision():
    row = BindingOverview("heater-1", 2, "expired", "binding changed: revision 2", "rec-1", 1,
                          NOW - timedelta(hours=3), None)
    (line,) = overview_lines([row], NOW)
    assert (line.status, line.revision, line.reason, line.age) == ("expired", 2, "binding changed: revision 2", "3 h")


def test_overview_lines_put_the_bindings_that_need_a_look_first():
    def row(binding_id, status, reason=None, failure=None, minutes=5.0):
        return BindingOverview(binding_id, 1, status, reason, status and f"rec-{binding_id}", 1,
                               status and NOW - timedelta(minutes=minutes), failure)

    rows = [row("a-ok", "verified"), row("b-none", None), row("c-bad", "rejected", "solver: infeasible"),
            row("d-maybe", "unverified", "coverage 0.7 < 0.8"), row("e-old", "expired", "valid_until passed"),
            row("f-failed", "verified", failure="uq_calibration: 0 val blocks", minutes=60.0)]
    lines = overview_lines(rows, NOW)
    assert [line.binding_id for line in lines] == ["c-bad", "d-maybe", "e-old", "b-none", "a-ok", "f-failed"]
    assert [line.reason for line in lines] == ["solver: infeasible", "coverage 0.7 < 0.8", "valid_until passed",
                                               "no recommendation yet", "-",
                                               "the latest run failed at uq_calibration: 0 val blocks"]
    assert [line.age_s for line in lines] == [300.0, 300.0, 300.0, None, 300.0, 3600.0]
    assert counts(lines) == "6 bindings: 1 rejected, 1 unverified, 1 expired, 1 none, 2 verified"
    text = overview_text(lines, width=60).splitlines()
    assert text[0] == counts(lines) and all(len(line) <= 60 for line in text[2:])
    assert text[4].startswith("c-bad") and "rejected" in text[4] and text[-1].endswith("…")


def test_status_command_lists_every_binding_worst_first_as_text_and_json(tmp_path):
    home = tmp_path / "home"
    _site(Ledger(ledger_path(home)))
    done = cli(home, "status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "4 bindings: 1 unverified, 1 none, 2 verified"
    assert [line.split()[0] for line in lines[4:]] == ["tanks-1", "blend-1", "blend-econ-1", "heater-1"]
    assert "live state is 2 h old" in lines[4] and "the latest run failed at model_artifact" in lines[7]
    doc = json.loads(cli(home, "status", "--json").stdout)
    assert [(d["binding_id"], d["status"]) for d in doc] == [("tanks-1", "unverified"), ("blend-1", "none"),
                                                             ("blend-econ-1", "verified"), ("heater-1", "verified")]
    assert doc[1]["age_s"] is None and 0 <= doc[0]["age_s"] < 60


def _tick(home, instance, cursor=None):
    defs = build_definitions(home, solver=InProcessSolverResource())  # FAKE solver: no solve here
    context = build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                   resources={"ledger": LedgerResource(home=str(home))})
    return defs.resolve_sensor_def("site_overview")(context)


def test_the_sensor_reports_the_overview_when_a_status_changes_and_skips_otherwise(tmp_path):
    home = tmp_path / "home"
    ledger = Ledger(ledger_path(home))
    _site(ledger)
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        first = _tick(home, instance)
        assert isinstance(first, SensorResult)
        (event,) = first.asset_events
        assert event.asset_key == AssetKey("site_overview") and event.partition is None
        table = event.metadata["bindings"].value
        assert [(r.data["status"], r.data["binding"]) for r in table.records][0] == ("unverified", "tanks-1")
        assert [c.name for c in table.schema.columns][:3] == ["status", "binding", "reason"]
        assert (event.metadata["verified"].value, event.metadata["unverified"].value) == (2, 1)

        again = _tick(home, instance, first.cursor)
        assert isinstance(again, SkipReason) and "no status changed" in again.skip_message

        _solve(ledger, "tanks-1")  # tanks-1 now verified
        changed = _tick(home, instance, first.cursor)
        assert changed.asset_events[0].metadata["verified"].value == 3
        spec = build_definitions(home, solver=InProcessSolverResource()).resolve_assets_def("site_overview")
        assert not spec.partitions_def and not spec.asset_deps[AssetKey("site_overview")]


@pytest.mark.parametrize("width", [80, 200])
def test_a_reason_is_cut_at_the_terminal_width(width):
    rows = [BindingOverview("tanks-1", 1, "unverified", "x" * 300, "rec-1", 1, NOW, None)]
    (line,) = overview_text(overview_lines(rows, NOW), width=width).splitlines()[-1:]
    assert len(line) == width and line.endswith("…")
