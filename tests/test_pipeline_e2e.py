"""End to end through real Dagster, DuckDB, solver workers and the demo plants (issue 5)."""

import numpy as np
import pytest
from dagster import AssetKey, AssetRecordsFilter, instance_for_test

from optimizer_pipeline import pipeline, uq
from optimizer_pipeline.contracts import CandidateKind, Template, utc_now
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.data.ingest import validate_history_frame
from optimizer_pipeline.model.artifact import current_state, local_artifact, local_fitter
from optimizer_pipeline.model.local import REGION_FRACTION, OperatingPoint
from optimizer_pipeline.plants import demo_plants
from optimizer_pipeline.recommend import improvement_conditions
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.solver.shared import kept_alive
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from optimizer_pipeline.solver.targets import compile_steered

from pipeline_fixtures import LIVE_AGE_S, SEED, DemoHome, allow_live_age, seed_home

REC_KEYS = {"id", "binding_id", "binding_revision", "run_id", "candidate_id", "template", "status", "status_label",
            "reasons", "created_at", "valid_until", "mv_tags", "cv_tags", "controls", "predicted", "band", "cost",
            "independent_cost", "problem_ir_hash", "model_artifact_hash", "evidence"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    plants = demo_plants()
    allow_live_age(home)  # its tests decide again minutes after the seeding on a loaded machine
    ledger = seed_home(home, plants)
    # the module's runs share their started worker pool (`kept_alive`, as the CLI's runs of one process do)
    with kept_alive(), instance_for_test(temp_dir=str(tmp_path_factory.mktemp("dagster"))) as instance:
        instance.add_dynamic_partitions("bindings", [p.spec.id for p in plants])
        demo = DemoHome(home, ledger, instance, {p.spec.id: p for p in plants})
        ids = [p.spec.id for p in plants]
        demo.result = demo.run_range(ids[0], ids[-1])  # one run for every binding, as `demo` runs it
        yield demo


def test_every_binding_gets_a_verified_recommendation_with_its_evidence(demo):
    for binding_id in demo.plants:
        doc = demo.ledger.latest_recommendation(binding_id).document()
        assert set(doc) >= REC_KEYS
        assert doc["status"] == "verified", (binding_id, doc["reasons"])
        assert doc["reasons"] == []
        assert doc["evidence"]["source"] == "simulation"
        assert doc["evidence"]["uq"]["method"] == "split_conformal"
        assert doc["evidence"]["uq"]["coverage"] >= doc["evidence"]["coverage_threshold"]
        assert all(b is not None and b > 0 for b in doc["band"])


def test_the_band_says_what_it_is_calibrated_for(demo):
    """A move plan's band covers its first P steps (max residual of P-step blocks); a steady target's
    band its settled value (the residual at the end of settling-horizon blocks)."""
    for binding_id, plant in demo.plants.items():
        doc = demo.ledger.latest_recommendation(binding_id).document()
        calibrated = doc["evidence"]["uq"]
        artifact = pipeline.load_artifact(demo.ledger, demo.ledger.get_binding(binding_id))
        local = artifact.selection["steady_model"]["procedure"] == "local"  # scored by the procedure identify chose
        if plant.spec.profile.template is Template.STEADY_RESPONSE:  # settled
            assert (doc["band_steps"], calibrated["score"]) == (1, "settled_residual_local" if local
                                                                else "settled_residual")
            assert calibrated["block_length"] > plant.spec.model.horizon  # the settling horizon, not P
        else:
            assert (doc["band_steps"], calibrated["score"]) == (min(plant.spec.model.horizon, len(doc["controls"])),
                                                                "max_residual_local" if local else "max_residual")
            assert calibrated["block_length"] == plant.spec.model.horizon
        (record,) = demo.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("model_artifact"), asset_partitions=[binding_id]), limit=1).records
        metadata = record.asset_materialization.metadata
        assert metadata["steady_model"].value == artifact.selection["steady_model"]  # the choice of model
        assert metadata["family"].value == artifact.selection["family"]  # one delay, per channel, long numerator
        gain = record.asset_materialization.metadata["steady_gain"].value
        assert gain["uncertainty"]["replicates"] >= 2 and len(gain["uncertainty"]["std"]) == len(plant.spec.cvs)
        assert record.asset_materialization.metadata["steady_gain_condition"].value == pytest.approx(gain["condition"])


