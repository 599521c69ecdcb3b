"""The step-response matrix (model/step_response.py): recovered on the demo plants against their
simulators, exact on a hand-built state space, the RGA against textbook values, the artifact field
(old artifacts stay readable with their hash) and the `model` command (issue 17, item 1)."""

import dataclasses
import json

import numpy as np
import pytest

from optimizer_pipeline import pipeline
from optimizer_pipeline.cli import main
from optimizer_pipeline.contracts import (ModelArtifact, Normalisation, StateSpace, binding_from_dict, canonical_json,
                                          content_hash)
from optimizer_pipeline.model.step_response import (INVERSE, MAX_STEPS, PSEUDO_INVERSE, dead_time_steps, gain_condition,
                                                    relative_gain_array, singular_values, step_response_record,
                                                    step_response_table)
from optimizer_pipeline.plants import QuadrupleTank, demo_plants

from pipeline_fixtures import seed_home


@pytest.fixture(scope="module")
def identified(tmp_path_factory):
    """The demo plants' histories (pipeline_fixtures.SEED) in a real DuckDB ledger, each identified by the
    pipeline stage: (home, ledger, {binding id: (plant, split, artifact)})."""
    home = tmp_path_factory.mktemp("home")
    ledger = seed_home(home)
    models = {}
    for plant in demo_plants():
        stored = ledger.get_binding(plant.spec.id)
        split = pipeline.prepare_split(ledger, stored)
        models[plant.spec.id] = plant, split, pipeline.identify_model(ledger, stored, split)
    return home, ledger, models


@pytest.fixture(scope="module")
def models(identified):
    return identified[2]


def operating_point(plant, split):
    """The train data's mean MVs and DVs: the point the linear model is centred on."""
    return split.normalisation.of(plant.spec.mv_tags)[0], split.normalisation.of(plant.spec.dv_tags)[0]


def true_gains(plant, split) -> np.ndarray:
    """(ny, nu + nd) steady gains of the simulator by central differences of its analytic steady state."""
    u0, d0 = operating_point(plant, split)
    columns = []
    for k, size in ((0, len(u0)), (1, len(d0))):
        for j in range(size):
            point, step = [u0.copy(), d0.copy()], 1e-4 * max(1.0, abs((u0, d0)[k][j]))
            point[k][j] += step
            up = plant.steady_output(*point)
            point[k][j] -= 2 * step
            columns.append((up - plant.steady_output(*point)) / (2 * step))
    return np.array(columns).T


def true_step_responses(plant, split, steps: int) -> np.ndarray:
    """(ny, nu + nd, steps) noise-free simulator responses to a small step of each input from the
    equilibrium at the operating point, per unit of the input."""
    u0, d0 = operating_point(plant, split)
    x0 = plant.equilibrium(u0, d0)
    out = []
    for k, size in ((0, len(u0)), (1, len(d0))):
        for j in range(size):
            held = [np.tile(u0, (steps, 1)), np.tile(d0, (steps, 1))]
            step = 1e-3 * max(1.0, abs((u0, d0)[k][j]))
            held[k][:, j] += step
            _, y = plant.simulate(x0, held[0], held[1], noise=False)
            out.append((y[1:] - y[0]) / step)
    return np.array(out).transpose(2, 0, 1)


# --------------------------------------------------------------------------- the demo plants


def test_the_matrix_recovers_the_simulators_gains_within_two_standard_errors(models):
    for plant, split, artifact in models.values():
        record = artifact.step_response
        truth = true_gains(plant, split)
        assert record["input_tags"] == list(plant.spec.mv_tags + plant.spec.dv_tags)
        assert record["uncertainty"]["replicates"] == len(split.train)
        for p, g in zip(record["pairs"], truth.ravel()):
            assert 0 < p["gain_se"] < 0.05 * abs(g), (plant.name, p["cv"], p["input"])
            assert abs(p["gain"] - g) <= 2 * p["gain_se"], (plant.name, p["cv"], p["input"], p["gain"], g)


