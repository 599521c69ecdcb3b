"""The plant zoo (bench/zoo.py): plants drawn from a seed whose truth is what they do. Each truth is
checked against the plant's own simulation (unit steps held from the operating point, noise off),
its binding against the product's contract, its history against its design and the product's
history contract, and the product's identification runs on a small one."""

import functools
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import signal
from scipy.optimize import lsq_linear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from zoo import MAX_DELAY, MIN_RUN_SAMPLES, RUN_FACTOR, ZooPlant, draw, draw_set  # noqa: E402

from optimizer_pipeline.contracts import Template, binding_from_dict  # noqa: E402
from optimizer_pipeline.data.prepare import prepare_history  # noqa: E402
from optimizer_pipeline.data.ingest import validate_history_frame  # noqa: E402
from optimizer_pipeline.model import identify  # noqa: E402
from optimizer_pipeline.plants.base import PlantInputError  # noqa: E402

SEEDS = range(50)


@functools.cache
def zoo() -> tuple[ZooPlant, ...]:
    return tuple(draw_set(SEEDS))


def first(predicate) -> ZooPlant:
    """The plant of the lowest seed for which `predicate(plant)` holds."""
    return next(p for p in map(draw, itertools.count()) if predicate(p))


@functools.cache
def unit_steps(seed: int) -> np.ndarray:
    """(nu + nd, n + 1, ny): the noise-free CVs after a unit step of each input (MVs, then DVs) held from
    the operating point until the plant has settled (its settling_time_s and 2 samples more)."""
    plant = draw(seed)
    t = plant.truth
    n = int(round(plant.settling_time_s / plant.sample_period_s)) + 2
    x0 = plant.equilibrium(t.u0, t.d0)
    out = []
    for j in range(plant.nu + plant.nd):
        inputs = np.concatenate([t.u0, t.d0]) + np.eye(plant.nu + plant.nd)[j]
        u, d = np.tile(inputs[:plant.nu], (n, 1)), np.tile(inputs[plant.nu:], (n, 1))
        out.append(plant.simulate(x0, u, d, noise=False)[1])
    return np.stack(out)


# Plants whose unit steps are simulated: a level behind a lag with a measured DV, a right-half-plane zero,
# a slow CV.
def with_level_and_dv(p):
    return any(p.truth.integrating) and p.nd > 0 and any(ch.taus for row in p.truth.channels for ch in row
                                                         if ch.integrating)


def with_rhp_zero(p):
    return any(ch.zero is not None for row in p.truth.channels for ch in row)


def with_slow_cv(p):  # and no level: its settling is a self-regulating channel's
    return any(p.truth.slow) and not any(p.truth.integrating)


SIMULATED = (with_level_and_dv, with_rhp_zero, with_slow_cv)


@pytest.mark.parametrize("kind", SIMULATED, ids=lambda f: f.__name__)
def test_truth_gains_are_the_settled_response_to_a_unit_step_and_a_levels_slope(kind):
    plant = first(kind)
    y = unit_steps(plant.seed)
    truth = plant.truth
    settled = np.where(truth.integrating, y[:, -1] - y[:, -2], y[:, -1] - y[:, 0])  # (inputs, ny)
    np.testing.assert_allclose(settled.T, truth.gains, rtol=1e-4, atol=1e-4 * np.abs(truth.gains).max())


@pytest.mark.parametrize("kind", SIMULATED, ids=lambda f: f.__name__)
def test_each_channel_stays_at_its_start_for_its_dead_time_and_moves_after(kind):
    plant = first(kind)
    y = unit_steps(plant.seed)
    for i, row in enumerate(plant.truth.channels):
        for j, ch in enumerate(row):
            if ch.gain == 0.0:
                continue
            moved = y[j, :, i] - y[j, 0, i]
            assert np.all(moved[:ch.delay + 1] == 0.0), (i, j, ch.delay)
            assert moved[ch.delay + 1] != 0.0, (i, j, ch.delay)


