"""Schema migrations: version 2 (issue 8) turns a version-1 ledger's JSON plan texts into DOUBLE[][] columns,
nothing lost; version 6 keys block scores by their score rule; version 9 stores the bindings' wiring."""

import json
from datetime import datetime, timezone
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest

from optimizer_pipeline import uq
from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.ledger import SCHEMA_VERSION, Ledger
from optimizer_pipeline.ledger.schema import apply_schema

from test_binding_wiring import OPCUA

# a version-1 candidate row as that release wrote it: plans and reports as JSON text
V1_CONTROLS = "[[1.0,2.5],[0.3333333333333333,-0.0],[1e300,1e-310]]"
V1_PREDICTED = "[[7.0],[123456789.123],[2.5e-07]]"
V1_ROW = ["oc-abc-0", "or-abc", 0, "nominal", "solved", V1_CONTROLS, V1_PREDICTED, 1.5,
          '{"slack":0.0}', True, False, None, '{"ok":true}', "m" * 64, "2026-01-02 03:04:05"]
V1_RUN = ["or-abc", "tanks-1", 1, "track", 1, "p" * 64, '{"why":"test"}', None, None, "succeeded", 1.5,
          "2026-01-02 03:04:00", "2026-01-02 03:04:05"]


@pytest.fixture
def v1_ledger(tmp_path):
    """A ledger file at schema version 1 holding one run and two candidates (one with empty plans)."""
    path = tmp_path / "optimizer.duckdb"
    conn = duckdb.connect(str(path))
    assert apply_schema(conn, up_to=1) == [1]
    conn.execute("INSERT INTO optimizer_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", V1_RUN)
    placeholders = ", ".join("?" * len(V1_ROW))
    conn.execute(f"INSERT INTO optimizer_candidates VALUES ({placeholders})", V1_ROW)
    conn.execute(f"INSERT INTO optimizer_candidates VALUES ({placeholders})",
                 ["oc-abc-1", *V1_ROW[1:2], 1, "hold", "hold", "[]", "[]", *V1_ROW[7:]])
    conn.close()
    return path


def test_opening_a_version_1_ledger_reads_the_plans_back_as_the_same_numbers(v1_ledger):
    rows = Ledger(v1_ledger).list_candidates(run_id="or-abc")
    assert [(r.controls, r.predicted) for r in rows] == \
        [(json.loads(V1_CONTROLS), json.loads(V1_PREDICTED)), ([], [])]