def test_ledger_holds_run_candidates_calibration_and_scores(demo):
    for binding_id in demo.plants:
        runs = demo.ledger.list_runs(binding_id)
        assert [r.status for r in runs] == ["succeeded"]
        rec = demo.ledger.latest_recommendation(binding_id)
        cands = demo.ledger.list_candidates(run_id=runs[0].id)
        assert [c.kind for c in cands] == ["hold", "nominal", "robust"]
        assert rec.run_id == runs[0].id and rec.candidate_id in {c.id for c in cands}
        assert runs[0].problem_ir_hash == rec.problem_ir_hash
        cal = demo.ledger.latest_calibration(binding_id)
        assert cal.has_evidence and cal.artifact_hash == rec.model_artifact_hash
        scores = demo.ledger.block_scores(rec.model_artifact_hash, uq.rule_key(cal.evidence["score"]))
        assert set(scores["segment"]) == {"val", "test"} and scores["score"].notna().all()


def test_one_run_materializes_every_asset_of_every_binding(demo):
    events = demo.result.get_asset_materialization_events()
    by_asset = {}
    for e in events:
        by_asset.setdefault(e.asset_key.path[-1], []).append(e.partition)
    assert {a: sorted(p) for a, p in by_asset.items()} == {
        a: sorted(demo.plants) for a in ("plant_history", "model_artifact", "uq_block_scores", "uq_calibration",
                                         "recommendation")}


def test_one_check_per_partition_carries_every_condition(demo):
    evaluations = demo.result.get_asset_check_evaluations()
    for binding_id in demo.plants:
        [check] = [e for e in evaluations if e.partition == binding_id]
        assert (check.asset_key, check.check_name, check.passed) == (AssetKey("recommendation"), "conditions", True)
        (record,) = demo.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=[binding_id]), limit=1).records
        shown = record.asset_materialization.metadata["conditions"].value.records
        table = {row.data["condition"]: row.data["holds"] for row in check.metadata["conditions"].value.records}
        assert table == {row.data["condition"]: row.data["holds"] for row in shown}, binding_id
        assert {"model gate G1", "model gate G4", "test coverage (worst CV)",
                "candidate verified independently"} <= set(table)
        assert all(table.values()) and check.metadata["failed"].value == []
        assert check.metadata["status"].value == demo.ledger.latest_recommendation(binding_id).status


def test_each_check_points_at_its_partitions_materialization_of_the_run(demo):
    records = demo.instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("recommendation")),
                                                   limit=10).records
    storage_ids = {r.partition_key: r.storage_id for r in records if r.run_id == demo.result.run_id}
    checks = [e for e in demo.result.get_asset_check_evaluations() if e.check_name == "conditions"]
    assert {e.partition: e.target_materialization_data.storage_id for e in checks} == storage_ids
    assert all(e.target_materialization_data.run_id == demo.result.run_id for e in checks)


def test_each_partition_shows_its_own_recommendation(demo):
    for binding_id in demo.plants:
        (record,) = demo.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=[binding_id]), limit=1).records
        metadata = record.asset_materialization.metadata
        rec = demo.ledger.latest_recommendation(binding_id)
        assert metadata["recommendation_id"].value == rec.id
        assert metadata["status"].value == "verified"
        assert ("economic_value" in metadata) == demo.plants[binding_id].spec.has_costs
        assert len(metadata["plan"].value.records) == len(rec.document()["controls"])
        assert metadata["problem_ir_hash"].value == rec.problem_ir_hash
        assert f"{binding_id}: verified plan" in metadata["plot"].value


