"""ARX realisation, identification, order selection, gates and the measured state of a run."""

import numpy as np
import pytest
from model_helpers import binding, excitation, run_series, simulate_arx, split_of, unit_normalisation

from optimizer_pipeline.contracts import ContractError, ModelArtifact, Normalisation, RunSeries
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model, current_state, identify, stack_for
from optimizer_pipeline.model.arx import (disturbance_window, fit_disturbance, fit_disturbance_measured, held_errors,
                                          rollout_windows, stack_runs, window_rows)
from optimizer_pipeline.model.fit import Structure
from optimizer_pipeline.model.select import LONG_NB
from optimizer_pipeline.model.artifact import (GAIN_JACKKNIFE, GAIN_OPERATING_RANGE, REFINE_SETTLING_CAP,
                                               predicted_run, refine_horizon, steady_gain_record)
from optimizer_pipeline.model.statespace import disturbance_step_gains

# A stable 2x2 plant with one DV, na = nb = 2, delay = 2 (engineering units).
A_TRUE = np.array([[[1.1, 0.1], [0.0, 0.9]], [[-0.35, 0.0], [0.05, -0.2]]])
B_TRUE = np.array([[[0.3, 0.1], [0.1, 0.25]], [[0.15, 0.0], [0.05, 0.1]]])
D_TRUE = np.array([[[0.2], [0.0]], [[0.0], [-0.1]]])
C_TRUE = np.array([0.4, -0.3])
MEAN_U, MEAN_D = np.array([3.0, -1.0]), np.array([2.0])


def plant_runs(seed: int, runs: int, n: int, noise: float, delay: int = 2):
    rng = np.random.default_rng(seed)
    u = MEAN_U + excitation(rng, runs, n, 2)
    d = MEAN_D + 0.5 * excitation(rng, runs, n, 1, hold=20)
    y = simulate_arx(A_TRUE, B_TRUE, D_TRUE, C_TRUE, delay, u, d, noise * rng.normal(size=(runs, n, 2)))
    return run_series("r", u, y, d)


def normalised_truth(norm, spec):
    """The true coefficients expressed in normalised units (z = (x - mean) / std)."""
    mu, su = norm.of(spec.mv_tags)
    my, sy = norm.of(spec.cv_tags)
    md, sd = norm.of(spec.dv_tags)
    A = np.array([np.diag(1 / sy) @ a @ np.diag(sy) for a in A_TRUE])
    B = np.array([np.diag(1 / sy) @ b @ np.diag(su) for b in B_TRUE])
    D = np.array([np.diag(1 / sy) @ d @ np.diag(sd) for d in D_TRUE])
    c = (A_TRUE.sum(axis=0) @ my + B_TRUE.sum(axis=0) @ mu + D_TRUE.sum(axis=0) @ md + C_TRUE - my) / sy
    return A, B, D, c


@pytest.mark.parametrize("na, nb, delay, n_dv", [(2, 3, 2, 1), (1, 1, 1, 0), (3, 1, 4, 0), (1, 2, 1, 2)])
def test_realisation_rollout_equals_arx_recursion(na, nb, delay, n_dv):
    rng = np.random.default_rng(na * 100 + nb * 10 + delay)
    spec = binding(n_mv=2, n_cv=2, n_dv=n_dv, na=na, nb=nb, delay=delay, horizon=7)
    model = ArxModel(Orders(na, nb, delay), A=0.3 * rng.normal(size=(na, 2, 2)), B=rng.normal(size=(nb, 2, 2)),
                     D=rng.normal(size=(nb, 2, n_dv)), c=rng.normal(size=2))
    u, d = rng.normal(size=(3, 40, 2)), rng.normal(size=(3, 40, n_dv))
    y = simulate_arx(model.A, model.B, model.D, model.c, delay, u, d, np.zeros((3, 40, 2)),
                     y_init=rng.normal(size=(3, max(na, delay + nb - 1), 2)))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec))
    stacked = stack_for(artifact, run_series("r", u, y, d))
    rows, _ = window_rows(stacked, model.orders.first_state_row, 7, 1)
    predicted, measured = rollout_windows(artifact.state_space, stacked, model.orders, rows, 7)
    assert rows.size == 3 * (40 - 7 - model.orders.first_state_row)
    np.testing.assert_allclose(predicted, measured, atol=1e-9)


@pytest.mark.parametrize("na, nb, delay, n_dv", [(2, 3, 2, 1), (1, 1, 1, 0), (3, 2, 4, 2), (2, 2, 1, 1)])
def test_the_disturbance_fitted_as_a_filter_of_one_step_residuals_equals_the_rollouts_least_squares(na, nb, delay,
                                                                                                    n_dv):
    """fit_disturbance filters the one-step residuals (model.arx.disturbance_filter); the definition it must
    reproduce: each window rolled out from its measured start state, then least squares on the held
    disturbance's step responses, here with np.linalg.lstsq."""
    rng = np.random.default_rng(na * 100 + nb * 10 + delay)
    spec = binding(n_mv=2, n_cv=2, n_dv=n_dv, na=na, nb=nb, delay=delay, horizon=5)
    model = ArxModel(Orders(na, nb, delay), A=0.3 / na * rng.normal(size=(na, 2, 2)), B=rng.normal(size=(nb, 2, 2)),
                     D=rng.normal(size=(nb, 2, n_dv)), c=rng.normal(size=2))
    runs = [RunSeries(f"r{i}", np.arange(float(n)), rng.normal(size=(n, 2)), rng.normal(size=(n, 2)),
                      rng.normal(size=(n, n_dv))) for i, n in enumerate((60, 85))]
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec))
    stacked, ss, window = stack_for(artifact, runs), artifact.state_space, 13
    rows, _ = window_rows(stacked, model.orders.first_state_row + window, 1, 3)
    predicted, measured = rollout_windows(ss, stacked, model.orders, rows - window, window)
    gains = disturbance_step_gains(ss, window).reshape(-1, 2)  # (window * ny, ny)
    expected = [np.linalg.lstsq(gains, (measured[i] - predicted[i]).ravel(), rcond=None)[0] for i in range(rows.size)]
    fitted = fit_disturbance(ss, stacked, model.orders, rows, window)
    assert rows.size > 30 and np.ptp(fitted) > 0.1
    np.testing.assert_allclose(fitted, np.array(expected), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("na, nb, delay, n_dv", [(2, 3, 2, 1), (1, 1, 1, 0), (3, 2, 4, 2)])
def test_the_disturbance_fitted_on_the_measured_values_alone_is_the_weighted_least_squares_of_the_rollout(
        na, nb, delay, n_dv):
    """fit_disturbance_measured against its definition: the window rolled out from its measured start
    state, least squares of the held disturbance's step responses on the measured values only (rows of
    np.linalg.lstsq dropped); every value measured, it is fit_disturbance; a value left out changes nothing
    when it is changed."""
    rng = np.random.default_rng(na * 100 + nb * 10 + delay + 7)
    spec = binding(n_mv=2, n_cv=2, n_dv=n_dv, na=na, nb=nb, delay=delay, horizon=5)
    model = ArxModel(Orders(na, nb, delay), A=0.3 / na * rng.normal(size=(na, 2, 2)), B=rng.normal(size=(nb, 2, 2)),
                     D=rng.normal(size=(nb, 2, n_dv)), c=rng.normal(size=2))
    run = RunSeries("r", np.arange(70.0), rng.normal(size=(70, 2)), rng.normal(size=(70, 2)),
                    rng.normal(size=(70, n_dv)))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec))
    stacked, ss, window, row = stack_for(artifact, [run]), artifact.state_space, 17, 66
    measured = np.ones((window, 2), bool)
    everything = fit_disturbance_measured(ss, stacked, model.orders, row, window, measured)
    np.testing.assert_allclose(everything, fit_disturbance(ss, stacked, model.orders, np.array([row]), window)[0],
                               rtol=1e-9, atol=1e-12)
    measured[[2, 3, 9], 0] = measured[[5, 16], 1] = False
    predicted, observed = rollout_windows(ss, stacked, model.orders, np.array([row - window]), window)
    gains = disturbance_step_gains(ss, window).reshape(-1, 2)[measured.ravel()]
    expected = np.linalg.lstsq(gains, (observed[0] - predicted[0])[measured], rcond=None)[0]
    fitted = fit_disturbance_measured(ss, stacked, model.orders, row, window, measured)
    np.testing.assert_allclose(fitted, expected, rtol=1e-9, atol=1e-12)
    assert np.abs(fitted - everything).max() > 1e-3  # (leaving values out matters)
    changed = stack_for(artifact, [RunSeries("r", run.t, run.u, run.y + np.where(
        np.pad(~measured, ((row - window + 1, 70 - row - 1), (0, 0))), 50.0, 0.0), run.d)])
    np.testing.assert_allclose(fit_disturbance_measured(ss, changed, model.orders, row, window, measured), fitted,
                               rtol=1e-9, atol=1e-12)


