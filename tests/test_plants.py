"""Demo plants: bindings, nonlinear simulation, dead time, history format, live state, perturbed copies."""

import time

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.integrate import solve_ivp
from scipy.optimize import least_squares

from optimizer_pipeline.contracts import ContractError, Template, binding_from_dict, load_binding_file
from optimizer_pipeline.data.prepare import prepare_history
from optimizer_pipeline.plants import (PLANTS, DeadTimeHeater, LiveState, PlantInputError, UnknownPlantError,
                                       demo_plants, get_plant)

NAMES = list(PLANTS)
SEED = 7


@pytest.fixture(scope="module")
def histories():
    """One default history per plant (the demo's size), generated once for the module."""
    return {name: get_plant(name).history(SEED) for name in NAMES}


def _settle_steps(plant) -> int:
    """Samples after which the plant is within ~1e-5 of steady state."""
    return int(np.ceil(plant.settling_time_s * plant.tau / plant.sample_period_s)) + plant.delay_samples


def _band_middle(plant) -> np.ndarray:
    return np.array(plant.excitation.mv_band).mean(axis=1)


def _band_crossing(plant) -> tuple[np.ndarray, np.ndarray]:
    """Two MV points inside the excitation band between which every CV of every plant moves clearly
    (the MVs move by different amounts, so the blend's concentration changes too)."""
    lo, hi = np.array(plant.excitation.mv_band).T
    return lo + (hi - lo) * np.array([0.1, 0.5])[:plant.nu], lo + (hi - lo) * np.array([0.9, 0.2])[:plant.nu]


# --------------------------------------------------------------------------- registry and bindings


def test_registry_holds_four_plants_in_demo_order():
    assert NAMES == ["tanks", "heater", "blend", "blend-econ"]
    assert [p.name for p in demo_plants()] == NAMES
    assert isinstance(get_plant("heater"), DeadTimeHeater)


def test_unknown_plant_name_raises_a_contract_error_listing_known_names():
    with pytest.raises(UnknownPlantError, match=r"'boiler' is unknown \(known: tanks, heater, blend, blend-econ\)"):
        get_plant("boiler")
    assert issubclass(UnknownPlantError, ContractError)


@pytest.mark.parametrize("name", NAMES)
def test_binding_validates_and_equals_its_packaged_yaml(name):
    plant = get_plant(name)
    doc = plant.binding_doc()
    assert yaml.safe_load(plant.binding_path().read_text(encoding="utf-8")) == doc
    assert load_binding_file(plant.binding_path()) == binding_from_dict(doc)
    assert doc["id"] == f"{name}-1"


def test_binding_doc_is_a_fresh_copy():
    plant = get_plant("tanks")
    plant.binding_doc()["mvs"][0]["hi"] = 99.0
    assert plant.binding_doc()["mvs"][0]["hi"] == 5.0


@pytest.mark.parametrize("name", NAMES)
def test_binding_horizons_suit_the_template(name):
    spec = get_plant(name).spec
    assert 10 <= spec.model.horizon <= 20
    if spec.profile.template is Template.LINEAR_MPC:
        assert 30 <= spec.profile.horizon <= 60
    else:
        assert spec.profile.horizon == 1


def test_templates_cover_mpc_and_steady_response_and_heater_leaves_orders_unset():
    specs = {name: get_plant(name).spec for name in NAMES}
    assert specs["tanks"].profile.template is Template.LINEAR_MPC
    assert specs["heater"].profile.template is Template.LINEAR_MPC
    assert specs["blend"].profile.template is Template.STEADY_RESPONSE
    heater = specs["heater"].model
    assert (heater.na, heater.nb, heater.delay) == (None, None, None)
    assert specs["heater"].dv_tags == ("t_in",)


# --------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("name", NAMES)
def test_simulate_is_deterministic_for_a_seed(name):
    plant = get_plant(name)
    rng = np.random.default_rng(0)
    u = rng.uniform(*np.array(plant.excitation.mv_band).T, size=(20, plant.nu))
    x0 = plant.equilibrium(_band_middle(plant))
    first = plant.simulate(x0, u, rng=np.random.default_rng(5))
    again = plant.simulate(x0, u, rng=np.random.default_rng(5))
    other = plant.simulate(x0, u, rng=np.random.default_rng(6))
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[1], other[1])
    assert first[1].shape == (21, plant.ny) and first[0].shape == (21, plant.nx)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gain, tau", [(1.0, 1.0), (1.15, 1.6)])
