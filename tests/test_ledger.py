"""The DuckDB ledger: schema, append-only rules, one-transaction writes, expiry (issue 2, "Ledger")."""

import json
from dataclasses import replace
from datetime import datetime, timezone

import duckdb
import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline.contracts import (HistorySplit, Outcome, OutcomeVerdict, RecommendationStatus, RunSeries,
                                         binding_from_dict, iso_utc, utc_now)
from optimizer_pipeline.ledger import (SCHEMA_VERSION, Ledger, LedgerBusyError, LedgerError, NotFoundError, RunStateError,
                                       RunStatus, new_id)

from optimizer_pipeline import pipeline, uq
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model

from ledger_helpers import candidates, recommendation, run_row, solve
from model_helpers import binding, unit_normalisation


@pytest.fixture
def ledger(any_ledger):
    """Every test of this module runs on both backends (DuckDB file, PostgreSQL database)."""
    return any_ledger


def test_schema_is_applied_once_and_reopening_is_idempotent(tmp_path):
    path = tmp_path / "l.duckdb"
    Ledger(path)
    Ledger(path)
    con = duckdb.connect(str(path))
    versions = con.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    assert {"bindings", "binding_revisions", "plant_samples", "model_artifacts", "uq_block_scores",
            "uq_calibrations", "optimizer_runs", "optimizer_candidates", "optimizer_recommendations",
            "optimizer_outcomes"} <= tables


def test_run_with_candidates_and_recommendation_is_stored_with_prefixed_ids(ledger):
    run_id, rec_id = solve(ledger)
    run = ledger.get_run(run_id)
    cands = ledger.list_candidates(run_id=run_id)
    rec = ledger.get_recommendation(rec_id)
    assert run_id.startswith("or-") and rec_id.startswith("rec-")
    assert run.status == "succeeded" and run.finished_at is not None and run.diagnostics == {"iterations": 12}
    assert [c.id for c in cands] == [f"oc-{run_id[3:]}-0", f"oc-{run_id[3:]}-1"]
    assert rec.status == "verified" and rec.payload["status_label"] == RecommendationStatus.VERIFIED.label
    assert rec.candidate_id == cands[1].id


def test_records_hold_aware_utc_times_and_enums_and_their_json_the_iso_text_and_values(ledger):
    before = utc_now()
    run_id, rec_id = solve(ledger)
    ledger.insert_outcome(Outcome(id=new_id("out"), recommendation_id=rec_id, binding_id="tanks-1",
                                  applied_at="2027-01-15T10:00:00+01:00", observed={}, delta={},
                                  verdict=OutcomeVerdict.CONFIRMED, details={}))
    run, rec, (outcome,) = ledger.get_run(run_id), ledger.get_recommendation(rec_id), ledger.list_outcomes("tanks-1")
    assert (type(run.status), type(rec.status), type(outcome.verdict)) == (RunStatus, RecommendationStatus,
                                                                           OutcomeVerdict)
    assert (run.status, rec.status, outcome.verdict) == ("succeeded", "verified", "confirmed")
    assert outcome.applied_at == datetime(2027, 1, 15, 9, tzinfo=timezone.utc)
    assert outcome.applied_at.tzinfo is timezone.utc
    assert before <= run.finished_at <= utc_now() and rec.expired_at is None
    doc = json.loads(json.dumps(run.to_json_dict()))  # plain JSON: no datetime or enum left
    assert (doc["status"], doc["started_at"], doc["finished_at"]) == (
        "succeeded", run.started_at.isoformat(), run.finished_at.isoformat())
    assert outcome.to_json_dict()["applied_at"] == "2027-01-15T09:00:00+00:00"
    assert rec.to_json_dict()["status"] == "verified" and rec.document()["status"] == "verified"


def test_finishing_a_run_twice_is_refused(ledger):
    run_id = ledger.insert_run(run_row())
    assert ledger.get_run(run_id).status == "running"
    ledger.finish_run(run_id, "succeeded", independent_cost=1.5)
    with pytest.raises(RunStateError, match=f"run {run_id} is already finished \\(succeeded\\)"):
        ledger.finish_run(run_id, "failed")
    assert ledger.get_run(run_id).status == "succeeded"
    assert ledger.get_run(run_id).independent_cost == 1.5


