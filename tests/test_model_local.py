"""Local refits (model/local.py): the weighted regression, the local gain of a plant whose gain changes
with the operating point, the choice identify records, and the SETTLED_LOCAL / MAX_RESIDUAL_LOCAL scores."""

import dataclasses
import json
import re

import numpy as np
import pytest
from model_helpers import binding, run_series, split_of, unit_normalisation

from optimizer_pipeline import pipeline, uq
from optimizer_pipeline.contracts import StateSpace, binding_from_dict
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model, identify, stack_for
from optimizer_pipeline.model import local as local_module
from optimizer_pipeline.model.artifact import LOCAL_WINDOWS, current_state, local_artifact, local_fitter
from optimizer_pipeline.model.arx import (disturbance_window, fit_disturbance, nrmse, rollout_windows, stack_runs,
                                          stride_for, window_rows)
from optimizer_pipeline.model.fit import RidgeProblem, Structure
from optimizer_pipeline.model.local import (GLOBAL, LOCAL, LOCAL_BANDWIDTH, REGION_FRACTION, REGIONS_KEPT,
                                            SETTLE_FACTOR, LocalFitter, OperatingPoint, local_paths, settle_limit,
                                            steady_model_record, steady_procedure, structure_of)
from optimizer_pipeline.model import statespace
from optimizer_pipeline.model.statespace import disturbance_gain, disturbance_step_gains, settling_steps, steady_state

POLE, INPUT = 0.8, 0.2  # y[t] = 0.8 y[t-1] + 0.2 f(u[t-1]): steady y = f(u)


def curved(u: np.ndarray) -> np.ndarray:
    """A static nonlinearity whose local gain f'(u) = 1 + u runs from -1 to 3 over [-2, 2]."""
    return u + 0.5 * u ** 2


def hammerstein_runs(seed: int, runs: int = 8, n: int = 400, noise: float = 0.0):
    """Runs of y[t] = POLE y[t-1] + INPUT f(u[t-1]) (+ noise), u random steps in [-2, 2] held 30-60 rows."""
    rng = np.random.default_rng(seed)
    u = np.empty((runs, n, 1))
    for r in range(runs):
        row = 0
        while row < n:
            hold = int(rng.integers(30, 61))
            u[r, row:row + hold, 0] = rng.uniform(-2.0, 2.0)
            row += hold
    y = plant(u) + noise * rng.normal(size=u.shape)
    return run_series("h", u, y, np.zeros((runs, n, 0)))


def plant(u: np.ndarray) -> np.ndarray:
    """The noise-free Hammerstein plant's CV (runs, n, 1) for MVs u (runs, n, 1), settled at the start."""
    y = np.zeros(u.shape)
    y[:, 0] = curved(u[:, 0])
    for t in range(1, u.shape[1]):
        y[:, t] = POLE * y[:, t - 1] + INPUT * curved(u[:, t - 1])
    return y


def split_runs(spec, runs):
    """Half the runs train, a quarter val, the rest test (no live run)."""
    n_train = len(runs) // 2
    n_val = (len(runs) - n_train) // 2
    return split_of(spec, runs, n_train, n_val, len(runs) - n_train - n_val)


def steady_binding(na=1, nb=1, delay=1):
    doc = binding(n_mv=1, n_cv=1, na=na, nb=nb, delay=delay, horizon=10).to_dict()
    doc["profile"] = {**doc["profile"], "template": "steady_response@1", "horizon": 1}
    return binding_from_dict(doc)


def test_the_weighted_regression_is_least_squares_with_the_rows_weighted():
    runs = hammerstein_runs(1, runs=3, n=120, noise=0.05)
    spec = steady_binding()
    split = split_runs(spec, runs)
    train = stack_for(identify(split, spec, 1), split.train)
    problem = RidgeProblem(train, 1, 1)
    weights = np.random.default_rng(0).uniform(0.1, 2.0, problem.n_rows)
    model = problem.weighted(weights).fit(Orders(1, 1, 1), 0.0)
    rows = problem.rows  # independent: lstsq of sqrt(w) [y[t-1], u[t-1], 1] against sqrt(w) y[t]
    phi = np.column_stack([train.y[rows - 1, 0], train.u[rows - 1, 0], np.ones(rows.size)])
    root = np.sqrt(weights)
    theta = np.linalg.lstsq(phi * root[:, None], train.y[rows, 0] * root, rcond=None)[0]
    np.testing.assert_allclose([model.A[0, 0, 0], model.B[0, 0, 0], model.c[0]], theta, rtol=1e-7, atol=1e-9)
    # all-ones weights are the plain regression
    plain, ones = problem.fit(Orders(1, 1, 1), 1e-3), problem.weighted(np.ones(problem.n_rows)).fit(Orders(1, 1, 1), 1e-3)
    for name in ("A", "B", "c"):
        np.testing.assert_allclose(getattr(ones, name), getattr(plain, name), rtol=1e-12)


def test_weighted_fits_solve_each_row_of_weights_as_its_own_weighted_regression(monkeypatch):
    """Several weightings at once, the normal equations summed over blocks of target rows (a block
    smaller than the rows here, so the sum crosses blocks), two CVs with their own delays per input,
    an MV and a DV, three runs: each the same model as `weighted(w).fit`; no weighting, no fit."""
    from optimizer_pipeline.model import fit as fit_module
    rng = np.random.default_rng(1)
    u, d = rng.normal(size=(3, 90, 1)), rng.normal(size=(3, 90, 1))
    y = np.concatenate([np.cumsum(u, axis=1) * 0.1 + d, 0.5 * np.roll(u, 2, axis=1)], axis=2) + rng.normal(size=(3, 90, 2))
    spec = binding(n_mv=1, n_cv=2, n_dv=1)
    train = stack_runs(run_series("w", u, y, d), unit_normalisation(spec), spec.mv_tags, spec.cv_tags, spec.dv_tags)
    problem = RidgeProblem(train, 2, 3)
    p = problem._phi.shape[1]
    monkeypatch.setattr(fit_module, "WEIGHTED_BLOCK_VALUES", 37 * (p * p + 2 * p))  # 37 rows a block
    weights = rng.uniform(0.0, 2.0, (3, problem.n_rows))
    structure = Structure(2, 2, ((1, 2), (2, 1)), own_ar=True)
    fits = problem.weighted_fits(structure, 1e-3, weights)
    assert len(fits) == 3 and problem.n_rows > 2 * 37 and problem.n_runs == 3
    for w, model in zip(weights, fits):
        alone = problem.weighted(w).fit(structure, 1e-3)
        for name in ("A", "B", "D", "c"):
            np.testing.assert_allclose(getattr(model, name), getattr(alone, name), rtol=1e-9, atol=1e-12)
    assert not np.allclose(fits[0].B, fits[1].B)  # the weights matter
    assert problem.weighted_fits(structure, 1e-3, np.zeros((0, problem.n_rows))) == []


