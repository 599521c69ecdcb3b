"""What-if solves (issue 17 item 3) on the demo plants, through the real ledger (DuckDB), solver
worker processes and Dagster: a what-if leaves the binding and its open recommendation as they are,
is recorded with its overrides and candidates, actually solves the overridden problem, is shown
beside the open recommendation (CLI table and JSON, launchpad observation), and a bad override is
refused with one line, exit code 2 and nothing written."""

import json

import numpy as np
import pytest
from dagster import AssetKey, AssetRecordsFilter, instance_for_test

from optimizer_pipeline import cli, whatif
from optimizer_pipeline.contracts import Outcome, OutcomeVerdict, binding_from_dict, iso_utc
from optimizer_pipeline.economics import economic_value
from optimizer_pipeline.outcomes import model_identity
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.solver.shared import kept_alive

from pipeline_fixtures import DemoHome, allow_live_age, seed_home

TOL = 1e-6


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """tanks-1 (move plan) and blend-1 (steady target) refreshed through Dagster with the worker pool.
    The module's solves share started worker pools (`kept_alive`, as the CLI's runs of one process do):
    real worker processes, started once per pool size rather than once per what-if or run."""
    home = tmp_path_factory.mktemp("home")
    plants = [get_plant("tanks"), get_plant("blend")]
    allow_live_age(home)  # its tests decide again minutes after the seeding on a loaded machine
    ledger = seed_home(home, plants)
    with kept_alive(), instance_for_test(temp_dir=str(tmp_path_factory.mktemp("dagster"))) as instance:
        instance.add_dynamic_partitions("bindings", [p.spec.id for p in plants])
        demo = DemoHome(home, ledger, instance, {p.spec.id: p for p in plants})
        for plant in plants:
            demo.run(plant.spec.id)
        yield demo


def run_cli(demo, capsys, *args):
    code = cli.main(["--home", str(demo.home), *args])
    out, err = capsys.readouterr()
    return code, out, err


def whatif_json(demo, capsys, binding_id, *overrides):
    code, out, err = run_cli(demo, capsys, "whatif", binding_id, *[a for o in overrides for a in ("--set", o)],
                             "--json")
    assert code == 0, err
    return json.loads(out)


def open_state(ledger, binding_id):
    """Everything a what-if must leave alone: the binding's revisions, its recommendations (rows as
    stored, so status, expiry and payload included) and which one is latest."""
    return (ledger.binding_revisions(binding_id), ledger.list_recommendations(binding_id),
            ledger.latest_recommendation(binding_id).id)


# ---------------------------------------------------------------------------- the open recommendation is untouched


def test_a_whatif_leaves_the_binding_and_its_open_recommendation_untouched(demo, capsys):
    before = open_state(demo.ledger, "tanks-1")
    rec = demo.ledger.latest_recommendation("tanks-1")
    assert rec.status == "verified" and rec.expired_at is None

    doc = whatif_json(demo, capsys, "tanks-1", "cvs.y1.hi=9.0", "mvs.v1.max_move=0.2")

    assert open_state(demo.ledger, "tanks-1") == before
    assert doc["open"]["id"] == rec.id and doc["open"]["status"] == "verified"
    code, out, err = run_cli(demo, capsys, "recommendation", "tanks-1", "--json")
    assert code == 0, err
    assert json.loads(out)["id"] == rec.id and json.loads(out)["status"] == "verified"


def test_a_normal_solve_after_a_whatif_supersedes_the_open_recommendation_as_usual(demo, capsys):
    whatif_json(demo, capsys, "blend-1", "cvs.conc.target=6.5")
    before = demo.ledger.latest_recommendation("blend-1")
    demo.run("blend-1", job="solve")
    after = demo.ledger.latest_recommendation("blend-1")
    assert after.id != before.id and after.status == "verified"
    assert demo.ledger.get_recommendation(before.id).status == "expired"


# ---------------------------------------------------------------------------- what is recorded