@pytest.mark.parametrize("kind", SIMULATED, ids=lambda f: f.__name__)
def test_self_regulating_channels_follow_their_transfer_function_sampled(kind):
    """The continuous transfer function K (1 + tz s) e^{-theta s} / ((tau1 s + 1)(tau2 s + 1)) of the truth,
    stepped by scipy.signal and read at the samples, against the plant's RK4 simulation."""
    plant = first(kind)
    y = unit_steps(plant.seed)
    n = y.shape[1]
    for i, row in enumerate(plant.truth.channels):
        for j, ch in enumerate(row):
            if ch.gain == 0.0 or ch.integrating:
                continue
            den = np.poly1d([1.0])
            for tau in ch.taus:
                den = den * np.poly1d([tau, 1.0])
            t = np.arange(n - ch.delay, dtype=float)
            num = ch.gain * np.array([ch.zero, 1.0] if ch.zero else [1.0])
            _, expected = signal.step((num, den.coeffs), T=t)
            np.testing.assert_allclose(y[j, ch.delay:, i] - y[j, 0, i], expected, atol=1e-6 * abs(ch.gain))


def test_right_half_plane_zeros_start_the_wrong_way_and_other_channels_never_do():
    plant = first(with_rhp_zero)
    y = unit_steps(plant.seed)
    for i, row in enumerate(plant.truth.channels):
        for j, ch in enumerate(row):
            if ch.gain == 0.0 or ch.integrating:
                continue
            toward_gain = np.sign(ch.gain) * (y[j, :, i] - y[j, 0, i])
            if ch.zero is not None:
                assert toward_gain[ch.delay + 1] < 0.0 < toward_gain[-1], (i, j, ch)
            else:
                assert toward_gain.min() >= -1e-9 * abs(ch.gain), (i, j, ch)


def test_the_design_settling_time_is_the_slowest_channels_98_percent_in_the_simulation():
    plant = first(with_slow_cv)
    y = unit_steps(plant.seed)
    slowest = 0
    for i, row in enumerate(plant.truth.channels):
        for j, ch in enumerate(row):
            if ch.gain != 0.0 and not ch.integrating:
                outside = np.flatnonzero(np.abs(y[j, :, i] - y[j, 0, i] - ch.gain) > 0.02 * abs(ch.gain))
                slowest = max(slowest, outside[-1] + 1)
    assert abs(plant.truth.settling_samples - slowest) <= 1


def test_condition_numbers_span_1_to_100_and_are_those_of_the_mv_gains():
    drawn = []
    for plant in zoo():
        mv_gains = plant.truth.gains[:, :plant.nu]
        assert plant.truth.condition_number == pytest.approx(np.linalg.cond(mv_gains), rel=1e-9)
        if min(plant.nu, plant.ny) > 1:
            drawn.append(plant.truth.condition_number)
    assert len(drawn) >= 20
    assert 1.0 <= min(drawn) < 2.0 and 50.0 < max(drawn) <= 100.0


def test_every_cv_is_moved_by_the_mvs_and_sizes_span_1_to_4():
    for plant in zoo():
        rows = np.linalg.norm(plant.truth.gains[:, :plant.nu], axis=1)
        assert rows.min() >= 0.1 * rows.max() > 0.0
    assert {p.nu for p in zoo()} == {p.ny for p in zoo()} == {1, 2, 3, 4}
    assert {p.nd for p in zoo()} == {0, 1, 2}


def test_the_same_seed_draws_the_same_plant_and_history_and_another_seed_does_not():
    a, b, c = draw(46), draw(46), draw(16)
    assert a == b and hash(a) == hash(b) and a != c
    assert a.binding == b.binding and np.array_equal(a.truth.gains, b.truth.gains)
    assert a.truth.channels == b.truth.channels and a.truth.design == b.truth.design
    first_history, again = a.history(3, end_at=1.0e9), b.history(3, end_at=1.0e9)
    assert first_history.frame.equals(again.frame)
    np.testing.assert_array_equal(first_history.live.x, again.live.x)
    assert not first_history.frame.equals(a.history(4, end_at=1.0e9).frame)
    assert a.name == "zoo-46" != c.name