def test_a_blocks_held_errors_do_not_depend_on_the_blocks_scored_with_it():
    """held_errors of one row alone equals that row's among many (its residuals and filter window are its
    own); no rows give empty arrays, also from fit_disturbance."""
    rng = np.random.default_rng(5)
    spec = binding(n_mv=2, n_cv=2, n_dv=1, na=2, nb=2, delay=1, horizon=4)
    model = ArxModel(Orders(2, 2, 1), A=0.2 * rng.normal(size=(2, 2, 2)), B=rng.normal(size=(2, 2, 2)),
                     D=rng.normal(size=(2, 2, 1)), c=rng.normal(size=2))
    run = RunSeries("r", np.arange(70.0), rng.normal(size=(70, 2)), rng.normal(size=(70, 2)), rng.normal(size=(70, 1)))
    artifact = artifact_from_model(model, spec, 1, unit_normalisation(spec))
    stacked, ss, window = stack_for(artifact, [run]), artifact.state_space, 9
    rows = np.arange(model.orders.first_state_row + window, 70 - 4, 4)
    together = held_errors(ss, stacked, model.orders, rows, 4, window)
    for i in (0, 3, rows.size - 1):
        np.testing.assert_allclose(held_errors(ss, stacked, model.orders, rows[i:i + 1], 4, window)[0], together[i],
                                   rtol=1e-12, atol=1e-12)
    assert together.shape == (rows.size, 4, 2) and np.ptp(together) > 1.0
    assert held_errors(ss, stacked, model.orders, rows[:0], 4, window).shape == (0, 4, 2)
    assert fit_disturbance(ss, stacked, model.orders, rows[:0], window).shape == (0, 2)


def test_state_size_is_outputs_plus_needed_past_inputs():
    model = ArxModel(Orders(2, 3, 2), A=np.zeros((2, 2, 2)), B=np.zeros((3, 2, 2)), D=np.zeros((3, 2, 1)),
                     c=np.zeros(2))
    ss = model.realise()
    # L = delay + nb - 2 = 3 past rows of 2 MVs and 1 DV, plus na * ny = 4 outputs
    assert len(ss.A) == 4 + 3 * 2 + 3 * 1


def test_identify_recovers_coefficients_from_noise_free_data():
    runs = plant_runs(seed=1, runs=10, n=400, noise=0.0)
    spec = binding(n_dv=1, na=2, nb=2, delay=2)
    split = split_of(spec, runs, 6, 2, 2)
    artifact = identify(split, spec, 1)
    A, B, D, c = normalised_truth(split.normalisation, spec)
    np.testing.assert_allclose(artifact.coefficients["A"], A, atol=1e-4)
    np.testing.assert_allclose(artifact.coefficients["B"], B, atol=1e-4)
    np.testing.assert_allclose(artifact.coefficients["D"], D, atol=1e-4)
    np.testing.assert_allclose(artifact.coefficients["c"], c, atol=1e-4)


def test_identify_recovers_coefficients_from_noisy_data():
    runs = plant_runs(seed=2, runs=14, n=600, noise=0.05)
    spec = binding(n_dv=1, na=2, nb=2, delay=2)
    split = split_of(spec, runs, 10, 2, 2)
    artifact = identify(split, spec, 1)
    A, B, D, c = normalised_truth(split.normalisation, spec)
    np.testing.assert_allclose(artifact.coefficients["A"], A, atol=0.05)
    np.testing.assert_allclose(artifact.coefficients["B"], B, atol=0.05)
    np.testing.assert_allclose(artifact.coefficients["D"], D, atol=0.05)


def test_order_selection_picks_the_true_delay():
    rng = np.random.default_rng(3)
    u = excitation(rng, 12, 400, 1)
    y = simulate_arx(np.array([[[0.8]]]), np.array([[[0.5]]]), np.zeros((1, 1, 0)), np.zeros(1), 4, u,
                     np.zeros((12, 400, 0)), 0.05 * rng.normal(size=(12, 400, 1)))
    spec = binding(n_mv=1, n_cv=1, na=None, nb=None, delay=None, horizon=8)
    artifact = identify(split_of(spec, run_series("r", u, y, np.zeros((12, 400, 0))), 8, 2, 2), spec, 1)
    assert artifact.delay == 4 and artifact.selection["family"] in ("one_delay", "per_channel")
    # na x nb x delay with one delay, all recorded, the structure with a delay per channel and the long numerators
    assert len(artifact.selection["order_scores"]) == 3 * 3 * 6 + 1 + len(LONG_NB)
    # best 3 orders x ridge grid, and the best long numerator x ridge grid
    assert len(artifact.selection["ridge_scores"]) == 3 * 5 + 5
    assert set(artifact.selection["settled_nrmse_by_family"]) == {"one_delay", "per_channel", "long_numerator"}


def test_selection_prefers_a_stable_candidate_and_records_radii():
    rng = np.random.default_rng(4)
    u = excitation(rng, 8, 120, 1)
    y = simulate_arx(np.array([[[1.03]]]), np.array([[[0.2]]]), np.zeros((1, 1, 0)), np.zeros(1), 1, u,
                     np.zeros((8, 120, 0)), 0.05 * rng.normal(size=(8, 120, 1)))
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=5)
    artifact = identify(split_of(spec, run_series("r", u, y, np.zeros((8, 120, 0))), 4, 2, 2), spec, 1)
    radii = [s["spectral_radius"] for s in artifact.selection["ridge_scores"]]
    assert max(radii) >= 1.0  # the unstable plant is seen as unstable by the near-unregularised fit
    assert artifact.selection["stable"] == (min(radii) < 1.0)
    assert (artifact.selection["final"]["spectral_radius"] < 1.0) == artifact.selection["stable"]


def test_gates_pass_on_a_well_identified_plant():
    runs = plant_runs(seed=5, runs=10, n=500, noise=0.02)
    spec = binding(n_dv=1, na=None, nb=None, delay=None)
    artifact = identify(split_of(spec, runs, 6, 2, 2), spec, 1)
    assert [g.name for g in artifact.gates] == ["G1", "G2", "G3", "G4"]
    assert artifact.gates_passed, artifact.gates