def test_a_whatif_is_recorded_with_its_overrides_spec_and_candidates(demo, capsys):
    doc = whatif_json(demo, capsys, "tanks-1", "cvs.y2.hi=7.3", "cvs.y2.target=7.2", "profile.horizon=30")
    record = demo.ledger.get_whatif(doc["whatif_run_id"])
    assert record.overrides == [{"path": "cvs.y2.hi", "value": 7.3}, {"path": "cvs.y2.target", "value": 7.2},
                                {"path": "profile.horizon", "value": 30}]
    spec = binding_from_dict(record.spec)
    assert (spec.cvs[1].hi, spec.cvs[1].target, spec.profile.horizon) == (7.3, 7.2, 30)
    assert spec.cvs[0] == demo.plants["tanks-1"].spec.cvs[0]  # what was not overridden is the stored spec's
    assert (record.binding_revision, record.requested_by, record.dagster_run_id) == (1, "cli", None)
    assert record.compared_recommendation_id == demo.ledger.latest_recommendation("tanks-1").id

    run = demo.ledger.get_run(record.run_id)
    candidates = demo.ledger.list_candidates(run_id=record.run_id)
    assert run.status == "succeeded" and run.context["whatif"] is True
    assert run.problem_ir_hash == record.result["problem_ir_hash"] != doc["open"]["problem_ir_hash"]
    assert [c.kind for c in candidates] == ["hold", "nominal", "robust"]
    assert record.result["candidate_id"] in {c.id for c in candidates}
    chosen = next(c for c in candidates if c.id == record.result["candidate_id"])
    assert chosen.controls == record.result["controls"] and len(chosen.controls) == 30
    assert doc["whatif"]["controls"] == record.result["controls"]
    assert [o["stored"] for o in doc["overrides"]] == [9.5, 7.5, 50]


# ---------------------------------------------------------------------------- the overrides are solved


def test_a_tightened_cv_limit_is_respected_by_the_whatifs_predicted_cvs(demo, capsys):
    doc = whatif_json(demo, capsys, "tanks-1", "cvs.y2.hi=7.3", "cvs.y2.target=7.2")
    whatif_y2 = np.asarray(doc["whatif"]["predicted"])[:, 1]
    open_y2 = np.asarray(doc["open"]["predicted"])[:, 1]
    assert open_y2.max() > 7.4  # the stored limits let the open plan go there
    assert whatif_y2.max() <= 7.3 + TOL and abs(whatif_y2[-1] - 7.2) < 0.01
    assert doc["whatif"]["status"] == "verified", doc["whatif"]["reasons"]


def test_a_lowered_mv_limit_is_respected_by_the_whatifs_plan(demo, capsys):
    open_doc = demo.ledger.latest_recommendation("tanks-1").document()
    open_v2 = np.asarray(open_doc["controls"])[:, 1]
    limit = round(float(open_v2.max()) - 0.1, 3)  # the open plan holds v2 above it at least once
    doc = whatif_json(demo, capsys, "tanks-1", f"mvs.v2.hi={limit}", "mvs.v2.max_move=0.5")
    assert np.asarray(doc["whatif"]["controls"])[:, 1].max() <= limit + TOL
    assert open_v2.max() > limit + 0.05


def test_costs_and_a_dropped_target_move_the_steady_target_to_a_cheaper_point(demo, capsys):
    overrides = ("mvs.f_rich.cost=2", "mvs.f_lean.cost=0.5", "cvs.level.target=none")
    doc = whatif_json(demo, capsys, "blend-1", *overrides)
    spec = binding_from_dict(demo.ledger.get_whatif(doc["whatif_run_id"]).spec)
    assert spec.cvs[1].target is None and spec.mvs[0].cost == 2.0
    ours, theirs = doc["whatif"], doc["open"]
    assert ours["economic_value"] == pytest.approx(economic_value(spec, ours["controls"][-1], ours["predicted"][-1]))
    assert theirs["economic_value"] == pytest.approx(economic_value(spec, theirs["controls"][-1],
                                                                   theirs["predicted"][-1]))
    assert ours["economic_value"] < theirs["economic_value"] - 0.1  # valued with the same (what-if) costs
    level = demo.plants["blend-1"].spec.cvs[1]
    assert level.lo - TOL <= ours["predicted"][-1][1] <= level.hi + TOL