def test_rollout_each_rolls_every_start_point_out_by_its_own_model():
    """Three models of one layout (2 CVs, an MV and a DV), each start point by its own: the product's
    one-model rollout of that point."""
    rng = np.random.default_rng(3)
    models = [StateSpace.of(0.5 * rng.uniform(-1, 1, (4, 4)), rng.normal(size=(4, 1)), rng.normal(size=(4, 1)),
                            rng.normal(size=4), rng.normal(size=(2, 4))) for _ in range(3)]
    x0, u, d = rng.normal(size=(3, 4)), rng.normal(size=(3, 7, 1)), rng.normal(size=(3, 7, 1))
    each = statespace.rollout_each(models, x0, u, d)
    assert each.shape == (3, 7, 2)
    for i, model in enumerate(models):
        np.testing.assert_allclose(each[i], statespace.rollout(model, x0[i:i + 1], u[i:i + 1], d[i:i + 1])[0],
                                   rtol=1e-12, atol=1e-12)
    without = statespace.rollout_each(models, x0, u)  # no DVs given: none drive the state
    np.testing.assert_allclose(without[1], statespace.rollout(models[1], x0[1:2], u[1:2])[0], rtol=1e-12, atol=1e-12)


def test_the_local_model_has_the_plants_local_gain_where_the_global_fit_has_the_average():
    """Noise-free Hammerstein data: the global fit's steady gain is the average slope of f over the
    data (~1), the refit around u = 1 the slope there (f'(1) = 2), in engineering units."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    train = stack_for(artifact, split.train)
    (u_mean,), (u_std,) = artifact.normalisation.of(spec.mv_tags)
    (y_mean,), (y_std,) = artifact.normalisation.of(spec.cv_tags)

    def gain(model: ArxModel) -> float:
        return float(steady_state(model.realise())[0][0, 0] * y_std / u_std)

    point = OperatingPoint(np.array([(1.0 - u_mean) / u_std]), np.array([(curved(1.0) - y_mean) / y_std]))
    fitter = LocalFitter.for_artifact(artifact, train)
    fit, refused = fitter.refit(point, 1000)
    local = gain(fit.model)
    overall = float(steady_state(artifact.state_space)[0][0, 0] * y_std / u_std)
    assert refused == "" and abs(overall - 1.0) < 0.3  # the average slope of 1 + u over u in [-2, 2]
    assert abs(local - 2.0) < 0.6 * abs(overall - 2.0), (local, overall)  # the kernel's width still averages
    # the kernel: a row's weight falls with its previous MVs' / CVs' distance from the point, the nearest 1
    w = fitter.weights(point)
    rows = fitter.problem.rows
    z = ((train.u[rows - 1, 0] - point.u[0]) ** 2 + (train.y[rows - 1, 0] - point.y[0]) ** 2)
    np.testing.assert_allclose(w, np.exp(-0.5 * (z - z.min()) / LOCAL_BANDWIDTH ** 2))
    assert fit.effective_rows == pytest.approx(w.sum() ** 2 / np.sum(w ** 2)) and 10 < fit.effective_rows < rows.size
    # the width is in train standard deviations: half of it, the exponent of each row's distance is 4 times as large
    narrow = LocalFitter(fitter.structure, fitter.ridge, train, bandwidth=0.5)
    np.testing.assert_allclose(narrow.weights(point), np.exp(-2.0 * (z - z.min())))
    # refitted together with a point further out, each refit is the one of that point alone
    further = OperatingPoint(point.u + 1.5, point.y - 1.0)
    together = list(fitter.refits([point, further], 1000))
    for (fit_k, _), alone in zip(together, (fit, fitter.refit(further, 1000)[0])):
        assert fit_k.effective_rows == pytest.approx(alone.effective_rows, rel=1e-12)
        np.testing.assert_allclose(fit_k.model.B, alone.model.B, rtol=1e-9)
    # ... and each point's own nearest row weighs 1: a narrow kernel far from the data counts its
    # effective rows instead of underflowing to 0 / 0 (next to a point near the data)
    far = OperatingPoint(point.u + 8.0, point.y - 8.0)
    (near_fit, _), (none, refused) = fitter.with_bandwidth(0.1).refits([point, far], 1000)
    assert none is None and re.fullmatch(r"\d+ effective train rows near the operating point, fewer than 30", refused)
    # the fit carries its weighted regression (the jackknife refits it): the row weights' total, the same model
    assert fit.problem.run_rows.sum() == pytest.approx(w.sum(), rel=1e-12)
    again = fit.problem.fit(fitter.structure, fitter.ridge)
    for name in ("A", "B", "c"):
        np.testing.assert_allclose(getattr(again, name), getattr(fit.model, name), rtol=1e-12)


def test_a_refit_far_from_the_data_or_too_slow_is_refused():
    """Far from every train row the kernel leaves a handful of effective rows: refused, whatever the
    weights' scale; a refit that cannot settle within the steps the evidence scores: refused."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    far = OperatingPoint(np.array([8.0]), np.array([-8.0]))  # 8 train std out on both axes
    fit, refused = fitter.refit(far, 1000)
    assert fit is None and "effective train rows near the operating point, fewer than 30" in refused  # 10 x 3
    near = OperatingPoint(np.array([0.0]), np.array([0.0]))
    assert fitter.refit(near, 1000)[0] is not None
    fit, refused = fitter.refit(near, 2)  # the pole 0.8 needs ~14 steps to come within 5 %
    assert fit is None and refused.startswith("the refit does not settle within 2 steps")


def linear_plant(u: np.ndarray, seed: int) -> np.ndarray:
    """y[t] = POLE y[t-1] + INPUT u[t-1] with noise 0.05 (runs, n), for MVs u (runs, n, 1)."""
    y = np.zeros(u.shape[:2])
    y[:, 0] = u[:, 0, 0]
    for t in range(1, u.shape[1]):
        y[:, t] = POLE * y[:, t - 1] + INPUT * u[:, t - 1, 0]
    return y + 0.05 * np.random.default_rng(seed).normal(size=y.shape)