@pytest.mark.parametrize("binding_id", ["tanks-1", "heater-1", "blend-1"])
def test_plan_applied_to_the_nonlinear_plant_moves_cvs_to_target_within_bounds_and_rates(demo, binding_id):
    plant = demo.plants[binding_id]
    spec = plant.spec
    live = plant.history(SEED).live
    doc = demo.ledger.latest_recommendation(binding_id).document()
    controls = np.asarray(doc["controls"])
    lo, hi = np.array([m.lo for m in spec.mvs]), np.array([m.hi for m in spec.mvs])
    max_move = np.array([m.max_move for m in spec.mvs])
    tol = 1e-4 * (hi - lo)  # judged at 0.01 % of range
    assert np.all(controls >= lo - tol) and np.all(controls <= hi + tol)
    moves = np.diff(np.vstack([live.u, controls]), axis=0)
    assert np.all(np.abs(moves) <= max_move + tol)
    if spec.profile.template is Template.STEADY_RESPONSE:
        controls = np.repeat(controls, 6 * spec.model.horizon, axis=0)  # hold the steady target until it settles
    target = np.array([c.target for c in spec.cvs])
    y_plan = plant.apply_plan(live, controls)
    y_hold = plant.apply_plan(live, np.repeat(live.u[None, :], len(controls), axis=0))
    error_plan = np.linalg.norm((y_plan[-1] - target) / [c.hi - c.lo for c in spec.cvs])
    error_hold = np.linalg.norm((y_hold[-1] - target) / [c.hi - c.lo for c in spec.cvs])
    assert error_plan <= 0.2 * error_hold, (error_plan, error_hold)


def _assert_region_of(recorded: dict, fitter, midway_u: np.ndarray, midway_y: np.ndarray) -> None:
    """The recorded operating point is the centre of the midpoint's region: within half a region's width
    of it along every MV and CV, on the regions' grid (model/local.py)."""
    width = REGION_FRACTION * fitter.bandwidth
    for centre, midway in ((recorded["u"], midway_u), (recorded["y"], midway_y)):
        centre = np.asarray(centre)
        assert np.all(np.abs(centre - midway) <= width / 2 + 1e-9), (centre, midway, width)
        np.testing.assert_allclose(centre / width, np.round(centre / width), rtol=0, atol=1e-9)


def test_the_blend_target_is_solved_with_the_model_refitted_midway_and_reaches_the_goal(demo):
    """The blending tank's gain changes over its range: identify keeps the local procedure for its
    steady target (it settles closer on val data), the solve refits the model midway between the live
    state and the first target, and the true plant settles within the judge's 10 % of holding's error
    (a linear model's target from the live MVs leaves >= 0.084 there: bench/linear_floor.py)."""
    plant, spec = demo.plants["blend-1"], demo.plants["blend-1"].spec
    artifact = pipeline.load_artifact(demo.ledger, demo.ledger.get_binding("blend-1"))
    choice = artifact.selection["steady_model"]
    assert choice["procedure"] == "local" and choice["settled_nrmse"]["local"] < choice["settled_nrmse"]["global"]
    rec = demo.ledger.latest_recommendation("blend-1")
    doc, run = rec.document(), demo.ledger.get_run(rec.run_id)
    recorded = run.context["steady_model"]
    live = plant.history(SEED).live
    u_mean, u_std = artifact.normalisation.of(spec.mv_tags)
    first = (np.asarray(recorded["first_target"]) - u_mean) / u_std
    y_mean, y_std = artifact.normalisation.of(spec.cv_tags)
    split = pipeline.load_split(demo.ledger, demo.ledger.get_binding("blend-1"))
    settled_first = (np.asarray(recorded["first_settled"]) - y_mean) / y_std  # the first target's CVs
    fitter = local_fitter(artifact, pipeline.artifact_runs(artifact, split, "train"))
    _assert_region_of(recorded["operating_point"], fitter, ((live.u - u_mean) / u_std + first) / 2,
                      ((split.live.y[-1] - y_mean) / y_std + settled_first) / 2)
    assert recorded["effective_rows"] > 50 and recorded["procedure"] == "local"
    assert run.problem["model_artifact_hash"] == artifact.artifact_hash == doc["model_artifact_hash"]
    # the problem holds the refit at the recorded point, on the artifact's own train runs
    point = OperatingPoint(np.asarray(recorded["operating_point"]["u"]), np.asarray(recorded["operating_point"]["y"]))
    refit, _ = local_artifact(artifact, spec, fitter, point, 10_000)
    assert np.allclose(run.problem["model"]["B"], refit.state_space.B, rtol=1e-9, atol=1e-12)
    assert not np.allclose(run.problem["model"]["B"], artifact.state_space.B)
    # the same solve again in process: the same refit, and its steady-gain condition judged the refit's
    # gain uncertainty, not the artifact's
    stored, cache = demo.ledger.get_binding("blend-1"), SolverCache()
    solved = pipeline.solve_and_decide(spec, stored, artifact, split, pipeline.load_calibration(demo.ledger, artifact),
                                       lambda p: solve_problem(p, cache), Settings(), "simulation", utc_now(),
                                       outcomes=demo.ledger.list_verdicts(spec.id))
    assert solved.problem.to_dict()["model"] == run.problem["model"]
    (gain_row,) = [c for c in solved.decision.conditions if c.name == "steady-gain uncertainty along the planned move"]
    move = (np.asarray(doc["controls"][-1]) - u_mean) / u_std - (live.u - u_mean) / u_std
    spread = 2 * np.sqrt(np.einsum("a,iab,b->i", move, np.asarray(refit.steady_gain["uncertainty"]["jackknife_cov"]),
                                   move))
    worst = int(np.argmax(spread / np.asarray(doc["evidence"]["uq"]["qhat"])))
    assert gain_row.value.startswith(f"{spec.cv_tags[worst]}: {spread[worst] * y_std[worst]:.4g} against band")
    target = np.array([c.target for c in spec.cvs])
    scale = np.array([c.hi - c.lo for c in spec.cvs])
    settled = plant.apply_plan(live, np.repeat(np.asarray(doc["controls"]), 6 * spec.model.horizon, axis=0))[-1]
    held = plant.apply_plan(live, np.repeat(live.u[None, :], 6 * spec.model.horizon, axis=0))[-1]
    assert np.linalg.norm((settled - target) / scale) <= 0.1 * np.linalg.norm((held - target) / scale)
    assert np.all(np.abs(settled - np.asarray(doc["predicted"][-1])) <= np.asarray(doc["band"]))