def test_without_costs_the_economic_value_is_null_on_both_sides(demo, capsys):
    doc = whatif_json(demo, capsys, "tanks-1", "profile.move_weight=0.5")
    assert doc["whatif"]["economic_value"] is None and doc["open"]["economic_value"] is None


# ---------------------------------------------------------------------------- shown side by side


def test_the_cli_table_shows_both_sides_row_by_row(demo, capsys):
    code, out, err = run_cli(demo, capsys, "whatif", "tanks-1", "--set", "cvs.y2.hi=7.3", "--set", "cvs.y2.target=7.2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    rec = demo.ledger.latest_recommendation("tanks-1")
    (record,) = [w for w in demo.ledger.list_whatifs("tanks-1") if w.run_id in lines[0]]
    assert f"open {rec.id}" in lines[1] and f"what-if {record.run_id}" in lines[1]
    rows = {line.split("  ")[1].strip(): line for line in lines[2:] if line.startswith("  ") and "  " in line[2:]}
    assert rows["cvs.y2.hi"].split()[1:] == ["9.5", "7.3"]
    assert rows["status"].split()[1:] == ["verified", record.result["status"]]
    end = rows["CV y2 end of plan"].split()
    assert float(end[5]) == pytest.approx(rec.document()["predicted"][-1][1], abs=1e-3)
    assert float(end[7]) == pytest.approx(record.result["predicted"][-1][1], abs=1e-3)
    assert "economic value" in out


# ---------------------------------------------------------------------------- bad overrides


@pytest.mark.parametrize("override, message", [
    ("cvs.y9.hi=1", "override 'cvs.y9.hi=1': binding tanks-1 has no CV 'y9' (its CVs: y1, y2)"),
    ("mvs.y1.hi=1", "override 'mvs.y1.hi=1': binding tanks-1 has no MV 'y1' (its MVs: v1, v2); 'y1' is a CV: cvs.y1"),
    ("cvs.y1.gain=2", "override 'cvs.y1.gain=2': unknown CV field 'gain' (known: lo, hi, target, weight, cost, "
                      "cost_quadratic)"),
    ("mvs.v1.target=2", "override 'mvs.v1.target=2': unknown MV field 'target' (known: lo, hi, max_move, cost, "
                        "cost_quadratic)"),
    ("profile.template=steady", "override 'profile.template=steady': unknown profile field 'template' (known: "
                                "horizon, move_weight)"),
    ("cvs.y1.lo=9.9", "override 'cvs.y1.lo=9.9': cvs.y1: lo (9.9) must be < hi (9.5)"),
    ("mvs.v1.hi=0.5", "override 'mvs.v1.hi=0.5': mvs.v1: lo (0.5) must be < hi (0.5)"),
    ("cvs.y1.target=9.6", "override 'cvs.y1.target=9.6': cvs.y1.target: must be from 2 to 9.5, got 9.6"),
    ("cvs.y1.hi=6.5", "override 'cvs.y1.hi=6.5': cvs.y1.target: must be from 2 to 6.5, got 7.0"),
    ("cvs.y1.hi=abc", "override 'cvs.y1.hi=abc': expected a finite number, got 'abc'"),
    ("cvs.y1.hi=nan", "override 'cvs.y1.hi=nan': expected a finite number, got 'nan'"),
    ("mvs.v1.max_move=none", "override 'mvs.v1.max_move=none': expected a finite number, got 'none'"),
    ("mvs.v1.max_move=0", "override 'mvs.v1.max_move=0': mvs.v1.max_move: must be > 0, got 0.0"),
    ("mvs.v1.cost_quadratic=-1", "override 'mvs.v1.cost_quadratic=-1': mvs.v1.cost_quadratic: must be >= 0, "
                                 "got -1.0"),
    ("profile.horizon=2.5", "override 'profile.horizon=2.5': expected an integer, got '2.5'"),
    ("cvs.y1.hi", "override 'cvs.y1.hi': expected PATH=VALUE with PATH mvs.<tag>.<field>, cvs.<tag>.<field> or "
                  "profile.<field> (e.g. cvs.y1.hi=9.8)"),
    ("cvs.hi=9", "override 'cvs.hi=9': expected cvs.<tag>.<field>, got 'cvs.hi'"),
    ("dvs.d1.lo=1", "override 'dvs.d1.lo=1': unknown section 'dvs'; did you mean 'mvs'? (known: mvs, cvs, profile)"),
    ("profle.horizon=3", "override 'profle.horizon=3': unknown section 'profle'; did you mean 'profile'? (known: mvs, "
                         "cvs, profile)"),
    ("zz.y1.hi=3", "override 'zz.y1.hi=3': unknown section 'zz' (known: mvs, cvs, profile)"),
    ("cvs.y1.targte=7", "override 'cvs.y1.targte=7': unknown CV field 'targte'; did you mean 'target'? (known: lo, hi, "
                        "target, weight, cost, cost_quadratic)"),
    ("cvs.Y1.hi=9", "override 'cvs.Y1.hi=9': binding tanks-1 has no CV 'Y1'; did you mean 'y1'? (its CVs: y1, y2)"),
    ("cvs.y1.hi=", "override 'cvs.y1.hi=': no value after '='"),
])
def test_a_bad_override_is_refused_with_one_line_and_nothing_written(demo, capsys, override, message):
    before = demo.ledger.counts()
    code, out, err = run_cli(demo, capsys, "whatif", "tanks-1", "--set", "cvs.y2.hi=9.0", "--set", override)
    assert (code, out, err) == (2, "", f"error: {message}\n")
    assert demo.ledger.counts() == before


def test_conflicting_overrides_are_named_together_and_a_path_given_twice_is_refused(demo, capsys):
    before = demo.ledger.counts()
    code, _, err = run_cli(demo, capsys, "whatif", "tanks-1", "--set", "cvs.y1.lo=8", "--set", "mvs.v1.hi=4",
                           "--set", "cvs.y1.hi=7.5")
    assert (code, err) == (2, "error: overrides 'cvs.y1.lo=8', 'cvs.y1.hi=7.5': cvs.y1: lo (8) must be < hi (7.5)\n")
    code, _, err = run_cli(demo, capsys, "whatif", "tanks-1", "--set", "cvs.y1.hi=9", "--set", "cvs.y1.hi=8")
    assert (code, err) == (2, "error: override 'cvs.y1.hi=8': cvs.y1.hi is already set by 'cvs.y1.hi=9'\n")
    assert demo.ledger.counts() == before


def test_an_unknown_binding_or_no_override_is_refused_with_one_line(demo, capsys):
    before = demo.ledger.counts()
    code, _, err = run_cli(demo, capsys, "whatif", "nope-1", "--set", "cvs.y1.hi=9")
    assert code == 2 and err.startswith("error: binding 'nope-1' is not in the ledger") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--home", str(demo.home), "whatif", "tanks-1"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert demo.ledger.counts() == before


def test_a_binding_without_a_model_yet_is_refused_naming_what_to_run_first(demo, capsys):
    plant = get_plant("heater")
    demo.ledger.ingest(plant.spec, plant.history(1).frame, "simulation")
    before = demo.ledger.counts()
    code, out, err = run_cli(demo, capsys, "whatif", "heater-1", "--set", "cvs.t_out.hi=70")
    assert (code, out) == (2, "")
    assert err == ("error: binding heater-1 revision 1: no model artifact in the ledger; materialize model_artifact "
                   "(job recalibrate or refresh) first\n")
    assert demo.ledger.counts() == before


# ---------------------------------------------------------------------------- the launchpad: the solve job's run config


def whatif_run_config(*overrides):
    return {"ops": {"binding_stages": {"config": {"whatif": list(overrides)}}}}


def recommendation_materializations(demo, binding_id):
    return demo.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=[binding_id]), limit=100).records