def test_identify_keeps_the_local_procedure_where_it_settles_closer_for_both_templates():
    """The curved plant: the refit settles closer on val windows, for a steady target and a move plan
    alike (both are solved with the choice); a linear plant: it only adds variance, the identified
    model is kept."""
    split = split_runs(steady_binding(), hammerstein_runs(3, noise=0.01))
    artifact = identify(split, steady_binding(), 1)
    choice = artifact.selection["steady_model"]
    assert steady_procedure(artifact) == choice["procedure"] == "local"
    assert choice["settled_nrmse"]["local"] < 0.85 * choice["settled_nrmse"]["global"]
    assert choice["windows"] > 10 and choice["refits"] == choice["windows"]
    move_plan = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    plan = identify(split_runs(move_plan, hammerstein_runs(3, noise=0.01)), move_plan, 1)
    assert plan.selection["steady_model"] == choice  # the same data, the same comparison
    u = np.stack([run.u for run in hammerstein_runs(3)])  # the same excitation on a linear plant
    linear = run_series("lin", u, linear_plant(u, 5)[:, :, None], np.zeros((u.shape[0], u.shape[1], 0)))
    kept = identify(split_runs(move_plan, linear), move_plan, 1).selection["steady_model"]
    assert kept["procedure"] == "global" and kept["settled_nrmse"]["global"] <= kept["settled_nrmse"]["local"]


def wiener_runs(seed: int, noise: float = 0.01):
    """hammerstein_runs' MVs through the linear lag first and a saturation after it: y = tanh(x), x[t] =
    POLE x[t-1] + INPUT u[t-1] (+ noise), so the gain falls off quickly as |y| nears 1."""
    u = np.stack([run.u for run in hammerstein_runs(seed)])
    x = np.zeros(u.shape)
    x[:, 0] = u[:, 0]
    for t in range(1, u.shape[1]):
        x[:, t] = POLE * x[:, t - 1] + INPUT * u[:, t - 1]
    y = np.tanh(x) + noise * np.random.default_rng(seed + 100).normal(size=x.shape)
    return run_series("w", u, y, np.zeros((u.shape[0], u.shape[1], 0)))


def test_identify_chooses_the_kernel_width_that_settles_closest_and_the_solve_uses_it():
    """A saturating output (gain falling off quickly): the narrowest width settles closest on val
    windows; the gently curved Hammerstein plant: the widest. Each recorded error is the local
    procedure's at that width (local_paths recomputed), the recorded width is their minimum, and the
    refits of the solve and the evidence (LocalFitter.for_artifact) use it; an artifact without the
    record uses LOCAL_BANDWIDTH."""
    spec = steady_binding()
    for runs, expected in ((wiener_runs(5), min(local_module.BANDWIDTHS)),
                           (hammerstein_runs(3, noise=0.01), max(local_module.BANDWIDTHS))):
        split = split_runs(spec, runs)
        artifact = identify(split, spec, 1)
        choice = artifact.selection["steady_model"]
        by_width = {float(b): e for b, e in choice["settled_nrmse_by_bandwidth"].items()}
        assert set(by_width) == set(local_module.BANDWIDTHS) and choice["procedure"] == LOCAL
        assert choice["bandwidth"] == expected == min(by_width, key=by_width.get)
        assert choice["settled_nrmse"][LOCAL] == by_width[expected] < choice["settled_nrmse"][GLOBAL]
        train, val = stack_for(artifact, split.train), stack_for(artifact, split.val)
        fitter = LocalFitter.for_artifact(artifact, train)
        assert fitter.bandwidth == local_module.bandwidth_of(artifact) == expected
        ss, orders = artifact.state_space, Orders(1, 1, 1)
        h, first = settling_steps(ss), orders.first_state_row
        rows = window_rows(val, first, h, stride_for(val, first, h, LOCAL_WINDOWS))[0]
        identified, measured = rollout_windows(ss, val, orders, rows, h)
        for width, error in by_width.items():
            other = LocalFitter(fitter.structure, fitter.ridge, train, bandwidth=width)
            path = local_paths(other, ss, val, orders, rows, identified, None)[1]
            assert error == pytest.approx(np.mean(nrmse(path[:, -1], measured[:, -1])), rel=1e-9)
    bare = dataclasses.replace(artifact, selection={})
    assert local_module.bandwidth_of(bare) == LOCAL_BANDWIDTH
    assert LocalFitter.for_artifact(bare, train).bandwidth == LOCAL_BANDWIDTH


def test_the_gain_uncertainty_spans_how_far_a_saturating_plants_gain_strays_over_the_held_out_points():
    """The saturating (Wiener) plant y = tanh(x): its local gain 1 - tanh(u)^2 runs from 1 to nearly 0,
    which the jackknife of one global fit does not see. The recorded operating-range spread is close
    to the true local gains' RMS deviation from the model's gain at the held-out windows' operating
    points (the kernel smooths a little of it away) and the step-response matrix shows it; a linear
    plant's is its refits' noise, a small fraction of its gain."""
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    split = split_runs(spec, wiener_runs(5))
    artifact = identify(split, spec, 1)
    uncertainty = artifact.steady_gain["uncertainty"]
    (u_mean,), (u_std,) = artifact.normalisation.of(artifact.mv_tags)
    _, (y_std,) = artifact.normalisation.of(artifact.cv_tags)
    gain = artifact.steady_gain["gain"][0][0] * y_std / u_std  # engineering units
    spread = uncertainty["operating_range"]["std"][0][0] * y_std / u_std
    # independent: the plant's own local gain at the held-out windows' operating points
    val, ss, orders = stack_for(artifact, split.val), artifact.state_space, Orders(1, 1, 1)
    h, first = settling_steps(ss), orders.first_state_row
    rows = window_rows(val, first, h, stride_for(val, first, h, LOCAL_WINDOWS))[0]
    ends = rollout_windows(ss, val, orders, rows, h)[0][:, -1]
    u = np.array([p.u[0] for p in local_module.window_points(val, rows, h, ends)]) * u_std + u_mean
    true_spread = np.sqrt(np.mean((1 - np.tanh(u) ** 2 - gain) ** 2))
    assert uncertainty["operating_range"]["points"] == rows.size
    assert 0.5 * true_spread <= spread <= 1.1 * true_spread
    assert uncertainty["jackknife_std"][0][0] * y_std / u_std < 0.1 * true_spread  # what the jackknife alone says
    assert artifact.step_response["pairs"][0]["gain_spread"] == pytest.approx(spread, rel=1e-9)
    u_runs = np.stack([run.u for run in hammerstein_runs(3)])
    linear = run_series("lin", u_runs, linear_plant(u_runs, 5)[:, :, None], np.zeros((*u_runs.shape[:2], 0)))
    flat = identify(split_runs(spec, linear), spec, 1).steady_gain
    assert flat["uncertainty"]["operating_range"]["std"][0][0] < 0.03 * abs(flat["gain"][0][0])


