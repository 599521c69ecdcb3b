"""The plant zoo: linear MIMO plants drawn at random from a seed, each with its truth, for judging
identification on plants nobody tuned the product to (issue 55).

A `ZooPlant` is a product demo plant (optimizer_pipeline.plants.base.Plant): its binding document,
`history(seed)`, live state, `simulate`, `equilibrium`, `steady_output` and `apply_plan` work as the
other plants' do. Its dynamics are linear, in engineering units around an operating point (MVs u0,
DVs d0, CVs y0): CV i is y0_i plus one channel per input j (the MVs, then the DVs),

    G_ij(s) = K_ij (1 + tz_ij s) e^{-theta_ij s} / ((tau1_ij s + 1)(tau2_ij s + 1))   self-regulating
    G_ij(s) = K_ij e^{-theta_ij s} / (s (tau_ij s + 1))                               integrating

on the input's deviation from its operating value, plus an unmeasured drift in some plants. Times
are in sample periods; dead times theta are whole samples, kept as past inputs in the state.
`Truth` records every channel, the steady gains, the noise, the drift and the step-test design.

How each plant is drawn (numpy's default_rng((seed, DRAW_STREAM)); U uniform, logU log-uniform):

* size: nu MVs and ny CVs each U{1..4}; measured DVs: none in 60 % of plants, else U{1, 2}.
* levels: in 30 % of plants, U{1..min(nu, ny)} CVs integrate (every channel to them a rate: a pure
  integrator, or with a lag tau ~ logU[2, 20] in half of them); each is declared `integrating: true`
  in the binding with probability 0.5. Slow lags: in 30 % of plants each other CV is, with
  probability 0.5 (at least one), self-regulating with its lag tau ~ U[50, 80] (the hard case for
  telling integrating from slow).
* channels: FOPDT, or SOPDT with probability 0.4, every tau ~ logU[2, 80] (a slow CV's first lag as
  above, its second ~ logU[2, 10]); dead time U{0..15} samples. In 25 % of plants each
  self-regulating channel has, with probability 0.5, a right-half-plane zero: tz = -f max(tau),
  f ~ U[0.2, 1], at least 1.5 samples (an inverse response that lasts samples), on an SOPDT channel
  (a first-order one gets the second lag drawn for it): strictly proper, so a CV at a sample depends
  on the state only.
* steady gains of the MVs (ny x nu, integrating rows: rates per sample): K = (g / h_u) U S V' with U,
  V random orthogonal (QR of a Gaussian matrix), S the singular values 1, 1/kappa and the others
  kappa^-U[0, 1], kappa ~ logU[1, 100] (1 where nu or ny is 1: one singular value), g ~ logU[0.5, 20]
  the CVs' move for an MV's half range h_u along the strongest direction; signs as U and V give
  them. Redrawn while some CV's row is under 10 % of the largest row's norm (each CV moved by the
  MVs). A DV's gain on a CV is (g / h_d) N(0, 0.5^2) where present (probability 0.7, each DV on at
  least one CV), h_d ~ logU[0.5, 50] its own scale.
* operating point and limits: the MVs share a half range h_u ~ logU[0.5, 50]; u0 ~ h_u U[1.5, 10],
  lo / hi = u0 -/+ h_u U[0.7, 1.3], max_move = (hi - lo) U[0.02, 0.1]; d0 ~ h_d U[2, 10]; y0 ~ U[0, 100].
* step-test design: U{6..16} runs, each of round(S U[1, 4]) samples (at least MIN_RUN_SAMPLES), S the
  slowest channel's 98 % settling time. Every MV moves as generalised binary noise u0 +- a, a = (hi -
  lo) U[0.05, 0.25], switching with probability 1 / hold per sample, mean hold ~ S logU[0.1, 0.5] (at
  least 2); each DV likewise, a = h_d U[0.3, 1], mean hold S logU[0.3, 1]. The live (last) run holds
  u0 and d0 for its last U[0.1, 0.5] fraction. In half of the plants with a level, the history is
  recorded in closed loop: a P controller on the first integrating CV moves the MV with the largest
  authority on it (|rate| x range), u = u0 + GBN + (y0 - y measured) / (rate lambda), the loop's time
  constant lambda = U[2, 4] max(theta + tau + 1, the MV's mean hold) samples, kept inside the MV limits.
* noise: per CV white measurement noise of std A / SNR, SNR ~ logU[5, 100], A the CV's step-response
  amplitude over the design: the std of its settled value under independent +-a inputs, sqrt(sum_j
  (K_ij a_j)^2), for a level its ramp over one mean hold, sqrt(sum_j (K_ij a_j hold_j)^2). In 30 % of
  plants an unmeasured drift on each CV with probability 0.6 (at least one): AR(1) with pole
  exp(-1 / tau_d), tau_d ~ logU[50, 1000] samples, stationary std A logU[0.03, 0.3]; part of the
  true CV (the live state carries it and it decays in a plan), never measured. DV measurement noise
  std a / 50.
* targets: the true steady state at MVs u* = u0 + delta inside the limits, delta random in the null
  space of the levels' MV rates (so the levels end balanced at u*), scaled to U[0.3, 0.8] of the
  way to the nearest limit: reachable by construction (tests/test_zoo.py solves for it). A level's
  target is y0 +- A U[0.5, 2]. CV limits: [min(y0, target), max(y0, target)] widened by U[2, 4]
  typical excursions (A; a level in open loop wanders as a random walk, A sqrt(longest run / mean hold)).
* binding: tags mv1.., cv1.., dv1..; `steady_response@1` (horizon: the ramp to u* at max_move plus
  U{1..5}) in 40 % of the plants without a level, else `linear_mpc_quadratic@1` (horizon S plus the
  ramp plus 10); model orders left to the product, its horizon P the larger of S / 4 and the longest
  dead time + 5, clipped to 10..40; sample period one of 10, 30, 60, 120 s.

Usage: `plant = draw(seed)`; `plant.truth`, `plant.history(history_seed)`.
"""

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Sequence

