"""bench/references.py: the judge's reference fits recover known gains with standard errors that cover."""

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import cont2discrete, lfilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from references import Estimate, miso_output_error, oracle, regularised_fir  # noqa: E402


@dataclass(frozen=True)
class Channel:
    """The attributes of bench/zoo.py's ChannelTruth the oracle reads (and the gain it must not)."""

    gain: float
    taus: tuple[float, ...]
    delay: int
    zero: float | None = None
    integrating: bool = False


def respond(channel: Channel, u: np.ndarray) -> np.ndarray:
    """The channel's response to u (deviation from its first sample, held over each sample, the plant
    at rest before), by scipy's own zero-order-hold discretisation: y[t] first moves at delay + 1."""
    den = np.array([1.0])
    for tau in channel.taus:
        den = np.polymul(den, [tau, 1.0])
    if channel.integrating:
        den = np.polymul(den, [1.0, 0.0])
    num = channel.gain * (np.array([channel.zero, 1.0]) if channel.zero is not None else np.array([1.0]))
    b, a, _ = cont2discrete((num, den), 1.0, method="zoh")
    y = lfilter(np.ravel(b), a, u - u[0])
    return np.concatenate([np.zeros(channel.delay), y[:len(y) - channel.delay]])


# a 2 x 2 plant of first-order lags with dead times
PLANT = ((Channel(2.0, (6.0,), 3), Channel(-1.0, (10.0,), 0)),
         (Channel(0.5, (4.0,), 5), Channel(1.5, (12.0,), 2)))


def history(plant, seed: int, runs: int = 8, length: int = 250, hold: int = 20,
            noise: float = 0.05) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random +-1 steps around an operating point of each run's own, every run from rest at its first
    inputs, CVs at levels of their own, white measurement noise."""
    rng = np.random.default_rng(seed)
    n_inputs = len(plant[0])
    out = []
    for _ in range(runs):
        u = np.repeat(rng.choice([-1.0, 1.0], size=(length // hold + 1, n_inputs)), hold, axis=0)[:length]
        u[:hold] = 0.0
        u = u + rng.normal(0.0, 3.0, n_inputs)
        y = np.column_stack([sum(respond(ch, u[:, j]) for j, ch in enumerate(row)) for row in plant])
        out.append((u, y + rng.normal(0.0, 10.0, len(plant)) + noise * rng.standard_normal(y.shape)))
    return out


def true_gains(plant) -> np.ndarray:
    return np.array([[ch.gain for ch in row] for row in plant])


def assert_covers(estimate: Estimate, truth: np.ndarray, sigmas: float = 3.0, relative: float = 0.01) -> None:
    assert estimate.gains.shape == truth.shape and estimate.se.shape == truth.shape
    assert np.all(np.abs(estimate.gains - truth) <= sigmas * estimate.se), (estimate.gains, estimate.se)
    assert np.all(np.abs(estimate.gains - truth) <= relative * np.abs(truth))
    assert np.all(estimate.se > 0) and estimate.seconds > 0


@pytest.fixture(scope="module")
def runs():
    return history(PLANT, 11)


@pytest.fixture(scope="module")
def fir(runs):
    return regularised_fir(runs, n_taps=60)


def test_regularised_fir_recovers_the_gains(fir):
    assert_covers(fir, true_gains(PLANT))
    assert len(fir.detail) == 2 and fir.detail[0].taps.shape == (2, 60)


def test_miso_output_error_recovers_the_gains_and_the_dead_times(runs, fir):
    estimate = miso_output_error(runs, fir=fir)
    assert_covers(estimate, true_gains(PLANT))
    assert [d["delays"] for d in estimate.detail] == [[3, 0], [5, 2]]


def test_oracle_recovers_the_gains(runs):
    assert_covers(oracle(runs, PLANT), true_gains(PLANT))


def test_oracle_is_at_least_as_good_as_the_miso_output_error():
    """Over noise draws: the true structure's errors no larger, its se no wider (it fits fewer parameters)."""
    truth, oracle_errors, miso_errors = true_gains(PLANT), [], []
    for seed in (21, 22, 23):
        runs = history(PLANT, seed)
        fitted, best = miso_output_error(runs, n_taps=60), oracle(runs, PLANT)
        assert np.all(best.se <= 1.05 * fitted.se)
        oracle_errors.append(np.linalg.norm(best.gains - truth))
        miso_errors.append(np.linalg.norm(fitted.gains - truth))
    assert np.mean(oracle_errors) <= np.mean(miso_errors)


def test_oracle_reads_the_structure_not_the_gains(runs):
    """Wrong gains in the structure change nothing: they are not starts (the gains are solved for)."""
    scrambled = tuple(tuple(Channel(-7.0 * ch.gain, ch.taus, ch.delay) for ch in row) for row in PLANT)
    np.testing.assert_allclose(oracle(runs, scrambled).gains, oracle(runs, PLANT).gains, rtol=1e-9)


# a level (rates per sample: one with a lag, one a pure integrator) beside a self-regulating CV
LEVEL_PLANT = ((Channel(0.04, (4.0,), 1, integrating=True), Channel(-0.03, (), 2, integrating=True)),
               (Channel(1.0, (8.0, 3.0), 2, zero=-2.0), Channel(0.5, (5.0,), 0)))


def test_an_integrating_cv_gets_rates_from_every_reference():
    runs = history(LEVEL_PLANT, 31, noise=0.02)
    truth, flags = true_gains(LEVEL_PLANT), (True, False)
    fir = regularised_fir(runs, flags, n_taps=80)
    assert_covers(fir, truth, relative=0.03)
    assert_covers(miso_output_error(runs, flags, fir=fir), truth, relative=0.03)
    assert_covers(oracle(runs, LEVEL_PLANT), truth, relative=0.03)


def test_bad_input_is_refused_naming_it(runs):
    with pytest.raises(ValueError, match="structure"):
        oracle(runs, PLANT[:1])
    with pytest.raises(ValueError, match="integrating"):
        regularised_fir(runs, (True,), n_taps=50)
    broken = list(runs)
    broken[3] = (runs[3][0], np.full_like(runs[3][1], np.nan))
    with pytest.raises(ValueError, match="run 3"):
        miso_output_error(broken, n_taps=50)
