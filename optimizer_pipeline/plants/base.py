"""Demo plant machinery: nonlinear ODE simulation between samples, dead-time buffer, excitation history.

A plant subclass supplies its physics (`_rhs`, `_outputs`, `_equilibrium`), its binding document
and its excitation design; this module turns them into simulation (`simulate`, `apply_plan`),
analytic steady states and history files in the docs/ARCHITECTURE.md, "History file" format.

Time convention (docs/ARCHITECTURE.md, "Recommendation JSON"): u[k] is held (zero-order hold) during step k,
which lasts one sample period; y[k] is the measurement at the start of step k, so y[k + 1] is the
CV at the end of step k. Every quantity is in engineering units.

State vector (a flat float array, shape (nx,)): the continuous ODE states followed, for a plant
with a transport delay of D samples, by the D most recent undelayed outputs (newest first) — the
content of the "pipe" between the process and the sensor. The measured output is the oldest
entry, so an input change reaches the measurement exactly D samples later than without delay.
"""

import copy
import dataclasses
import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, ContractError, binding_from_dict

log = logging.getLogger(__name__)



class PlantInputError(ContractError):
    """An argument given to a demo plant has the wrong shape, size or value; the message names it."""


@dataclass(frozen=True)
class Excitation:
    """How the demo history moves the inputs: rate-limited random steps inside a band.

    Bands are per tag (lo, hi) in engineering units and lie inside the binding bounds; holds are
    (min, max) samples a new level is kept. MVs move at most the binding's max_move per sample;
    DVs at most `dv_rate` per sample. The live run spends its last `live_hold_fraction` of samples
    holding `mv_live` / `dv_live`, so "now" is a steady-ish state away from the targets.
    """

    mv_band: tuple[tuple[float, float], ...]
    mv_hold: tuple[int, int]
    mv_live: tuple[float, ...]
    dv_band: tuple[tuple[float, float], ...] = ()
    dv_hold: tuple[int, int] = (1, 1)
    dv_rate: tuple[float, ...] = ()
    dv_live: tuple[float, ...] = ()
    live_hold_fraction: float = 0.4


@dataclass(frozen=True, eq=False)
class LiveState:
    """The plant at the last sample of the live run ("now").

    x (nx,) true plant state; u (nu,) MVs held now; d (nd,) true DVs now; y (ny,) noise-free CVs
    now; t seconds since epoch of the last sample.
    """

    x: np.ndarray
    u: np.ndarray
    d: np.ndarray
    y: np.ndarray
    t: float


@dataclass(frozen=True, eq=False)
class DemoHistory:
    """A generated history file (wide frame, docs/ARCHITECTURE.md, "History file") and the live state at its end."""

    frame: pd.DataFrame
    live: LiveState