def test_gates_fail_with_a_description_when_there_are_no_test_runs():
    runs = plant_runs(seed=6, runs=8, n=300, noise=0.02)
    spec = binding(n_dv=1)
    artifact = identify(split_of(spec, runs, 6, 2, 0), spec, 1)
    by_name = {g.name: g for g in artifact.gates}
    for name in ("G1", "G2", "G3"):
        assert not by_name[name].passed and by_name[name].value is None
    assert "no test runs" in by_name["G1"].description
    assert by_name["G4"].passed
    ModelArtifact.from_dict(artifact.to_dict())  # still canonical JSON


def test_g4_fails_with_a_single_train_run():
    runs = plant_runs(seed=7, runs=5, n=400, noise=0.02)
    spec = binding(n_dv=1)
    artifact = identify(split_of(spec, runs, 1, 2, 2), spec, 1)
    g4 = artifact.gates[3]
    assert not g4.passed and "train runs: 1" in g4.description


def test_artifact_records_splits_hash_and_round_trips():
    runs = plant_runs(seed=8, runs=8, n=300, noise=0.02)
    spec = binding(n_dv=1)
    split = split_of(spec, runs, 4, 2, 1)
    artifact = identify(split, spec, 3)
    assert artifact.splits == {"train": ("r0", "r1", "r2", "r3"), "val": ("r4", "r5"), "test": ("r6",),
                               "live": ("r7",)}
    assert artifact.training_data_hash == split.data_hash and artifact.binding_revision == 3
    again = ModelArtifact.from_dict(artifact.to_dict())
    assert again.artifact_hash == artifact.artifact_hash


def _val_rollout_nrmse(artifact: ModelArtifact, runs, horizon: int) -> float:
    """Mean over CVs of the `horizon`-step open-loop rollout NRMSE on `runs` of an na = nb = delay = 1
    artifact: a plain recursion on its stored coefficients, every window (independent of model.arx)."""
    coef = artifact.coefficients
    a, b, d, c = (np.asarray(coef[k], float) for k in ("A", "B", "D", "c"))
    norm = artifact.normalisation
    (mu, su), (my, sy), (md, sd) = (norm.of(t) for t in (artifact.mv_tags, artifact.cv_tags, artifact.dv_tags))
    errors, measured = [], []
    for run in runs:
        u, y, dv = (run.u - mu) / su, (run.y - my) / sy, (run.d - md) / sd
        for t in range(len(y) - horizon):
            x = y[t]
            for k in range(horizon):
                x = a[0] @ x + b[0] @ u[t + k] + d[0] @ dv[t + k] + c
                errors.append(y[t + k + 1] - x)
        measured.append(y)
    rmse = np.sqrt(np.mean(np.square(errors), axis=0))
    return float(np.mean(rmse / np.concatenate(measured).std(axis=0)))


def _identify_without_refinement(monkeypatch, split, spec, replacement=None):
    """identify() with refine_multistep replaced: not tried (replacement None) or returning `replacement(model)`."""
    import optimizer_pipeline.model.artifact as artifact_module

    def fake(model, *args, **kwargs):
        if replacement is None:
            return model, {"tried": False, "reason": "disabled by the test"}
        return replacement(model), {"tried": True}

    with monkeypatch.context() as patch:
        patch.setattr(artifact_module, "refine_multistep", fake)
        return identify(split, spec, 1)


def _radius(artifact: ModelArtifact) -> float:
    return float(np.max(np.abs(np.linalg.eigvals(np.asarray(artifact.state_space.A)))))


def test_refinement_that_improves_validation_is_the_model_the_artifact_holds(monkeypatch):
    runs = plant_runs(seed=9, runs=10, n=400, noise=0.05)
    spec = binding(n_dv=1, na=1, nb=1, delay=1)  # deliberately too simple: refinement has work to do
    split = split_of(spec, runs, 6, 2, 2)
    refined = identify(split, spec, 1)
    plain = _identify_without_refinement(monkeypatch, split, spec)  # the chosen model, unrefined
    report = refined.selection["refinement"]
    assert report["tried"] and report["kept"]
    # the artifact holds the refined model, not the chosen one ...
    assert refined.coefficients != plain.coefficients
    assert refined.selection["chosen"] == plain.selection["final"] == plain.selection["chosen"]
    # ... which is better on val by an independent rollout of the stored coefficients, not by the report's numbers
    horizon = spec.model.horizon
    assert _val_rollout_nrmse(refined, split.val, horizon) < 0.95 * _val_rollout_nrmse(plain, split.val, horizon)
    # the report describes the models the artifacts hold
    assert refined.selection["final"]["spectral_radius"] == pytest.approx(_radius(refined), rel=1e-9)
    assert report["spectral_radius_after"] == pytest.approx(_radius(refined), rel=1e-9)
    assert report["val_score_before"] == plain.selection["final"]["val_rollout_nrmse"]
    assert report["val_score_after"] == refined.selection["final"]["val_rollout_nrmse"] < report["val_score_before"]


@pytest.mark.parametrize("a, expected", [(0.5, 10), (0.9, 29), (0.97, 40), (1.0, 10)])
def test_refinement_simulates_the_settling_horizon_between_p_and_its_cap(a, expected):
    """y[t] = a y[t-1] + 0.1 u[t-1] settles within 5 % after ceil(log 0.05 / log a) steps (5 for 0.5,
    29 for 0.9, 99 for 0.97); P = 10 below that, 4 P above it, P when it never settles (a = 1)."""
    model = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), a), np.full((1, 1, 1), 0.1), np.zeros((1, 1, 0)), np.zeros(1))
    assert REFINE_SETTLING_CAP * 10 == 40
    assert refine_horizon(model, 10) == expected


def _slow_plant_split(seed: int, spec):
    """x[t] = 0.95 x[t-1] + 0.05 u[t-1] (gain 1, settling ~60 steps), measured with noise 0.1: the
    lagged noisy CV biases the equation-error fit's pole and with it the gain (~0.7 by least squares)."""
    rng = np.random.default_rng(seed)
    u = excitation(rng, 10, 400, 1, hold=20)
    x = np.zeros((10, 400, 1))
    for t in range(1, 400):
        x[:, t] = 0.95 * x[:, t - 1] + 0.05 * u[:, t - 1]
    return split_of(spec, run_series("r", u, x + 0.1 * rng.normal(size=x.shape), np.zeros((10, 400, 0))), 6, 2, 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_refinement_over_the_settling_horizon_gets_a_slow_noisy_plants_gain(monkeypatch, seed):
    import optimizer_pipeline.model.artifact as artifact_module

    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=5)
    split = _slow_plant_split(seed, spec)
    su, sy = split.normalisation.std[0], split.normalisation.std[1]

    def gain(artifact):  # engineering units; the plant's is 1
        return artifact.steady_gain["gain"][0][0] * sy / su

    settled = identify(split, spec, 1)
    assert settled.selection["refinement"]["horizon"] == 20 and settled.selection["refinement"]["kept"]
    with monkeypatch.context() as patch:  # the refinement over P steps only, as before
        patch.setattr(artifact_module, "refine_horizon", lambda model, horizon: horizon)
        p_step = identify(split, spec, 1)
    assert p_step.selection["refinement"]["horizon"] == 5
    assert abs(gain(settled) - 1) < min(0.05, abs(gain(p_step) - 1) / 2)  # 0.021-0.038 against 0.079-0.199


