"""The DVs a plan holds over its horizon (problem.held_dvs): the mean of the newest samples at one
level, not the newest noisy sample; a step or a drift ends the stretch."""

import numpy as np
import pytest

from optimizer_pipeline.problem import held_dvs

SIGMA = 0.3  # a feed's measurement noise (m^3/h)


def noisy(level: np.ndarray, seed: int) -> np.ndarray:
    return (level + SIGMA * np.random.default_rng(seed).normal(size=level.shape))[:, None]


def test_a_steady_noisy_dv_is_held_at_the_mean_of_its_newest_samples():
    level = np.full(300, 60.0)
    errors = np.array([held_dvs(noisy(level, seed), 40)[0] - 60.0 for seed in range(300)])
    last = np.array([noisy(level, seed)[-1, 0] - 60.0 for seed in range(300)])
    rms = float(np.sqrt(np.mean(errors ** 2)))
    assert rms < 1.3 * SIGMA / np.sqrt(40)  # the mean of ~40 samples (a spurious cut is rare and unbiased)
    assert abs(float(np.mean(errors))) < 3 * SIGMA / np.sqrt(40 * 300) + 0.01
    assert rms < 0.25 * float(np.sqrt(np.mean(last ** 2)))  # the newest sample alone: ~SIGMA


def test_a_step_ends_the_stretch_so_the_new_level_is_held():
    level = np.concatenate([np.full(290, 60.0), np.full(10, 62.0)])  # a step of ~7 noise sigmas, 10 samples ago
    errors = np.array([held_dvs(noisy(level, seed), 60)[0] - 62.0 for seed in range(200)])
    assert np.sqrt(np.mean(errors ** 2)) < 1.5 * SIGMA / np.sqrt(10)  # the 10 samples after the step, no old level
    assert abs(float(np.mean(errors))) < 0.05


@pytest.mark.parametrize("per_sample", [0.01, 0.05])  # a thirtieth and a sixth of the noise per sample
def test_a_drifting_dv_is_held_at_its_newest_level_not_behind_it(per_sample):
    level = 60.0 + per_sample * np.arange(300)
    errors = np.array([held_dvs(noisy(level, seed), 60)[0] - level[-1] for seed in range(200)])
    assert abs(float(np.mean(errors))) < 0.2 * SIGMA  # no lag: the trend's line, not the stretch's mean
    assert np.sqrt(np.mean(errors ** 2)) < 0.7 * SIGMA  # nearer than the newest sample alone (SIGMA)


def test_a_dv_without_noise_is_held_at_its_newest_value_also_right_after_a_step():
    d = np.column_stack([np.full(50, 3.0), np.r_[np.full(49, 1.0), 2.0], np.linspace(0.0, 1.0, 50)])
    np.testing.assert_array_equal(held_dvs(d, 40), [3.0, 2.0, 1.0])


def test_each_dv_is_judged_on_its_own_and_no_dv_gives_an_empty_vector():
    rng = np.random.default_rng(1)
    d = np.column_stack([60.0 + SIGMA * rng.normal(size=200), np.r_[np.full(199, 5.0), 7.0]])
    held = held_dvs(d, 50)
    assert abs(held[0] - 60.0) < 4 * SIGMA / np.sqrt(50) and held[1] == 7.0
    assert held_dvs(np.zeros((20, 0)), 10).shape == (0,)
    assert held_dvs(d[:1], 10).tolist() == d[0].tolist()  # one sample: itself