def test_the_solve_job_with_whatif_run_config_records_a_whatif_and_observes_it(demo):
    before, materialized = open_state(demo.ledger, "tanks-1"), len(recommendation_materializations(demo, "tanks-1"))
    job = demo.defs().resolve_job_def("solve")
    result = job.execute_in_process(instance=demo.instance, partition_key="tanks-1",
                                    run_config=whatif_run_config("cvs.y2.hi=7.3", "cvs.y2.target=7.2"))
    assert result.success
    (record,) = demo.ledger.list_whatifs(dagster_run_id=result.run_id)
    assert (record.binding_id, record.requested_by) == ("tanks-1", "dagster")
    assert record.overrides == [{"path": "cvs.y2.hi", "value": 7.3}, {"path": "cvs.y2.target", "value": 7.2}]
    assert max(row[1] for row in record.result["predicted"]) <= 7.3 + TOL
    assert open_state(demo.ledger, "tanks-1") == before
    assert len(recommendation_materializations(demo, "tanks-1")) == materialized
    assert result.get_asset_materialization_events() == []
    observations = demo.instance.fetch_observations(
        AssetRecordsFilter(asset_key=AssetKey("recommendation"), asset_partitions=["tanks-1"]), limit=100).records
    (mine,) = [o for o in observations if o.run_id == result.run_id]
    metadata = mine.asset_observation.metadata
    assert mine.partition_key == "tanks-1" and metadata["whatif_run_id"].value == record.run_id
    assert metadata["compared_with"].value == before[2]
    side = {r.data["row"]: r.data for r in metadata["side_by_side"].value.records}
    assert (side["cvs.y2.hi"]["open"], side["cvs.y2.hi"]["what_if"]) == ("9.5", "7.3")
    assert (side["status"]["open"], side["status"]["what_if"]) == ("verified", record.result["status"])
    plot = metadata["plot"].value  # the what-if's plan, the open one dashed beside it: a PNG inline
    assert plot.startswith("![tanks-1: what-if plan](data:image/png;base64,") and len(plot) > 5000