def test_a_seed_is_a_non_negative_integer():
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(PlantInputError, match="seed"):
            draw(bad)


def test_every_binding_validates_leaves_orders_to_the_product_and_uses_both_templates():
    templates = set()
    for plant in zoo():
        spec = binding_from_dict(plant.binding_doc(), source=plant.name)
        assert spec.id == plant.name and plant.spec == spec
        assert spec.model.na is None and spec.model.nb is None and spec.model.delay is None
        assert all(m.lo < u < m.hi for m, u in zip(spec.mvs, plant.truth.u0))
        templates.add(spec.profile.template)
    assert templates == set(Template)


def test_targets_are_the_steady_state_of_mvs_within_their_limits_with_every_level_balanced():
    """Solved independently: least squares over the MV box of the self-regulating CVs' steady_output
    minus their targets and the levels' rates (from the truth's gains)."""
    for plant in zoo():
        t, spec = plant.truth, plant.spec
        lo, hi = np.array([m.lo for m in spec.mvs]), np.array([m.hi for m in spec.mvs])
        target = np.array([c.target for c in spec.cvs])
        level = np.array(t.integrating)
        base = plant.steady_output(t.u0, t.d0)
        slopes = np.stack([plant.steady_output(t.u0 + e, t.d0) - base for e in np.eye(plant.nu)], axis=1)
        A = np.where(level[:, None], t.gains[:, :plant.nu], slopes)  # per unit of u - u0
        b = np.where(level, 0.0, target - base)
        scale = np.linalg.norm(A, axis=1) * np.mean(hi - lo)  # a row's reach over the MV box
        solved = lsq_linear(A / scale[:, None], b / scale, bounds=(lo - t.u0, hi - t.u0), tol=1e-12)
        assert np.max(np.abs(A @ solved.x - b) / scale) < 1e-7, plant.name
        assert all(c.lo < c.target < c.hi for c in spec.cvs)


def test_levels_are_declared_in_the_binding_exactly_where_the_truth_says_and_some_are_not():
    seen = set()
    for plant in zoo():
        t = plant.truth
        assert tuple(c.integrating for c in plant.spec.cvs) == t.declared
        assert all(t.integrating[i] for i, d in enumerate(t.declared) if d)
        assert not (any(t.integrating) and plant.spec.profile.template is Template.STEADY_RESPONSE)
        seen.update((i, d) for i, d in zip(t.integrating, t.declared) if i)
        assert not any(s and i for s, i in zip(t.slow, t.integrating))
    assert seen == {(True, True), (True, False)}
    assert any(p.truth.closed_loop for p in zoo()) and any(p.truth.drift for p in zoo())


def test_noise_std_is_the_design_amplitude_over_the_snr():
    """A self-regulating CV's amplitude: the std of its settled value over every +-a corner of the inputs."""
    for plant in zoo()[:10]:
        t, test = plant.truth, plant.truth.design
        amplitude = np.concatenate([test.mv_amplitude, test.dv_amplitude])
        corners = [np.concatenate([t.u0, t.d0]) + np.array(signs) * amplitude
                   for signs in itertools.product((-1.0, 1.0), repeat=plant.nu + plant.nd)]
        spread = np.std([plant.steady_output(v[:plant.nu], v[plant.nu:]) for v in corners], axis=0)
        for i in np.flatnonzero(~np.array(t.integrating)):
            assert t.noise_std[i] * t.snr[i] == pytest.approx(spread[i], rel=1e-9)
            assert 5.0 <= t.snr[i] <= 100.0


def test_histories_follow_the_design_and_pass_the_history_contract():
    for plant in (first(lambda p: p.nd > 0 and not p.truth.closed_loop), first(lambda p: p.truth.closed_loop)):
        test = plant.truth.design
        history = plant.history(1, end_at=1.0e9)
        frame = validate_history_frame(history.frame, plant.spec, "zoo")
        lengths = frame.groupby("run_id", sort=False).size()
        assert list(lengths) == list(test.run_lengths) and len(lengths) == test.runs
        assert history.live.t == pytest.approx(frame["timestamp"].iloc[-1]) == pytest.approx(1.0e9)
        if not plant.truth.closed_loop:  # the live run ends holding the operating point
            np.testing.assert_allclose(history.live.u, plant.truth.u0)
            np.testing.assert_allclose(history.live.d, plant.truth.d0)