import numpy as np
import pandas as pd
from scipy import signal

from optimizer_pipeline.plants.base import DemoHistory, LiveState, Plant, PlantInputError

DRAW_STREAM = 55  # keeps a plant's draw apart from the stream of history(seed) with the same number
MAX_SIZE = 4
TAU_RANGE = (2.0, 80.0)
SLOW_TAU_RANGE = (50.0, 80.0)
MAX_DELAY = 15
CONDITION_RANGE = (1.0, 100.0)
SNR_RANGE = (5.0, 100.0)
RUN_FACTOR = (1.0, 4.0)  # run length over the slowest 98 % settling time
MIN_RUN_SAMPLES = 120  # a fast plant's runs still hold a few GBN switches and the product's windows
SETTLED = 0.02  # the design's settling: within 2 % of the final value
SETTLED_EXACTLY = 1e-5  # Plant.settling_time_s: within ~1e-5 of steady state
MIN_RHP_ZERO = 1.5  # samples
SETTLING_GRID = 0.05  # samples between the points a second-order step response is evaluated at


@dataclass(frozen=True)
class ChannelTruth:
    """One input (MV or DV) -> one CV, times in sample periods."""

    gain: float  # steady gain in engineering units (integrating: the CV's rate per sample per unit input)
    taus: tuple[float, ...]  # 1 (FOPDT) or 2 (SOPDT) time constants, samples (() for a pure integrator)
    delay: int  # dead time, samples
    zero: float | None  # numerator time constant tz of (1 + tz s), samples; negative: right-half-plane zero
    integrating: bool

    def settling(self, tolerance: float) -> float:
        """Samples from an input step until the response (a level's: its rate) stays within `tolerance`
        of its final value, relative; the dead time included. 0 for an absent channel."""
        if self.gain == 0.0:
            return 0.0
        if self.integrating or len(self.taus) == 1:
            return self.delay + (self.taus[0] * math.log(1.0 / tolerance) if self.taus else 0.0)
        tau1, tau2 = self.taus
        tz = self.zero or 0.0
        t = np.arange(0.0, 40.0 * max(tau1, tau2, abs(tz)), SETTLING_GRID)
        if abs(tau1 - tau2) > 1e-6 * tau1:
            y = 1.0 - ((tau1 - tz) * np.exp(-t / tau1) - (tau2 - tz) * np.exp(-t / tau2)) / (tau1 - tau2)
        else:  # the double pole's limit
            y = 1.0 - (1.0 + t * (tau1 - tz) / tau1 ** 2) * np.exp(-t / tau1)
        outside = np.flatnonzero(np.abs(y - 1.0) > tolerance)
        return self.delay + (t[outside[-1]] + SETTLING_GRID if outside.size else 0.0)