def test_a_finished_run_keeps_its_diagnostics_and_cost_and_no_diagnostics_are_an_empty_document(ledger):
    with_diagnostics, without = ledger.insert_run(run_row()), ledger.insert_run(run_row())
    ledger.finish_run(with_diagnostics, "failed", independent_cost=0.25, diagnostics={"osqp": "max_iter_reached"})
    ledger.finish_run(without, "interrupted")
    run = ledger.get_run(with_diagnostics)
    assert (run.status, run.independent_cost, run.diagnostics) == ("failed", 0.25, {"osqp": "max_iter_reached"})
    run = ledger.get_run(without)
    assert (run.status, run.independent_cost, run.diagnostics) == ("interrupted", None, {})
    assert run.finished_at is not None


def test_finishing_a_run_that_is_not_in_the_ledger_is_refused_naming_it(ledger):
    with pytest.raises(NotFoundError) as refused:
        ledger.finish_run("or-nowhere", "succeeded")
    assert str(refused.value) == "run or-nowhere is not in the ledger"


def test_a_solve_recorded_without_a_run_id_gets_one_and_its_candidates_follow_it(ledger):
    run_id = ledger.record_solve(run_row(), candidates(), "m" * 64, None, run_status="succeeded",
                                 independent_cost=2.5, diagnostics={"iterations": 7}, evidence_source="simulation")
    assert run_id.startswith("or-") and len(run_id) == 19  # or- and 16 hex digits
    run = ledger.get_run(run_id)
    assert (run.status, run.independent_cost, run.diagnostics) == ("succeeded", 2.5, {"iterations": 7})
    assert [c.id for c in ledger.list_candidates(run_id=run_id)] == [f"oc-{run_id[3:]}-0", f"oc-{run_id[3:]}-1"]
    assert ledger.list_recommendations() == []


def test_candidates_are_inserted_as_one_batch(ledger):
    run_id = ledger.insert_run(run_row())
    ids = ledger.insert_candidates(run_id, candidates(), "m" * 64)
    assert len(ids) == 2 and len(ledger.list_candidates(run_id=run_id)) == 2


def test_failed_transaction_leaves_nothing(ledger):
    run = replace(run_row(), id=new_id("or"))
    rec = recommendation(run.id)
    bad = candidates() + candidates()  # duplicate candidate ids violate the primary key mid-transaction
    with pytest.raises(LedgerError, match="(?i)duplicate key|unique"):
        ledger.record_solve(run, bad, "m" * 64, rec, run_status="succeeded", independent_cost=1.0,
                            diagnostics={}, evidence_source="simulation")
    counts = ledger.counts()
    assert counts["optimizer_runs"] == counts["optimizer_candidates"] == counts["optimizer_recommendations"] == 0


def test_exception_inside_a_transaction_rolls_back(ledger):
    with pytest.raises(RuntimeError):
        with ledger.transaction() as conn:
            ledger.insert_run(run_row(), conn)
            raise RuntimeError("boom")
    assert ledger.counts()["optimizer_runs"] == 0


def test_new_recommendation_supersedes_the_open_one(ledger):
    _, first = solve(ledger)
    _, second = solve(ledger)
    old = ledger.get_recommendation(first)
    assert old.status == "expired" and old.expired_reason == f"superseded by {second}"
    assert ledger.latest_recommendation("tanks-1").id == second
    assert ledger.get_recommendation(second).status == "verified"


def test_expiry_is_idempotent_and_keeps_rows(ledger):
    solve(ledger, binding_id="a", problem_hash="x" * 64)
    solve(ledger, binding_id="b", problem_hash="y" * 64)
    assert ledger.expire(binding_id="a", reason="test") == 1
    assert ledger.expire(binding_id="a", reason="test") == 0
    assert ledger.expire(problem_ir_hash="y" * 64, reason="test") == 1
    rows = ledger.list_recommendations()
    assert len(rows) == 2 and {r.status for r in rows} == {"expired"}
    assert all(r.payload["status"] == "verified" for r in rows)  # what was published is kept


def test_expire_by_run(ledger):
    run_id, rec_id = solve(ledger)
    assert ledger.expire(run_id=run_id, reason="operator") == 1
    assert ledger.get_recommendation(rec_id).expired_reason == "operator"


def test_past_valid_until_is_expired_in_the_ledger(ledger):
    _, stale = solve(ledger, binding_id="a", valid_for_s=-1.0)
    _, fresh = solve(ledger, binding_id="b", valid_for_s=3600.0)
    assert ledger.expire_past_valid_until() == 1
    assert ledger.get_recommendation(stale).status == "expired"
    assert ledger.get_recommendation(fresh).status == "verified"