def test_run_lengths_are_1_to_4_settling_times_with_a_floor():
    for plant in zoo():
        S = plant.truth.settling_samples
        for n in plant.truth.design.run_lengths:
            assert n == MIN_RUN_SAMPLES or RUN_FACTOR[0] * S - 1 <= n <= RUN_FACTOR[1] * S + 1
            assert n >= MIN_RUN_SAMPLES
        assert 6 <= plant.truth.design.runs <= 16
    assert max(ch.delay for p in zoo() for row in p.truth.channels for ch in row) == MAX_DELAY


def test_mvs_are_binary_noise_and_the_controlled_one_adds_the_p_law_on_the_measured_level():
    plant = first(lambda p: p.truth.closed_loop)
    test, t = plant.truth.design, plant.truth
    frame = plant.history(2, end_at=1.0e9).frame
    historic = frame[frame["run_id"] != frame["run_id"].iloc[-1]]
    level = historic[plant.spec.cv_tags[test.loop.cv]].to_numpy()
    for j, (tag, mv) in enumerate(zip(plant.spec.mv_tags, plant.spec.mvs)):
        u = historic[tag].to_numpy()
        dither = u - t.u0[j]
        if j == test.loop.mv:
            inside = (mv.lo < u) & (u < mv.hi)
            assert inside.mean() > 0.9
            dither = (dither - test.loop.gain * (t.y0[test.loop.cv] - level))[inside]
            assert test.loop.gain * t.gains[test.loop.cv, j] > 0.0  # negative feedback
        np.testing.assert_allclose(np.abs(dither), test.mv_amplitude[j], rtol=1e-9)


def test_measured_cvs_carry_white_noise_of_their_std_and_the_drift_only_where_drawn():
    """The residual of each run against the plant simulated from its first inputs' steady state with its
    recorded MVs: white noise of noise_std on a CV without drift; on a drifting CV a run's mean moves
    far more than white noise's would."""
    plant = first(lambda p: p.truth.drift and not all(p.truth.drift_std) and not p.truth.closed_loop and p.nd == 0
                  and not any(p.truth.integrating) and sum(p.truth.design.run_lengths) < 2500)
    t = plant.truth
    frame = plant.history(5, end_at=1.0e9).frame
    residuals = []
    for _, run in frame.groupby("run_id", sort=False):
        u = run[list(plant.spec.mv_tags)].to_numpy()
        _, y = plant.simulate(plant.equilibrium(u[0]), u[:-1], noise=False)
        residuals.append(run[list(plant.spec.cv_tags)].to_numpy() - y)
    for i, drifting in enumerate(np.array(t.drift_std) > 0):
        means = np.array([r[:, i].mean() / (t.noise_std[i] / np.sqrt(len(r))) for r in residuals])
        if drifting:
            assert np.std(means) > 5.0
        else:
            assert np.std(means) < 2.0
            assert np.std(np.concatenate([r[:, i] for r in residuals])) == pytest.approx(t.noise_std[i], rel=0.1)


def test_the_product_identifies_a_small_zoo_plant_from_its_history():
    plant = first(lambda p: p.nu == 1 and p.ny == 1 and p.nd == 0 and not any(p.truth.integrating)
                  and not p.truth.drift and p.truth.settling_samples < 150)
    spec = plant.spec
    split = prepare_history(validate_history_frame(plant.history(1).frame, spec, "zoo"), spec)
    artifact = identify(split, spec, 1)
    assert (artifact.binding_id, artifact.mv_tags, artifact.cv_tags) == (spec.id, spec.mv_tags, spec.cv_tags)
    [pair] = artifact.step_response["pairs"]
    assert pair["gain"] == pytest.approx(plant.truth.gains[0, 0], rel=0.5)