def test_the_matrix_recovers_the_simulators_dead_times(models):
    """Heater: its 4-sample pipe behind a first-order tank (power and inlet temperature both pass it).
    The others have no transport delay; a higher-order lag (the quadruple tank's cross channels, through
    an upper tank) has an apparent dead time, which is compared with the simulator's by the same rule.
    Allowance: 2 standard errors plus half a sample (the ARX(2, 2) model of a 4-tank plant
    approximates the cross channels' first samples)."""
    plant, split, artifact = models["heater-1"]
    for p in artifact.step_response["pairs"]:
        assert abs(p["dead_time_steps"] - plant.delay_samples) <= 2 * p["dead_time_se_steps"] + 1e-9
        assert p["dead_time_s"] == pytest.approx(p["dead_time_steps"] * plant.sample_period_s)
    for plant, split, artifact in models.values():
        record = artifact.step_response
        truth = dead_time_steps(true_step_responses(plant, split, record["steps"]))
        for p, theta in zip(record["pairs"], truth.ravel()):
            assert abs(p["dead_time_steps"] - theta) <= 2 * p["dead_time_se_steps"] + 0.5, \
                (plant.name, p["cv"], p["input"], p["dead_time_steps"], theta)
    heater, split, _ = models["heater-1"]  # the rule gives the simulator's own pipe
    np.testing.assert_allclose(dead_time_steps(true_step_responses(heater, split, 30)), [[4.0, 4.0]], atol=0.05)


def test_mv_gains_and_their_standard_errors_are_the_steady_gain_record_in_engineering_units(models):
    for plant, split, artifact in models.values():
        record, steady = artifact.step_response, artifact.steady_gain
        _, su = split.normalisation.of(plant.spec.mv_tags)
        _, sy = split.normalisation.of(plant.spec.cv_tags)
        scale = sy[:, None] / su[None, :]
        nu, n_in = len(su), len(record["input_tags"])
        gain = np.array([p["gain"] for p in record["pairs"]]).reshape(-1, n_in)[:, :nu]
        se = np.array([p["gain_se"] for p in record["pairs"]]).reshape(-1, n_in)[:, :nu]
        spread = np.array([p["gain_spread"] for p in record["pairs"]]).reshape(-1, n_in)[:, :nu]
        uncertainty = steady["uncertainty"]
        np.testing.assert_allclose(gain, np.asarray(steady["gain"]) * scale, rtol=1e-10)
        np.testing.assert_allclose(se, np.asarray(uncertainty["jackknife_std"]) * scale, rtol=1e-8)
        np.testing.assert_allclose(spread, np.asarray(uncertainty["operating_range"]["std"]) * scale, rtol=1e-8)
        assert record["gain_spread_points"] == uncertainty["operating_range"]["points"] > 0
        # the steady gain's standard error is both parts together
        np.testing.assert_allclose(np.asarray(uncertainty["std"]) * scale, np.hypot(se, spread), rtol=1e-8)
        np.testing.assert_allclose(record["mv_gain"]["gain"], gain, rtol=1e-12)


def test_the_responses_settle_on_their_gains_and_the_quadruple_tank_rga_is_johanssons(models):
    for plant, split, artifact in models.values():
        record = artifact.step_response
        assert record["steps"] == min(MAX_STEPS, 2 * record["model_settling_steps"])
        for p in record["pairs"]:
            tail = np.asarray(p["response"][p["settling_steps"] - 1:])
            assert np.all(np.abs(tail - p["gain"]) <= 0.05 * abs(p["gain"]))
            assert abs(p["response"][p["settling_steps"] - 2] - p["gain"]) > 0.05 * abs(p["gain"])
            assert len(p["response"]) == len(p["response_se"]) == record["steps"]
    # Johansson (2000): the minimum-phase quadruple tank's RGA lambda = g1 g2 / (g1 + g2 - 1)
    g1, g2 = QuadrupleTank.gamma
    lam = g1 * g2 / (g1 + g2 - 1)  # 1.4
    plant, split, artifact = models["tanks-1"]
    assert relative_gain_array(true_gains(plant, split))[0][0, 0] == pytest.approx(lam)
    rga = np.asarray(artifact.step_response["mv_gain"]["rga"])
    np.testing.assert_allclose(rga, [[lam, 1 - lam], [1 - lam, lam]], atol=0.05)
    assert artifact.step_response["mv_gain"]["rga_method"] == INVERSE


# --------------------------------------------------------------------------- a hand-built model


HAND_DOC = {
    "id": "hand", "sample_period_s": 10, "mvs": [{"tag": "u", "lo": -10, "hi": 10, "max_move": 1}],
    "cvs": [{"tag": "y1", "lo": -10, "hi": 10, "target": 0}, {"tag": "y2", "lo": -10, "hi": 10, "target": 0}],
    "dvs": [{"tag": "d"}], "model": {"horizon": 5}, "profile": {"id": "p", "template": "linear_mpc_quadratic@1"}}
HAND_SPEC = binding_from_dict(HAND_DOC)