def test_an_unknown_binding_is_refused_naming_the_closest_known_ids(ledger, binding_doc):
    with pytest.raises(NotFoundError) as refused:
        ledger.get_binding("tanks-1")
    assert str(refused.value).endswith("is not in the ledger " + str(ledger.path) + " (it holds no binding yet: "
                                       "ingest one first)")
    for binding_id in ("tanks-1", "tanks-12", "heater-1", "blend-1", "column-7"):
        ledger.upsert_binding(binding_from_dict({**binding_doc, "id": binding_id}))
    with pytest.raises(NotFoundError) as refused:
        ledger.get_binding("tank-1")
    assert str(refused.value).startswith(f"binding 'tank-1' is not in the ledger {ledger.path} "
                                         "(5 bindings; closest: tanks-1, tanks-12, ")  # then the next most alike


def test_identical_binding_upsert_writes_nothing(ledger, binding_doc):
    spec = binding_from_dict(binding_doc)
    first = ledger.upsert_binding(spec)
    solve(ledger, revision=1)
    again = ledger.upsert_binding(binding_from_dict(binding_doc))
    assert (first.revision, first.created, first.changed) == (1, True, True)
    assert (again.revision, again.changed, again.expired) == (1, False, 0)
    assert ledger.counts()["binding_revisions"] == 1
    assert ledger.latest_recommendation("tanks-1").status == "verified"


def test_changed_binding_bumps_revision_and_expires_open_recommendations(ledger, binding_doc):
    ledger.upsert_binding(binding_from_dict(binding_doc))
    _, rec_id = solve(ledger, revision=1)
    binding_doc["cvs"][0]["target"] = 6.5
    bumped = ledger.upsert_binding(binding_from_dict(binding_doc))
    assert (bumped.revision, bumped.changed, bumped.expired) == (2, True, 1)
    assert ledger.get_recommendation(rec_id).status == "expired"
    assert [r[0] for r in ledger.binding_revisions("tanks-1")] == [1, 2]
    assert ledger.get_binding("tanks-1").spec.cvs[0].target == 6.5
    assert ledger.get_binding("tanks-1", revision=1).spec.cvs[0].target == 7.0


def test_history_round_trips_and_duplicate_samples_are_skipped(ledger, binding_doc):
    spec = binding_from_dict(binding_doc)
    frame = pd.DataFrame({"run_id": ["r1"] * 3 + ["r2"] * 2, "timestamp": [0.0, 5.0, 10.0, 100.0, 105.0],
                          "v1": [1, 2, 3, 4, 5], "v2": [1.0] * 5, "y1": [7.0] * 5, "y2": [7.5, None, 7.5, 7.5, 7.5]})
    upsert, rows = ledger.ingest(spec, frame, "real")
    assert upsert.revision == 1 and rows == 19  # one NaN not stored
    assert ledger.ingest(spec, frame, "real")[1] == 0
    back = ledger.history_frame("tanks-1", spec.tags)
    assert list(back.columns) == ["run_id", "timestamp", "v1", "v2", "y1", "y2"]
    pd.testing.assert_frame_equal(back[["run_id", "timestamp", "v1"]], frame[["run_id", "timestamp", "v1"]]
                                  .astype({"v1": float}), check_dtype=False)
    assert back["y2"].isna().sum() == 1 and ledger.sample_source("tanks-1") == "real"
    assert ledger.run_counts() == {"tanks-1": 2} and ledger.newest_samples() == {"tanks-1": 105.0}


def test_outcomes_are_appended(ledger):
    _, rec_id = solve(ledger)
    for verdict in (OutcomeVerdict.CONFIRMED, OutcomeVerdict.DEVIATED):
        ledger.insert_outcome(Outcome(id=new_id("out"), recommendation_id=rec_id, binding_id="tanks-1",
                                      applied_at=iso_utc(utc_now()), observed={"y1": [7.0]}, delta={"y1": [0.1]},
                                      verdict=verdict))
    assert [o.verdict for o in ledger.list_outcomes(recommendation_id=rec_id)] == ["confirmed", "deviated"]