def test_the_tank_move_plan_is_solved_with_the_model_refitted_midway_to_its_p_th_step(demo):
    """The four-tank plant's gains change with its levels: identify keeps the local procedure for its
    move plan too, the first solve's nominal plan at step P (where the band's claim ends) and the live
    state centre the refit, the problem holds that refit, its band is scored by the same procedure, and
    the true plant ends within the judge's 10 % of holding's error (the identified model alone: 0.08-0.11
    on the judge's seeds, BENCHMARKS.md)."""
    plant, spec = demo.plants["tanks-1"], demo.plants["tanks-1"].spec
    stored = demo.ledger.get_binding("tanks-1")
    artifact, split = pipeline.load_artifact(demo.ledger, stored), pipeline.load_split(demo.ledger, stored)
    assert artifact.selection["steady_model"]["procedure"] == "local"
    rec = demo.ledger.latest_recommendation("tanks-1")
    doc, run = rec.document(), demo.ledger.get_run(rec.run_id)
    assert doc["evidence"]["uq"]["score"] == "max_residual_local"
    recorded = run.context["steady_model"]
    assert recorded["procedure"] == "local" and recorded["effective_rows"] > 50
    # the first solve, by hand: the identified model's plan at step P
    calibration = pipeline.load_calibration(demo.ledger, artifact)
    first = solve_problem(compile_steered(spec, artifact, *current_state(artifact, split.live), split.live.u[-1],
                                          split.live.d[-1], np.asarray(calibration.evidence.qhat)), SolverCache())
    (nominal,) = [c for c in first.candidates if c.kind is CandidateKind.NOMINAL]
    P = artifact.horizon
    np.testing.assert_allclose(recorded["first_target"], nominal.controls[P - 1], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(recorded["first_settled"], nominal.predicted[P - 1], rtol=1e-6, atol=1e-9)
    u_mean, u_std = artifact.normalisation.of(spec.mv_tags)
    y_mean, y_std = artifact.normalisation.of(spec.cv_tags)
    fitter = local_fitter(artifact, pipeline.artifact_runs(artifact, split, "train"))
    _assert_region_of(recorded["operating_point"], fitter,
                      ((split.live.u[-1] - u_mean) / u_std + (nominal.controls[P - 1] - u_mean) / u_std) / 2,
                      ((split.live.y[-1] - y_mean) / y_std + (nominal.predicted[P - 1] - y_mean) / y_std) / 2)
    point = OperatingPoint(np.asarray(recorded["operating_point"]["u"]), np.asarray(recorded["operating_point"]["y"]))
    refit, _ = local_artifact(artifact, spec, fitter, point, 10_000)
    assert np.allclose(run.problem["model"]["B"], refit.state_space.B, rtol=1e-9, atol=1e-12)
    assert not np.allclose(run.problem["model"]["B"], artifact.state_space.B)
    # its end is held to the wider of the P-step band and the settled band of the same procedure
    cache = SolverCache()
    solved = pipeline.solve_and_decide(spec, stored, artifact, split, calibration, lambda p: solve_problem(p, cache),
                                       Settings(), "simulation", utc_now(), outcomes=())
    conditions = {c.name: c for c in solved.decision.conditions}
    assert conditions["settled evidence of the plan's end"].holds
    settled, _ = pipeline.settled_evidence(spec, artifact, split, Settings(), utc_now())
    assert settled.score == "settled_residual_local"
    wider = np.maximum(uq.band_engineering(calibration.evidence, artifact),
                       uq.band_engineering(settled, artifact)).tolist()
    [improvement] = improvement_conditions(spec, solved.result, solved.decision.chosen, wider,
                                           Settings().uq_max_band_fraction)
    assert conditions["band against the improvement over holding"] == improvement
    live = plant.history(SEED).live
    target, scale = np.array([c.target for c in spec.cvs]), np.array([c.hi - c.lo for c in spec.cvs])
    y_plan = plant.apply_plan(live, np.asarray(doc["controls"]))
    y_hold = plant.apply_plan(live, np.repeat(live.u[None, :], len(doc["controls"]), axis=0))
    assert np.linalg.norm((y_plan[-1] - target) / scale) <= 0.1 * np.linalg.norm((y_hold[-1] - target) / scale)


def test_the_economic_binding_earns_most_of_the_true_optimum_within_its_limits(demo, capsys):
    """blend-econ-1: conc held at 7 g/L, level only kept under 1.4 m, both feeds earn (negative
    costs). The true optimum of the nonlinear tank, from its balance equations: the level at its
    limit (throughput 6 sqrt(1.4) = 7.1 m3/h) with the feed ratio that gives 7 g/L."""
    from optimizer_pipeline.economics import economic_value

    plant = demo.plants["blend-econ-1"]
    spec = plant.spec
    live = plant.history(SEED).live
    doc = demo.ledger.latest_recommendation("blend-econ-1").document()
    assert doc["status"] == "verified", doc["reasons"]
    total = 6.0 * np.sqrt(1.4)
    rich = total * (7.0 - 2.0) / (10.0 - 2.0)  # 10 rich + 2 lean = 7 total
    best = economic_value(spec, [rich, total - rich], [7.0, 1.4])
    held = economic_value(spec, live.u, live.y)
    planned = economic_value(spec, doc["controls"][0], doc["predicted"][0])
    settled = plant.apply_plan(live, np.repeat(np.asarray(doc["controls"]), 6 * spec.model.horizon, axis=0))[-1]
    assert planned < held and (held - planned) >= 0.6 * (held - best), (held, planned, best)
    assert settled[1] <= 1.4 + 0.01  # the level limit holds on the true plant
    assert abs(settled[0] - 7.0) <= doc["band"][0]  # the target, within the band
    # the UI shows J at the plan's end (a plain number: Dagster's Plots tab draws it per partition) ...
    (record,) = demo.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=["blend-econ-1"]), limit=1).records
    assert record.asset_materialization.metadata["economic_value"].value == pytest.approx(planned, rel=1e-12)
    # ... and so does the CLI's description of the recommendation (its `main`, in this process: the
    # command as a process of its own is tests/test_cli.py's round trip)
    from test_cli import cli_main

    shown = cli_main(capsys, demo.home, "recommendation", "blend-econ-1")
    assert shown.returncode == 0, shown.stderr
    assert f"economic cost J at the plan's end: {planned:.6g}" in shown.stdout