def test_refinement_that_worsens_validation_is_dropped_and_the_chosen_model_kept(monkeypatch):
    runs = plant_runs(seed=9, runs=10, n=400, noise=0.05)
    spec = binding(n_dv=1, na=1, nb=1, delay=1)
    split = split_of(spec, runs, 6, 2, 2)
    plain = _identify_without_refinement(monkeypatch, split, spec)

    def worse(model: ArxModel) -> ArxModel:  # a stable but wrong "refinement": the inputs' gains halved
        return ArxModel(model.orders, model.A, 0.5 * model.B, 0.5 * model.D, model.c)

    spoiled = _identify_without_refinement(monkeypatch, split, spec, worse)
    report = spoiled.selection["refinement"]
    assert report["tried"] and not report["kept"] and report["val_score_after"] > report["val_score_before"]
    assert spoiled.coefficients == plain.coefficients  # the chosen model, not the worse one
    assert spoiled.selection["final"] == plain.selection["final"]


def test_identify_rejects_train_runs_too_short_for_any_model():
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    runs = [RunSeries(f"r{i}", np.arange(2.0), np.ones((2, 1)) * i, np.ones((2, 1)) * i, np.empty((2, 0)))
            for i in range(3)]
    with pytest.raises(ContractError, match="usable rows"):
        identify(split_of(spec, runs, 1, 1, 1, norm=unit_normalisation(spec)), spec, 1)


def test_stack_rejects_a_run_whose_columns_do_not_match_the_tags():
    spec = binding(n_mv=2, n_cv=2)
    artifact = artifact_from_model(ArxModel(Orders(1, 1, 1), np.zeros((1, 2, 2)), np.zeros((1, 2, 2)),
                                            np.zeros((1, 2, 0)), np.zeros(2)), spec, 1, unit_normalisation(spec))
    bad = RunSeries("bad-run", np.arange(5.0), np.zeros((5, 3)), np.zeros((5, 2)), np.empty((5, 0)))
    with pytest.raises(ContractError, match="bad-run: u has shape"):
        stack_for(artifact, [bad])


STACK_NORM = Normalisation(("u0", "u1", "y0", "y1", "d0"), (1.0, -1.0, 2.0, 0.5, 0.0), (2.0, 4.0, 0.5, 1.0, 1e-9))


def test_stack_normalises_each_column_with_its_own_train_statistics_into_float_arrays():
    """Integer samples are stacked as floats; column j is (x - mean) / std of the j-th tag given; DVs
    given as any empty array where the binding has none; the runs' offsets and lengths."""
    runs = [RunSeries("a", np.arange(3.0), np.array([[1, 3], [5, -1], [3, 7]]), np.array([[2, 1], [4, 0], [3, 2]]),
                      np.empty(0)),
            RunSeries("b", np.arange(2.0), np.array([[0, 1], [2, 2]]), np.array([[1, 1], [2, 0]]), np.empty((2, 0)))]
    stacked = stack_runs(runs, STACK_NORM, ("u1", "u0"), ("y0", "y1"), ())
    assert stacked.u.dtype == stacked.y.dtype == np.float64 and stacked.d.shape == (5, 0)
    np.testing.assert_array_equal(stacked.u[:, 0], (np.array([1, 5, 3, 0, 2]) + 1.0) / 4.0)  # column 0 is u1
    np.testing.assert_array_equal(stacked.u[:, 1], (np.array([3, -1, 7, 1, 2]) - 1.0) / 2.0)
    np.testing.assert_array_equal(stacked.y[:, 0], (np.array([2, 4, 3, 1, 2]) - 2.0) / 0.5)
    assert list(stacked.offsets) == [0, 3] and list(stacked.lengths) == [3, 2] and stacked.run_ids == ("a", "b")


def test_stack_of_no_runs_is_empty_in_every_part():
    stacked = stack_runs([], STACK_NORM, ("u0", "u1"), ("y0",), ("d0",))
    assert stacked.u.shape == (0, 2) and stacked.y.shape == (0, 1) and stacked.d.shape == (0, 1)
    assert stacked.offsets.size == 0 and stacked.lengths.size == 0


def test_stack_names_every_tag_without_train_statistics_and_every_flat_tag():
    with pytest.raises(ContractError) as missing:
        stack_runs([], STACK_NORM, ("u0", "u7"), ("y0", "y9"), ())
    assert str(missing.value) == "normalisation: no train statistics for tag(s) u7, y9"
    flat = Normalisation(("u0", "u1", "y0"), (0.0, 0.0, 0.0), (0.5e-9, 0.9e-9, 1.0))
    with pytest.raises(ContractError) as both:
        stack_runs([], flat, ("u0", "u1"), ("y0",), ())
    assert str(both.value).startswith("normalisation: train std of u0, u1 is below 1e-09 (never moves")
    assert stack_runs([], STACK_NORM, (), ("y0",), ("d0",)).d.shape == (0, 1)  # a std of exactly MIN_STD is kept


@pytest.mark.parametrize("shapes, dv_tags, refused", [
    (((4, 1), (4, 2), (4, 1)), ("d0",), "y has shape (4, 1), expected (4, 2)"),
    (((4, 2), (4, 2), (4, 2)), ("d0",), "d has shape (4, 2), expected (4, 1)"),
    (((4, 2), (4, 2), (4, 1)), (), "d has shape (4, 1), expected (4, 0)"),  # a DV the binding does not have
])
def test_stack_names_the_run_and_part_whose_shape_is_wrong(shapes, dv_tags, refused):
    y, u, d = (np.ones(shape) for shape in shapes)
    with pytest.raises(ContractError) as bad:
        stack_runs([RunSeries("r3", np.arange(4.0), u, y, d)], STACK_NORM, ("u0", "u1"), ("y0", "y1"), dv_tags)
    assert str(bad.value) == f"run r3: {refused}"


# ---------------------------------------------------------------- current state and bias

KNOWN = ArxModel(Orders(1, 2, 1), A=np.array([[[0.5]]]), B=np.array([[[1.0]], [[0.25]]]), D=np.zeros((2, 1, 0)),
                 c=np.array([0.1]))


def known_artifact():
    spec = binding(n_mv=1, n_cv=1, na=1, nb=2, delay=1, horizon=3)
    return artifact_from_model(KNOWN, spec, 1, Normalisation(("u0", "y0"), (0.5, 1.0), (4.0, 2.0)))


def known_simulation(yn, un, start, steps, bias):
    """KNOWN's plain recursion in normalised units from the measured history at `start`, `bias` added to
    every step: y[start + 1 .. start + steps]."""
    sim = {start: yn[start]}
    for t in range(start + 1, start + steps + 1):
        sim[t] = 0.5 * sim[t - 1] + un[t - 1] + 0.25 * un[t - 2] + 0.1 + bias
    return np.array([sim[t] for t in range(start + 1, start + steps + 1)])


def fitted_bias(yn, un, window):
    """The constant that, added to every step of KNOWN's recursion over the last `window` rows, fits
    their measured y best: np.linalg.lstsq on the recursion's response to a unit bias."""
    n = len(yn)
    free = known_simulation(yn, un, n - 1 - window, window, 0.0)
    response = known_simulation(yn, un, n - 1 - window, window, 1.0) - free
    return np.linalg.lstsq(response[:, None], yn[n - window:] - free, rcond=None)[0]


def test_disturbance_window_is_two_settling_horizons_at_least_p():
    # KNOWN's unit MV step from rest: y = 1, 1.75, 2.125, 2.3125, 2.406, ... -> 2.5; within 5 % of 2.5
    # (0.125) from the 5th step on (2.3125 is 0.19 away): settling horizon 5
    ss = KNOWN.realise()
    assert disturbance_window(ss, 3) == 10 and disturbance_window(ss, 12) == 12
    integrating = ArxModel(Orders(1, 1, 1), A=np.array([[[1.0]]]), B=np.array([[[1.0]]]), D=np.zeros((1, 1, 0)),
                           c=np.zeros(1))
    assert disturbance_window(integrating.realise(), 7) == 7  # never settles: P