def test_settled_local_scores_refit_each_block_at_its_own_operating_point():
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(4, noise=0.01))
    artifact = identify(split, spec, 1)
    h = settling_steps(artifact.state_space)
    local = uq.block_scores(artifact, split.val, h, uq.SETTLED_LOCAL, split.train)
    plain = uq.block_scores(artifact, split.val, h, uq.SETTLED_RESIDUAL)
    assert local.score == uq.SETTLED_LOCAL and local.scores.shape == plain.scores.shape and local.scores.size > 5
    np.testing.assert_array_equal(local.starts, plain.starts)  # the same blocks
    # one block by hand: the centre, the weighted fit (lstsq), then the product's rollout and held disturbance
    stacked, train = stack_for(artifact, split.val), stack_for(artifact, split.train)
    orders, ss = Orders(1, 1, 1), artifact.state_space
    window = disturbance_window(ss, artifact.horizon)
    rows, _ = window_rows(stacked, orders.first_state_row + window, h, h)
    k = rows[:1]
    predicted, measured = rollout_windows(ss, stacked, orders, k, h)
    global_end = predicted[0, -1] + fit_disturbance(ss, stacked, orders, k, window)[0] @ disturbance_gain(ss, h).T
    cu, cy = (stacked.u[k[0]] + stacked.u[k[0] + h - 1]) / 2, (stacked.y[k[0]] + global_end) / 2
    target_rows, _ = window_rows(train, 1, 0, 1)
    z = (train.u[target_rows - 1] - cu) ** 2 + (train.y[target_rows - 1] - cy) ** 2
    root = np.sqrt(np.exp(-0.5 * z[:, 0] / local_module.bandwidth_of(artifact) ** 2))
    phi = np.column_stack([train.y[target_rows - 1, 0], train.u[target_rows - 1, 0], np.ones(target_rows.size)])
    ridge = artifact.selection["final"]["ridge"]
    gram = (phi * root[:, None] ** 2).T @ phi / root.dot(root) + np.diag([ridge, ridge, 0.0])
    a, b, c = np.linalg.solve(gram, (phi * root[:, None] ** 2).T @ train.y[target_rows, 0] / root.dot(root))
    by_hand = ArxModel(Orders(1, 1, 1), np.array([[[a]]]), np.array([[[b]]]), np.zeros((1, 1, 0)), np.array([c]))
    mine = by_hand.realise()
    end = rollout_windows(mine, stacked, orders, k, h)[0][0, -1]
    centre = np.concatenate([cu, cy])
    end = end + weighted_disturbance(mine, stacked, orders, k[0], window, centre,
                                     local_module.bandwidth_of(artifact)) @ disturbance_gain(mine, h).T
    assert local.scores[0, 0] == pytest.approx(abs(measured[0, -1, 0] - end[0]), rel=1e-6, abs=1e-9)


def test_settled_local_scores_need_the_train_runs():
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(5, runs=6, n=200))
    artifact = identify(split, spec, 1)
    with pytest.raises(uq.UQInputError, match="train runs"):
        uq.block_scores(artifact, split.val, 20, uq.SETTLED_LOCAL)


def test_a_structure_without_a_record_is_refitted_with_its_orders():
    spec = steady_binding(na=2, nb=2, delay=1)
    model = ArxModel(Orders(2, 2, 1), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 0)), np.zeros(1))
    structure, ridge = structure_of(artifact_from_model(model, spec, 1, unit_normalisation(spec)))
    assert (structure, ridge) == (Structure.common(Orders(2, 2, 1), 1, 1), 0.0)
    # a DV is an input channel of its own, with the MV's delay
    with_dv = binding(n_mv=1, n_cv=1, n_dv=1, na=2, nb=2, delay=1)
    model = ArxModel(Orders(2, 2, 1), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), np.zeros(1))
    structure, ridge = structure_of(artifact_from_model(model, with_dv, 1, unit_normalisation(with_dv)))
    assert (structure, ridge) == (Structure(2, 2, ((1, 1),)), 0.0)


def test_the_refit_uses_the_structure_and_ridge_identification_recorded():
    """structure_of reads artifact.selection's `structure` and `final` ridge, not the plain orders."""
    spec = steady_binding()
    artifact = identify(split_runs(spec, hammerstein_runs(2, runs=4, n=200)), spec, 1)
    selection = artifact.selection
    chosen = dataclasses.replace(artifact, selection={**selection, "final": {**selection["final"], "ridge": 0.25},
                                                      "structure": {"na": 2, "nb": 3, "delays": [[2]], "own_ar": True}})
    assert structure_of(chosen) == (Structure(2, 3, ((2,),), True), 0.25)
    fitter = LocalFitter.for_artifact(chosen, stack_for(chosen, hammerstein_runs(9, runs=1, n=60)))
    assert (fitter.structure, fitter.ridge) == (Structure(2, 3, ((2,),), True), 0.25)
    # a record without `own_ar` (written before it existed): every CV's past in every equation
    older = dataclasses.replace(artifact, selection={**selection, "structure": {"na": 2, "nb": 3, "delays": [[2]]}})
    assert structure_of(older)[0] == Structure(2, 3, ((2,),), False)