def test_mpc_prediction_stays_inside_the_band_on_the_true_plant_within_p(demo):
    for binding_id in ("tanks-1", "heater-1"):
        plant = demo.plants[binding_id]
        live = plant.history(SEED).live
        doc = demo.ledger.latest_recommendation(binding_id).document()
        P = plant.spec.model.horizon
        y_plan = plant.apply_plan(live, np.asarray(doc["controls"]))[:P]
        inside = np.abs(y_plan - np.asarray(doc["predicted"])[:P]) <= np.asarray(doc["band"])
        assert inside.mean() >= 0.85, (binding_id, inside.mean())


def test_solve_job_alone_reuses_the_calibration_and_supersedes(demo):
    first = demo.ledger.latest_recommendation("heater-1")
    demo.run("heater-1", job="solve")
    second = demo.ledger.latest_recommendation("heater-1")
    assert second.id != first.id and second.status == "verified"
    assert demo.ledger.get_recommendation(first.id).status == "expired"
    assert second.model_artifact_hash == first.model_artifact_hash


def test_solve_job_plans_from_the_newest_live_sample(demo):
    plant = demo.plants["tanks-1"]
    frame = demo.ledger.history_frame("tanks-1", plant.spec.tags)  # as seeded: it ended when it was seeded
    live = frame[frame["run_id"] == frame.loc[frame["timestamp"].idxmax(), "run_id"]]
    period = plant.spec.sample_period_s
    later = live.tail(5).assign(timestamp=live["timestamp"].iloc[-1] + period * np.arange(1, 6))
    assert demo.ledger.append_samples("tanks-1", later, plant.spec.tags, "simulation") == 5 * len(plant.spec.tags)
    before = demo.ledger.latest_recommendation("tanks-1")
    demo.run("tanks-1", job="solve")
    after = demo.ledger.latest_recommendation("tanks-1")
    run_before, run_after = demo.ledger.get_run(before.run_id), demo.ledger.get_run(after.run_id)
    assert run_after.context["live_t"] == pytest.approx(later["timestamp"].iloc[-1])
    assert run_after.context["live_t"] > run_before.context["live_t"]
    assert after.model_artifact_hash == before.model_artifact_hash  # the model is reused, not refit