@dataclass(frozen=True)
class LevelLoop:
    """A closed-loop step test's P controller: MV `mv` = its GBN + (y0 - measured CV `cv`) x `gain`."""

    cv: int
    mv: int
    gain: float  # MV units per CV unit


@dataclass(frozen=True)
class StepTest:
    """A zoo plant's history design: runs of GBN on every input around the operating point."""

    run_lengths: tuple[int, ...]  # samples per run, the live run last
    mv_hold: tuple[float, ...]  # mean samples between switches per MV (switch probability 1 / hold)
    mv_amplitude: tuple[float, ...]  # +- around u0, engineering units
    dv_hold: tuple[float, ...]
    dv_amplitude: tuple[float, ...]
    live_hold_fraction: float  # the live run holds u0, d0 for this last fraction
    loop: LevelLoop | None  # closed loop on a level, or open loop

    @property
    def runs(self) -> int:
        return len(self.run_lengths)


@dataclass(frozen=True, eq=False)
class Truth:
    """What a zoo plant is, for the judge: per CV and input (MVs then DVs), engineering units, samples."""

    gains: np.ndarray  # (ny, nu + nd) true steady gains (integrating CV rows: rates per sample)
    channels: tuple[tuple[ChannelTruth, ...], ...]  # [cv][input]
    integrating: tuple[bool, ...]  # per CV, the truth
    declared: tuple[bool, ...]  # per CV, what the binding declares
    slow: tuple[bool, ...]  # per CV, self-regulating with a lag of 50 samples or more (drawn so, or by chance)
    condition_number: float  # drawn for the MV gains (ny x nu); 1 for a single row or column
    snr: tuple[float, ...]  # per CV: step-response amplitude over the design / noise std
    noise_std: tuple[float, ...]  # per CV, white measurement noise
    drift_std: tuple[float, ...]  # per CV, the unmeasured AR(1) drift's stationary std (0: none)
    drift_pole: float  # the drift's pole per sample
    settling_samples: int  # the slowest channel's 98 % settling time
    u0: np.ndarray  # (nu,) the operating point
    d0: np.ndarray  # (nd,)
    y0: np.ndarray  # (ny,) the CVs at (u0, d0), levels balanced there
    u_target: np.ndarray  # (nu,) MVs whose steady state is the binding's targets
    design: StepTest
    dv_noise_std: tuple[float, ...]

    @property
    def drift(self) -> bool:
        return any(self.drift_std)

    @property
    def closed_loop(self) -> bool:
        return self.design.loop is not None


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, size: Any = None) -> Any:
    return np.exp(rng.uniform(math.log(lo), math.log(hi), size))


def _orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random orthogonal matrix (n, n), Haar distributed: QR of a Gaussian one, signs fixed by R."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def _mv_gains(rng: np.random.Generator, ny: int, nu: int, kappa: float) -> np.ndarray:
    """U S V' (ny, nu) with singular values from 1 down to 1 / kappa, each CV's row >= 10 % of the largest."""
    r = min(ny, nu)
    exponents = np.concatenate([[0.0, 1.0][:r], rng.uniform(0.0, 1.0, max(r - 2, 0))])
    while True:
        gains = _orthogonal(rng, ny)[:, :r] @ np.diag(kappa ** -exponents) @ _orthogonal(rng, nu)[:, :r].T
        rows = np.linalg.norm(gains, axis=1)
        if rows.min() >= 0.1 * rows.max():
            return gains


def _channel(rng: np.random.Generator, gain: float, integrating: bool, slow: bool, rhp: bool) -> ChannelTruth:
    """One channel of steady gain `gain` to a level, a slow CV or another; `rhp`: its plant has RHP zeros."""
    delay = int(rng.integers(0, MAX_DELAY + 1))
    if gain == 0.0:
        return ChannelTruth(0.0, (), 0, None, integrating)
    if integrating:
        taus = (float(_log_uniform(rng, 2.0, 20.0)),) if rng.random() < 0.5 else ()
        return ChannelTruth(gain, taus, delay, None, True)
    first = rng.uniform(*SLOW_TAU_RANGE) if slow else _log_uniform(rng, *TAU_RANGE)
    second = _log_uniform(rng, 2.0, 10.0) if slow else _log_uniform(rng, *TAU_RANGE)
    taus = (float(first), float(second)) if rng.random() < 0.4 else (float(first),)
    zero = None
    if rhp and rng.random() < 0.5:
        taus = (taus[0], float(second))
        zero = -max(rng.uniform(0.2, 1.0) * max(taus), MIN_RHP_ZERO)
    return ChannelTruth(gain, taus, delay, zero, False)