def test_the_solve_job_refuses_a_bad_whatif_config_with_its_line_and_writes_nothing(demo):
    before = demo.ledger.counts()
    job = demo.defs().resolve_job_def("solve")
    result = job.execute_in_process(instance=demo.instance, partition_key="tanks-1", raise_on_error=False,
                                    run_config=whatif_run_config("cvs.y1.hi=1"))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "what-if of tanks-1: override 'cvs.y1.hi=1': cvs.y1: lo (2) must be < hi (1)" in \
        failure.step_failure_data.error.message
    assert demo.ledger.counts() == before


def test_whatif_config_is_refused_on_the_refresh_job(demo):
    before = demo.ledger.counts()
    result = demo.defs().resolve_job_def("refresh").execute_in_process(
        instance=demo.instance, partition_key="tanks-1", raise_on_error=False,
        run_config=whatif_run_config("cvs.y1.hi=9"))
    assert not result.success and demo.ledger.counts() == before


# ---------------------------------------------------------------------------- the overrides alone


def test_overrides_change_only_their_fields_and_leave_the_stored_spec_alone():
    spec = get_plant("tanks").spec
    overrides, changed = whatif.whatif_spec(spec, [" cvs.y1.hi = 9.0 ", "mvs.v2.cost=-1.5", "cvs.y2.target=none",
                                                   "profile.horizon=20"])
    assert [o.path for o in overrides] == ["cvs.y1.hi", "mvs.v2.cost", "cvs.y2.target", "profile.horizon"]
    assert (changed.cvs[0].hi, changed.mvs[1].cost, changed.cvs[1].target, changed.profile.horizon) == \
        (9.0, -1.5, None, 20)
    assert changed.mvs[0] == spec.mvs[0] and changed.model == spec.model and changed.id == spec.id
    assert get_plant("tanks").spec == spec and spec.cvs[0].hi == 9.5


