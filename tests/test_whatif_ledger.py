"""What-if runs in the ledger (issue 17 item 3), on both backends: run + candidates + the what-if row
in one transaction, the binding's open recommendation never touched; and a ledger written before
what-if runs existed (schema version 4) opens, keeps its rows and records what-ifs."""

import math
from dataclasses import replace

import duckdb
import pytest

from optimizer_pipeline.contracts import ContractError, binding_from_dict
from optimizer_pipeline.ledger import SCHEMA_VERSION, Ledger, LedgerError, NotFoundError, new_id
from optimizer_pipeline.ledger.schema import apply_schema

from ledger_helpers import candidates, run_row, solve

OVERRIDES = [{"path": "cvs.y1.hi", "value": 9.0}]
RESULT = {"status": "verified", "reasons": [], "mv_tags": ["v1", "v2"], "cv_tags": ["y1", "y2"],
          "controls": [[1.0, 2.0]], "predicted": [[7.0, 7.5]], "economic_value": None}


@pytest.fixture
def spec(binding_doc):
    return binding_from_dict(binding_doc)


def record(ledger, spec, compared=None, **changes):
    run = replace(run_row(), id=new_id("or"), context={"whatif": True})
    kwargs = dict(overrides=OVERRIDES, spec=spec.to_dict(), compared_recommendation_id=compared, result=RESULT,
                  run_status="succeeded", independent_cost=2.0, diagnostics={"iterations": 3},
                  requested_by="cli")
    kwargs.update(changes)
    return ledger.record_whatif(run, candidates(), "m" * 64, **kwargs)


def test_a_whatif_is_recorded_with_its_overrides_spec_result_and_candidates(any_ledger, spec):
    any_ledger.upsert_binding(spec)
    run_id = record(any_ledger, spec, dagster_run_id="d-1")
    row = any_ledger.get_whatif(run_id)
    assert (row.binding_id, row.binding_revision, row.overrides, row.result, row.requested_by, row.dagster_run_id) == \
        ("tanks-1", 1, OVERRIDES, RESULT, "cli", "d-1")
    assert binding_from_dict(row.spec) == spec
    assert [c.kind for c in any_ledger.list_candidates(run_id=run_id)] == ["hold", "nominal"]
    assert any_ledger.get_run(run_id).status == "succeeded"
    assert [w.run_id for w in any_ledger.list_whatifs("tanks-1")] == [run_id]
    assert [w.run_id for w in any_ledger.list_whatifs(dagster_run_id="d-1")] == [run_id]
    assert any_ledger.list_whatifs("other") == [] and any_ledger.list_whatifs(dagster_run_id="d-2") == []


def test_a_whatif_leaves_the_open_recommendation_open_and_latest(any_ledger, spec):
    any_ledger.upsert_binding(spec)
    _, rec_id = solve(any_ledger)
    before = any_ledger.get_recommendation(rec_id)
    record(any_ledger, spec, compared=rec_id)
    assert any_ledger.get_recommendation(rec_id) == before and before.status == "verified"
    assert any_ledger.latest_recommendation("tanks-1").id == rec_id
    assert len(any_ledger.list_recommendations("tanks-1")) == 1
    # the open recommendation can still be superseded by a normal solve afterwards
    _, newer = solve(any_ledger)
    assert any_ledger.get_recommendation(rec_id).status == "expired"
    assert any_ledger.latest_recommendation("tanks-1").id == newer


def test_a_whatif_with_a_bad_number_writes_nothing(any_ledger, spec):
    any_ledger.upsert_binding(spec)
    before = any_ledger.counts()
    with pytest.raises(ContractError):
        record(any_ledger, spec, result=dict(RESULT, economic_value=math.inf))
    with pytest.raises(LedgerError, match="run status"):
        record(any_ledger, spec, run_status="running")
    with pytest.raises(ValueError, match="requested_by"):
        record(any_ledger, spec, requested_by="someone")
    assert any_ledger.counts() == before


def test_an_unknown_whatif_run_is_not_found(any_ledger):
    with pytest.raises(NotFoundError, match="what-if run or-nope"):
        any_ledger.get_whatif("or-nope")