def test_the_verdicts_of_a_binding_are_its_judged_outcomes_without_their_documents(ledger):
    _, rec_id = solve(ledger)
    recorded = [Outcome(id=new_id("out"), recommendation_id=rec_id, binding_id="tanks-1",
                        applied_at=iso_utc(utc_now()), observed={"y1": [7.0]}, delta={"y1": [0.1]},
                        verdict=verdict, details={"hits": 9, "trials": 10})
                for verdict in (OutcomeVerdict.CONFIRMED, None, OutcomeVerdict.DEVIATED)]  # None: pending
    for outcome in recorded:
        ledger.insert_outcome(outcome)
    full = {o.id: o for o in ledger.list_outcomes("tanks-1")}
    verdicts = ledger.list_verdicts("tanks-1")
    assert [o.id for o in verdicts] == [recorded[0].id, recorded[2].id]
    for o in verdicts:
        assert not hasattr(o, "observed") and not hasattr(o, "delta")
        assert (o.verdict, o.details, o.applied_at, o.created_at, o.recommendation_id, o.binding_id) == (
            full[o.id].verdict, full[o.id].details, full[o.id].applied_at, full[o.id].created_at, rec_id, "tanks-1")
    assert ledger.list_verdicts("no-such-binding") == []


def test_lock_held_past_the_bound_gives_a_clear_error(tmp_path):
    from filelock import FileLock

    path = tmp_path / "l.duckdb"
    Ledger(path)
    impatient = Ledger(path, lock_timeout_s=0.2)
    with FileLock(str(path) + ".lock"):
        with pytest.raises(LedgerBusyError, match=r"stayed locked for 0\.2 s"):
            impatient.counts()


def test_duckdb_lock_from_outside_our_lock_is_retried_then_reported(tmp_path):
    path = tmp_path / "l.duckdb"
    Ledger(path)
    ledger = Ledger(path, connect_attempts=3)
    import subprocess
    import sys
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(path)!r}); "
                               "print('held', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerBusyError, match="cannot be opened"):
            ledger.counts()
    finally:
        holder.kill()
        holder.wait()
    assert ledger.counts()["optimizer_runs"] == 0


def test_stale_running_runs_are_closed_as_interrupted_once(ledger):
    from datetime import timedelta

    stale = ledger.insert_run(replace(run_row(), started_at=utc_now() - timedelta(seconds=120)))
    fresh = ledger.insert_run(run_row())
    assert ledger.close_stale_runs(older_than_s=60) == 1
    assert ledger.close_stale_runs(older_than_s=60) == 0
    assert ledger.get_run(stale).status == "interrupted" and ledger.get_run(fresh).status == "running"
    with pytest.raises(RunStateError):
        ledger.finish_run(stale, "succeeded")


def test_recommendation_payload_reads_back_as_created(ledger):
    run = replace(run_row(), id=new_id("or"))
    rec = recommendation(run.id)
    ledger.record_solve(run, candidates(), "m" * 64, rec, run_status="succeeded", independent_cost=2.0,
                        diagnostics={}, evidence_source="simulation")
    assert ledger.get_recommendation(rec.id).payload == rec.to_json_dict()