def _realisation(ch: ChannelTruth) -> tuple[float, ...]:
    """The channel's two states (a, b) per sample: a' = ba v + aaa a, b' = aba a + abb b, its share of
    the CV ca a + cb b; and the states it settles at per unit of K v (a level's integral stays put).
    Returns (ba, aaa, aba, abb, ca, cb, settle_a, settle_b)."""
    k = ch.gain
    if k == 0.0:
        return (0.0,) * 8
    if ch.integrating:
        if not ch.taus:  # a = the level's share
            return k, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0
        tau = ch.taus[0]  # a = its rate through the lag, b = its share
        return k / tau, -1.0 / tau, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0
    if len(ch.taus) == 1:
        tau = ch.taus[0]
        return k / tau, -1.0 / tau, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0
    tau1, tau2 = ch.taus
    tz = ch.zero or 0.0  # y = b + tz b'
    return k / tau1, -1.0 / tau1, 1.0 / tau2, -1.0 / tau2, tz / tau2, 1.0 - tz / tau2, 1.0, 1.0


def _gbn(rng: np.random.Generator, shape: tuple[int, int], hold: Sequence[float],
         amplitude: Sequence[float]) -> np.ndarray:
    """Generalised binary noise (runs, n, k): +-amplitude per input, switching with probability 1 / hold."""
    k = len(hold)
    start = rng.choice([-1.0, 1.0], size=(shape[0], 1, k))
    switches = np.cumsum(rng.random((*shape, k)) < 1.0 / np.asarray(hold, float), axis=1)
    return start * np.where(switches % 2, -1.0, 1.0) * np.asarray(amplitude, float)


def _drift(rng: np.random.Generator, shape: tuple[int, int], pole: float, std: Sequence[float]) -> np.ndarray:
    """AR(1) series (runs, n, ny) of pole `pole` and stationary std `std`, each run from its stationary law."""
    w = rng.standard_normal((*shape, len(std)))
    w[:, 1:] *= math.sqrt(1.0 - pole ** 2)
    return signal.lfilter([1.0], [1.0, -pole], w, axis=1) * np.asarray(std, float)