def test_a_tag_with_dots_is_found_by_its_last_dot(binding_doc):
    binding_doc["cvs"][0]["tag"] = "FIC101.PV"
    spec = binding_from_dict(binding_doc)
    (override,), changed = whatif.whatif_spec(spec, ["cvs.FIC101.PV.hi=9"])
    assert (override.tag, override.field, changed.cvs[0].hi) == ("FIC101.PV", "hi", 9.0)


def test_the_ledger_command_marks_whatif_runs_and_lists_their_overrides(demo, capsys):
    doc = whatif_json(demo, capsys, "tanks-1", "cvs.y1.hi=9.1")
    code, out, err = run_cli(demo, capsys, "ledger", "--binding", "tanks-1")
    assert code == 0, err
    run_id = doc["whatif_run_id"]
    [run_line] = [line for line in out.splitlines() if line.strip().startswith(run_id) and "@r" in line
                  and "what-if" in line and "cvs." not in line]
    assert run_line.rstrip().endswith("what-if")
    [whatif_line] = [line for line in out.splitlines() if line.strip().startswith(run_id) and "cvs.y1.hi=9.1" in line]
    assert f"beside {doc['open']['id']}" in whatif_line
    candidates = demo.ledger.list_candidates(binding_id="tanks-1")
    marked = {line.split()[0] for line in out.splitlines() if line.strip().startswith("oc-") and
              line.rstrip().endswith("what-if")}
    whatif_runs = {w.run_id for w in demo.ledger.list_whatifs("tanks-1")}  # earlier tests' what-ifs too
    assert {c.id for c in candidates if c.run_id == run_id} <= marked
    assert marked == {c.id for c in candidates if c.run_id in whatif_runs} != {c.id for c in candidates}
    ordinary = [r.id for r in demo.ledger.list_runs("tanks-1") if r.id not in {w.run_id for w in
                                                                               demo.ledger.list_whatifs("tanks-1")}]
    assert ordinary and all("what-if" not in line for line in out.splitlines() if line.strip().startswith(ordinary[0]))
    code, out, err = run_cli(demo, capsys, "ledger", "--binding", "tanks-1", "--json")
    whatifs = json.loads(out)["whatifs"]
    assert any(w["run_id"] == run_id and w["overrides"] == [{"path": "cvs.y1.hi", "value": 9.1}] for w in whatifs)


# ---------------------------------------------------------------------------- last: it records outcomes


def test_a_whatif_is_decided_with_the_models_own_outcomes_like_a_normal_solve(demo, capsys):
    """Two deviated outcomes of the model behind tanks-1's open recommendation (stored directly, as
    outcomes.evaluate_row records them): the what-if's decision is `unverified` naming the drift,
    as a normal solve's would be; the open recommendation stays as it was."""
    rec = demo.ledger.latest_recommendation("tanks-1")
    model = model_identity(demo.ledger.get_artifact(rec.model_artifact_hash))
    for i in range(2):
        demo.ledger.insert_outcome(Outcome(
            id=f"out-drifted-{i}", recommendation_id=rec.id, binding_id="tanks-1", applied_at=iso_utc(rec.created_at),
            observed={}, delta={}, verdict=OutcomeVerdict.DEVIATED,
            details={"hits": 3, "trials": 10, "promised_rate": 0.9, "model": model}))
    doc = whatif_json(demo, capsys, "tanks-1", "cvs.y1.hi=9.2")
    assert doc["open"]["id"] == rec.id and doc["open"]["status"] == rec.status
    assert doc["whatif"]["status"] == "unverified"
    assert [r for r in doc["whatif"]["reasons"] if r.startswith("the plant disagrees with this model: ")] == [
        "the plant disagrees with this model: 2 of the last 2 outcomes of tanks-1 deviated from the prediction "
        "(newest out-drifted-1)"]