def test_a_solves_region_is_a_grid_cell_and_its_refit_and_gain_are_made_once(monkeypatch):
    """A point's region centre: every coordinate rounded to a multiple of REGION_FRACTION x the kernel
    width; two points of one region share one refit and jackknife (made once, kept per fitter, the
    oldest of more than REGIONS_KEPT regions dropped); another width keeps its own."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train)).with_bandwidth(2.0)
    width = REGION_FRACTION * 2.0  # 0.2
    centre = fitter.region(OperatingPoint(np.array([0.31]), np.array([-0.29])))
    np.testing.assert_allclose(centre.u, [0.4], atol=1e-12)
    np.testing.assert_allclose(centre.y, [-0.2], atol=1e-12)
    assert np.allclose(fitter.region(OperatingPoint(np.array([0.49]), np.array([-0.11]))).centre(), centre.centre())
    made = []
    real_refit = LocalFitter.refit
    monkeypatch.setattr(LocalFitter, "refit", lambda self, *a: made.append(a) or real_refit(self, *a))
    first, record = local_artifact(artifact, spec, fitter, centre, 1000)
    same_region = fitter.region(OperatingPoint(np.array([0.45]), np.array([-0.15])))
    again, _ = local_artifact(artifact, spec, fitter, same_region, 1000)
    assert len(made) == 1 and record["procedure"] == LOCAL
    np.testing.assert_array_equal(again.state_space.B, first.state_space.B)
    assert again.steady_gain == first.steady_gain
    # the same region refitted from scratch: the kept refit is the refit of that point
    fresh, _ = local_artifact(artifact, spec, fitter.with_bandwidth(2.0), centre, 1000)
    assert len(made) == 2
    np.testing.assert_allclose(fresh.state_space.B, first.state_space.B, rtol=1e-12)
    # REGIONS_KEPT other regions later the first one is made again
    for k in range(1, REGIONS_KEPT + 1):
        local_artifact(artifact, spec, fitter, OperatingPoint(centre.u + k * width, centre.y), 1000)
    assert len(made) == 2 + REGIONS_KEPT
    local_artifact(artifact, spec, fitter, centre, 1000)
    assert len(made) == 3 + REGIONS_KEPT


def test_the_operating_point_of_a_move_is_its_midpoint_and_is_recorded_as_plain_json():
    point = OperatingPoint.of_move(np.array([0.25, -1.0]), np.array([1.5]), np.array([0.75, 1.0]), np.array([-3.5]))
    np.testing.assert_array_equal(point.u, [0.5, 0.0])
    np.testing.assert_array_equal(point.y, [-1.0])
    doc = point.to_json_dict()
    assert doc == {"u": [0.5, 0.0], "y": [-1.0]} and json.loads(json.dumps(doc)) == doc


def test_the_effective_sample_is_asked_per_parameter_of_one_cv_equation():
    """Two CVs, one MV, na = nb = 1: each CV's equation has 4 parameters (both CVs' pasts, the MV, the
    intercept), so a refit needs MIN_ROWS_PER_PARAMETER x 4 effective rows, not x 8 (the whole model)."""
    spec = binding(n_mv=1, n_cv=2, na=1, nb=1, delay=1)
    rng = np.random.default_rng(7)
    runs = run_series("m", rng.normal(size=(2, 60, 1)), rng.normal(size=(2, 60, 2)), np.zeros((2, 60, 0)))
    train = stack_runs(runs, unit_normalisation(spec), spec.mv_tags, spec.cv_tags, spec.dv_tags)
    fitter = LocalFitter(Structure.common(Orders(1, 1, 1), 2, 1), 0.0, train)
    assert fitter.min_rows == local_module.MIN_ROWS_PER_PARAMETER * 4
    fit, refused = fitter.refit(OperatingPoint(np.array([9.0]), np.array([9.0, -9.0])), 1000)
    assert fit is None and refused.endswith(f"fewer than {local_module.MIN_ROWS_PER_PARAMETER * 4}")


def test_an_infinitely_wide_kernel_is_the_plain_regression_and_its_rows_the_effective_sample():
    """Every row weighs 1: the refit is the unweighted fit and its effective sample is its row count, so
    exactly MIN_ROWS_PER_PARAMETER rows per parameter is enough (the rule refuses fewer) and one less is not."""
    spec = steady_binding()
    artifact = identify(split_runs(spec, hammerstein_runs(2)), spec, 1)
    structure, ridge = structure_of(artifact)
    needed = local_module.MIN_ROWS_PER_PARAMETER * 3  # a, b and the intercept
    point = OperatingPoint(np.array([0.3]), np.array([-0.2]))
    for rows in (needed, needed - 1):
        train = stack_for(artifact, hammerstein_runs(9, runs=1, n=rows + 1))  # the first row has no lag
        fitter = LocalFitter(structure, ridge, train, bandwidth=np.inf)
        np.testing.assert_array_equal(fitter.weights(point), np.ones(rows))
        fit, refused = fitter.refit(point, 1000)
        if rows < needed:
            assert fit is None
            assert refused == f"{rows} effective train rows near the operating point, fewer than {needed}"
            continue
        assert refused == "" and fit.effective_rows == rows
        plain = fitter.problem.fit(structure, ridge)
        for name in ("A", "B", "c"):  # the same normal equations, summed in another order
            np.testing.assert_allclose(getattr(fit.model, name), getattr(plain, name), rtol=1e-10, atol=1e-12)


def test_a_refit_is_kept_when_its_slowest_mode_has_decayed_to_the_settle_fraction(monkeypatch):
    """Decayed to 5 % within n steps: radius ** n <= SETTLE_FRACTION, the boundary included; an unstable
    or NaN refit never has. The refit's spectral radius is set here to put it on either side."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    near = OperatingPoint(np.array([0.0]), np.array([0.0]))
    fraction = local_module.SETTLE_FRACTION
    for radius, steps, kept in ((fraction, 1, True), (np.nextafter(fraction, 1.0), 1, False), (0.5, 5, True),
                                (0.5, 4, False), (1.0, 10 ** 6, False), (np.nan, 10 ** 6, False)):
        monkeypatch.setattr(local_module, "spectral_radius", lambda ss, r=radius: r)
        fit, refused = fitter.refit(near, steps)
        assert (fit is not None, refused == "") == (kept, kept), (radius, steps, refused)
        assert kept or refused.startswith(f"the refit does not settle within {steps} steps")


def test_a_later_split_refits_and_scores_on_the_artifacts_own_runs():
    """A solve re-reads the history, whose runs a new run can assign anew: the refit still trains on the
    runs the artifact was identified on, and the model's evidence is scored on the runs its fit held
    out, never on a run it was fitted on (nor does a held-out run become a refit's train run)."""
    spec = steady_binding()
    runs = hammerstein_runs(6, runs=8)
    artifact = identify(split_runs(spec, runs), spec, 1)
    later = split_of(spec, runs[::-1], 4, 2, 2)  # the same runs, some of the train ones now held out
    assert {r.run_id for r in (*later.val, *later.test)} & set(artifact.splits["train"])
    for segment in ("train", "val", "test"):
        assert [r.run_id for r in pipeline.artifact_runs(artifact, later, segment)] == list(artifact.splits[segment])
    scores = pipeline.score_blocks(spec, artifact, later)
    for segment in ("val", "test"):
        scored = set(getattr(scores, segment).run_ids)
        assert scored and scored <= set(artifact.splits[segment])
    # a fit that records no split (a benchmark's reference) is scored on the split it is given
    unsplit = dataclasses.replace(artifact, splits={"train": (), "val": (), "test": ()})
    assert pipeline.artifact_runs(unsplit, later, "val") == later.val
    gone = split_of(spec, runs[1:], 3, 2, 2)
    with pytest.raises(pipeline.MissingInputError, match=r"the model's train run\(s\) h0 are not in the history"):
        pipeline.artifact_runs(artifact, gone, "train")