def test_appending_overlapping_samples_stores_each_sample_once(ledger, binding_doc):
    """Samples already stored are skipped, also a second time in the same transaction (PostgreSQL
    stages the rows and moves them with ON CONFLICT DO NOTHING)."""
    spec = binding_from_dict(binding_doc)  # tags v1, v2, y1, y2
    frame = pd.DataFrame({"run_id": "r1", "timestamp": [1.0, 2.0, 3.0], "v1": [0.1, 0.2, 0.3], "v2": 1.0,
                          "y1": [5.0, None, 7.0], "y2": 6.0})
    upsert, added = ledger.ingest(spec, frame, "real")
    assert added == 11  # 12 values, one missing (a missing value is no sample)
    later = pd.DataFrame({"run_id": "r1", "timestamp": [3.0, 4.0], "v1": [0.3, 0.4], "v2": 1.0, "y1": [7.0, 8.0],
                          "y2": 6.0})
    assert ledger.append_samples(spec.id, later, spec.tags, "real") == 4
    with ledger.backend.transaction() as tx:
        assert ledger._append_samples(tx, spec.id, later, spec.tags, "real") == 0
        assert ledger._append_samples(tx, spec.id, frame.assign(timestamp=[5.0, 6.0, 7.0]), spec.tags, "real") == 11
    wide = ledger.history_frame(spec.id, spec.tags)
    assert wide["timestamp"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert wide["v1"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3]


def test_block_scores_read_back_as_the_blocks_stored(ledger):
    """Runs hold different numbers of blocks: pipeline.load_scores reads back the stored blocks and no
    others (a block added with NaN scores would read as a non-finite score: no evidence); a NaN that
    was stored is kept; the pieces of a run split at a gap count as one run (the split names them);
    scores stored of a run the model was fitted on (by code that scored a later split) are left out."""
    spec = binding(n_mv=1, n_cv=2, na=1, nb=1, delay=1)
    model = ArxModel(Orders(1, 1, 1), np.full((1, 2, 2), 0.1), np.full((1, 2, 1), 0.5), np.zeros((1, 2, 0)),
                     np.zeros(2))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec),
                                   splits={"train": ("t",), "val": ("a", "b"), "test": ("c", "d")})
    val = ["a", "a", "a", "b", "b"], [0, 10, 20, 0, 10], [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    test = ["c", "d", "d"], [0, 0, 10], [[1, np.nan], [2, 3], [4, 5]]
    rule = uq.rule_key(uq.MAX_RESIDUAL)
    for segment, (run_ids, starts, scores) in (("val", val), ("test", test)):
        ledger.put_block_scores(artifact, rule, segment, run_ids, starts, scores)
    ledger.put_block_scores(artifact, rule, "val", ["t"], [0], [[0.5, 0.5]])  # the train run, scored as val

    def series(run_id, source_run=""):
        return RunSeries(run_id, np.zeros(1), np.zeros((1, 1)), np.zeros((1, 2)), np.zeros((1, 0)), source_run)

    # a later split of the same runs: the train run now held out, the model's test runs pieces of one run
    split = HistorySplit((series("a"),), (series("t"), series("b")), (series("c", "x"), series("d", "x")), None,
                         unit_normalisation(spec), {}, "data-hash")
    loaded = pipeline.load_scores(ledger, spec, artifact, split)
    for got, (run_ids, starts, scores), runs in ((loaded.val, val, 2), (loaded.test, test, 1)):
        assert list(got.run_ids) == run_ids and list(got.starts) == starts
        np.testing.assert_array_equal(got.scores, np.asarray(scores, float))
        assert got.n_runs == runs and got.n_unique_steps == len(run_ids) * spec.model.horizon


def test_block_scores_of_an_older_text_of_the_rule_are_kept_and_never_read(ledger, monkeypatch):
    """An artifact's hash is its content, so a recalibration after an upgrade that changed a score rule
    scores the same artifact again, often at the same block starts: the new scores are stored beside
    the old ones (keyed by uq.rule_key) and pipeline.load_scores reads only this version's."""
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    model = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), 0.1), np.full((1, 1, 1), 0.5), np.zeros((1, 1, 0)),
                     np.zeros(1))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec),
                                   splits={"train": ("t",), "val": ("a",), "test": ("c",)})
    runs = {name: RunSeries(name, np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 0)))
            for name in "tac"}
    split = HistorySplit((runs["t"],), (runs["a"],), (runs["c"],), None, unit_normalisation(spec), {}, "data-hash")
    monkeypatch.setitem(uq.SCORE_RULES, uq.MAX_RESIDUAL, "an older text of max_residual")
    old = uq.rule_key(uq.MAX_RESIDUAL)
    for segment, run in (("val", "a"), ("test", "c")):
        ledger.put_block_scores(artifact, old, segment, [run, run], [0, 10], [[1.0], [2.0]])
    monkeypatch.undo()
    assert uq.rule_key(uq.MAX_RESIDUAL) != old
    with pytest.raises(pipeline.MissingInputError, match="by this version's max_residual rule"):
        pipeline.load_scores(ledger, spec, artifact, split)
    for segment, run in (("val", "a"), ("test", "c")):  # block 10 again, and a new block 40
        ledger.put_block_scores(artifact, uq.rule_key(uq.MAX_RESIDUAL), segment, [run, run], [10, 40], [[3.0], [4.0]])
    loaded = pipeline.load_scores(ledger, spec, artifact, split)
    for got in (loaded.val, loaded.test):
        assert list(got.starts) == [10, 40] and got.scores.ravel().tolist() == [3.0, 4.0]
    assert len(ledger.block_scores(artifact.artifact_hash, old)) == 4  # the old rule's rows are kept


@pytest.mark.parametrize("status", ["running", "done", None])
def test_a_run_ends_only_with_an_end_status(tmp_path, status):
    """A run's end status is one of RunStatus's end values, given as the enum or its text; anything else is
    refused naming them, and the run stays running."""
    from optimizer_pipeline.ledger import RunStatus

    ledger = Ledger(tmp_path / "ledger.duckdb")
    run_id = ledger.insert_run(run_row())
    with pytest.raises(LedgerError, match="run status must be one of succeeded, failed, interrupted"):
        ledger.finish_run(run_id, status)
    assert ledger.get_run(run_id).status == RunStatus.RUNNING
    ledger.finish_run(run_id, RunStatus.INTERRUPTED)
    assert ledger.get_run(run_id).status == "interrupted"
