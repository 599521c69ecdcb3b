"""Outcomes end to end (issue 6): the heater demo materialized through real Dagster, its recommended
plan applied to the heater's own simulator (and to drifted copies), recorded with the `outcome`
command, judged by the `outcome_deltas` asset, watched by the `outcome_drift` sensor."""

import dataclasses
import json
import os
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from dagster import AssetKey, RunRequest, build_sensor_context, instance_for_test

from optimizer_pipeline import cli
from optimizer_pipeline.contracts import Outcome, Recommendation, RecommendationStatus, Template, iso_utc, utc_now
from optimizer_pipeline.outcomes import EVALUATION_SUFFIX, Observation, model_identity, record_outcome
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.resources.ledger import LedgerResource

from pipeline_fixtures import SEED, DemoHome, seed_home

APPLY_DELAY_S = 5.0  # the operator applies the plan a few seconds after it was published


@pytest.fixture(scope="module")
def heater(tmp_path_factory):
    plant = get_plant("heater")
    home = tmp_path_factory.mktemp("home")
    ledger = seed_home(home, [plant])
    with instance_for_test(temp_dir=str(tmp_path_factory.mktemp("dagster"))) as instance:
        instance.add_dynamic_partitions("bindings", [plant.spec.id])
        demo = DemoHome(home, ledger, instance, {plant.spec.id: plant}, in_process_solver=True)
        demo.run(plant.spec.id)
        demo.rec = ledger.latest_recommendation(plant.spec.id)
        demo.plant = plant
        demo.files = tmp_path_factory.mktemp("observed")
        yield demo


def observed_file(demo, name, plant=None, steps=None, seed=0, applied_at=None):
    """What `plant` (default: the nominal heater) does under the recommended plan from the demo's live
    state, as a history-format CSV: row 0 at applied_at (the state when the first move is made), row
    k + 1 at the end of step k, with the heater's measurement noise; MVs as the plan holds them."""
    plant = plant or demo.plant
    spec = plant.spec
    doc = demo.rec.payload
    live = plant.history(SEED).live
    controls = np.asarray(doc["controls"])[:steps]
    y = np.vstack([live.y, plant.apply_plan(live, controls)])
    y = y + np.random.default_rng(seed).standard_normal(y.shape) * np.asarray(plant.cv_noise)
    start = applied_at if applied_at is not None else demo.rec.created_at.timestamp() + APPLY_DELAY_S
    frame = {"run_id": "after-apply", "timestamp": [iso_utc(pd.Timestamp(start + k * spec.sample_period_s, unit="s"))
                                                   for k in range(len(y))]}
    u = np.vstack([controls, controls[-1:]])
    frame.update({tag: u[:, i] for i, tag in enumerate(spec.mv_tags)})
    frame.update({tag: y[:, j] for j, tag in enumerate(spec.cv_tags)})
    frame.update({tag: np.full(len(y), live.d[i]) for i, tag in enumerate(spec.dv_tags)})
    path = demo.files / f"{name}.csv"
    pd.DataFrame(frame).to_csv(path, index=False)
    return path