def test_current_state_bias_is_the_disturbance_fitted_to_the_multi_step_error_of_the_last_window():
    rng = np.random.default_rng(5)
    y, u = rng.normal(size=30) * 2 + 1, rng.normal(size=30) * 4 + 0.5
    run = RunSeries("live", np.arange(30.0), u[:, None], y[:, None], np.empty((30, 0)))
    x0, bias = current_state(known_artifact(), run)
    yn, un = (y - 1.0) / 2.0, (u - 0.5) / 4.0
    np.testing.assert_allclose(x0, [yn[29], un[28]])  # x[t] = [y[t], u[t-1]]
    np.testing.assert_allclose(bias, fitted_bias(yn, un, 10), rtol=1e-10)  # W = 2 x 5 settling steps
    assert abs(bias[0] - fitted_bias(yn, un, 9)[0]) > 1e-3  # (the window matters)


def test_current_state_fits_the_disturbance_over_the_rows_a_short_run_has():
    y = np.array([1.0, 2.0, 0.5, 3.0, 2.5, 4.0])
    u = np.array([0.0, 1.0, 2.0, -1.0, 3.0, 0.5])
    run = RunSeries("live", np.arange(6.0), u[:, None], y[:, None], np.empty((6, 0)))
    _, bias = current_state(known_artifact(), run)
    yn, un = (y - 1.0) / 2.0, (u - 0.5) / 4.0
    np.testing.assert_allclose(bias, fitted_bias(yn, un, 4), rtol=1e-10)  # rows 1..4 have a state before them


RAISE = np.array([0.3, -0.2])  # the known disturbance of `raised_plant`, engineering units
RAISE_NORMALISED = RAISE / np.array([3.0, 0.5])  # over the CVs' std of its normalisation


def raised_plant() -> tuple:
    """The 2x2 truth of this module with its equation offset raised by RAISE, started away from rest and
    driven by moving MVs / DVs, without noise: its run of 120 rows and the exact model's artifact."""
    spec = binding(n_dv=1, na=2, nb=2, delay=2, horizon=6)
    rng = np.random.default_rng(8)
    u, d = MEAN_U + excitation(rng, 1, 120, 2), MEAN_D + 0.5 * excitation(rng, 1, 120, 1, hold=20)
    y = simulate_arx(A_TRUE, B_TRUE, D_TRUE, C_TRUE + RAISE, 2, u, d, np.zeros((1, 120, 2)),
                     y_init=rng.normal(size=(1, 3, 2)))
    norm = Normalisation(spec.tags, (3.0, -1.0, 1.0, 2.0, 2.0), (2.0, 1.0, 3.0, 0.5, 1.5))
    A, B, D, c = normalised_truth(norm, spec)
    return run_series("r", u, y, d)[0], artifact_from_model(ArxModel(Orders(2, 2, 2), A, B, D, c), spec, 1, norm)


def test_current_state_recovers_a_held_disturbance_exactly_without_noise():
    # the fitted disturbance is the raise (normalised units)
    run, artifact = raised_plant()
    _, bias = current_state(artifact, run)
    np.testing.assert_allclose(bias, RAISE_NORMALISED, atol=1e-9)


def test_the_live_states_missing_values_are_left_out_and_its_newest_ones_predicted_exactly_without_noise():
    """The held disturbance test's plant (exact model, no noise): CV values cleaning filled in (wrong
    here on purpose) are left out of the disturbance fit, which still finds the raise; the newest
    two rows' missing CV values (held placeholders) are predicted as the plant gave them."""
    truth, artifact = raised_plant()
    unmeasured = np.zeros((120, 2), bool)
    unmeasured[[110, 111], 0] = unmeasured[[113], 1] = True  # filled in across gaps, in the fit's window
    assert disturbance_window(artifact.state_space, artifact.horizon) > 118 - 110
    unmeasured[118, 1] = unmeasured[119, :] = True  # the newest: held
    wrong = np.where(unmeasured, truth.y + 5.0, truth.y)
    live = RunSeries("r", truth.t, truth.u, wrong, truth.d, unmeasured=unmeasured)
    assert live.newest_unmeasured == 2 and live.first(118).newest_unmeasured == 0
    _, bias = current_state(artifact, live.first(118))
    np.testing.assert_allclose(bias, RAISE_NORMALISED, atol=1e-9)
    predicted = predicted_run(artifact, live)
    np.testing.assert_allclose(predicted.y[118:], truth.y[118:], atol=1e-9)
    np.testing.assert_array_equal(predicted.y[:118], wrong[:118])  # only the newest are replaced
    assert predicted.unmeasured is live.unmeasured and predicted_run(artifact, truth) is truth
    x0, bias = current_state(artifact, predicted)
    np.testing.assert_allclose(bias, RAISE_NORMALISED, atol=1e-9)
    np.testing.assert_allclose(x0, current_state(artifact, truth)[0], atol=1e-9)


def test_the_fitted_disturbance_reaches_the_settled_prediction_with_less_noise_than_the_mean_residual():
    # a slow plant (steady disturbance gain 1 / (1 - 0.9) = 10) at rest under white measurement noise,
    # model exact: the true disturbance is 0, so its settled effect G_ss * bias is pure noise. The mean
    # one-step residual over P rows (the estimate before) carries its end samples' noise times G_ss / P
    slow = ArxModel(Orders(1, 1, 1), A=np.array([[[0.9]]]), B=np.array([[[0.1]]]), D=np.zeros((1, 1, 0)),
                    c=np.zeros(1))
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=8)
    artifact = artifact_from_model(slow, spec, 1, unit_normalisation(spec))
    rng = np.random.default_rng(3)
    fitted, mean_residual = [], []
    for _ in range(300):
        y = 0.05 * rng.normal(size=200)
        run = RunSeries("live", np.arange(200.0), np.zeros((200, 1)), y[:, None], np.empty((200, 0)))
        fitted.append(current_state(artifact, run)[1][0] * 10)
        mean_residual.append(np.mean(y[-8:] - 0.9 * y[-9:-1]) * 10)
    assert abs(np.mean(fitted)) < 0.01  # unbiased
    assert np.std(fitted) < 0.2 * np.std(mean_residual)  # measured: 0.0092 against 0.089


def test_current_state_bias_is_zero_when_no_row_has_a_one_step_prediction():
    run = RunSeries("live", np.arange(2.0), np.array([[1.0], [2.0]]), np.array([[0.0], [1.0]]), np.empty((2, 0)))
    _, bias = current_state(known_artifact(), run)
    np.testing.assert_array_equal(bias, [0.0])


def test_current_state_rejects_a_run_too_short_for_the_state():
    run = RunSeries("tiny-run", np.arange(1.0), np.array([[1.0]]), np.array([[0.0]]), np.empty((1, 0)))
    with pytest.raises(ContractError, match="tiny-run: 1 rows are too few"):
        current_state(known_artifact(), run)



def test_identify_rejects_a_tag_that_never_moves_in_train():
    runs = plant_runs(seed=11, runs=6, n=200, noise=0.02)
    spec = binding(n_dv=1)
    runs = [RunSeries(r.run_id, r.t, r.u, r.y, np.full_like(r.d, 2.0)) for r in runs]  # constant DV
    with pytest.raises(ContractError, match="train std of d0 is below"):
        identify(split_of(spec, runs, 4, 1, 1), spec, 1)


def test_selection_falls_back_to_train_when_no_val_run_holds_a_window():
    runs = plant_runs(seed=12, runs=6, n=300, noise=0.02)
    spec = binding(n_dv=1)
    artifact = identify(split_of(spec, runs, 4, 0, 2), spec, 1)
    assert artifact.selection["data"].startswith("train")