def test_local_paths_refit_each_window_midway_to_its_predicted_end_or_keep_the_identified_path():
    """local_paths, window by window: the identified model's h-step path; the refit centred between the
    window's first MVs / CVs and the MVs of its last step / that path's end, within settle_limit (SETTLE_FACTOR
    x the identified model's settling horizon); its path where it is kept, the identified path where it is
    refused. A window refused early (a run held far outside the train range) does not stop the later ones
    (short holds: the last step's MVs often differ from the step's before). Both window lengths the
    evidence uses: a move plan's P and a steady target's settling horizon."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    ss, orders = artifact.state_space, Orders(1, 1, 1)
    settling = settling_steps(ss)
    assert settle_limit(ss) == SETTLE_FACTOR * settling
    u = np.empty((2, 60, 1))
    u[0] = 7.0  # f(7) = 31.5: far above the train CVs
    u[1] = np.repeat(np.random.default_rng(11).uniform(-2.0, 2.0, 20), 3)[:, None]
    stacked = stack_for(artifact, run_series("v", u, plant(u), np.zeros((2, 60, 0))))
    for h in (artifact.horizon, settling):
        rows, which = window_rows(stacked, orders.first_state_row, h, 1)
        identified = rollout_windows(ss, stacked, orders, rows, h)[0]
        global_path, local_path, used, refits = local_paths(fitter, ss, stacked, orders, rows, identified.copy(), None)
        np.testing.assert_allclose(global_path, identified, rtol=1e-12)
        gains = iter(local_module.local_gains(refits, 1, 1))  # the refits used, in window order
        assert len(refits) == used.sum()
        for i, k in enumerate(rows):
            centre = OperatingPoint((stacked.u[k] + stacked.u[k + h - 1]) / 2, (stacked.y[k] + identified[i, -1]) / 2)
            fit, _ = fitter.refit(centre, SETTLE_FACTOR * settling)
            assert used[i] == (fit is not None), k
            if fit is not None:
                path = rollout_windows(fit.model.realise(), stacked, orders, rows[i:i + 1], h)[0][0]
                np.testing.assert_allclose(local_path[i], path, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(next(gains), steady_state(fit.model.realise())[0], rtol=1e-9)
        np.testing.assert_array_equal(local_path[~used], global_path[~used])  # `used` is a mask
        assert not used[which == 0].any() and used[which == 1].all()


def test_a_model_that_does_not_settle_gives_a_settle_limit_that_refuses_every_refit():
    """settle_limit: SETTLE_FACTOR x the identified model's settling horizon; 0 for an unstable model (no
    settling horizon), and a limit of 0 steps refuses any refit."""
    def first_order(pole: float) -> StateSpace:
        return StateSpace.of([[pole]], [[0.2]], np.zeros((1, 0)), [0.0], [[1.0]])

    stable = first_order(POLE)
    assert settle_limit(stable) == SETTLE_FACTOR * settling_steps(stable) == SETTLE_FACTOR * 14  # 0.8 ** 14 < 5 % < 0.8 ** 13
    assert settle_limit(first_order(1.05)) == 0
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(2))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    fit, refused = fitter.refit(OperatingPoint(np.array([0.0]), np.array([0.0])), 0)
    assert fit is None and refused.startswith("the refit does not settle within 0 steps")


def test_an_artifact_without_the_choice_is_solved_with_the_identified_model():
    """An artifact identified before the choice was recorded for its template (no steady_model), or a
    record without a procedure: GLOBAL, never None."""
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1)
    artifact = identify(split_runs(spec, hammerstein_runs(3, noise=0.01)), spec, 1)
    older = dataclasses.replace(artifact, selection={k: v for k, v in artifact.selection.items() if k != "steady_model"})
    assert steady_procedure(older) == GLOBAL
    assert steady_procedure(dataclasses.replace(artifact, selection={**artifact.selection, "steady_model": {}})) == GLOBAL
    assert pipeline.block_rule(spec, older) == (older.horizon, uq.MAX_RESIDUAL)


def held_path(model, stacked, orders, k, window, h, centre=None, bandwidth=None):
    """The response over h steps to the disturbance `model` fits over the `window` rows before row k
    (model.arx.fit_disturbance; with `centre`, a refit's, `weighted_disturbance`), simulated from rest:
    x <- A x + C' e, y = C x."""
    A, _, _, _, C = (np.asarray(m, float) for m in model.arrays())
    e = (fit_disturbance(model, stacked, orders, np.array([k]), window)[0] if centre is None else
         weighted_disturbance(model, stacked, orders, k, window, centre, bandwidth))
    x, out = np.zeros(A.shape[0]), []
    for _ in range(h):
        x = A @ x + C.T @ e
        out.append(C @ x)
    return np.array(out)


def weighted_disturbance(model, stacked, orders, k, window, centre, bandwidth):
    """A refit's held disturbance at row k by hand (model.local.local_disturbances): each of the `window`
    rows t before k predicted one step from its measured state (a rollout of one step), the residuals
    averaged with weights exp(-d / (2 bandwidth^2)), d the squared distance of row t's MVs / CVs from
    `centre` less the smallest such distance."""
    rows = np.arange(k - window, k)
    predicted, measured = rollout_windows(model, stacked, orders, rows, 1)
    residual = (measured - predicted)[:, 0]  # (window, ny)
    before = np.hstack([stacked.u[rows], stacked.y[rows]])
    distance = np.sum((before - centre) ** 2, axis=1)
    weights = np.exp(-0.5 * (distance - distance.min()) / bandwidth ** 2)
    return weights @ residual / weights.sum()


def test_local_paths_hold_each_windows_disturbance_over_every_step_of_two_coupled_cvs():
    """With `window`, every step of a path adds the held disturbance's response, simulated here from rest
    (x <- A x + C' e, y = C x) for the identified model and each kept refit: two CVs whose AR coupling
    makes that response's matrix unsymmetric, so a transposed contraction would show; a measured DV
    drives both, so each refit's path must be driven by it too."""
    rng = np.random.default_rng(21)
    u = np.repeat(rng.uniform(-2.0, 2.0, (6, 20, 1)), 20, axis=1)  # 6 runs of 400 rows, holds of 20
    d = np.repeat(rng.uniform(-1.0, 1.0, (6, 16, 1)), 25, axis=1)
    y = np.zeros((6, 400, 2))
    for t in range(1, 400):
        y[:, t, 0] = 0.8 * y[:, t - 1, 0] + 0.2 * curved(u[:, t - 1, 0]) + 0.15 * d[:, t - 1, 0]
        y[:, t, 1] = 0.6 * y[:, t - 1, 1] + 0.3 * y[:, t - 1, 0] + 0.1 * u[:, t - 1, 0] - 0.1 * d[:, t - 1, 0]
    y += 0.01 * rng.normal(size=y.shape)
    spec = binding(n_mv=1, n_cv=2, n_dv=1, na=1, nb=1, delay=1)
    split = split_runs(spec, run_series("c", u, y, d))
    artifact = identify(split, spec, 1)
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    stacked, orders, ss = stack_for(artifact, split.val), Orders(1, 1, 1), artifact.state_space
    h, window = 10, 30
    rows, _ = window_rows(stacked, orders.first_state_row + window, h, h)

    gains = disturbance_step_gains(ss, h)
    assert not np.allclose(gains[-1], gains[-1].T)
    predicted = rollout_windows(ss, stacked, orders, rows, h)[0]
    global_path, local_path, used, _ = local_paths(fitter, ss, stacked, orders, rows, predicted.copy(), window)
    for i, k in enumerate(rows):
        np.testing.assert_allclose(global_path[i], predicted[i] + held_path(ss, stacked, orders, k, window, h), rtol=1e-9, atol=1e-12)
        centre = OperatingPoint((stacked.u[k] + stacked.u[k + h - 1]) / 2, (stacked.y[k] + global_path[i, -1]) / 2)
        fit, _ = fitter.refit(centre, settle_limit(ss))
        assert used[i] == (fit is not None)
        if fit is not None:
            refit = fit.model.realise()
            own = rollout_windows(refit, stacked, orders, rows[i:i + 1], h)[0][0]
            mine = held_path(refit, stacked, orders, k, window, h, np.concatenate([centre.u, centre.y]),
                             fitter.bandwidth)
            np.testing.assert_allclose(local_path[i], own + mine, rtol=1e-9, atol=1e-12)
    assert used.sum() > rows.size // 2


def test_max_residual_local_scores_refit_each_p_step_block_at_its_own_operating_point():
    """A move plan of a local artifact: P-step blocks as max_residual's, each scored by the largest residual
    of the refit's rollout with the refit's own disturbance held (fitted over the W rows before the block),
    the refit centred midway between the block's start and its last MVs / the identified model's P-step
    prediction with its disturbance held."""
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=10)
    split = split_runs(spec, hammerstein_runs(4, noise=0.01))
    artifact = identify(split, spec, 1)
    assert steady_procedure(artifact) == LOCAL
    h = artifact.horizon
    local = uq.block_scores(artifact, split.val, h, uq.MAX_RESIDUAL_LOCAL, split.train)
    plain = uq.block_scores(artifact, split.val, h, uq.MAX_RESIDUAL)
    assert local.score == uq.MAX_RESIDUAL_LOCAL and local.scores.shape == plain.scores.shape and local.scores.size > 20
    np.testing.assert_array_equal(local.starts, plain.starts)  # the same blocks
    assert pipeline.block_rule(spec, artifact) == (h, uq.MAX_RESIDUAL_LOCAL)
    with pytest.raises(uq.UQInputError, match="max_residual_local refits on the train runs"):
        uq.block_scores(artifact, split.val, h, uq.MAX_RESIDUAL_LOCAL)
    # every block by hand: its centre, the refit, the refit's rollout, the largest residual
    stacked, orders, ss = stack_for(artifact, split.val), Orders(1, 1, 1), artifact.state_space
    fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, split.train))
    window = disturbance_window(ss, h)
    rows, _ = window_rows(stacked, orders.first_state_row + window, h, h)
    predicted, measured = rollout_windows(ss, stacked, orders, rows, h)
    refits = 0
    for i, k in enumerate(rows):
        model = ss
        held = predicted[i] + held_path(ss, stacked, orders, k, window, h)
        centre = OperatingPoint((stacked.u[k] + stacked.u[k + h - 1]) / 2, (stacked.y[k] + held[-1]) / 2)
        fit, _ = fitter.refit(centre, SETTLE_FACTOR * settling_steps(ss))
        weighted = {}
        if fit is not None:  # the refit's own disturbance, its rows weighted by its kernel
            refits, model = refits + 1, fit.model.realise()
            weighted = {"centre": np.concatenate([centre.u, centre.y]), "bandwidth": fitter.bandwidth}
        path = (rollout_windows(model, stacked, orders, rows[i:i + 1], h)[0][0]
                + held_path(model, stacked, orders, k, window, h, **weighted))
        assert local.scores[i, 0] == pytest.approx(np.max(np.abs(measured[i, :, 0] - path[:, 0])), rel=1e-9, abs=1e-12)
    assert refits > rows.size // 2