def hand_built() -> tuple[StateSpace, list[StateSpace], Normalisation]:
    """x1+ = 0.5 x1 + x3, x2+ = 0.8 x2 + 0.2 d, x3+ = u (one sample of dead time); y1 = x1 + x2, y2 = 2 x1.
    Unit steps (normalised units), response[k] at the end of step k:
      u -> y1: 2 (1 - 0.5^k) = 0, 1, 1.5, 1.75 ...; gain 2      u -> y2: twice that; gain 4
      d -> y1: 1 - 0.8^(k+1) = 0.2, 0.36, 0.488 ...; gain 1     d -> y2: 0
    Engineering units: std y1 and y2 2, u 4, d 0.5, so scales 0.5 from u and 4 from d."""
    A = [[0.5, 0, 1], [0, 0.8, 0], [0, 0, 0]]
    C = [[1, 1, 0], [2, 0, 0]]

    def model(b: float) -> StateSpace:
        return StateSpace.of(A, [[0], [0], [b]], [[0], [0.2], [0]], [0.3, -0.1, 0], C)  # f: an offset that cancels

    norm = Normalisation(("u", "y1", "y2", "d"), (5.0, 1.0, -2.0, 3.0), (4.0, 2.0, 2.0, 0.5))
    return model(1.0), [model(0.9), model(1.0), model(1.1)], norm


def test_a_hand_built_state_space_gives_its_worked_out_step_responses():
    ss, replicates, norm = hand_built()
    record = step_response_record(ss, replicates, HAND_SPEC, norm)
    # settling horizon of the model: y1 within 5 % of 2 (its largest gain) once d -> y1 is (0.8^11 < 0.1 <
    # 0.8^10): after 11 steps; the matrix shows twice that
    assert (record["model_settling_steps"], record["steps"]) == (11, 22)
    pairs = {(p["cv"], p["input"]): p for p in record["pairs"]}
    assert list(pairs) == [("y1", "u"), ("y1", "d"), ("y2", "u"), ("y2", "d")]
    uy1, dy1, uy2, dy2 = pairs.values()
    np.testing.assert_allclose(uy1["response"][:4], [0.0, 0.5, 0.75, 0.875], atol=1e-12)
    np.testing.assert_allclose(uy2["response"][:4], [0.0, 1.0, 1.5, 1.75], atol=1e-12)
    np.testing.assert_allclose(dy1["response"][:3], [0.8, 1.44, 1.952], atol=1e-12)
    np.testing.assert_allclose(dy2["response"], 0.0, atol=0)
    assert [p["gain"] for p in (uy1, dy1, uy2, dy2)] == pytest.approx([1.0, 4.0, 2.0, 0.0], abs=1e-12)
    # tangent method: u steepest move 1 (normalised) at k = 1 onto 1 -> 1 + 1 - 1 = 1 sample; d at k = 0 -> 0
    assert [uy1["dead_time_steps"], uy2["dead_time_steps"], dy1["dead_time_steps"]] == pytest.approx([1, 1, 0])
    assert (uy1["dead_time_s"], dy2["dead_time_steps"], dy2["dead_time_s"]) == (pytest.approx(10.0), None, None)
    # settling per pair, 5 % of its own gain: 0.5^k <= 0.05 from k = 5 (6 steps held); 0.8^(k+1) <= 0.05 from
    # k = 13 (14 steps); a zero response is settled at once
    assert [p["settling_steps"] for p in (uy1, dy1, uy2, dy2)] == [6, 14, 6, 1]
    assert [p["settling_s"] for p in (uy1, dy1, uy2, dy2)] == [60.0, 140.0, 60.0, 10.0]
    # jackknife of B scaled 0.9, 1, 1.1: se = sqrt(2/3 * (0.1^2 + 0 + 0.1^2)) = 0.11547 of the response
    factor = np.sqrt(2 / 3 * 0.02)
    np.testing.assert_allclose(uy1["response_se"], factor * np.abs(uy1["response"]), atol=1e-12)
    assert (uy2["gain_se"], uy2["dead_time_se_steps"]) == (pytest.approx(factor * 2.0), pytest.approx(0.0, abs=1e-12))
    assert dy1["gain_se"] == pytest.approx(0.0, abs=1e-12) and max(dy1["response_se"]) < 1e-12
    # one MV, two CVs: the RGA by the pseudo-inverse, g .* g / |g|^2 = (1, 4) / 5; a column's condition is 1
    mv = record["mv_gain"]
    assert mv["rga_method"] == PSEUDO_INVERSE
    np.testing.assert_allclose(mv["rga"], [[0.2], [0.8]], atol=1e-12)
    assert mv["condition"] == pytest.approx(1.0)
    json.dumps(record, allow_nan=False)  # plain JSON