def test_ill_conditioned_steady_gain_is_flagged():
    rng = np.random.default_rng(13)
    u = excitation(rng, 8, 300, 2)
    gain = np.array([[[1.0, 0.99], [0.99, 0.98]]]) * 0.2  # nearly rank one
    y = simulate_arx(np.array([[[0.8, 0.0], [0.0, 0.8]]]), gain, np.zeros((1, 2, 0)), np.zeros(2), 1, u,
                     np.zeros((8, 300, 0)), 0.01 * rng.normal(size=(8, 300, 2)))
    spec = binding(na=1, nb=1, delay=1)
    artifact = identify(split_of(spec, run_series("r", u, y, np.zeros((8, 300, 0))), 4, 2, 2), spec, 1)
    record = artifact.steady_gain
    assert record["ill_conditioned"] and record["condition"] > 100


def test_refinement_sensitivities_equal_finite_differences():
    from optimizer_pipeline.model.fit import _simulate

    rng = np.random.default_rng(14)
    orders = Orders(2, 2, 1)
    theta = 0.3 * rng.normal(size=(2 * 2 + 2 * 3 + 1, 2))  # ny = 2; exo = 2 lags x (2 MVs + 1 DV) + 1
    y_hist, exo = rng.normal(size=(5, 2, 2)), rng.normal(size=(5, 6, 7))
    _, jac = _simulate(theta, orders, y_hist, exo, True)
    eps = 1e-6
    for r, c in [(0, 0), (3, 1), (5, 0), (10, 1)]:
        step = np.zeros_like(theta)
        step[r, c] = eps
        plus, _ = _simulate(theta + step, orders, y_hist, exo, False)
        minus, _ = _simulate(theta - step, orders, y_hist, exo, False)
        np.testing.assert_allclose(jac[..., r, c], (plus - minus) / (2 * eps), atol=1e-7)


def test_settling_steps_of_known_step_responses():
    from optimizer_pipeline.model.statespace import SETTLE_FRACTION, settling_steps

    # y[t] = 0.9 y[t-1] + 0.1 u[t-delay]: after H steps held the response is 1 - 0.9^(H - delay + 1)
    for delay in (1, 3):
        model = ArxModel(Orders(1, 1, delay), np.full((1, 1, 1), 0.9), np.full((1, 1, 1), 0.1),
                         np.zeros((1, 1, 0)), np.zeros(1))
        expected = int(np.ceil(np.log(SETTLE_FRACTION) / np.log(0.9))) + delay - 1
        assert settling_steps(model.realise()) == expected
    # an integrator settles when its rate does: y[t] = y[t-1] + 0.1 u[t-1] ramps at 0.1 from the first step,
    # y[t] = 1.5 y[t-1] - 0.5 y[t-2] + 0.1 u[t-1] at a rate r[t] = 0.5 r[t-1] + 0.1 u[t-1], within 5 % of its
    # final 0.2 once 0.5^H <= 0.05
    integrator = ArxModel(Orders(1, 1, 1), np.ones((1, 1, 1)), np.full((1, 1, 1), 0.1), np.zeros((1, 1, 0)),
                          np.zeros(1))
    assert settling_steps(integrator.realise()) == 1
    lagged = ArxModel(Orders(2, 1, 1), np.array([[[1.5]], [[-0.5]]]), np.full((1, 1, 1), 0.1), np.zeros((1, 1, 0)),
                      np.zeros(1))
    assert settling_steps(lagged.realise()) == int(np.ceil(np.log(SETTLE_FRACTION) / np.log(0.5)))
    unstable = ArxModel(Orders(1, 1, 1), np.full((1, 1, 1), 1.05), np.full((1, 1, 1), 0.1), np.zeros((1, 1, 0)),
                        np.zeros(1))
    assert settling_steps(unstable.realise()) is None


def test_gain_uncertainty_is_the_jackknife_over_train_runs_of_the_chosen_fit():
    rng = np.random.default_rng(15)
    u = excitation(rng, 9, 200, 1)
    y = simulate_arx(np.array([[[0.7]]]), np.array([[[0.6]]]), np.zeros((1, 1, 0)), np.zeros(1), 1, u,
                     np.zeros((9, 200, 0)), 0.2 * rng.normal(size=(9, 200, 1)))
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=5)
    split = split_of(spec, run_series("r", u, y, np.zeros((9, 200, 0))), 5, 2, 2)
    artifact = identify(split, spec, 1)
    ridge = artifact.selection["final"]["ridge"]
    # independent: per left-out run, the ridge normal equations of y[t] ~ (y[t-1], u[t-1], 1), t >= 1
    mu, su = split.normalisation.of(spec.mv_tags)
    my, sy = split.normalisation.of(spec.cv_tags)
    rows = [np.column_stack([(r.y[:-1] - my) / sy, (r.u[:-1] - mu) / su, np.ones(len(r) - 1)]) for r in split.train]
    targets = [(r.y[1:, 0] - my[0]) / sy[0] for r in split.train]
    gains = []
    for left_out in range(len(rows)):
        phi = np.vstack([x for i, x in enumerate(rows) if i != left_out])
        target = np.concatenate([t for i, t in enumerate(targets) if i != left_out])
        a, b, _ = np.linalg.solve(phi.T @ phi / len(phi) + np.diag([ridge, ridge, 0.0]), phi.T @ target / len(phi))
        gains.append(b / (1 - a))
    k = len(gains)
    expected = (k - 1) / k * np.sum((np.array(gains) - np.mean(gains)) ** 2)
    record = artifact.steady_gain["uncertainty"]
    assert record["replicates"] == 5
    np.testing.assert_allclose(record["jackknife_std"], [[np.sqrt(expected)]], rtol=1e-6)
    # the total adds the local gains' spread over the held-out operating points (model/artifact.py)
    spread = np.asarray(record["operating_range"]["std"])
    np.testing.assert_allclose(record["cov"], [[[expected + spread[0, 0] ** 2]]], rtol=1e-6)
    np.testing.assert_allclose(record["std"], [[np.sqrt(expected + spread[0, 0] ** 2)]], rtol=1e-6)
    assert artifact.steady_gain["condition"] == 1.0


def test_the_gain_uncertainty_adds_the_local_gains_spread_to_the_jackknife():
    """steady_gain_record with replicates and local gains: per CV, cov = the jackknife's + the mean
    outer product of the local MV gains' deviations from G (the DV columns are not the MVs' gain);
    each part's standard errors are recorded; without local gains the jackknife alone."""
    model = ArxModel(Orders(1, 1, 1), np.array([[[0.5, 0.0], [0.0, 0.5]]]), np.array([[[1.0, 0.5], [0.0, 2.0]]]),
                     np.zeros((1, 2, 1)), np.zeros(2))  # G = B / (1 - 0.5) = [[2, 1], [0, 4]]
    replicates = [ArxModel(model.orders, model.A, model.B * f, model.D, model.c).realise() for f in (0.9, 1.0, 1.1)]
    gain = np.array([[2.0, 1.0], [0.0, 4.0]])
    deviations = np.array([[[0.2, -0.1], [0.0, 0.3]], [[-0.4, 0.1], [0.1, 0.1]]])
    local = np.concatenate([gain + deviations, np.full((2, 2, 1), 7.0)], axis=2)  # with a DV column
    jackknife = 2 / 3 * np.einsum("ia,ib->iab", 0.1 * gain, 0.1 * gain) * 2  # B scaled 0.9, 1, 1.1
    ranged = np.einsum("kia,kib->iab", deviations, deviations) / 2
    record = steady_gain_record(model, replicates, local)["uncertainty"]
    np.testing.assert_allclose(record["cov"], jackknife + ranged, atol=1e-12)
    np.testing.assert_allclose(record["std"], np.sqrt(np.einsum("iaa->ia", jackknife + ranged)), atol=1e-12)
    np.testing.assert_allclose(record["jackknife_std"], np.sqrt(np.einsum("iaa->ia", jackknife)), atol=1e-12)
    np.testing.assert_allclose(record["jackknife_cov"], jackknife, atol=1e-12)  # what the gain condition judges
    assert record["operating_range"]["points"] == 2
    np.testing.assert_allclose(record["operating_range"]["std"], np.sqrt(np.mean(deviations ** 2, axis=0)), atol=1e-12)
    assert record["method"] == f"{GAIN_JACKKNIFE}; plus {GAIN_OPERATING_RANGE}"
    for none in (None, np.zeros((0, 2, 3))):
        alone = steady_gain_record(model, replicates, none)["uncertainty"]
        np.testing.assert_allclose(alone["cov"], jackknife, atol=1e-12)
        assert alone["operating_range"] is None and alone["method"] == GAIN_JACKKNIFE