def test_the_steady_model_record_states_the_rule_and_its_figures():
    """What identification records (artifact.selection["steady_model"]): the procedure, the kernel width
    with the lowest local error (a non-finite one never chosen), the rule (module docstring: the settled
    NRMSE on held-out windows, the models' own open-loop prediction from the measured state with no
    disturbance held, local at its best width when below the identified model's), the errors (None
    when not finite: JSON), the windows and refits, and a note only when given."""
    chosen = steady_model_record(LOCAL, 0.2, {1.0: 0.08, 0.7: 0.05, 0.5: np.nan}, windows=40, refits=38)
    assert chosen["procedure"] == LOCAL and chosen["bandwidth"] == 0.7 and "note" not in chosen
    assert chosen["settled_nrmse"] == {GLOBAL: 0.2, LOCAL: 0.05} and (chosen["windows"], chosen["refits"]) == (40, 38)
    assert chosen["settled_nrmse_by_bandwidth"] == {"1": 0.08, "0.7": 0.05, "0.5": None}
    assert local_module.best_bandwidth({1.0: np.inf, 0.7: np.nan, 0.5: 0.3}) == 0.5
    assert local_module.best_bandwidth({0.7: np.nan, 1.0: 0.4, 0.5: 0.3}) == 0.5  # NaN first: never the minimum
    rule = chosen["rule"]
    assert rule.startswith("the local procedure at the kernel width (of 1, 0.7, 0.5) whose settled NRMSE on the "
                           "held-out windows")
    assert "open-loop from the measured state, no disturbance held" in rule
    assert rule.endswith("is lowest, when that is below the identified model's")
    none = steady_model_record(GLOBAL, note="no val run to compare on")
    assert none["procedure"] == GLOBAL and none["note"] == "no val run to compare on"
    assert none["bandwidth"] == LOCAL_BANDWIDTH and none["settled_nrmse_by_bandwidth"] == {}
    assert none["settled_nrmse"] == {GLOBAL: None, LOCAL: None} and (none["windows"], none["refits"]) == (0, 0)
    diverged = steady_model_record(GLOBAL, 0.3, {1.0: np.nan}, windows=5)
    assert diverged["settled_nrmse"] == {GLOBAL: 0.3, LOCAL: None} and diverged["refits"] == 0
    assert steady_model_record(GLOBAL, np.inf, {1.0: 0.1})["settled_nrmse"][GLOBAL] is None
    json.dumps([chosen, none, diverged], allow_nan=False)


def test_local_gains_are_the_refits_steady_state_gains_of_mvs_and_dvs():
    """local_gains solves (I - sum A) [G, Gd] = [sum B, sum D] for every refit at once: the steady state of
    each refit's realisation (statespace.steady_state), here with two coupled CVs and two AR lags, where
    the AR sum is a matrix; none gives an empty (0, ny, nv) stack."""
    rng = np.random.default_rng(8)
    refits = [ArxModel(Orders(2, 2, 1), A=0.2 * rng.normal(size=(2, 2, 2)), B=rng.normal(size=(2, 2, 1)),
                       D=rng.normal(size=(2, 2, 1)), c=rng.normal(size=2)) for _ in range(3)]
    expected = [np.hstack(steady_state(model.realise())[:2]) for model in refits]
    np.testing.assert_allclose(local_module.local_gains(refits, 2, 2), np.array(expected), rtol=1e-10)
    assert local_module.local_gains([], 2, 3).shape == (0, 2, 3)