def test_a_cv_missing_in_the_newest_sample_is_refused_or_predicted_as_the_setting_allows(demo):
    """One rule for the newest sample: a CV without a value makes the plan unverified at once, naming the
    tag and the setting; with live.predict_missing: 1 the model's prediction stands in for it (the plan
    starts from it, the condition holds, saying so), close to the value the plant gave. CV values
    cleaning filled in within the live window are reported beside the conditions."""
    plant, stored = demo.plants["tanks-1"], demo.ledger.get_binding("tanks-1")
    spec = plant.spec
    frame = validate_history_frame(demo.ledger.history_frame(spec.id, spec.tags), spec, "test")
    newest = frame["timestamp"].idxmax()
    tag = spec.cv_tags[0]
    given = float(frame.loc[newest, tag])
    frame.loc[newest, tag] = np.nan
    frame.loc[newest - 7, spec.cv_tags[1]] = np.nan  # filled in by cleaning, inside the live window
    split = prepare_history(frame, spec)
    artifact = pipeline.load_artifact(demo.ledger, stored)
    calibration, cache = pipeline.load_calibration(demo.ledger, artifact), SolverCache()

    def solved(allowed: int):
        decided = pipeline.solve_and_decide(spec, stored, artifact, split, calibration,
                                            lambda p: solve_problem(p, cache),
                                            Settings(live_predict_missing=allowed, live_max_age_s=LIVE_AGE_S),
                                            "simulation", utc_now(), outcomes=())
        return decided.decision.recommendation, {c.name: c for c in decided.decision.conditions}

    refused, conditions = solved(0)
    assert refused.status.value == "unverified"
    assert not conditions["newest sample has every MV and CV"].holds
    assert (f"the newest sample has no value of {tag} (missing, or refused as bad by its source; 1 newest sample(s) "
            f"of a CV missing, live.predict_missing allows 0 newest sample(s) predicted)") in refused.reasons[0]
    assert refused.evidence["live_state"]["cvs"][tag] != pytest.approx(given)  # the state before it
    rode, conditions = solved(1)
    row = conditions["newest sample has every MV and CV"]
    assert row.holds and row.value == f"no value of {tag}, predicted by the model (1 of 1 allowed)"
    assert rode.status.value == "verified" and not rode.reasons
    predicted = rode.evidence["live_state"]["cvs"][tag]
    band = uq.band_engineering(calibration.evidence, artifact)[0]
    assert predicted != given and abs(predicted - given) <= band
    window = conditions["live window's CV samples measured"]
    assert window.holds and window.value.startswith(f"{spec.cv_tags[1]}: 1 of ")