def test_rk4_matches_an_adaptive_ode_solver(name, gain, tau):
    """The fixed-step RK4 with zero-order hold agrees with solve_ivp (tight tolerances) sample by sample;
    for a perturbed plant the input is scaled by gain and time by tau; the pipe delays by D samples."""
    plant = get_plant(name).perturbed(gain=gain, tau=tau)
    rng = np.random.default_rng(1)
    n = 30
    u = rng.uniform(*np.array(plant.excitation.mv_band).T, size=(n, plant.nu))
    d = rng.uniform(*np.array(plant.excitation.dv_band).T, size=(n, plant.nd)) if plant.nd else None
    x0 = plant.equilibrium(_band_middle(plant))
    states, y = plant.simulate(x0, u, d, noise=False)

    dk = np.zeros((n, 0)) if d is None else d
    xc = [x0[:plant.n_cont]]
    for k in range(n):
        def rhs(_t, x, k=k):
            return plant._rhs(x[None], gain * u[k][None], dk[k][None])[0] / tau

        sol = solve_ivp(rhs, (0.0, plant.sample_period_s), xc[-1], method="LSODA", rtol=1e-10, atol=1e-10)
        xc.append(sol.y[:, -1])
    xc = np.array(xc)
    undelayed = plant._outputs(xc)
    D = plant.delay_samples
    expected = np.vstack([np.tile(undelayed[0], (D, 1)), undelayed[:n + 1 - D]]) if D else undelayed
    np.testing.assert_allclose(states[:, :plant.n_cont], xc, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_long_hold_settles_at_the_analytic_steady_state(name):
    plant = get_plant(name)
    lo, hi = _band_crossing(plant)
    x0 = plant.equilibrium(lo)
    u = np.tile(hi, (_settle_steps(plant), 1))
    _, y = plant.simulate(x0, u, noise=False)
    np.testing.assert_allclose(y[-1], plant.steady_output(hi), rtol=1e-5, atol=1e-5)
    assert np.all(np.abs(y[-1] - y[0]) > 0.1)  # it did move


@pytest.mark.parametrize("name", NAMES)
def test_simulated_steady_state_is_not_a_linear_extrapolation(name):
    """Three equally spaced MV points inside the excitation band: the third simulated steady state
    misses the straight line through the first two by far more than the measurement noise."""
    plant = get_plant(name)
    lo, hi = _band_crossing(plant)
    points = [lo + f * (hi - lo) for f in (0.0, 0.5, 1.0)]
    x0 = plant.equilibrium(points[0])
    ends = [plant.simulate(x0, np.tile(p, (_settle_steps(plant), 1)), noise=False)[1][-1] for p in points]
    miss = np.abs(ends[2] - (2 * ends[1] - ends[0]))
    change = np.abs(ends[1] - ends[0])
    worst = np.argmax(miss / change)
    assert miss[worst] > 0.05 * change[worst]
    assert miss[worst] > 5 * plant.cv_noise[worst]


def test_heater_dead_time_holds_the_cv_for_the_delay_samples():
    plant = get_plant("heater")
    x0 = plant.equilibrium([100.0])
    u = np.full((10, 1), 130.0)  # step at k = 0
    _, y = plant.simulate(x0, u, noise=False)
    D = plant.delay_samples
    assert D == 4
    np.testing.assert_array_equal(y[1:D + 1], np.tile(y[0], (D, 1)))
    assert y[D + 1, 0] > y[0, 0] + 0.1


def test_heater_inlet_temperature_disturbance_reaches_the_outlet_after_the_delay():
    plant = get_plant("heater")
    x0 = plant.equilibrium([100.0], [15.0])
    _, y = plant.simulate(x0, np.full((40, 1), 100.0), np.full((40, 1), 18.0), noise=False)
    D = plant.delay_samples
    np.testing.assert_array_equal(y[1:D + 1], np.tile(y[0], (D, 1)))
    assert y[-1, 0] > y[0, 0] + 1.0
    np.testing.assert_allclose(y[-1], plant.steady_output([100.0], [18.0]), atol=0.05)


def test_tanks_without_dead_time_respond_within_the_first_step():
    plant = get_plant("tanks")
    x0 = plant.equilibrium([3.0, 3.0])
    _, y = plant.simulate(x0, np.tile([3.5, 3.0], (1, 1)), noise=False)
    assert y[1, 0] > y[0, 0] + 1e-3


# --------------------------------------------------------------------------- history


@pytest.mark.parametrize("name", NAMES)
def test_history_has_the_history_file_columns(name, histories):
    frame = histories[name].frame
    spec = get_plant(name).spec
    assert list(frame.columns) == ["run_id", "timestamp", *spec.mv_tags, *spec.cv_tags, *spec.dv_tags]
    assert frame["timestamp"].dtype == np.float64
    assert all(frame[tag].dtype == np.float64 for tag in spec.tags)
    assert np.isfinite(frame[list(spec.tags)].to_numpy()).all()
    plant = get_plant(name)
    assert len(frame) == plant.history_runs * plant.history_run_length == 12 * (600 if name.startswith("blend") else 300)


@pytest.mark.parametrize("name", NAMES)
def test_history_timestamps_increase_within_runs_and_runs_do_not_overlap(name, histories):
    frame = histories[name].frame
    period = get_plant(name).sample_period_s
    spans = []
    for _, run in frame.groupby("run_id", sort=False):
        t = run["timestamp"].to_numpy()
        np.testing.assert_allclose(np.diff(t), period)
        spans.append((t[0], t[-1]))
    starts, ends = np.array(spans).T
    assert np.all(starts[1:] > ends[:-1] + period)  # a gap separates consecutive runs


@pytest.mark.parametrize("name", NAMES)
def test_history_live_run_is_the_last_run_with_the_latest_timestamp(name, histories):
    frame = histories[name].frame
    latest = frame.loc[frame["timestamp"].idxmax(), "run_id"]
    assert frame["run_id"].nunique() == 12
    assert latest == frame["run_id"].iloc[-1] == f"{name}-run-11"
    assert (frame["run_id"] == latest).to_numpy()[-get_plant(name).history_run_length:].all()


@pytest.mark.parametrize("name", NAMES)
def test_history_mv_excitation_respects_bounds_and_max_move(name, histories):
    plant, frame = get_plant(name), histories[name].frame
    for mv, (band_lo, band_hi) in zip(plant.spec.mvs, plant.excitation.mv_band):
        values = frame[mv.tag].to_numpy()
        assert values.min() >= mv.lo and values.max() <= mv.hi
        moves = frame.groupby("run_id")[mv.tag].diff().dropna().abs()
        assert moves.max() <= mv.max_move + 1e-12
        assert moves.max() > 0.5 * mv.max_move  # it is excited, not flat
        assert values.std() > 0.2 * (band_hi - band_lo)


def test_history_is_deterministic_for_a_seed(histories):
    plant = get_plant("heater")
    end = histories["heater"].live.t
    pd.testing.assert_frame_equal(plant.generate_history(SEED, end_at=end), histories["heater"].frame)
    assert not plant.generate_history(SEED + 1)["t_out"].equals(histories["heater"].frame["t_out"])


@pytest.mark.parametrize("name", NAMES)
def test_history_split_gives_enough_val_and_test_runs_for_uq_evidence(name, histories):
    plant = get_plant(name)
    split = prepare_history(histories[name].frame, plant.spec)
    assert len(split.val) >= 2 and len(split.test) >= 2
    assert sum(len(run) for run in split.test) >= 120
    assert split.live.run_id == f"{name}-run-11"


@pytest.mark.parametrize("name", NAMES)
def test_history_cvs_carry_the_stated_measurement_noise(name, histories):
    """The live run ends settling at fixed inputs: sample-to-sample differences there are noise
    (std sqrt(2) sigma); the slow remaining transient adds almost nothing to them."""
    plant, frame = get_plant(name), histories[name].frame
    settling = frame[list(plant.spec.cv_tags)].to_numpy()[-100:]
    np.testing.assert_allclose(np.diff(settling, axis=0).std(axis=0, ddof=1) / np.sqrt(2), plant.cv_noise, rtol=0.25)


def test_history_rejects_a_run_count_below_one():
    with pytest.raises(PlantInputError, match="n_runs"):
        get_plant("tanks").history(SEED, n_runs=0)


# --------------------------------------------------------------------------- live state and plans


@pytest.mark.parametrize("name", NAMES)
def test_live_state_matches_the_last_history_row(name, histories):
    plant = get_plant(name)
    frame, live = histories[name].frame, histories[name].live
    last = frame.iloc[-1]
    assert isinstance(live, LiveState)
    assert live.t == last["timestamp"]
    np.testing.assert_array_equal(live.u, last[list(plant.spec.mv_tags)].to_numpy(float))
    np.testing.assert_allclose(live.y, last[list(plant.spec.cv_tags)].to_numpy(float), atol=5 * max(plant.cv_noise))
    np.testing.assert_allclose(live.u, plant.excitation.mv_live)


@pytest.mark.parametrize("name", NAMES)
def test_holding_the_current_mvs_from_the_live_state_does_not_drift(name, histories):
    plant, live = get_plant(name), histories[name].live
    y = plant.apply_plan(live, np.tile(live.u, (60, 1)))
    assert y.shape == (60, plant.ny)
    assert np.abs(y - live.y).max() < 2 * max(plant.cv_noise)
    np.testing.assert_allclose(y[-1], plant.steady_output(live.u, live.d), atol=2e-3)


@pytest.mark.parametrize("name", NAMES)
def test_an_mv_step_moves_each_cv_in_the_direction_of_the_steady_state_gain(name, histories):
    plant, live = get_plant(name), histories[name].live
    hold = plant.apply_plan(live, np.tile(live.u, (_settle_steps(plant), 1)))[-1]
    for i, mv in enumerate(plant.spec.mvs):
        step = np.zeros(plant.nu)
        step[i] = mv.max_move
        gain = (plant.steady_output(live.u + step, live.d) - plant.steady_output(live.u, live.d)) / mv.max_move
        moved = plant.apply_plan(live, np.tile(live.u + step, (_settle_steps(plant), 1)))[-1]
        for j in np.flatnonzero(np.abs(gain * mv.max_move) > 10 * np.asarray(plant.cv_noise)):
            assert np.sign(moved[j] - hold[j]) == np.sign(gain[j]), (mv.tag, plant.spec.cv_tags[j])


@pytest.mark.parametrize("name", NAMES)
def test_targets_are_reachable_from_the_live_state_within_the_horizon(name, histories):
    """The MVs that hold the targets at steady state lie inside the excitation band; ramping to them
    at max_move leaves at most 20 % of the hold error at the end of the horizon (steady_response:
    after the model horizon P times 4)."""
    plant, live = get_plant(name), histories[name].live
    spec = plant.spec
    # a CV without a target (blend-econ's level): where its economics put it, its upper limit
    target = np.array([c.hi if c.target is None else c.target for c in spec.cvs])
    lo, hi = np.array(plant.excitation.mv_band).T
    solved = least_squares(lambda u: plant.steady_output(u, live.d) - target, live.u, bounds=(lo, hi), xtol=1e-12)
    assert solved.cost < 1e-10  # reached exactly, not only approached at a band edge
    u_star = solved.x
    steps = spec.profile.horizon if spec.profile.template is Template.LINEAR_MPC else 4 * spec.model.horizon
    max_move = np.array([m.max_move for m in spec.mvs])
    plan = np.empty((steps, plant.nu))
    u = live.u.copy()
    for k in range(steps):
        u = u + np.clip(u_star - u, -max_move, max_move)
        plan[k] = u
    hold_error = np.abs(plant.apply_plan(live, np.tile(live.u, (steps, 1)))[-1] - target)
    plan_error = np.abs(plant.apply_plan(live, plan)[-1] - target)
    assert np.all(hold_error > 10 * np.asarray(plant.cv_noise))  # there is something to recommend
    assert np.all(plan_error <= 0.2 * hold_error)


def test_apply_plan_returns_the_cv_at_the_end_of_each_step(histories):
    plant, live = get_plant("tanks"), histories["tanks"].live
    plan = np.tile([3.5, 2.5], (5, 1))
    _, y = plant.simulate(live.x, plan, noise=False)
    np.testing.assert_array_equal(plant.apply_plan(live, plan), y[1:])


def test_apply_plan_holds_a_given_dv_vector_over_the_plan(histories):
    plant, live = get_plant("heater"), histories["heater"].live
    plan = np.tile(live.u, (30, 1))
    np.testing.assert_array_equal(plant.apply_plan(live, plan, d=[18.0]),
                                  plant.apply_plan(live, plan, d=np.full((30, 1), 18.0)))
    assert plant.apply_plan(live, plan, d=[18.0])[-1, 0] > plant.apply_plan(live, plan)[-1, 0] + 1.0


def test_apply_plan_rejects_a_plan_with_the_wrong_number_of_mvs(histories):
    with pytest.raises(PlantInputError, match=r"controls must be finite with shape \(n, 2\), got \(5, 3\)"):
        get_plant("tanks").apply_plan(histories["tanks"].live, np.ones((5, 3)))


def test_simulate_rejects_a_state_of_the_wrong_size():
    with pytest.raises(PlantInputError, match="x0 must be 5 finite numbers"):
        get_plant("heater").simulate(np.zeros(1), np.ones((3, 1)))


# --------------------------------------------------------------------------- perturbed copies


@pytest.mark.parametrize("name", NAMES)
def test_perturbed_gain_shifts_the_steady_state(name):
    """Every plant moves at least one CV; the blend's concentration is a flow ratio and so stays."""
    plant = get_plant(name)
    u = _band_crossing(plant)[1]
    shifted = plant.perturbed(gain=1.2)
    assert shifted.gain == pytest.approx(1.2) and plant.gain == 1.0
    assert np.any(np.abs(shifted.steady_output(u) - plant.steady_output(u)) > 10 * np.asarray(plant.cv_noise))


@pytest.mark.parametrize("name", NAMES)
def test_perturbed_tau_stretches_time_and_keeps_the_steady_state(name):
    """With tau = 2 the process states after 2k samples are those of the nominal plant after k."""
    plant = get_plant(name)
    slow = plant.perturbed(tau=2.0)
    lo, hi = _band_crossing(plant)
    x0 = plant.equilibrium(lo)
    np.testing.assert_allclose(slow.steady_output(hi), plant.steady_output(hi))
    k = 6
    fast = plant.simulate(x0, np.tile(hi, (k, 1)), noise=False)[0][-1, :plant.n_cont]
    stretched = slow.simulate(x0, np.tile(hi, (2 * k, 1)), noise=False)[0][-1, :plant.n_cont]
    np.testing.assert_allclose(stretched, fast, rtol=1e-6)
    assert np.abs(fast - x0[:plant.n_cont]).max() > 0.1


def test_perturbed_rejects_a_non_positive_factor():
    with pytest.raises(PlantInputError, match=r"perturbed\(tau=...\) must be a finite number > 0"):
        get_plant("blend").perturbed(tau=0.0)


def test_history_ends_when_it_is_seeded_unless_an_end_is_given():
    plant = get_plant("blend")  # sample period 30 s
    before = time.time()
    now = plant.history(SEED)
    assert before - 30 < now.live.t <= time.time() and now.live.t % 30 == 0
    assert now.frame["timestamp"].max() == now.live.t
    then = plant.history(SEED, end_at=1_700_000_000.0)
    assert then.live.t == then.frame["timestamp"].max() == 1_700_000_000.0
    np.testing.assert_allclose(now.frame["timestamp"] - then.frame["timestamp"], now.live.t - 1_700_000_000.0)
    pd.testing.assert_frame_equal(now.frame.drop(columns="timestamp"), then.frame.drop(columns="timestamp"))