def test_a_single_train_run_records_no_gain_uncertainty():
    runs = plant_runs(seed=16, runs=5, n=300, noise=0.02)
    spec = binding(n_dv=1)
    assert identify(split_of(spec, runs, 1, 2, 2), spec, 1).steady_gain["uncertainty"] is None


def test_per_channel_delays_are_recovered_on_a_known_plant_and_its_gains_with_them():
    """Each CV its own first-order lag; every MV / DV channel its own dead time (2 to 6 samples)."""
    delays = np.array([[2, 5, 4], [6, 3, 1]])  # CV x (MV0, MV1, DV0)
    a, b = np.array([0.7, 0.8]), np.array([[0.5, -0.4, 0.3], [0.3, 0.6, -0.2]])
    rng = np.random.default_rng(17)
    runs, n = 10, 400
    v = excitation(rng, runs, n, 3)
    y = np.zeros((runs, n, 2))
    for t in range(n):  # plain recursion: y_i[t] = a_i y_i[t-1] + sum_j b_ij v_j[t - delay_ij] + noise
        for i in range(2):
            y[:, t, i] = 0.02 * rng.normal(size=runs) + (a[i] * y[:, t - 1, i] if t else 0.0) + sum(
                b[i, j] * v[:, t - delays[i, j], j] for j in range(3) if t >= delays[i, j])
    spec = binding(n_mv=2, n_cv=2, n_dv=1, na=None, nb=None, delay=None, horizon=10)
    split = split_of(spec, run_series("r", v[:, :, :2], y, v[:, :, 2:]), 6, 2, 2)
    artifact = identify(split, spec, 1)
    structure = artifact.selection["structure"]
    assert structure["delays"] == delays.tolist() and structure["own_ar"]
    assert (structure["na"], structure["nb"]) == (1, 1)
    assert artifact.delay == 1 and artifact.nb == 6  # realised: lags 1..6 span every channel
    settled = artifact.selection["settled_nrmse_by_family"]  # the families' settled errors
    assert settled["per_channel"] < settled["one_delay"]
    mu, su = split.normalisation.of(spec.mv_tags)
    my, sy = split.normalisation.of(spec.cv_tags)
    truth = (b[:, :2] / (1 - a)[:, None]) * su[None, :] / sy[:, None]  # steady gain in normalised units
    np.testing.assert_allclose(artifact.steady_gain["gain"], truth, rtol=0.02)


def test_a_binding_that_gives_the_delay_gets_one_delay_for_every_channel():
    runs = plant_runs(seed=18, runs=8, n=300, noise=0.02)
    spec = binding(n_dv=1, na=None, nb=None, delay=2)
    artifact = identify(split_of(spec, runs, 4, 2, 2), spec, 1)
    assert artifact.selection["per_channel_search"] is None
    assert artifact.selection["structure"]["delays"] == [[2, 2, 2], [2, 2, 2]]


def test_the_pieces_of_a_run_are_one_run_for_the_jackknife_and_gate_g4():
    """Pieces of one run cut at a gap (RunSeries.source_run) are not independent: the jackknife leaves
    the run out with all its pieces (the fit of the other runs' rows alone), and gate G4 counts it once."""
    from optimizer_pipeline.model.arx import stack_runs
    from optimizer_pipeline.model.artifact import quality_gates
    from optimizer_pipeline.model.fit import RidgeProblem

    rng = np.random.default_rng(16)
    u = excitation(rng, 4, 120, 1)
    y = simulate_arx(np.array([[[0.7]]]), np.array([[[0.6]]]), np.zeros((1, 1, 0)), np.zeros(1), 1, u,
                     np.zeros((4, 120, 0)), 0.2 * rng.normal(size=(4, 120, 1)))
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=5)

    def stacked(runs):
        return stack_runs(runs, unit_normalisation(spec), spec.mv_tags, spec.cv_tags, spec.dv_tags)

    whole = run_series("r", u, y, np.zeros((4, 120, 0)))
    pieces = [RunSeries(f"r0#{i + 1}", whole[0].t[rows], whole[0].u[rows], whole[0].y[rows], whole[0].d[rows],
                        source_run="r0") for i, rows in enumerate((slice(None, 60), slice(60, None)))]
    problem = RidgeProblem(stacked(pieces + whole[1:]), 1, 1)
    assert problem.n_runs == 4  # r0 (two pieces), r1, r2, r3
    others, orders = RidgeProblem(stacked(whole[1:]), 1, 1), Orders(1, 1, 1)
    for matrix in ("A", "B", "c"):
        np.testing.assert_allclose(getattr(problem.fit(orders, 1e-3, without=0), matrix),
                                   getattr(others.fit(orders, 1e-3), matrix), rtol=1e-12)
    g4 = quality_gates(problem.fit(orders, 1e-3), stacked(pieces), stacked(whole[1:]), stacked(whole[1:]), 5,
                       10_000)[-1]
    assert g4.name == "G4" and not g4.passed and "(train runs: 1)" in g4.description


def test_a_fits_effective_parameters_are_the_trace_of_its_ridge_hat_matrix():
    """RidgeProblem.effective_params against the hat matrix built by hand for y[t] = a y[t-1] + b u[t-1] + c
    (regressors [y[t-1], u[t-1], 1], the intercept not shrunk): tr(Phi (Phi'Phi + n R)^-1 Phi'); without
    a ridge, the 3 coefficients; the more ridge, the fewer."""
    from optimizer_pipeline.model.arx import stack_runs
    from optimizer_pipeline.model.fit import RidgeProblem

    rng = np.random.default_rng(3)
    u = excitation(rng, 3, 80, 1)
    y = simulate_arx(np.array([[[0.8]]]), np.array([[[0.5]]]), np.zeros((1, 1, 0)), np.zeros(1), 1, u,
                     np.zeros((3, 80, 0)), 0.1 * rng.normal(size=(3, 80, 1)))
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    runs = run_series("r", u, y, np.zeros((3, 80, 0)))
    problem = RidgeProblem(stack_runs(runs, unit_normalisation(spec), spec.mv_tags, spec.cv_tags, spec.dv_tags), 1, 1)
    structure = Structure.common(Orders(1, 1, 1), 1, 1)
    phi = np.concatenate([np.column_stack([r.y[:-1, 0], r.u[:-1, 0], np.ones(79)]) for r in runs])
    assert problem.n_rows == len(phi)
    for ridge in (1e-3, 0.05, 0.5):
        hat = phi @ np.linalg.solve(phi.T @ phi + len(phi) * np.diag([ridge, ridge, 0.0]), phi.T)
        assert problem.effective_params(structure, ridge) == pytest.approx(np.trace(hat), rel=1e-9)
    assert problem.effective_params(structure, 0.0) == pytest.approx(3.0, rel=1e-9)
    assert 1.0 < problem.effective_params(structure, 0.5) < problem.effective_params(structure, 0.05) < 3.0