def test_the_gain_spread_is_the_local_gains_rms_deviation_in_engineering_units():
    """Two local gains (normalised) each side of the hand model's [G, Gd] = [[2, 1], [4, 0]] by
    delta: the spread is |delta| scaled to engineering units (0.5 from u, 4 from d), shown in the table."""
    ss, replicates, norm = hand_built()
    gain, delta = np.array([[2.0, 1.0], [4.0, 0.0]]), np.array([[0.2, 0.1], [0.4, 0.0]])
    record = step_response_record(ss, replicates, HAND_SPEC, norm, np.stack([gain + delta, gain - delta, gain]))
    spread = np.sqrt(2 / 3) * delta * np.array([[0.5, 4.0]])  # two of the three deviate by delta
    np.testing.assert_allclose([p["gain_spread"] for p in record["pairs"]], spread.ravel(), atol=1e-12)
    assert record["gain_spread_points"] == 3
    table = step_response_table(record)
    assert "| gain ± se | gain spread |" in table and "| y1 | u (MV) | 1 ± 0.12 | 0.082 |" in table
    assert "gain spread: root-mean-square deviation of the local gains at 3 held-out operating points" in table
    bare = step_response_record(ss, replicates, HAND_SPEC, norm)
    assert bare["gain_spread_points"] == 0 and all(p["gain_spread"] is None for p in bare["pairs"])
    assert "| y1 | u (MV) | 1 ± 0.12 | - |" in step_response_table(bare)
    assert "no gain spread (no held-out operating points)" in step_response_table(bare)
    older = {k: v for k, v in bare.items() if k != "gain_spread_points"}  # identified before the spread was kept
    older["pairs"] = [{k: v for k, v in p.items() if k != "gain_spread"} for p in bare["pairs"]]
    assert "gain spread not recorded (identified before it was)" in step_response_table(older)


def test_fewer_than_two_replicates_give_no_standard_errors():
    ss, _, norm = hand_built()
    record = step_response_record(ss, [ss], HAND_SPEC, norm)
    assert record["uncertainty"] is None
    assert all(p["gain_se"] is None and p["response_se"] is None and p["dead_time_se_steps"] is None
               for p in record["pairs"])


def test_dead_time_of_a_first_order_lag_behind_a_delay_is_the_delay():
    k = np.arange(40)
    for delay in (0, 1, 3):
        response = np.where(k >= delay, 1 - 0.9 ** (k - delay + 1), 0.0)
        assert dead_time_steps(-2.0 * response) == pytest.approx(delay)  # a negative gain alike
    assert np.isnan(dead_time_steps(np.zeros(10)))


# --------------------------------------------------------------------------- RGA and condition number


def test_rga_and_condition_number_of_skogestads_lv_distillation_column():
    """Skogestad & Postlethwaite, Multivariable Feedback Control (2005), the LV column model
    G(0) = [[87.8, -86.4], [108.2, -109.6]]: RGA [[35.1, -34.1], [-34.1, 35.1]], condition number 141.7."""
    G = np.array([[87.8, -86.4], [108.2, -109.6]])
    rga, method = relative_gain_array(G)
    assert method == INVERSE
    np.testing.assert_allclose(rga, [[35.1, -34.1], [-34.1, 35.1]], atol=0.05)
    assert gain_condition(G) == pytest.approx(141.7, abs=0.05)


def test_rga_of_a_non_square_or_singular_gain_uses_the_pseudo_inverse():
    wide = np.array([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]])
    rga, method = relative_gain_array(wide)
    assert method == PSEUDO_INVERSE
    np.testing.assert_allclose(rga.sum(axis=1), 1.0)  # G pinv(G) = I for full row rank
    rga, method = relative_gain_array(np.array([[1.0, 2.0], [2.0, 4.0]]))
    assert method == PSEUDO_INVERSE and np.all(np.isfinite(rga))
    assert gain_condition(np.array([[1.0, 2.0], [2.0, 4.0]])) is None