def test_a_live_run_that_ended_eleven_months_ago_is_unverified_with_its_age(tmp_path):
    from datetime import timedelta

    from optimizer_pipeline import pipeline
    from optimizer_pipeline.contracts import iso_utc, utc_now
    from optimizer_pipeline.ledger import Ledger
    from optimizer_pipeline.plants import get_plant
    from optimizer_pipeline.settings import Settings
    from optimizer_pipeline.solver.solve import SolverCache, solve_problem

    plant = get_plant("heater")
    now = utc_now().replace(microsecond=0)
    ended = now - timedelta(days=335)
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.ingest(plant.spec, plant.history(SEED, end_at=ended.timestamp()).frame, "simulation")
    stored = ledger.get_binding(plant.spec.id)
    split = pipeline.prepare_split(ledger, stored)
    artifact = pipeline.identify_model(ledger, stored, split)
    calibration = pipeline.calibrate(ledger, artifact, pipeline.score_and_store(ledger, stored.spec, artifact, split),
                                     Settings(), now)
    cache = SolverCache()
    record = pipeline.recommend(stored, artifact, split, calibration, lambda p: solve_problem(p, cache), ledger,
                                Settings(), "simulation", now)
    rec = record.recommendation
    assert rec.status.value == "unverified"
    assert rec.reasons == (f"live state is 335 days old (last sample {iso_utc(ended)}); live.max_age_s allows 300 s",)
    live = split.live  # the live state's values are recorded beside its age, engineering units, by tag
    assert rec.evidence["live_state"] == {"last_sample_at": iso_utc(ended), "age_s": 335 * 86400.0, "max_age_s": 300.0,
                                          "mvs": dict(zip(plant.spec.mv_tags, live.u[-1].tolist())),
                                          "cvs": dict(zip(plant.spec.cv_tags, live.y[-1].tolist()))}
    (age,) = [c for c in record.conditions if c.name == "live state age"]
    assert (age.value, age.limit, age.holds) == ("335 days old", "<= 300 s (live.max_age_s)",
                                                 False)


def test_materializations_carry_plain_numbers_for_the_plots_tab(demo):
    """Dagster draws the history of numeric metadata per partition: coverage, qhat per CV, costs,
    input distance, gate values (issue 16, trends)."""
    from dagster import FloatMetadataValue

    events = {(e.asset_key.path[-1], e.partition): e.materialization.metadata
              for e in demo.result.get_asset_materialization_events()}
    for binding_id, plant in demo.plants.items():
        calibration, rec = events[("uq_calibration", binding_id)], events[("recommendation", binding_id)]
        for tag in plant.spec.cv_tags:
            assert isinstance(calibration[f"qhat_{tag}"], FloatMetadataValue)
        stored = demo.ledger.get_recommendation(rec["recommendation_id"].value)  # later tests solve again
        assert rec["cost"].value == pytest.approx(stored.payload["cost"])
        assert rec["input_distance"].value == pytest.approx(stored.payload["evidence"]["input_distance"])
        assert isinstance(rec["independent_cost"], FloatMetadataValue)
        assert isinstance(events[("model_artifact", binding_id)]["G1_value"], FloatMetadataValue)