@pytest.mark.parametrize("phi", [0.0, 0.6])
def test_gate_g4_counts_the_rows_as_independent_as_the_residuals_are(phi):
    """An exact model whose equation errors are AR(1) with coefficient phi: the residuals' lag-1
    correlation is phi (within sampling error), and G4 counts n (1 - phi) / (1 + phi) independent rows: enough
    for 150 effective parameters with white errors, not with these correlated ones."""
    from optimizer_pipeline.model.artifact import G4_ROWS_PER_PARAM, quality_gates, residual_correlation

    rng = np.random.default_rng(11)
    u, white = excitation(rng, 6, 400, 1), 0.1 * rng.normal(size=(6, 400, 1))
    noise = white.copy()
    for t in range(1, 400):
        noise[:, t] = phi * noise[:, t - 1] + white[:, t]
    y = simulate_arx(np.array([[[0.8]]]), np.array([[[0.5]]]), np.zeros((1, 1, 0)), np.zeros(1), 1, u,
                     np.zeros((6, 400, 0)), noise)
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    train = stack_runs(run_series("r", u, y, np.zeros((6, 400, 0))), unit_normalisation(spec), spec.mv_tags,
                       spec.cv_tags, spec.dv_tags)
    exact = ArxModel(Orders(1, 1, 1), np.array([[[0.8]]]), np.array([[[0.5]]]), np.zeros((1, 1, 0)), np.zeros(1))
    rho = residual_correlation(exact, train)
    assert rho == pytest.approx(phi, abs=0.05)
    g4 = quality_gates(exact, train, train, train, 5, 2394, 150.0)[-1]  # 150 effective parameters, say
    assert g4.value == pytest.approx(2394 * (1 - rho) / (1 + rho)) and g4.threshold == G4_ROWS_PER_PARAM * 150.0
    assert g4.passed is (phi == 0.0)  # 2394 rows hold 150 x 5; a quarter of them do not


def wood_berry_like_runs(seed: int):
    """Four first-order channels with their own poles (0.85-0.97) and dead times (1-8 samples), the
    CVs their sums: no low-order common or per-CV model holds both of a CV's poles."""
    poles, gains, delays = np.array([[0.9, 0.97], [0.95, 0.85]]), np.array([[1.0, -1.2], [0.6, -1.0]]), \
        np.array([[1, 6], [8, 3]])
    rng = np.random.default_rng(seed)
    runs, n = 10, 500
    u = excitation(rng, runs, n, 2, hold=25)
    lag, y = np.zeros((runs, 2, 2)), np.zeros((runs, n, 2))
    for t in range(n):
        y[:, t] = lag.sum(axis=2) + 0.02 * rng.normal(size=(runs, 2))
        for i in range(2):
            for j in range(2):
                held = u[:, t - delays[i, j] + 1, j] if t >= delays[i, j] - 1 else 0.0
                lag[:, i, j] = poles[i, j] * lag[:, i, j] + (1 - poles[i, j]) * gains[i, j] * held
    return gains, run_series("w", u, y, np.zeros((runs, n, 0)))


def test_the_long_numerator_family_wins_where_channels_have_poles_of_their_own():
    """A binding that leaves every order to the data also gets the long numerator (na = 1, delay = 1, nb
    from LONG_NB); identify keeps the family whose best model settles closest on the held-out runs, here
    the long numerator by far, kept as least squares fitted it; its steady gain is the plant's."""
    gains, runs = wood_berry_like_runs(5)
    spec = binding(n_mv=2, n_cv=2, na=None, nb=None, delay=None, horizon=10)
    split = split_of(spec, runs, 6, 2, 2)
    artifact = identify(split, spec, 1)
    selection, settled = artifact.selection, artifact.selection["settled_nrmse_by_family"]
    assert selection["family"] == "long_numerator" and selection["long_numerator"] == list(LONG_NB)
    assert (artifact.na, artifact.delay) == (1, 1) and artifact.nb in LONG_NB
    assert settled["long_numerator"] < 0.5 * min(settled["one_delay"], settled["per_channel"])
    assert not selection["refinement"]["tried"] and "long numerator" in selection["refinement"]["reason"]
    mu, su = split.normalisation.of(spec.mv_tags)
    my, sy = split.normalisation.of(spec.cv_tags)
    truth = gains * su[None, :] / sy[:, None]  # normalised units
    np.testing.assert_allclose(artifact.steady_gain["gain"], truth, atol=0.1 * np.abs(truth).max())


@pytest.mark.parametrize("settled, g4, kept", [
    ((0.30, 0.20), (True, True), 1),  # the long numerator settles closer by more than LONG_MARGIN: kept
    ((0.21, 0.20), (True, True), 0),  # ... by less: the per-channel model
    ((0.24, 0.20), (True, False), 0),  # closer, but its data cannot pin it down; the other is within the margin
    ((0.40, 0.20), (True, False), 1),  # ... and outside it: the closest, failing G4 (its status says so)
    ((0.30, 0.20), (False, False), 1),  # no family passes: the closest
])
def test_the_family_kept_is_the_closest_unless_it_fails_g4_and_one_within_the_margin_passes(settled, g4, kept):
    from optimizer_pipeline.model.artifact import family_choice

    index, reason = family_choice(["per_channel", "long_numerator"], settled, g4)
    assert index == kept and reason.startswith(["per_channel", "long_numerator"][kept])
    assert ("fails G4" in reason) == (g4 == (True, False) and kept == 0)


def test_identify_records_which_families_pass_g4_and_why_one_was_kept():
    _, runs = wood_berry_like_runs(5)
    spec = binding(n_mv=2, n_cv=2, na=None, nb=None, delay=None, horizon=10)
    selection = identify(split_of(spec, runs, 6, 2, 2), spec, 1).selection
    choice = selection["family_choice"]
    assert set(choice["g4_passed"]) == set(selection["settled_nrmse_by_family"])
    assert choice["reason"].startswith(selection["family"] + ":")


def test_a_binding_that_gives_an_order_gets_no_long_numerator():
    _, runs = wood_berry_like_runs(6)
    spec = binding(n_mv=2, n_cv=2, na=2, nb=None, delay=None, horizon=10)
    artifact = identify(split_of(spec, runs, 6, 2, 2), spec, 1)
    assert artifact.selection["long_numerator"] == "not searched" and artifact.selection["family"] != "long_numerator"
    assert all(s["nb"] not in LONG_NB for s in artifact.selection["order_scores"])


def test_a_structure_is_a_long_numerator_only_where_the_binding_searched_them():
    """A binding that gives nb = 20 itself has one-delay candidates of that length: they are refined
    and compared as such (selection.family), not handicapped as long numerators."""
    from optimizer_pipeline.model.fit import Structure
    from optimizer_pipeline.model.select import family

    long = Structure.common(Orders(1, LONG_NB[0], 1), 2, 2)
    assert family(long, binding(na=None, nb=None, delay=None)) == "long_numerator"
    assert family(long, binding(na=None, nb=LONG_NB[0], delay=None)) == "one_delay"
    assert family(Structure.common(Orders(1, 3, 1), 2, 2), binding(na=None, nb=None, delay=None)) == "one_delay"
    assert family(Structure(1, 2, ((1, 3), (2, 2)), own_ar=True), binding(na=None, nb=None, delay=None)) == \
        "per_channel"
