"""CV transforms (contracts/transform.py): the logit's arithmetic, the binding field and its refusals, the
refusal of values at or beyond the limits (ingest and split), normalisation, the problem in transformed
units with its plan in engineering units, block scores in engineering units, and a Wiener plant whose
settled values the transformed model gets right where the linear one does not."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline import pipeline, uq
from optimizer_pipeline.contracts import (CVTransform, ContractError, ModelArtifact, RunSeries, StoredBinding,
                                          binding_from_dict, fast_json, forward_columns, inverse_columns,
                                          utc_now)
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.data.ingest import HistoryError
from optimizer_pipeline.data.split import split_runs
from optimizer_pipeline.data.ingest import validate_history_frame
from optimizer_pipeline.model import current_state, identify
from optimizer_pipeline.model.artifact import stack_for
from optimizer_pipeline.model.arx import Orders, disturbance_window, held_errors, window_rows
from optimizer_pipeline.model.statespace import rollout, steady_state
from optimizer_pipeline.model.local import REGION_FRACTION, bandwidth_of
from optimizer_pipeline.model.step_response import step_response_table
from optimizer_pipeline.plots import model_fit_series
from optimizer_pipeline.problem import compile_problem, problem_from_dict, robust_limits
from optimizer_pipeline.solver.codec import decode
from optimizer_pipeline.solver.solve import SolverCache, solve_problem
from optimizer_pipeline.solver.verify import Tolerances
from optimizer_pipeline.uq import MAX_RESIDUAL, block_scores, input_distance

LOGIT = CVTransform("logit", -0.85, 0.85)
SATURATION = 0.8  # the Wiener plant's outputs: SATURATION tanh(x / SATURATION)
WIENER = CVTransform("logit", -0.82, 0.82)  # its transform: the saturation with a margin over the noise
R = WIENER.hi  # the logit's radius (centred at 0): engineering = R tanh(transformed / R)


def _doc(transform=LOGIT, lo=-0.84, hi=0.84, template="linear_mpc_quadratic@1", **cv):
    item = {"tag": "x", "lo": lo, "hi": hi, "target": 0.5, **cv}
    if transform is not None:
        item["transform"] = {"kind": transform.kind, "lo": transform.lo, "hi": transform.hi}
    return {"id": "wiener", "sample_period_s": 10, "mvs": [{"tag": "u", "lo": -3, "hi": 3, "max_move": 0.5}],
            "cvs": [item], "model": {"na": 1, "nb": 1, "delay": 2, "horizon": 12},
            "profile": {"id": "p", "template": template, "horizon": 30}}


# --------------------------------------------------------------------------- the logit


def test_logit_is_the_scaled_log_odds_and_inverts():
    y = np.linspace(-0.84, 0.84, 41)
    z = LOGIT.forward(y)
    # the log-odds of (y - lo) / (hi - lo), scaled by half the range over 2 (an independent formula)
    assert np.allclose(z, 0.85 / 2 * np.log((y + 0.85) / (0.85 - y)), rtol=1e-12, atol=1e-14)
    assert np.allclose(LOGIT.inverse(z), y, rtol=0, atol=1e-14)
    assert LOGIT.forward(0.0) == 0.0
    step = 1e-6  # slope 1 at the midpoint
    assert math.isclose(float(LOGIT.inverse(step) - LOGIT.inverse(-step)) / (2 * step), 1.0, rel_tol=1e-9)
    assert np.isinf(LOGIT.forward(0.85)) and np.isnan(LOGIT.forward(0.9))
    assert list(LOGIT.inside([-0.85, -0.8499, 0.8499, 0.85, np.nan])) == [False, True, True, False, False]


def test_column_helpers_transform_only_the_transformed_columns_and_return_floats():
    transforms = (None, LOGIT)
    values = [[3, 0], [-2, 1]]  # integers: the results are floats, not truncated
    z = forward_columns(transforms, [[3, 0.5], [-2, -0.25]])
    assert np.array_equal(z[:, 0], [3.0, -2.0]) and np.allclose(z[:, 1], LOGIT.forward([0.5, -0.25]))
    back = inverse_columns(transforms, values)
    assert back.dtype == float and np.array_equal(back[:, 0], [3.0, -2.0])
    assert np.allclose(back[:, 1], LOGIT.inverse([0.0, 1.0])) and back[1, 1] != 0.0
    assert forward_columns(transforms, values).dtype == float


def test_the_logit_at_and_beyond_its_limits_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isinf(LOGIT.forward([0.85, -0.85])).all() and np.isnan(LOGIT.forward([0.9, -1.0])).all()


def test_an_asymmetric_logit_is_centred_between_its_limits():
    t = CVTransform("logit", 0.0, 1.0)
    assert t.forward(0.5) == 0.0
    assert math.isclose(float(t.forward(0.9)), 0.25 * math.log(0.9 / 0.1), rel_tol=1e-12)
    assert math.isclose(float(t.inverse(t.forward(0.999))), 0.999, rel_tol=1e-12)


# --------------------------------------------------------------------------- the binding


def test_a_binding_without_transforms_keeps_its_canonical_json():
    spec = binding_from_dict(_doc(transform=None))
    assert "transform" not in spec.canonical_json()
    with_transform = binding_from_dict(_doc())
    assert with_transform.cvs[0].transform == LOGIT
    assert with_transform.spec_hash != spec.spec_hash
    assert with_transform.to_dict()["cvs"][0]["transform"] == {"kind": "logit", "lo": -0.85, "hi": 0.85}
    assert binding_from_dict(with_transform.to_dict()) == with_transform  # as the ledger stores and reads it


@pytest.mark.parametrize("transform, message", [
    ({"kind": "log", "lo": -1, "hi": 1}, "b.cvs[0].transform.kind"),
    ({"kind": "logit", "lo": 1, "hi": -1}, "b.cvs[0].transform"),
    ({"kind": "logit", "lo": -0.84, "hi": 0.9},
     "b.cvs[0].transform: expected limits outside the CV's own [-0.84, 0.84] (the CV saturates toward them and "
     "never reaches them), got [-0.84, 0.9]"),
    ({"kind": "logit", "hi": 0.9}, "b.cvs[0].transform.lo: required field is missing"),
    ("logit", "b.cvs[0].transform: expected a mapping"),
])
def test_bad_transforms_are_refused_naming_the_field(transform, message):
    doc = _doc(transform=None)
    doc["cvs"][0]["transform"] = transform
    with pytest.raises(ContractError) as info:
        binding_from_dict(doc, source="b")
    assert str(info.value).startswith(message)


def test_an_economic_cost_on_a_transformed_cv_is_refused():
    with pytest.raises(ContractError, match=r"^b\.cvs\[0\]\.cost: an economic cost on a transformed CV is not "
                                            r"supported"):
        binding_from_dict(_doc(cost=2.0), source="b")


# --------------------------------------------------------------------------- data


def test_ingest_refuses_a_value_at_the_limit_naming_column_run_and_row():
    spec = binding_from_dict(_doc())
    frame = pd.DataFrame({"run_id": ["a"] * 4, "timestamp": [0.0, 10.0, 20.0, 30.0], "u": [0.0] * 4,
                          "x": [0.1, 0.2, 0.85, 0.3]})
    with pytest.raises(HistoryError) as info:
        validate_history_frame(frame, spec, "h.csv")
    assert str(info.value) == ("h.csv: column 'x': 0.85 in run 'a' at row 3 is not inside the limits of the CV's "
                               "transform (logit between -0.85 and 0.85)")
    frame.loc[2, "x"] = np.nan  # a missing value stays missing
    assert validate_history_frame(frame, spec, "h.csv")["x"].isna().sum() == 1


def _runs(values):
    return [RunSeries(f"r{i}", 10.0 * np.arange(len(v)) + 1000.0 * i, np.zeros((len(v), 1)),
                      np.asarray(v, float)[:, None], np.empty((len(v), 0))) for i, v in enumerate(values)]


def test_split_normalises_transformed_values_and_refuses_a_run_beyond_the_limits():
    spec = binding_from_dict(_doc())
    rng = np.random.default_rng(0)
    values = [rng.uniform(-0.8, 0.8, 20) for _ in range(3)]
    split = split_runs(_runs(values), spec)
    train = np.concatenate([r.y[:, 0] for r in split.train])
    z = 0.85 * np.arctanh(train / 0.85)
    mean, std = split.normalisation.of(("x",))
    assert np.allclose([mean[0], std[0]], [z.mean(), z.std()], rtol=1e-12)
    assert split.normalisation.transforms == {"x": LOGIT}
    y = np.array([[-0.5], [0.0], [0.7]])
    assert np.allclose(split.normalisation.engineering(("x",), split.normalisation.normalise(("x",), y)), y)

    values[1][4] = -0.9
    with pytest.raises(HistoryError, match=r"^binding 'wiener': run 'r1': CV 'x' is -0.9 at sample 5 \(t = 1040 s\), "
                                           r"not inside the limits of its transform \(logit between -0.85 and 0.85\)$"):
        split_runs(_runs(values), spec)


# --------------------------------------------------------------------------- a Wiener plant


def _wiener_runs(seed: int, n_runs: int = 10, n: int = 300) -> list[RunSeries]:
    """x[t+1] = 0.9 x[t] + 0.1 * 1.2 u[t - 1], y = SATURATION tanh(x / SATURATION) + noise: a static gain of
    1.2 that saturates; steps of u across [-2, 2] drive y well into the curve."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n_runs):
        u = np.repeat(rng.uniform(-2, 2, n // 20 + 1), 20)[:n]
        x = np.zeros(n)
        for t in range(2, n):
            x[t] = 0.9 * x[t - 1] + 0.12 * u[t - 2]
        y = SATURATION * np.tanh(x / SATURATION) + rng.normal(0, 0.002, n)
        runs.append(RunSeries(f"r{i:02d}", 10.0 * np.arange(n) + 1e4 * i, u[:, None], y[:, None], np.empty((n, 0))))
    return runs


def _settled(artifact: ModelArtifact, u: float) -> float:
    """The model's settled CV at a held MV u, engineering units (no disturbance)."""
    norm = artifact.normalisation
    G, _, y0 = steady_state(artifact.state_space)
    z = G @ norm.normalise(("u",), [u]) + y0
    return float(norm.engineering(("x",), z)[0])


@pytest.fixture(scope="module")
def wiener():
    runs = _wiener_runs(1)
    linear = binding_from_dict(_doc(transform=None, lo=-0.81, hi=0.81))
    transformed = binding_from_dict(_doc(transform=WIENER, lo=-0.81, hi=0.81))
    return {name: (spec, split := split_runs(runs, spec), identify(split, spec, 1))
            for name, spec in (("linear", linear), ("transformed", transformed))}


def test_the_transformed_model_settles_where_the_plant_does(wiener):
    a_lin, a_t = wiener["linear"][2], wiener["transformed"][2]
    truth = {u: SATURATION * math.tanh(1.2 * u / SATURATION) for u in (-1.5, 0.5, 1.5)}
    err_linear = max(abs(_settled(a_lin, u) - y) for u, y in truth.items())
    err_transformed = max(abs(_settled(a_t, u) - y) for u, y in truth.items())
    # measured: 0.041 against 0.208 (the transform's limits 2.5 % beyond the saturation)
    assert err_transformed < err_linear / 4 and err_linear > 0.15
    assert a_t.normalisation.transforms == {"x": WIENER} and not a_lin.normalisation.transforms
    assert ModelArtifact.from_dict(a_t.to_dict()) == a_t
    assert "transforms" not in a_lin.to_dict()["normalisation"]
    assert ModelArtifact.from_dict(a_lin.to_dict()).artifact_hash == a_lin.artifact_hash
    assert a_t.step_response["transformed_cvs"] == {"x": "logit between -0.82 and 0.82"}
    assert "transformed_cvs" not in a_lin.step_response
    assert step_response_table(a_t.step_response).endswith("toward them): x: logit between -0.82 and 0.82")
    assert "Transformed CVs" not in step_response_table(a_lin.step_response)


def test_block_scores_are_engineering_errors_over_the_train_std(wiener):
    _, split, artifact = wiener["transformed"]
    scores = block_scores(artifact, split.val, score=MAX_RESIDUAL)
    # independently: the same blocks' normalised errors, each step's engineering values by the logit's tanh
    stacked = stack_for(artifact, split.val)
    orders = Orders(artifact.na, artifact.nb, artifact.delay)
    window = disturbance_window(artifact.state_space, artifact.horizon)
    h = artifact.horizon
    rows, _ = window_rows(stacked, orders.first_state_row + window, h, h)
    errors = held_errors(artifact.state_space, stacked, orders, rows, h, window)[..., 0]
    (mean,), (std,) = artifact.normalisation.of(("x",))
    measured = stacked.y[rows[:, None] + 1 + np.arange(h), 0]

    def eng(z):
        return R * np.tanh((mean + std * z) / R)

    expected = np.max(np.abs(eng(measured) - eng(measured - errors)), axis=1) / std
    assert scores.scores.shape == (len(rows), 1)
    assert np.allclose(scores.scores[:, 0], expected, rtol=1e-10, atol=1e-13)
    assert not np.allclose(scores.scores[:, 0], np.max(np.abs(errors), axis=1), rtol=1e-3)


def test_the_plan_is_solved_in_transformed_units_and_read_in_engineering_units(wiener):
    transformed, split, artifact = wiener["transformed"]
    x0, bias = current_state(artifact, split.live)
    band = np.array([0.05])
    problem = compile_problem(transformed, artifact, x0, bias, split.live.u[-1], [], band)
    norm = artifact.normalisation
    assert np.allclose(problem.y_target, norm.normalise(("x",), [0.5]))
    assert np.allclose(problem.cv_engineering(problem.y_lo), [-0.81]) and problem.y_transform == (WIENER,)
    # robust limits: tightened by the band in engineering units (band x std), then transformed back
    r_lo, r_hi = robust_limits(problem)
    (std,) = problem.y_std
    assert np.allclose(problem.cv_engineering(r_lo), [-0.81 + 0.05 * std])
    assert np.allclose(problem.cv_engineering(r_hi), [0.81 - 0.05 * std])
    # the wire: the worker rebuilds the same problem, its hash included
    wire = problem_from_dict(decode(fast_json(problem)))
    assert wire == problem and wire.hash == problem.hash and "y_transform" in problem.to_dict()

    result = solve_problem(problem, SolverCache())
    assert result.ok
    nominal = next(c for c in result.candidates if c.kind.value == "nominal")
    controls = np.asarray(nominal.controls)
    # independently: the model rolled out from the live state with the plan's MVs, through the logit's inverse
    u = norm.normalise(("u",), controls)
    z = rollout(artifact.state_space, x0[None], u[None], None, bias)[0]
    (mean,), _ = norm.of(("x",))
    assert np.allclose(nominal.predicted, R * np.tanh((mean + std * z) / R), atol=1e-9)
    assert abs(nominal.predicted[-1][0] - 0.5) < 0.01
    assert all(c.verified for c in result.candidates if c.kind.value != "hold")


def test_a_problem_without_transforms_keeps_its_json_and_bad_transforms_are_refused(wiener):
    linear, split, artifact = wiener["linear"]
    x0, bias = current_state(artifact, split.live)
    problem = compile_problem(linear, artifact, x0, bias, split.live.u[-1], [])
    assert problem.y_transform is None and "y_transform" not in problem.to_dict()
    doc = problem.to_dict()
    for bad, message in (([None, None], "problem.y_transform: expected one entry per CV (1)"),
                         ([{"kind": "logit", "lo": 1.0, "hi": 0.0}], "problem.y_transform[0]"),
                         ([{"kind": "probit", "lo": 0.0, "hi": 1.0}], "problem.y_transform[0].kind"),
                         ([{"kind": "logit", "lo": -1.0}], "problem.y_transform[0].hi: required field is missing"),
                         (["logit"], "problem.y_transform[0]: expected a mapping like {kind: logit"),
                         ([{"kind": "logit", "lo": "a", "hi": 1.0}], "problem.y_transform[0].lo: expected a number"),
                         ([{"kind": "logit", "lo": 0.0, "hi": "b"}], "problem.y_transform[0].hi: expected a number"),
                         ([{"kind": 5, "lo": 0.0, "hi": 1.0}], "problem.y_transform[0].kind: expected text"),
                         ("logit", "problem.y_transform: expected a list (one entry per CV)")):
        with pytest.raises(ContractError) as info:
            problem_from_dict({**doc, "y_transform": bad})
        assert str(info.value).startswith(message)


def test_input_distance_is_infinite_at_a_transform_limit(wiener):
    artifact = wiener["transformed"][2]
    assert math.isfinite(input_distance(artifact, [0.0], [0.5]))
    assert input_distance(artifact, [0.0], [R]) == math.inf


def test_the_model_fit_plot_shows_the_rollouts_in_engineering_units(wiener):
    _, split, artifact = wiener["transformed"]
    series = model_fit_series(artifact, split.val[0])
    shown = ~np.isnan(series.predicted[:, 0])
    assert shown.sum() > 100
    # the rollouts follow the measured CV in engineering units (in transformed units they would not)
    error = np.abs(series.predicted[shown, 0] - series.measured[shown, 0])
    assert np.median(error) < 0.02 and np.all(np.abs(series.predicted[shown, 0]) < R)


@pytest.mark.parametrize("template", ["linear_mpc_quadratic@1", "steady_response@1"])
def test_a_transformed_binding_is_recommended_through_the_pipeline(tmp_path, template):
    """Scores, calibration, the solve (with its local refit) and the decision: the recommendation's plan
    reaches the target on the true Wiener plant and its band is in engineering units."""
    spec = binding_from_dict(_doc(transform=WIENER, lo=-0.81, hi=0.81, template=template))
    split = split_runs(_wiener_runs(1), spec)
    artifact = identify(split, spec, 1)
    ledger, settings, cache = Ledger(tmp_path / "ledger.duckdb"), Settings(), SolverCache()
    calibration = pipeline.calibrate(ledger, artifact, pipeline.score_blocks(spec, artifact, split), settings,
                                     utc_now())
    record = pipeline.recommend(StoredBinding(spec, 1, spec.spec_hash, None), artifact, split, calibration,
                                lambda p: solve_problem(p, cache), ledger, settings, "simulation", utc_now())
    rec = record.recommendation
    assert rec.controls and abs(rec.predicted[-1][0] - 0.5) < 0.02
    # the local refit is centred on the region of the point midway between the live state and the first
    # plan's end, both transformed: within half a region's width of it, on the regions' grid
    norm = artifact.normalisation
    local = ledger.get_run(record.run_id).context["steady_model"]
    assert local["procedure"] == "local"
    midway = (norm.normalise(("x",), split.live.y[-1]) + norm.normalise(("x",), local["first_settled"])) / 2
    width = REGION_FRACTION * bandwidth_of(artifact)
    centre = np.asarray(local["operating_point"]["y"])
    assert np.all(np.abs(centre - midway) <= width / 2 + 1e-12)
    assert np.allclose(centre / width, np.round(midway / width), rtol=0, atol=1e-9)
    # the verifier's CV limits are the binding's, in engineering units
    chosen = record.chosen
    assert np.allclose(chosen.verify_report["cv_allowed"], [Tolerances().cv_rel * (0.81 + 0.81)], rtol=1e-12)
    if template == "linear_mpc_quadratic@1":  # the band against the improvement (the wider of the P-step and
        # the settled band at the plan's end), against the engineering target
        [c] = [c for c in record.conditions if c.name == "band against the improvement over holding"]
        hold = next(c for c in record.result.candidates if c.kind.value == "hold")
        held = max(abs(hold.predicted[-1][0] - 0.5) / 1.62, 0.1)
        settled, _ = pipeline.settled_evidence(spec, artifact, split, settings, utc_now())  # its end's band
        end_band = max(rec.band[0], uq.band_engineering(settled, artifact)[0])
        widened = (abs(rec.predicted[-1][0] - 0.5) + end_band) / 1.62
        assert c.value.startswith(f"{widened / held:.3g} of ")
    # the plant's settled CV at the last MVs: measured 0.525 for both templates (0.665 without the transform,
    # whose band was 0.35); the transform's limits sit 2.5 % beyond the saturation
    settled = SATURATION * math.tanh(1.2 * rec.controls[-1][0] / SATURATION)
    assert abs(settled - 0.5) < 0.04
    assert 0.0 < rec.band[0] < 0.1  # engineering units (measured 0.049-0.058)


def test_without_transforms_a_binding_problem_and_artifact_hash_as_before_transforms_existed():
    """The hashes at 0d61073, the tree before CV transforms (a stored binding keeps its revision, a stored
    artifact or problem its identity)."""
    from test_contracts import _problem
    from test_recommend import ARTIFACT

    from optimizer_pipeline.plants import demo_plants

    assert _problem().hash == "ca58bb3937e46a74ef8485b27ab399d077a4e48ef02dbfb1acd1328c7f504e09"
    assert demo_plants()[0].spec.spec_hash == "47364ae6e40ba869f668dec91a21136ebf114486ce438a82b3b042895223538b"
    assert ARTIFACT.artifact_hash == "93612441314f268e4e3f565d740df4b2bf6cab1c3707f2d301d9adad3db6293e"