@dataclass(frozen=True)
class Plant(ABC):
    """A nonlinear demo plant. `gain` scales every MV's physical effect and `tau` every time constant
    (steady states unchanged by `tau`; the transport delay stays D samples): 1.0 is the nominal plant,
    other values make the drifted copies returned by `perturbed`.
    """

    gain: float = 1.0
    tau: float = 1.0

    name: ClassVar[str]
    binding: ClassVar[dict[str, Any]]  # the binding document (docs/ARCHITECTURE.md, "Binding file")
    n_cont: ClassVar[int]  # continuous ODE states
    settling_time_s: ClassVar[float]  # from anywhere in the excitation band to within ~1e-5 of steady state
    delay_samples: ClassVar[int] = 0  # transport delay between process and sensor, samples
    substeps: ClassVar[int]  # fixed RK4 steps per sample period
    cv_noise: ClassVar[tuple[float, ...]]  # measurement noise std per CV, engineering units
    dv_noise: ClassVar[tuple[float, ...]] = ()  # measurement noise std per DV
    excitation: ClassVar[Excitation]
    nominal_d: ClassVar[tuple[float, ...]] = ()  # DVs used when a call gives none
    # the demo history's size: runs x samples per run (a slow plant needs longer runs for the UQ
    # evidence of a steady target, scored over its settling horizon)
    history_runs: ClassVar[int] = 12
    history_run_length: ClassVar[int] = 300

    # ------------------------------------------------------------------ physics (per plant)

    @abstractmethod
    def _rhs(self, xc: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        """dxc/dt of the nominal-speed plant: xc (m, n_cont), u (m, nu) actual actuation, d (m, nd)."""

    @abstractmethod
    def _outputs(self, xc: np.ndarray) -> np.ndarray:
        """Noise-free undelayed CVs (m, ny) of continuous states xc (m, n_cont)."""

    @abstractmethod
    def _equilibrium(self, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Continuous steady state (n_cont,) for actual actuation u (nu,) and DVs d (nd,), solved
        from the balance equations (not by simulating)."""

    # ------------------------------------------------------------------ binding

    def binding_doc(self) -> dict[str, Any]:
        """The binding document as a fresh dict (the packaged `<name>.yaml` holds the same content)."""
        return copy.deepcopy(self.binding)

    @classmethod
    def binding_path(cls) -> Path:
        """Path of the packaged binding file `optimizer_pipeline/plants/<name>.yaml`."""
        return Path(str(resources.files("optimizer_pipeline.plants") / f"{cls.name}.yaml"))

    @cached_property
    def spec(self) -> BindingSpec:
        return binding_from_dict(self.binding, source=f"plant {self.name} binding")

    @property
    def nu(self) -> int:
        return len(self.spec.mvs)

    @property
    def ny(self) -> int:
        return len(self.spec.cvs)

    @property
    def nd(self) -> int:
        return len(self.spec.dvs)

    @property
    def nx(self) -> int:
        return self.n_cont + self.delay_samples * self.ny

    @property
    def sample_period_s(self) -> float:
        return self.spec.sample_period_s

    def perturbed(self, gain: float = 1.0, tau: float = 1.0) -> "Plant":
        """A copy whose MV effect is `gain` times and whose time constants are `tau` times this plant's."""
        for label, value in (("gain", gain), ("tau", tau)):
            if not (np.isfinite(value) and value > 0):
                raise PlantInputError(f"plant {self.name}: perturbed({label}=...) must be a finite number > 0, got {value!r}")
        return dataclasses.replace(self, gain=self.gain * gain, tau=self.tau * tau)

    # ------------------------------------------------------------------ steady state

    def equilibrium(self, u: Any, d: Any = None) -> np.ndarray:
        """Full steady state (nx,) for MVs u (nu,) and DVs d (nd,) held forever (pipe filled)."""
        u = self._vector(u, self.nu, "u")
        d = self._vector(self.nominal_d if d is None else d, self.nd, "d")
        xc = np.asarray(self._equilibrium(self.gain * u, d), float)
        pipe = np.tile(self._outputs(xc[None, :])[0], self.delay_samples)
        return np.concatenate([xc, pipe])

    def steady_output(self, u: Any, d: Any = None) -> np.ndarray:
        """Noise-free steady-state CVs (ny,) for MVs u (nu,) and DVs d (nd,) held forever."""
        return self._measure(self.equilibrium(u, d)[None, :])[0]

    # ------------------------------------------------------------------ simulation

    def simulate(self, x0: Any, u_plan: Any, d: Any = None, rng: np.random.Generator | None = None,
                 noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Simulate n sample periods from state x0 (nx,).

        u_plan (n, nu) held during each step; d (n, nd) true DVs held during each step, or None for
        `nominal_d`. Returns states (n + 1, nx) at the sample instants and y (n + 1, ny): y[0] is
        measured at x0, y[k + 1] at the end of step k. With `noise`, Gaussian measurement noise of
        `cv_noise` is added from `rng` (None: a fixed seed-0 stream, so results are reproducible).
        """
        x0 = self._vector(x0, self.nx, "x0")
        u = self._matrix(u_plan, self.nu, "u_plan")
        d = self._dv_matrix(d, u.shape[0])
        states = self._simulate_batch(x0[None], u[None], d[None])[0]
        y = self._measure(states)
        if noise:
            y = y + self._noise(rng, y.shape, self.cv_noise)
        return states, y

    def apply_plan(self, state_now: "LiveState | np.ndarray", controls: Any, d: Any = None) -> np.ndarray:
        """Apply an MV plan open loop from `state_now` (a LiveState or a state vector (nx,)).

        controls (k, nu): controls[k] is held during step k (k = 0 starts now). d: (k, nd), (nd,)
        held, or None (the LiveState's DVs, else `nominal_d`). Returns the noise-free CVs at the
        end of each step, (k, ny) — the `predicted[k]` convention of a recommendation.
        """
        if isinstance(state_now, LiveState):
            x0, d_now = state_now.x, state_now.d
        else:
            x0, d_now = state_now, np.asarray(self.nominal_d, float)
        u = self._matrix(controls, self.nu, "controls")
        if d is None:
            d = np.tile(d_now, (u.shape[0], 1))
        elif np.ndim(d) == 1:
            d = np.tile(self._vector(d, self.nd, "d"), (u.shape[0], 1))
        return self.simulate(x0, u, d, noise=False)[1][1:]

    def _simulate_batch(self, x0: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        """m simulations at once: x0 (m, nx), u (m, n, nu), d (m, n, nd) -> states (m, n + 1, nx).

        Fixed-step RK4 with `substeps` steps per sample and zero-order hold of u and d; the pipe
        shifts by one sample per step (the transport delay).
        """
        m, n, _ = u.shape
        states = np.empty((m, n + 1, self.nx))
        states[:, 0] = x0
        h = self.sample_period_s / self.substeps
        # Scaling time by tau stretches every time constant and leaves steady states alone.
        rate = 1.0 / self.tau
        for k in range(n):
            xc = states[:, k, :self.n_cont]
            uk, dk = self.gain * u[:, k], d[:, k]
            for _ in range(self.substeps):
                k1 = self._rhs(xc, uk, dk)
                k2 = self._rhs(xc + 0.5 * h * rate * k1, uk, dk)
                k3 = self._rhs(xc + 0.5 * h * rate * k2, uk, dk)
                k4 = self._rhs(xc + h * rate * k3, uk, dk)
                xc = xc + (h * rate / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
            states[:, k + 1, :self.n_cont] = self._end_of_step(xc, uk, dk)
            if self.delay_samples:
                # newest undelayed output enters the pipe; the oldest one has reached the sensor
                pipe = states[:, k, self.n_cont:]
                states[:, k + 1, self.n_cont:] = np.concatenate(
                    [self._outputs(states[:, k, :self.n_cont]), pipe[:, :-self.ny]], axis=1)
        return states

    def _end_of_step(self, xc: np.ndarray, u: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Continuous states (m, n_cont) at the end of a sample period in which u (m, nu, actual
        actuation) and d (m, nd) were held. The ODE states are integrated already; a plant that keeps
        past inputs in its state (dead times per input-output channel) shifts them in here."""
        return xc

    def _measure(self, states: np.ndarray) -> np.ndarray:
        """Noise-free measured CVs (..., ny) of states (..., nx): the oldest pipe entry when delayed."""
        if self.delay_samples:
            return states[..., self.nx - self.ny:]
        flat = states.reshape(-1, self.nx)[:, :self.n_cont]
        return self._outputs(flat).reshape(states.shape[:-1] + (self.ny,))

    # ------------------------------------------------------------------ history

    def history(self, seed: int, n_runs: int | None = None, run_length: int | None = None,
                end_at: float | None = None) -> DemoHistory:
        """Excitation runs around the operating point, with measurement noise, deterministic in `seed`.

        Returns the wide frame (`run_id`, `timestamp` seconds since epoch, one column per MV, CV and
        DV tag, in binding order), runs separated in time; the last run is the live run and its
        final rows are a steady-ish state at `excitation.mv_live`. Also returns that live state.
        The live run's last sample is at `end_at` (seconds since the epoch); None = now, the time
        the history is made (seeded), rounded down to a whole sample period, so a history seeded
        for a solve is current (docs/ARCHITECTURE.md, "Recommendation status": live state age).
        Only the timestamps depend on `end_at`. n_runs / run_length default to the plant's
        history_runs / history_run_length.
        """
        n_runs = self.history_runs if n_runs is None else n_runs
        run_length = self.history_run_length if run_length is None else run_length
        if isinstance(n_runs, bool) or not isinstance(n_runs, (int, np.integer)) or n_runs < 1:
            raise PlantInputError(f"plant {self.name}: n_runs must be an integer >= 1, got {n_runs!r}")
        # a run shorter than this would be one or two input levels: too little excitation to identify
        min_length = 3 * max(self.excitation.mv_hold[1], self.excitation.dv_hold[1])
        if isinstance(run_length, bool) or not isinstance(run_length, (int, np.integer)) or run_length < min_length:
            raise PlantInputError(f"plant {self.name}: run_length must be an integer >= {min_length}, got {run_length!r}")
        rng = np.random.default_rng(seed)
        ex, spec = self.excitation, self.spec
        n = int(run_length)
        tail = int(round(ex.live_hold_fraction * n))

        mv_lo, mv_hi = np.array(ex.mv_band, float).T
        u = np.stack([_steps(rng, n, mv_lo, mv_hi, ex.mv_hold, np.array([m.max_move for m in spec.mvs]),
                             np.array(ex.mv_live) if r == n_runs - 1 else None, tail)
                      for r in range(n_runs)])
        if self.nd:
            dv_lo, dv_hi = np.array(ex.dv_band, float).T
            d = np.stack([_steps(rng, n, dv_lo, dv_hi, ex.dv_hold, np.array(ex.dv_rate, float),
                                 np.array(ex.dv_live) if r == n_runs - 1 else None, tail)
                          for r in range(n_runs)])
        else:
            d = np.zeros((n_runs, n, 0))

        # each run starts settled at its first inputs
        x0 = np.stack([self.equilibrium(u[r, 0], d[r, 0]) for r in range(n_runs)])
        # the last row's MVs are the ones held "now": rows 0..n-1 need n-1 simulated steps
        states = self._simulate_batch(x0, u[:, :-1], d[:, :-1])
        y = self._measure(states) + self._noise(rng, (n_runs, n, self.ny), self.cv_noise)
        d_measured = d + self._noise(rng, d.shape, self.dv_noise)

        starts = np.concatenate([[0.0], np.cumsum((n + rng.integers(60, 360, size=n_runs - 1)) * self.sample_period_s)])
        t = starts[:, None] + self.sample_period_s * np.arange(n)[None, :]
        period = self.sample_period_s
        t += (math.floor(time.time() / period) * period if end_at is None else float(end_at)) - t[-1, -1]
        columns: dict[str, Any] = {
            "run_id": np.repeat([f"{self.name}-run-{r:02d}" for r in range(n_runs)], n),
            "timestamp": t.ravel(),
        }
        for i, tag in enumerate(spec.mv_tags):
            columns[tag] = u[:, :, i].ravel()
        for j, tag in enumerate(spec.cv_tags):
            columns[tag] = y[:, :, j].ravel()
        for i, tag in enumerate(spec.dv_tags):
            columns[tag] = d_measured[:, :, i].ravel()
        live = LiveState(x=states[-1, -1].copy(), u=u[-1, -1].copy(), d=d[-1, -1].copy(),
                         y=self._measure(states[-1, -1]), t=float(t[-1, -1]))
        log.debug("plant %s: %d runs x %d samples from seed %d", self.name, n_runs, n, seed)
        return DemoHistory(frame=pd.DataFrame(columns), live=live)

    def generate_history(self, seed: int, n_runs: int | None = None, run_length: int | None = None,
                         end_at: float | None = None) -> pd.DataFrame:
        """The history frame of `history(seed, n_runs, run_length, end_at)`."""
        return self.history(seed, n_runs, run_length, end_at).frame

    def live_state(self, seed: int, n_runs: int | None = None, run_length: int | None = None,
                   end_at: float | None = None) -> LiveState:
        """The live state at the end of `history(seed, n_runs, run_length, end_at)`."""
        return self.history(seed, n_runs, run_length, end_at).live

    # ------------------------------------------------------------------ argument checks

    def _vector(self, value: Any, size: int, label: str) -> np.ndarray:
        array = np.asarray(value, float)
        if array.shape != (size,) or not np.all(np.isfinite(array)):
            raise PlantInputError(f"plant {self.name}: {label} must be {size} finite numbers, got shape {array.shape}")
        return array

    def _matrix(self, value: Any, cols: int, label: str) -> np.ndarray:
        array = np.asarray(value, float)
        if array.ndim != 2 or array.shape[1] != cols or not np.all(np.isfinite(array)):
            raise PlantInputError(f"plant {self.name}: {label} must be finite with shape (n, {cols}), got {array.shape}")
        return array

    def _dv_matrix(self, d: Any, n: int) -> np.ndarray:
        if d is None:
            return np.tile(np.asarray(self.nominal_d, float), (n, 1)).reshape(n, self.nd)
        d = self._matrix(d, self.nd, "d")
        if d.shape[0] != n:
            raise PlantInputError(f"plant {self.name}: d must have one row per step ({n}), got {d.shape[0]}")
        return d

    @staticmethod
    def _noise(rng: np.random.Generator | None, shape: tuple[int, ...], std: tuple[float, ...]) -> np.ndarray:
        rng = np.random.default_rng(0) if rng is None else rng
        return rng.standard_normal(shape) * np.asarray(std, float)


def _steps(rng: np.random.Generator, n: int, lo: np.ndarray, hi: np.ndarray, hold: tuple[int, int],
           rate: np.ndarray, final: np.ndarray | None, tail: int) -> np.ndarray:
    """One run of rate-limited random steps, (n, len(lo)): each tag picks a level uniform in [lo, hi],
    keeps it for a random number of samples in `hold`, and moves toward it at most `rate` per sample.
    With `final`, the last `tail` samples head for and then hold `final` (the live run's settling).
    """
    width = lo.shape[0]
    levels = np.empty((n, width))
    for i in range(width):
        k = 0
        while k < n:
            length = int(rng.integers(hold[0], hold[1] + 1))
            levels[k:k + length, i] = rng.uniform(lo[i], hi[i])
            k += length
    if final is not None:
        levels[n - tail:] = final
    out = np.empty((n, width))
    out[0] = levels[0]
    for k in range(1, n):
        out[k] = out[k - 1] + np.clip(levels[k] - out[k - 1], -rate, rate)
    return out