def run_outcome(demo, capsys, *args):
    code = cli.main(["--home", str(demo.home), "outcome", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def store_copy(demo, **changes):
    """A copy of the demo's recommendation stored as another recommendation (own id and run) of a
    copy of its binding: the ledger holds at most one open recommendation per binding, and the
    demo's own must stay open for the other tests."""
    doc = demo.rec.payload
    n = len(demo.ledger.list_recommendations())
    spec = demo.ledger.get_binding(doc["binding_id"]).spec
    copy = demo.ledger.upsert_binding(dataclasses.replace(spec, id=f"{spec.id}-copy{n}"))
    fields = {f.name: doc[f.name] for f in dataclasses.fields(Recommendation)}
    fields.update(id=f"rec-copy{n}", run_id=f"or-copy{n}", binding_id=copy.binding_id,
                  binding_revision=copy.revision, template=Template(doc["template"]),
                  status=RecommendationStatus(doc["status"]))
    fields.update(changes)
    rec = Recommendation(**fields)
    demo.ledger.insert_recommendation(rec, "simulation")
    return rec


def assert_refused(demo, capsys, args, *fragments):
    before = demo.ledger.counts()
    code, out, err = run_outcome(demo, capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert demo.ledger.counts() == before


# --------------------------------------------------------------------------- verdicts through the CLI


def test_plan_applied_to_the_heaters_own_simulator_is_confirmed(heater):
    path = observed_file(heater, "nominal")
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    proc = subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(heater.home), "outcome",
                           heater.rec.id, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["verdict"] == "confirmed", summary
    assert summary["trials"] == heater.plant.spec.model.horizon  # every step within P judged, one CV
    stored = [o for o in heater.ledger.list_outcomes(recommendation_id=heater.rec.id) if o.id == summary["outcome_id"]]
    assert stored[0].verdict == "confirmed"
    assert stored[0].applied_at.timestamp() == \
        pytest.approx(heater.rec.created_at.timestamp() + APPLY_DELAY_S, abs=1e-3)
    assert len(stored[0].delta["delta"]) == len(heater.rec.payload["predicted"])


@pytest.mark.parametrize("drift", [{"gain": 1.5}, {"tau": 2.0}], ids=["gain-1.5", "tau-2"])
def test_plan_applied_to_a_plant_changed_after_calibration_is_deviated(heater, capsys, drift):
    path = observed_file(heater, f"drift-{'-'.join(drift)}", plant=heater.plant.perturbed(**drift))
    code, out, err = run_outcome(heater, capsys, heater.rec.id, path)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["verdict"] == "deviated" and summary["p_value"] < 0.01, summary


def test_too_short_an_observation_is_inconclusive(heater, capsys):
    code, out, err = run_outcome(heater, capsys, heater.rec.id, observed_file(heater, "short", steps=3))
    assert code == 0, err
    summary = json.loads(out)
    assert summary["verdict"] == "inconclusive" and summary["steps_aligned"] == 3, summary


def test_one_recommendation_collects_several_outcomes(heater):
    before = len(heater.ledger.list_outcomes(recommendation_id=heater.rec.id))
    for seed in (1, 2):
        record_outcome(heater.ledger, heater.rec.id, observed_file(heater, f"again-{seed}", seed=seed))
    assert len(heater.ledger.list_outcomes(recommendation_id=heater.rec.id)) == before + 2


# --------------------------------------------------------------------------- refused, nothing written


def test_unknown_recommendation_is_refused(heater, capsys):
    assert_refused(heater, capsys, ["rec-0000000000000000", observed_file(heater, "unknown")],
                   "rec-0000000000000000", "not in the ledger")


def test_rejected_recommendation_is_refused(heater, capsys):
    rec = store_copy(heater, status=RecommendationStatus.REJECTED, controls=(), predicted=(), candidate_id=None)
    assert_refused(heater, capsys, [rec.id, observed_file(heater, "rejected")], rec.id, "rejected")


def test_recommendation_expired_before_it_was_applied_is_refused(heater, capsys):
    created = utc_now() - timedelta(minutes=30)
    rec = store_copy(heater, created_at=iso_utc(created), valid_until=iso_utc(created + timedelta(hours=1)))
    heater.ledger.expire(run_id=rec.run_id, reason="superseded (test)")
    late = (utc_now() + timedelta(minutes=1)).timestamp()
    assert_refused(heater, capsys, [rec.id, observed_file(heater, "late", applied_at=late)], rec.id, "expired at")


def test_recommendation_expired_after_it_was_applied_still_takes_the_outcome(heater, capsys):
    created = utc_now() - timedelta(minutes=30)
    rec = store_copy(heater, created_at=iso_utc(created), valid_until=iso_utc(created + timedelta(hours=1)))
    heater.ledger.expire(run_id=rec.run_id, reason="superseded (test)")
    path = observed_file(heater, "in-time", applied_at=created.timestamp() + 60)
    code, out, err = run_outcome(heater, capsys, rec.id, path)
    assert code == 0, err
    assert json.loads(out)["verdict"] == "confirmed"


def test_observed_file_failing_validation_is_refused(heater, capsys):
    path = observed_file(heater, "no-dv")
    pd.read_csv(path).drop(columns=["t_in"]).to_csv(path, index=False)
    assert_refused(heater, capsys, [heater.rec.id, path], str(path), "'t_in'")


def test_applied_at_that_is_not_iso_8601_is_refused(heater, capsys):
    assert_refused(heater, capsys, [heater.rec.id, observed_file(heater, "bad-time"), "--applied-at", "yesterday"],
                   "--applied-at", "yesterday")


# --------------------------------------------------------------------------- the asset


def test_outcome_deltas_judges_a_pending_observation_once(heater):
    spec = heater.plant.spec
    from optimizer_pipeline.data.ingest import read_history

    frame = read_history(observed_file(heater, "pending"), spec)
    observation = Observation.from_frame(frame, spec, "pending.csv")
    applied = iso_utc(pd.Timestamp(observation.t[0], unit="s"))
    pending = Outcome(id="out-pendingtest00001", recommendation_id=heater.rec.id, binding_id=spec.id,
                      applied_at=applied, observed=observation.to_dict(), delta={}, verdict=None)
    heater.ledger.insert_outcome(pending)

    heater.run(spec.id, job="outcomes")
    rows = {o.id: o for o in heater.ledger.list_outcomes(spec.id)}
    evaluation = rows[pending.id + EVALUATION_SUFFIX]
    assert evaluation.verdict == "confirmed" and evaluation.details["evaluates"] == pending.id
    metadata = heater.instance.get_latest_materialization_event(AssetKey("outcome_deltas")).asset_materialization.metadata
    assert metadata["outcomes_evaluated_now"].value == 1
    assert metadata["verdicts_confirmed"].value == sum(o.verdict == "confirmed" for o in rows.values())
    assert len(metadata["latest_deltas"].value.records) > 0
    assert "data:image/png;base64," in metadata["plot"].value  # predicted vs observed, shown in the UI

    count = heater.ledger.counts()["optimizer_outcomes"]
    heater.run(spec.id, job="outcomes")
    assert heater.ledger.counts()["optimizer_outcomes"] == count
    metadata = heater.instance.get_latest_materialization_event(AssetKey("outcome_deltas")).asset_materialization.metadata
    assert metadata["outcomes_evaluated_now"].value == 0


# --------------------------------------------------------------------------- the drift sensor (last: it recalibrates)


def tick(demo):
    defs = demo.defs()
    context = build_sensor_context(instance=demo.instance, definitions=defs,
                                   resources={"ledger": LedgerResource(home=str(demo.home))})
    return defs.resolve_sensor_def("outcome_drift")(context)


def test_deviated_outcomes_make_the_drift_sensor_request_one_recalibration(heater):
    drifted = heater.plant.perturbed(gain=1.5)
    newest = [record_outcome(heater.ledger, heater.rec.id, observed_file(heater, f"drift-{s}", plant=drifted, seed=s))
              for s in (3, 4)][-1]
    assert newest.verdict.value == "deviated"
    requests = tick(heater)
    assert [(r.partition_key, r.run_key) for r in requests] == [("heater-1", f"heater-1@{newest.id}")]
    assert isinstance(requests[0], RunRequest) and "deviated" in requests[0].tags["optimizer/reason"]

    heater.run("heater-1", job="recalibrate")  # what the request launches
    assert not isinstance(tick(heater), list)  # outcomes of the old calibration no longer count

    # ... but the recalibration identified the same model from the same runs and scores the same
    # val / test runs: its recommendations are not `verified` while that model's outcomes deviate
    heater.run("heater-1", job="solve")
    latest = heater.ledger.latest_recommendation("heater-1")
    before, after = (heater.ledger.get_artifact(r.model_artifact_hash) for r in (heater.rec, latest))
    assert latest.id != heater.rec.id and after.training_data_hash == before.training_data_hash
    assert after.coefficients == before.coefficients
    assert newest.details["model"] == model_identity(before)
    reason = [r for r in latest.payload["reasons"] if r.startswith("the plant disagrees with this model: ")]
    assert latest.status == "unverified" and len(reason) == 1 and "deviated" in reason[0], latest.payload["reasons"]
    # the heater's move plans are solved with a local refit, but not while the model's outcomes drift:
    # the refit would weigh the train rows of the plant the outcomes disagree with
    assert after.selection["steady_model"]["procedure"] == "local"
    assert heater.ledger.get_run(heater.rec.run_id).context["steady_model"]["procedure"] == "local"
    run = heater.ledger.get_run(latest.run_id)
    assert run.context["steady_model"] == {"procedure": "global", "refused": reason[0]}
    for matrix in ("A", "B", "C"):  # the problem holds the identified model's realisation
        np.testing.assert_allclose(run.problem["model"][matrix], getattr(after.state_space, matrix), rtol=1e-12)