def test_a_version_4_ledger_opens_keeps_its_recommendation_and_records_whatifs(tmp_path, spec):
    path = tmp_path / "optimizer.duckdb"
    conn = duckdb.connect(str(path))
    assert apply_schema(conn, up_to=4) == [1, 2, 3, 4]
    conn.close()
    old = Ledger.__new__(Ledger)  # the v4 rows are written by this release's code on a v4 file:
    from optimizer_pipeline.ledger.duckdb_backend import _SCHEMA_CHECKED, DuckDBBackend

    _SCHEMA_CHECKED.add(str(path.resolve()))  # ... with the on-open migration held back
    try:
        old.backend = DuckDBBackend(path)
        with old.backend.transaction() as tx:  # the binding as a v4 release stored it (no wiring table yet)
            tx.execute("INSERT INTO bindings VALUES (?, now())", [spec.id])
            tx.execute("INSERT INTO binding_revisions VALUES (?, 1, ?, ?, now())",
                       [spec.id, spec.spec_hash, spec.canonical_json()])
        _, rec_id = solve(old)
        assert "whatif_runs" not in set(old.query("SELECT table_name FROM information_schema.tables")["table_name"])
    finally:
        _SCHEMA_CHECKED.discard(str(path.resolve()))

    ledger = Ledger(path)  # opened as a user would: migrated to the current version
    versions = ledger.query("SELECT version FROM schema_migrations ORDER BY version")["version"].tolist()
    assert versions == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 5
    assert ledger.latest_recommendation("tanks-1").id == rec_id
    assert ledger.get_recommendation(rec_id).status == "verified"
    run_id = record(ledger, spec, compared=rec_id)
    assert ledger.get_whatif(run_id).compared_recommendation_id == rec_id
    assert ledger.counts()["whatif_runs"] == 1 and ledger.counts()["optimizer_recommendations"] == 1


@pytest.mark.timeout(1560)  # five commands of up to 300 s each
def test_the_whatif_command_on_a_postgres_ledger_leaves_the_open_recommendation(postgres, tmp_path):
    """The CLI end to end on PostgreSQL (ingest, materialize through Dagster, whatif, recommendation),
    each command in its own process as a user runs them."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
    from optimizer_pipeline.plants import get_plant

    url, home = postgres.new_database(), tmp_path / "home"
    plant = get_plant("heater")
    binding, history = tmp_path / "heater.yaml", tmp_path / "history.csv"
    binding.write_text(yaml.safe_dump(plant.binding_doc()))
    plant.history(1).frame.to_csv(history, index=False)
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    env["OPTIMIZER_LEDGER_URL"] = url

    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args],
                              capture_output=True, text=True, timeout=300, env=env)
        return proc.returncode, proc.stdout, proc.stderr

    for args in (("ingest", str(binding), str(history)), ("materialize", "heater-1")):
        code, _, err = cli(*args)
        assert code == 0, (args, err[-2000:])
    ledger = Ledger(PostgresBackend(url))
    try:
        open_rec = ledger.latest_recommendation("heater-1")
        before = ledger.counts()
        code, out, err = cli("whatif", "heater-1", "--set", "cvs.t_out.hi=9", "--json")
        assert (code, out, err.strip()) == (2, "", "error: override 'cvs.t_out.hi=9': cvs.t_out: lo (20) must be < "
                                                   "hi (9)")
        assert ledger.counts() == before
        code, out, err = cli("whatif", "heater-1", "--set", "mvs.q_heat.max_move=5", "--json")
        assert code == 0, err[-2000:]
        doc = json.loads(out)
        (record,) = ledger.list_whatifs("heater-1")
        assert doc["whatif_run_id"] == record.run_id and doc["open"]["id"] == open_rec.id
        assert record.overrides == [{"path": "mvs.q_heat.max_move", "value": 5.0}]
        moves = [b[0] - a[0] for a, b in zip(record.result["controls"], record.result["controls"][1:])]
        assert max(abs(m) for m in moves) <= 5.0 + 1e-6
        assert len(ledger.list_candidates(run_id=record.run_id)) == 3
        assert ledger.list_recommendations("heater-1") == [open_rec]
        assert [r[0] for r in ledger.binding_revisions("heater-1")] == [1]
        code, out, _ = cli("recommendation", "heater-1", "--json")
        assert code == 0 and json.loads(out)["id"] == open_rec.id and json.loads(out)["status"] == open_rec.status
    finally:
        ledger.backend.close()