def test_singular_values_below_the_rank_tolerance_are_recorded_as_zero():
    """A rank-1 gain's second singular value is rounding noise (1.7e-17 for [[.5, .5], [.5, .5]] from
    one machine's OpenBLAS, 0 from another's): recorded as 0, so the artifact's hash does not depend on
    the machine; real ones are kept."""
    rank_one = (np.full((2, 2), 0.5), np.array([[0.1, 0.3], [0.2, 0.6]]), np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]))
    for gain in rank_one:
        sv = singular_values(gain)
        assert sv[-1] == 0.0 and sv[0] == pytest.approx(np.linalg.norm(gain, 2))
    G = np.array([[87.8, -86.4], [108.2, -109.6]])
    np.testing.assert_array_equal(singular_values(G), np.linalg.svd(G, compute_uv=False))
    assert singular_values(np.array([[1.0, 0.0], [0.0, 1e-14]]))[-1] == 1e-14  # above 2 x eps x 1: kept


# --------------------------------------------------------------------------- the artifact field


def test_an_artifact_stored_before_step_responses_keeps_its_json_and_hash(models):
    _, _, artifact = models["tanks-1"]
    old = artifact.to_dict()
    del old["step_response"]
    loaded = ModelArtifact.from_dict(old)
    assert loaded.step_response is None
    assert loaded.to_dict() == old and loaded.artifact_hash == content_hash(old)
    assert ModelArtifact.from_dict(artifact.to_dict()).artifact_hash == artifact.artifact_hash != loaded.artifact_hash


# --------------------------------------------------------------------------- the `model` command


def run_cli(capsys, home, *args) -> tuple[int, str, str]:
    code = main(["--home", str(home), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_model_command_prints_the_latest_artifacts_step_response_matrix(identified, capsys):
    home, _, models = identified
    _, _, artifact = models["tanks-1"]
    code, out, err = run_cli(capsys, home, "model", "tanks-1", "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (doc["binding_id"], doc["binding_revision"], doc["artifact_hash"]) == ("tanks-1", 1, artifact.artifact_hash)
    assert doc["step_response"] == json.loads(json.dumps(artifact.step_response))
    code, out, _ = run_cli(capsys, home, "model", "heater-1")
    assert code == 0
    assert "| t_out | q_heat (MV) |" in out and "| t_out | t_in (DV) |" in out
    assert "| gain ± se | gain spread |" in out and "gain spread: root-mean-square deviation" in out
    assert "Condition number of the MV gain matrix (engineering units): 1" in out


def test_model_command_refuses_an_unknown_binding_or_one_without_a_model_in_one_line(identified, capsys):
    home, ledger, _ = identified
    code, out, err = run_cli(capsys, home, "model", "no-such-binding")
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and "'no-such-binding'" in err
    spec = dataclasses.replace(demo_plants()[0].spec, id="tanks-2")
    ledger.upsert_binding(spec)
    code, out, err = run_cli(capsys, home, "model", "tanks-2")
    assert (code, out) == (2, "")
    assert err == ("error: binding 'tanks-2' revision 1 has no model yet; run "
                   "`optimizer-pipeline materialize tanks-2`\n")


def test_model_command_on_an_artifact_from_before_step_responses_says_to_recalibrate(tmp_path, capsys):
    plant = demo_plants()[1]
    ledger = seed_home(tmp_path, [plant])
    stored = ledger.get_binding(plant.spec.id)
    artifact = pipeline.identify_model(ledger, stored, pipeline.prepare_split(ledger, stored))
    old = artifact.to_dict()
    del old["step_response"]
    ledger.put_artifact(ModelArtifact.from_dict(old))  # stored later: the latest
    code, out, err = run_cli(capsys, tmp_path, "model", plant.spec.id)
    assert (code, out) == (2, "")
    assert "was identified before step-response matrices were recorded" in err and err.count("\n") == 1
    assert f"materialize {plant.spec.id} --job recalibrate" in err


def test_an_unstable_model_still_gives_a_json_record_over_the_capped_horizon():
    """x+ = 20 x + u: the response overflows within the 300 steps; the record says None there."""
    spec = binding_from_dict({**HAND_DOC, "dvs": [], "cvs": HAND_DOC["cvs"][:1]})
    norm = Normalisation(("u", "y1"), (0.0, 0.0), (1.0, 1.0))
    record = step_response_record(StateSpace.of([[20.0]], [[1.0]], np.zeros((1, 0)), [0.0], [[1.0]]), [], spec, norm)
    assert (record["model_settling_steps"], record["steps"]) == (None, MAX_STEPS)
    (pair,) = record["pairs"]
    assert pair["response"][:3] == [1.0, 21.0, 421.0] and pair["response"][-1] is None
    assert pair["gain"] == pytest.approx(-1 / 19) and pair["settling_steps"] is pair["dead_time_steps"] is None
    canonical_json(record)  # storable: no NaN or inf