def _levels(rng: np.random.Generator, nu: int, ny: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per CV (ny,): whether it integrates, whether the binding declares it, whether it is a slow lag."""
    integrating = np.zeros(ny, bool)
    if rng.random() < 0.3:
        integrating[rng.choice(ny, int(rng.integers(1, min(nu, ny) + 1)), replace=False)] = True
    declared = integrating & (rng.random(ny) < 0.5)
    slow = np.zeros(ny, bool)
    if rng.random() < 0.3 and not integrating.all():
        slow = ~integrating & (rng.random(ny) < 0.5)
        if not slow.any():
            slow[rng.choice(np.flatnonzero(~integrating))] = True
    return integrating, declared, slow


def _gains(rng: np.random.Generator, ny: int, nu: int, kappa: float, g: float, h_u: float,
           h_d: np.ndarray) -> np.ndarray:
    """The steady gains (ny, nu + nd): the MVs' of condition number kappa, then each DV's on some CVs."""
    gains = np.zeros((ny, nu + len(h_d)))
    gains[:, :nu] = g / h_u * _mv_gains(rng, ny, nu, kappa)
    for k, scale in enumerate(h_d):
        present = rng.random(ny) < 0.7
        present[rng.integers(ny)] = True
        gains[:, nu + k] = np.where(present, g / scale * rng.normal(0.0, 0.5, ny), 0.0)
    return gains


def _step_test(rng: np.random.Generator, S: int, channels: tuple[tuple[ChannelTruth, ...], ...], gains: np.ndarray,
               integrating: np.ndarray, span: np.ndarray, h_d: np.ndarray) -> StepTest:
    """The history design for a plant settling in S samples whose MVs span `span` (hi - lo)."""
    nu = len(span)
    runs = int(rng.integers(6, 17))
    lengths = tuple(max(int(round(S * f)), MIN_RUN_SAMPLES) for f in rng.uniform(*RUN_FACTOR, runs))
    mv_amplitude = span * rng.uniform(0.05, 0.25, nu)
    mv_hold = np.maximum(S * _log_uniform(rng, 0.1, 0.5, nu), 2.0)
    dv_amplitude = h_d * rng.uniform(0.3, 1.0, len(h_d))
    dv_hold = np.maximum(S * _log_uniform(rng, 0.3, 1.0, len(h_d)), 2.0)
    loop = None
    if integrating.any() and rng.random() < 0.5:
        cv = int(np.flatnonzero(integrating)[0])
        mv = int(np.argmax(np.abs(gains[cv, :nu]) * span))  # the most authority on the level
        ch = channels[cv][mv]
        # slower than the dither's switching (its moves stay in the data) and than the channel's lag
        lam = rng.uniform(2.0, 4.0) * max(ch.delay + sum(ch.taus) + 1.0, mv_hold[mv])
        loop = LevelLoop(cv, mv, 1.0 / (gains[cv, mv] * lam))
    return StepTest(lengths, tuple(mv_hold), tuple(mv_amplitude), tuple(dv_hold), tuple(dv_amplitude),
                    float(rng.uniform(0.1, 0.5)), loop)


def _amplitude(gains: np.ndarray, test: StepTest, integrating: np.ndarray) -> np.ndarray:
    """A per CV (ny,), the step-response amplitude over the design: a self-regulating CV's settled std
    under independent +-a inputs, a level's ramp over one mean hold."""
    amplitude = np.concatenate([test.mv_amplitude, test.dv_amplitude])
    hold = np.concatenate([test.mv_hold, test.dv_hold])
    return np.where(integrating, np.linalg.norm(gains * amplitude * hold, axis=1),
                    np.linalg.norm(gains * amplitude, axis=1))


def _targets(rng: np.random.Generator, gains: np.ndarray, integrating: np.ndarray, u0: np.ndarray, lo: np.ndarray,
             hi: np.ndarray, y0: np.ndarray, amplitude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u*, targets): the CVs' steady state at MVs u* = u0 + delta inside the limits, delta in the null
    space of the levels' MV rates (they end balanced); a level's target y0 +- A U[0.5, 2]."""
    nu = len(u0)
    rates = gains[integrating, :nu]
    null = np.linalg.svd(rates)[2][np.linalg.matrix_rank(rates):].T if rates.size else np.eye(nu)
    delta = null @ rng.standard_normal(null.shape[1])
    if np.any(delta):
        room = np.where(delta > 0, hi - u0, u0 - lo)
        delta *= rng.uniform(0.3, 0.8) / np.max(np.abs(delta) / room)
    ny = len(y0)
    level_moves = rng.choice([-1.0, 1.0], ny) * amplitude * rng.uniform(0.5, 2.0, ny)
    return u0 + delta, np.where(integrating, y0 + level_moves, y0 + gains[:, :nu] @ delta)


def _draw(seed: int) -> tuple[Truth, dict[str, Any]]:
    """The plant of `seed`: its truth and its binding document (module docstring)."""
    rng = np.random.default_rng((seed, DRAW_STREAM))
    nu, ny = (int(n) for n in rng.integers(1, MAX_SIZE + 1, 2))
    nd = int(rng.integers(1, 3)) if rng.random() < 0.4 else 0
    period = float(rng.choice([10.0, 30.0, 60.0, 120.0]))
    integrating, declared, slow = _levels(rng, nu, ny)
    rhp = rng.random() < 0.25

    kappa = float(_log_uniform(rng, *CONDITION_RANGE)) if min(nu, ny) > 1 else 1.0
    g, h_u = _log_uniform(rng, 0.5, 20.0), _log_uniform(rng, 0.5, 50.0)
    h_d = _log_uniform(rng, 0.5, 50.0, nd)
    gains = _gains(rng, ny, nu, kappa, g, h_u, h_d)
    channels = tuple(tuple(_channel(rng, float(gains[i, j]), bool(integrating[i]), bool(slow[i]), rhp)
                           for j in range(nu + nd)) for i in range(ny))
    S = int(math.ceil(max(ch.settling(SETTLED) for row in channels for ch in row)))

    u0 = h_u * rng.uniform(1.5, 10.0, nu)
    lo, hi = u0 - h_u * rng.uniform(0.7, 1.3, nu), u0 + h_u * rng.uniform(0.7, 1.3, nu)
    max_move = (hi - lo) * rng.uniform(0.02, 0.1, nu)
    d0 = h_d * rng.uniform(2.0, 10.0, nd)
    y0 = rng.uniform(0.0, 100.0, ny)

    test = _step_test(rng, S, channels, gains, integrating, hi - lo, h_d)
    amplitude = _amplitude(gains, test, integrating)
    snr = _log_uniform(rng, *SNR_RANGE, ny)
    drift_std = np.zeros(ny)
    if rng.random() < 0.3:
        drifting = rng.random(ny) < 0.6
        drifting[rng.integers(ny)] = True
        drift_std = np.where(drifting, amplitude * _log_uniform(rng, 0.03, 0.3, ny), 0.0)
    drift_pole = math.exp(-1.0 / _log_uniform(rng, 50.0, 1000.0))

    u_target, target = _targets(rng, gains, integrating, u0, lo, hi, y0, amplitude)
    # a level in open loop wanders as a random walk of one A per mean hold
    excursion = np.where(integrating, amplitude * math.sqrt(
        max(test.run_lengths) / np.mean(test.mv_hold + test.dv_hold)), amplitude)
    margin = excursion * rng.uniform(2.0, 4.0, ny)
    ramp = int(math.ceil(np.max(np.abs(u_target - u0) / max_move)))
    steady = not integrating.any() and rng.random() < 0.4
    doc = {
        "id": f"zoo-{seed}", "sample_period_s": period,
        "unit": f"zoo plant {seed}: {ny} CV x {nu} MV, {nd} DV, condition number {kappa:.3g}",
        "mvs": [{"tag": f"mv{j + 1}", "lo": float(lo[j]), "hi": float(hi[j]), "max_move": float(max_move[j])}
                for j in range(nu)],
        "cvs": [{"tag": f"cv{i + 1}", "lo": float(min(y0[i], target[i]) - margin[i]),
                 "hi": float(max(y0[i], target[i]) + margin[i]), "target": float(target[i]), "weight": 1.0,
                 **({"integrating": True} if declared[i] else {})} for i in range(ny)],
        "dvs": [{"tag": f"dv{k + 1}"} for k in range(nd)],
        "model": {"horizon": int(np.clip(max(S // 4, max(ch.delay for row in channels for ch in row) + 5), 10, 40))},
        "profile": {"id": f"zoo-{seed}-" + ("steady" if steady else "plan"), "version": 1,
                    "template": "steady_response@1" if steady else "linear_mpc_quadratic@1",
                    "horizon": ramp + int(rng.integers(1, 6)) if steady else S + ramp + 10,
                    "move_weight": 0.1, "valid_for_s": 3600},
    }
    truth = Truth(gains=gains, channels=channels, integrating=tuple(map(bool, integrating)),
                  declared=tuple(map(bool, declared)), condition_number=kappa,
                  slow=tuple(not level and max(tau for ch in row for tau in ch.taus) >= SLOW_TAU_RANGE[0]
                             for level, row in zip(integrating, channels)),
                  snr=tuple(map(float, snr)), noise_std=tuple(map(float, amplitude / snr)),
                  drift_std=tuple(map(float, drift_std)), drift_pole=drift_pole, settling_samples=S,
                  u0=u0, d0=d0, y0=y0, u_target=u_target, design=test,
                  dv_noise_std=tuple(float(a) / 50.0 for a in test.dv_amplitude))
    return truth, doc


@dataclass(frozen=True)
class ZooPlant(Plant):
    """The zoo plant of `seed` (module docstring), drawn on first use; equal seeds are equal plants.

    State: per channel (CV-major, inputs MVs then DVs) its states a, then b, then each CV's drift,
    then the last inputs' deviations (newest first), as many as the longest dead time. A level has no
    steady value: `equilibrium` puts it at its operating value, every lag settled at the inputs, and
    from there it moves at its rate (0 where the inputs balance it, as at the operating point).
    `simulate` adds the white measurement noise only; the drift is the history's, and from the live
    state on it decays in the state. The truth is the nominal plant's (`perturbed` copies keep it)."""

    seed: int = field(kw_only=True)
    substeps: ClassVar[int] = 4  # RK4 steps per sample: h / tau <= 1 / 8

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise PlantInputError(f"zoo: seed must be an integer >= 0, got {self.seed!r}")

    @cached_property
    def _drawn(self) -> tuple[Truth, dict[str, Any]]:
        return _draw(int(self.seed))

    @property
    def truth(self) -> Truth:
        return self._drawn[0]

    @property
    def binding(self) -> dict[str, Any]:  # type: ignore[override]
        return self._drawn[1]

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"zoo-{self.seed}"

    @property
    def cv_noise(self) -> tuple[float, ...]:  # type: ignore[override]
        return self.truth.noise_std

    @property
    def dv_noise(self) -> tuple[float, ...]:  # type: ignore[override]
        return self.truth.dv_noise_std

    @property
    def nominal_d(self) -> tuple[float, ...]:  # type: ignore[override]
        return tuple(self.truth.d0)

    @cached_property
    def settling_time_s(self) -> float:  # type: ignore[override]
        steps = max(ch.settling(SETTLED_EXACTLY) for row in self.truth.channels for ch in row)
        return math.ceil(steps) * self.sample_period_s

    @cached_property
    def _coefficients(self) -> np.ndarray:
        """(8, ny * nv) the channels' `_realisation`s, CV-major."""
        return np.array([_realisation(ch) for row in self.truth.channels for ch in row]).T

    @cached_property
    def _delays(self) -> np.ndarray:
        return np.array([[ch.delay for ch in row] for row in self.truth.channels])

    @cached_property
    def _past(self) -> int:
        return int(self._delays.max())

    @property
    def _lags(self) -> int:
        return self.truth.gains.size

    @property
    def n_cont(self) -> int:  # type: ignore[override]
        return 2 * self._lags + self.ny + self._past * self.truth.gains.shape[1]

    def _deviation(self, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The inputs' deviations from the operating point (m, nv), u the actual actuation (gain x MVs)."""
        return np.concatenate([u - self.gain * self.truth.u0, d - self.truth.d0], axis=-1)

    def _rhs(self, xc, u, d):
        m, lags, ny = len(xc), self._lags, self.ny
        v = self._deviation(u, d)
        past = xc[:, 2 * lags + ny:].reshape(m, self._past, v.shape[1])
        inputs = np.concatenate([v[:, None], past], axis=1)  # inputs[:, l] = v[k - l]
        seen = inputs[:, self._delays, np.arange(v.shape[1])].reshape(m, lags)
        ba, aaa, aba, abb = self._coefficients[:4]
        a, b, drift = xc[:, :lags], xc[:, lags:2 * lags], xc[:, 2 * lags:2 * lags + ny]
        rate = -math.log(self.truth.drift_pole)
        per_sample = [ba * seen + aaa * a, aba * a + abb * b, -rate * drift, np.zeros_like(xc[:, 2 * lags + ny:])]
        return np.concatenate(per_sample, axis=1) / self.sample_period_s

    def _end_of_step(self, xc, u, d):
        if not self._past:
            return xc
        v = self._deviation(u, d)
        keep = 2 * self._lags + self.ny
        return np.concatenate([xc[:, :keep], v, xc[:, keep:-v.shape[1]]], axis=1)

    def _outputs(self, xc):
        lags, ny = self._lags, self.ny
        ca, cb = self._coefficients[4:6]
        share = ca * xc[:, :lags] + cb * xc[:, lags:2 * lags]
        return self.truth.y0 + share.reshape(len(xc), ny, -1).sum(axis=2) + xc[:, 2 * lags:2 * lags + ny]

    def _equilibrium(self, u, d):
        v = self._deviation(u, d)
        kv = (self.truth.gains * v).ravel()
        settle_a, settle_b = self._coefficients[6:]
        return np.concatenate([settle_a * kv, settle_b * kv, np.zeros(self.ny), np.tile(v, self._past)])

    def history(self, seed: int, n_runs: int | None = None, run_length: int | None = None,
                end_at: float | None = None) -> DemoHistory:
        """The drawn step test (`truth.design`), deterministic in `seed`: GBN on every MV and DV
        around the operating point, each run from the steady state of its first inputs (a level at its
        operating value), the live run last, holding u0 and d0 over its last `live_hold_fraction`; in
        closed loop the P controller acts on the measured CV. Measured CVs carry the drift and white
        noise, DVs their noise. The frame and live state as Plant.history's; n_runs / run_length
        override the design's (n_runs alone repeats its lengths in turn)."""
        test, truth, spec = self.truth.design, self.truth, self.spec
        n_runs = test.runs if n_runs is None else n_runs
        if isinstance(n_runs, bool) or not isinstance(n_runs, (int, np.integer)) or n_runs < 2:
            raise PlantInputError(f"plant {self.name}: n_runs must be an integer >= 2, got {n_runs!r}")
        if run_length is not None and (isinstance(run_length, bool) or not isinstance(run_length, (int, np.integer))
                                       or run_length < 2):
            raise PlantInputError(f"plant {self.name}: run_length must be an integer >= 2, got {run_length!r}")
        lengths = [test.run_lengths[r % test.runs] if run_length is None else int(run_length) for r in range(n_runs)]
        rng = np.random.default_rng(seed)
        n, last = max(lengths), n_runs - 1
        u = truth.u0 + _gbn(rng, (n_runs, n), test.mv_hold, test.mv_amplitude)
        d = truth.d0 + _gbn(rng, (n_runs, n), test.dv_hold, test.dv_amplitude)
        live_from = lengths[last] - int(round(test.live_hold_fraction * lengths[last]))
        u[last, live_from:], d[last, live_from:] = truth.u0, truth.d0
        drift = _drift(rng, (n_runs, n), truth.drift_pole, truth.drift_std)
        noise = self._noise(rng, (n_runs, n, self.ny), self.cv_noise)

        x0 = np.stack([self.equilibrium(u[r, 0], d[r, 0]) for r in range(n_runs)])
        if test.loop is None:
            states = self._simulate_batch(x0, u[:, :-1], d[:, :-1])
        else:
            states = self._closed_loop(x0, u, d, drift + noise)
        y = self._measure(states) + drift + noise
        d_measured = d + self._noise(rng, d.shape, self.dv_noise)

        period = self.sample_period_s
        gaps = rng.integers(60, 360, size=n_runs - 1)
        starts = np.concatenate([[0.0], np.cumsum((np.array(lengths[:-1]) + gaps) * period)])
        shift = (math.floor(time.time() / period) * period if end_at is None else float(end_at)) \
            - (starts[last] + (lengths[last] - 1) * period)
        columns: dict[str, Any] = {
            "run_id": np.concatenate([[f"{self.name}-run-{r:02d}"] * lengths[r] for r in range(n_runs)]),
            "timestamp": np.concatenate([starts[r] + shift + period * np.arange(lengths[r]) for r in range(n_runs)])}
        for values, tags in ((u, spec.mv_tags), (y, spec.cv_tags), (d_measured, spec.dv_tags)):
            for i, tag in enumerate(tags):
                columns[tag] = np.concatenate([values[r, :lengths[r], i] for r in range(n_runs)])
        now = lengths[last] - 1
        x = states[last, now].copy()
        drift_at = 2 * self._lags
        x[drift_at:drift_at + self.ny] = drift[last, now]  # the drift is part of the true CV from now on
        live = LiveState(x=x, u=u[last, now].copy(), d=d[last, now].copy(), y=self._measure(x[None])[0],
                         t=float(columns["timestamp"][-1]))
        return DemoHistory(frame=pd.DataFrame(columns), live=live)

    def _closed_loop(self, x0: np.ndarray, u: np.ndarray, d: np.ndarray, disturbance: np.ndarray) -> np.ndarray:
        """States (runs, n, nx) of the step test under the level loop; u (runs, n, nu) holds the GBN and
        gets the controller's moves; `disturbance` (runs, n, ny) is what the sensor adds to the CVs."""
        loop, mv = self.truth.design.loop, self.spec.mvs[self.truth.design.loop.mv]
        n = u.shape[1]
        states = np.empty((len(x0), n, self.nx))
        states[:, 0] = x0
        for k in range(n):
            measured = self._measure(states[:, k])[:, loop.cv] + disturbance[:, k, loop.cv]
            u[:, k, loop.mv] = np.clip(u[:, k, loop.mv] + loop.gain * (self.truth.y0[loop.cv] - measured), mv.lo, mv.hi)
            if k < n - 1:
                states[:, k + 1] = self._simulate_batch(states[:, k], u[:, k:k + 1], d[:, k:k + 1])[:, 1]
        return states


def draw(seed: int) -> ZooPlant:
    """The zoo plant of `seed`, deterministic in it."""
    return ZooPlant(seed=seed)


def draw_set(seeds: Sequence[int]) -> list[ZooPlant]:
    """The zoo plants of `seeds`, in order."""
    return [draw(seed) for seed in seeds]