def test_opening_a_version_1_ledger_keeps_every_other_candidate_field(v1_ledger):
    row = Ledger(v1_ledger).list_candidates(run_id="or-abc")[0]
    assert {k: getattr(row, k) for k in ("id", "run_id", "seq", "kind", "solver_status", "cost", "constraints",
                                         "feasible", "verified", "independent_cost", "verify_report", "model_id",
                                         "created_at")} == \
        {"id": "oc-abc-0", "run_id": "or-abc", "seq": 0, "kind": "nominal", "solver_status": "solved", "cost": 1.5,
         "constraints": {"slack": 0.0}, "feasible": True, "verified": False, "independent_cost": None,
         "verify_report": {"ok": True}, "model_id": "m" * 64,
         "created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}


def test_opening_a_version_1_ledger_records_the_new_version_and_numeric_plan_columns(v1_ledger):
    ledger = Ledger(v1_ledger)
    versions = ledger.query("SELECT version FROM schema_migrations ORDER BY version")["version"].tolist()
    types = ledger.query("""SELECT column_name, data_type FROM information_schema.columns
                            WHERE table_name = 'optimizer_candidates' AND column_name IN ('controls', 'predicted',
                            'controls_json', 'predicted_json') ORDER BY column_name""")
    assert versions == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 2
    assert types.values.tolist() == [["controls", "DOUBLE[][]"], ["predicted", "DOUBLE[][]"]]
    assert ledger.counts()["optimizer_candidates"] == 2 and len(ledger.list_runs()) == 1


V5_SCORE_ROWS = "INSERT INTO uq_block_scores VALUES ('a', 'tanks-1', 1, 'val', 'r1', 0, 'y1', 0.25, " \
                "'2026-01-02 03:04:05'), ('a', 'tanks-1', 1, 'val', 'r1', 0, 'y2', NULL, '2026-01-02 03:04:05')"


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_version_5_ledger_keeps_its_block_scores_as_of_an_unrecorded_rule(backend, tmp_path, request):
    """Schema version 6 keys block scores by their score rule (uq.rule_key): the rows stored before
    are kept, a NULL score too, named 'unrecorded', so no calibration of this version reads them; a
    score of this version's rule is stored beside them at the same block."""
    if backend == "duckdb":
        path = tmp_path / "optimizer.duckdb"
        conn = duckdb.connect(str(path))
        assert apply_schema(conn, up_to=5) == [1, 2, 3, 4, 5]
        conn.execute(V5_SCORE_ROWS)
        conn.close()
        ledger = Ledger(path)
    else:
        import psycopg

        from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
        from optimizer_pipeline.ledger.schema import POSTGRES

        url = request.getfixturevalue("postgres").new_database()
        with psycopg.connect(url) as conn:  # the schema as the release of version 5 left it

            class Placeholders:  # apply_schema writes `?`, psycopg takes %s
                def execute(self, sql, params=()):
                    return conn.execute(sql.replace("?", "%s"), params)

            assert apply_schema(Placeholders(), up_to=5, dialect=POSTGRES) == [1, 2, 3, 4, 5]
            conn.execute(V5_SCORE_ROWS)
        postgres_backend = PostgresBackend(url)
        request.addfinalizer(postgres_backend.close)
        ledger = Ledger(postgres_backend)
    assert ledger.query("SELECT version FROM schema_migrations ORDER BY version")["version"].tolist()[-1] == SCHEMA_VERSION
    kept = ledger.block_scores("a", "unrecorded")
    assert kept["score"].tolist()[0] == 0.25 and np.isnan(kept["score"].tolist()[1])
    assert kept[["segment", "run_id", "block_start", "cv_tag"]].values.tolist() == [["val", "r1", 0, "y1"],
                                                                                   ["val", "r1", 0, "y2"]]
    assert ledger.block_scores("a", uq.rule_key(uq.MAX_RESIDUAL)).empty
    # put_block_scores reads only these fields of the artifact (its hash named 'a' like the v5 rows')
    artifact = SimpleNamespace(artifact_hash="a", binding_id="tanks-1", binding_revision=1, cv_tags=("y1", "y2"))
    assert ledger.put_block_scores(artifact, uq.rule_key(uq.MAX_RESIDUAL), "val", ["r1"], [0], [[0.5, 0.75]]) == 2
    assert ledger.block_scores("a", uq.rule_key(uq.MAX_RESIDUAL))["score"].tolist() == [0.5, 0.75]
    assert SCHEMA_VERSION >= 6 and ledger.counts()["uq_block_scores"] == 4


def test_a_version_8_ledger_reads_its_bindings_unwired_and_wires_one_in_the_same_revision(tmp_path, binding_doc):
    path = tmp_path / "optimizer.duckdb"
    conn = duckdb.connect(str(path))
    assert apply_schema(conn, up_to=8) == list(range(1, 9))
    spec = binding_from_dict(binding_doc)
    conn.execute("INSERT INTO bindings VALUES ('tanks-1', '2026-01-02 03:04:05')")
    conn.execute("INSERT INTO binding_revisions VALUES (?, ?, ?, ?, ?)",
                 ["tanks-1", 1, spec.spec_hash, spec.canonical_json(), "2026-01-02 03:04:05"])
    conn.close()
    ledger = Ledger(path)
    assert ledger.get_binding("tanks-1").spec.opcua is None
    wired = ledger.upsert_binding(binding_from_dict({**binding_doc, "opcua": OPCUA}))
    assert (wired.revision, wired.changed, wired.wiring_changed) == (1, False, True)