def test_a_refits_disturbance_is_its_kernel_weighted_one_step_residual_so_a_run_that_just_arrived_is_not_offset():
    """A noise-free live run held at u = -1.5 until its last 6 rows, then moved to u = 1.5 (mid-transient:
    0.8^6 of the step left): the refit around that move describes the plant near u = 1.5. The identified
    model's multi-step fit over the window rolls the refit out from u = -1.5, where its gain is wrong,
    and holds that error as a disturbance: holding u = 1.5 is predicted to settle 3.4 above f(1.5)
    (the truth: no disturbance). The refit's own disturbance, the kernel-weighted mean of its one-step
    residuals, puts it within a tenth of the step of f(1.5) (0.14 here; 0.10 with none held, the
    refit's own static error)."""
    spec = steady_binding()
    split = split_runs(spec, hammerstein_runs(4, noise=0.01))
    artifact = identify(split, spec, 1)
    assert steady_procedure(artifact) == LOCAL
    u = np.full((1, 120, 1), -1.5)
    u[0, -6:, 0] = 1.5
    live = run_series("live", u, plant(u), np.zeros((1, 120, 0)))[0]
    norm, mvs, cvs = artifact.normalisation, spec.mv_tags, spec.cv_tags
    point = OperatingPoint.of_move(norm.normalise(mvs, [1.5]), norm.normalise(cvs, live.y[-1]),
                                   norm.normalise(mvs, [1.5]), norm.normalise(cvs, [curved(1.5)]))
    local, record = local_artifact(artifact, spec, local_fitter(artifact, split.train), point,
                                   settle_limit(artifact.state_space))
    assert record["procedure"] == LOCAL
    x0, weighted = current_state(local, live, (artifact, point))
    stacked, orders = stack_for(artifact, [live]), Orders(1, 1, 1)
    window = disturbance_window(artifact.state_space, artifact.horizon)
    unweighted = fit_disturbance(local.state_space, stacked, orders, np.array([119]), window)[0]
    held = np.full((1, 400, 1), norm.normalise(mvs, [1.5])[0])

    def settles(bias: np.ndarray) -> float:
        return float(norm.engineering(cvs, statespace.rollout(local.state_space, x0[None], held, None, bias)[0, -1])[0])
    truth = curved(1.5)
    step = abs(curved(1.5) - curved(-1.5))
    assert abs(settles(weighted) - truth) < 0.1 * step, (settles(weighted), truth)
    assert abs(settles(weighted) - truth) < 0.1 * abs(settles(unweighted) - truth), (settles(weighted),
                                                                                       settles(unweighted))
    # the product's estimate is the by-hand weighted mean of this module, also over the rows a short run has
    centre, width = np.concatenate([point.u, point.y]), local_module.bandwidth_of(artifact)
    np.testing.assert_allclose(weighted, weighted_disturbance(local.state_space, stacked, orders, 119, window, centre,
                                                              width), rtol=1e-9)
    short = run_series("short", u[:, -20:], plant(u)[:, -20:], np.zeros((1, 20, 0)))[0]
    cut = 19 - orders.first_state_row
    assert cut < window
    np.testing.assert_allclose(current_state(local, short, (artifact, point))[1],
                               weighted_disturbance(local.state_space, stack_for(artifact, [short]), orders, 19, cut,
                                                    centre, width), rtol=1e-9)


def test_each_refits_disturbance_is_its_own_weighted_one_step_mean_with_two_mvs_two_cvs_and_a_dv():
    """`local_disturbances` of three models at once (each with its own centre and row), on a stacked
    history of two MVs, two CVs (coupled through A) and a DV, na = 2, nb = 2, delay 2: each row equals
    the by-hand weighted mean of that model's one-step rollouts."""
    rng = np.random.default_rng(8)
    spec = binding(n_mv=2, n_cv=2, n_dv=1, na=2, nb=2, delay=2)
    orders, (ny, nu, nd) = Orders(2, 2, 2), (2, 2, 1)
    models = []
    for scale in (0.2, 0.3, 0.25):
        A = np.stack([np.array([[0.5, scale], [-0.1, 0.4]]), np.array([[0.1, 0.0], [0.05, -0.2]])])
        models.append(ArxModel(orders, A, rng.normal(0.0, 0.5, (2, ny, nu)), rng.normal(0.0, 0.5, (2, ny, nd)),
                               rng.normal(0.0, 0.1, ny)))
    runs = run_series("r", rng.normal(size=(2, 150, nu)), rng.normal(size=(2, 150, ny)), rng.normal(size=(2, 150, nd)))
    artifact = artifact_from_model(models[0], spec, 1, unit_normalisation(spec))
    stacked = stack_for(artifact, runs)
    window = 25
    rows = np.array([60, 149, 150 + 90])  # two rows of the first run, one of the second
    centres = rng.normal(size=(3, nu + ny))
    ss = [m.realise() for m in models]
    got = local_module.local_disturbances(ss, centres, 0.7, stacked, orders, rows, window)
    for i, k in enumerate(rows):
        mine = weighted_disturbance(ss[i], stacked, orders, int(k), window, centres[i], 0.7)
        np.testing.assert_allclose(got[i], mine, rtol=1e-10, atol=1e-12)
    # CV values filled in (False in `measured`, of y[k - window + 1 .. k]) leave their residuals out of
    # their CV's mean: by hand, each CV's weighted mean over its measured rows alone
    measured = np.ones((window, ny), bool)
    measured[[3, 4, 20], 0] = measured[[24], 1] = False
    left_out = local_module.local_disturbances(ss, centres, 0.7, stacked, orders, rows, window, measured)
    for i, k in enumerate(rows):
        for a in range(ny):
            kept = np.flatnonzero(measured[:, a])
            rows_kept = np.arange(int(k) - window, int(k))[kept]
            predicted, observed = rollout_windows(ss[i], stacked, orders, rows_kept, 1)
            before = np.hstack([stacked.u[rows_kept], stacked.y[rows_kept]])
            weights = np.exp(-0.5 * np.sum((before - centres[i]) ** 2, axis=1) / 0.7 ** 2)  # a shift cancels
            mine = weights @ (observed - predicted)[:, 0, a] / weights.sum()
            np.testing.assert_allclose(left_out[i, a], mine, rtol=1e-10, atol=1e-12)
        assert np.abs(left_out[i] - got[i]).max() > 1e-6
