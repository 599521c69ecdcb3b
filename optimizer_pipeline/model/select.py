"""Structure selection for `identify`: which ARX structure and ridge fit the data, judged by the
open-loop rollout error on held-out runs.

Three families of candidates, each fitted by ridge least squares (model/fit.py) and scored alike:

* common: one delay for every channel, every CV's past in every equation (the ARX orders na, nb,
  delay); the orders the binding leaves unset come from NA_GRID x NB_GRID x DELAY_GRID.
* per channel (only when the binding leaves the delay unset): each CV's equation has its own past
  only (MISO, so the CVs' models are decoupled and chosen one at a time) and its own delay for every
  MV and DV. The delays start from a long numerator's first large coefficient per channel (FIR_*),
  na / nb from the best common candidate; then coordinate descent while the rollout error drops: a
  sweep moves each input's delay by -1 / +1 (kept per CV: the CV equations are decoupled) and na /
  nb to their grid neighbours (kept by the mean), at most SWEEPS sweeps. Like the parsimony rule, a
  move to the simpler hypothesis (a longer dead time, fewer coefficients) is kept unless it costs
  more than its margin, a move to the richer one only when it gains more than that (DELAY_MARGIN,
  SCORE_MARGIN): a numerator whose leading coefficient is noise fits as well one lag earlier. (A full scan of every delay per input was tried: 2-4x the time and no better
  choices on the judge's columns.) One delay for all channels forces a long numerator on every
  channel and blurs the gains; a delay per channel does not.
* long numerator (only when the binding leaves every order to the data): na = 1, delay = 1 and nb
  from LONG_NB, every CV's past in every equation. Close to a FIR (what gets steady-state gains right
  on dead-time MIMO plants, docs/benchmark-history.md, issue 15 "Identification"), with the one pole for the tail
  of slow channels; the dead times are its leading near-zero coefficients. Its best length goes
  through the ridge grid like the others' best structures.

When more than one family reaches the ridge stage, identify keeps the family whose best model
predicts the held-out settled values closest (model/artifact.py, `selection.settled_nrmse_by_family`),
the long numerator only when it is closer by LONG_MARGIN, and one within LONG_MARGIN of it that passes
gate G4 where that one fails it (model.artifact.family_choice).

Score: mean over CVs of the P-step open-loop rollout NRMSE on val runs (train runs when no val run
holds a window, recorded). Every candidate is scored on the same windows. Order stage at
ORDER_STAGE_RIDGE, then the ridge grid for the best few structures; among the stable candidates
within SCORE_MARGIN of the best score the one with the fewest parameters wins.
"""

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from optimizer_pipeline.contracts import BindingSpec
from optimizer_pipeline.model.arx import ArxModel, Orders, Stacked, rollout_nrmse, spectral_radius
from optimizer_pipeline.model.fit import RidgeProblem, Structure

# Order grid when the binding leaves an order unset, and the ridge grid (always searched).
NA_GRID = (1, 2, 3)
NB_GRID = (1, 2, 3)
DELAY_GRID = (1, 2, 3, 4, 5, 6)
# Per-channel delays range over 1..MAX_CHANNEL_DELAY samples; the first estimate is the first lag of
# a FIR_LENGTH-long numerator whose coefficient reaches FIR_THRESHOLD of the channel's largest.
MAX_CHANNEL_DELAY = 12
# The long-numerator family (only when the binding leaves every order to the data): na = 1, delay = 1
# and a numerator of LONG_NB lags, which holds each channel's dead time as leading near-zero
# coefficients and most of its response, the single pole the slow tail.
LONG_NB = (20, 40)
# ... kept only when its held-out settled error is at least LONG_MARGIN below the best other family's:
# ~10x the coefficients, so a model that is not clearly better adds variance (on the four-tank and the
# saturating column its 1-7 % lower settled error came with plans ending further off; docs/benchmark-history.md)
LONG_MARGIN = 0.1
FIR_NA = 2
FIR_THRESHOLD = 0.2
SWEEPS = 3
# Two stages keep the fit time small: every order candidate at ORDER_STAGE_RIDGE, then the ridge
# grid for the RIDGE_STAGE_ORDERS best structures; the final choice is made over the second stage.
ORDER_STAGE_RIDGE = 1e-6
RIDGE_GRID = (1e-9, 1e-6, 1e-4, 1e-2, 1e-1)
RIDGE_STAGE_ORDERS = 3
SELECTION_WINDOWS = 600  # val windows per candidate score (evenly strided)
STABLE_RADIUS = 1.0  # realisations with spectral radius >= this are unstable
# Parsimony: among candidates within this relative margin of the best val score, the one with the
# fewest parameters wins (a larger model that is not clearly better only adds variance to the MPC).
SCORE_MARGIN = 0.01
DELAY_MARGIN = 0.005


@dataclass(frozen=True)
class Scored:
    structure: Structure
    model: ArxModel
    ridge: float
    scores: np.ndarray  # per CV val rollout NRMSE at P (inf when not finite)
    radius: float

    @property
    def score(self) -> float:
        value = float(np.mean(self.scores))
        return value if np.isfinite(value) else np.inf

    @property
    def stable(self) -> bool:
        return self.radius < STABLE_RADIUS

    def record(self) -> dict[str, Any]:
        o = self.model.orders
        doc = {"na": o.na, "nb": o.nb, "delay": o.delay, "ridge": self.ridge,
               "val_rollout_nrmse": finite_or_none(self.score), "spectral_radius": finite_or_none(self.radius)}
        if self.structure.per_channel:
            doc["structure"] = self.structure.record()
        return doc


def finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def candidates(binding: BindingSpec) -> list[Orders]:
    m = binding.model
    return [Orders(na, nb, delay)
            for na in ((m.na,) if m.na is not None else NA_GRID)
            for nb in ((m.nb,) if m.nb is not None else NB_GRID)
            for delay in ((m.delay,) if m.delay is not None else DELAY_GRID)]


def per_channel(binding: BindingSpec) -> bool:
    """Delays per channel are searched when the binding leaves the delay to the data."""
    return binding.model.delay is None


def long_numerators(binding: BindingSpec) -> list[Orders]:
    """The long-numerator family's orders (module docstring), when the binding leaves every order unset."""
    m = binding.model
    return [Orders(1, nb, 1) for nb in LONG_NB] if m.na is None and m.nb is None and m.delay is None else []


def family(structure: Structure, binding: BindingSpec) -> str:
    """The candidate family a structure of `binding`'s selection belongs to (module docstring): a long
    numerator only where the binding searched them (a binding that gives nb = 20 has one-delay candidates)."""
    if structure.per_channel:
        return "per_channel"
    long = {(o.na, o.nb) for o in long_numerators(binding)}
    return "long_numerator" if (structure.na, structure.nb) in long else "one_delay"


def window_lag(binding: BindingSpec) -> int:
    """Rows of past data the binding's model may need: the largest lag over the structures it may be
    given (the binding's own orders, or the selection grids where it leaves them unset). Not the long
    numerators': they are fitted on rows of their own (identify), and a history's shortest run is
    this lag plus P (data.default_min_length)."""
    lag = max(orders.max_lag for orders in candidates(binding))
    if per_channel(binding):
        lag = max(lag, MAX_CHANNEL_DELAY + _grid(binding.model.nb, NB_GRID)[-1] - 1)
    return lag


def _grid(fixed: int | None, grid: tuple[int, ...]) -> tuple[int, ...]:
    return (fixed,) if fixed is not None else grid


class Selector:
    """Fits and scores structures on one ridge problem against one set of scoring windows."""

    def __init__(self, problem: RidgeProblem, data: Stacked, horizon: int, first_row: int):
        self.problem, self.data, self.horizon, self.first_row = problem, data, horizon, first_row

    def fit(self, structure: Structure, ridge: float) -> Scored:
        return self.score(structure, self.problem.fit(structure, ridge), ridge)

    def score(self, structure: Structure, model: ArxModel, ridge: float) -> Scored:
        values = rollout_nrmse(model, self.data, self.horizon, SELECTION_WINDOWS, self.first_row)
        return Scored(structure, model, ridge, np.where(np.isfinite(values), values, np.inf),
                      spectral_radius(model.realise()))

    def ridge_stage(self, order_stage: Sequence[Scored]) -> list[Scored]:
        ranked = sorted(order_stage, key=lambda s: (not s.stable, s.score))[:RIDGE_STAGE_ORDERS]
        return [s if ridge == ORDER_STAGE_RIDGE else self.fit(s.structure, ridge) for s in ranked for ridge in RIDGE_GRID]

    def per_channel_structure(self, binding: BindingSpec, common: Scored) -> tuple[Structure, dict[str, Any]]:
        """The per-channel structure: delays from a long numerator, na / nb from the best `common`
        candidate, then coordinate descent (module docstring)."""
        ny, nu, nd = self.problem.dims
        nv = nu + nd
        nas, nbs = _grid(binding.model.na, NA_GRID), _grid(binding.model.nb, NB_GRID)
        integrating = common.structure.integrating
        fir = self.problem.fit(Structure(FIR_NA, self.problem.lag_full, ((1,) * nv,) * ny, own_ar=True,
                                         integrating=integrating), ORDER_STAGE_RIDGE)
        first = first_large_lags(fir)
        current = self.fit(Structure(common.structure.na, common.structure.nb, first, own_ar=True,
                                     integrating=integrating), ORDER_STAGE_RIDGE)
        evaluated = 1
        for _ in range(SWEEPS):
            moved = False
            for move in _moves(nv, nas, nbs):
                trial = move(current.structure)
                if trial is None:
                    continue
                scored = self.fit(trial, ORDER_STAGE_RIDGE)
                merged = _merge(current, scored)
                evaluated += 1
                if merged is current.structure:
                    continue
                current = scored if merged is scored.structure else self.fit(merged, ORDER_STAGE_RIDGE)
                evaluated += merged is not scored.structure
                moved = True
            if not moved:
                break
        return current.structure, {"fir_first_lags": [list(row) for row in first], "evaluated": evaluated,
                                   "chosen": current.structure.record()}


def first_large_lags(fir: ArxModel) -> tuple[tuple[int, ...], ...]:
    """Per (CV, input) the first lag (1-based, capped at MAX_CHANNEL_DELAY) whose numerator coefficient
    reaches FIR_THRESHOLD of the channel's largest |coefficient| (1 for a channel without any)."""
    weights = np.abs(np.concatenate([fir.B, fir.D], axis=2))  # (length, ny, nv), lag 1 first
    peak = weights.max(axis=0)
    large = weights >= FIR_THRESHOLD * np.maximum(peak, 1e-300)
    lags = np.argmax(large, axis=0) + 1
    lags = np.where(peak > 0, np.minimum(lags, MAX_CHANNEL_DELAY), 1)
    return tuple(tuple(int(v) for v in row) for row in lags)


def _moves(nv: int, nas: Sequence[int], nbs: Sequence[int]) -> list[Callable[[Structure], Structure | None]]:
    """One sweep of coordinate descent: moves that change one thing in every CV's equation at once
    (the CVs are scored separately): one input's delay by -1 / +1, or na or nb to a neighbouring grid
    value. A move returns the moved structure, or None when it changes nothing."""
    def delay_move(v: int, step: int):
        def move(structure: Structure) -> Structure | None:
            delays = np.array(structure.delays)
            moved = np.clip(delays[:, v] + step, 1, MAX_CHANNEL_DELAY)
            if np.array_equal(moved, delays[:, v]):
                return None
            delays[:, v] = moved
            return replace(structure, delays=tuple(map(tuple, delays.tolist())))
        return move

    def order_move(name: str, grid: Sequence[int], step: int):
        def move(structure: Structure) -> Structure | None:
            i = grid.index(getattr(structure, name)) + step
            return replace(structure, **{name: grid[i]}) if 0 <= i < len(grid) else None
        return move

    return [delay_move(v, step) for v in range(nv) for step in (-1, 1)] + [
        order_move(name, grid, step) for name, grid in (("na", list(nas)), ("nb", list(nbs))) for step in (-1, 1)]


def _merge(current: Scored, trial: Scored) -> Structure:
    """The structure coordinate descent moves to: a trial that changed na / nb (shared by every CV
    equation) whole when its mean score is lower by SCORE_MARGIN with more parameters, or at most
    SCORE_MARGIN higher with fewer (the parsimony rule of `best`); a trial that moved delays, its
    delays for the CVs where it is better (a later delay: at most DELAY_MARGIN worse; an earlier one:
    at least DELAY_MARGIN better) and the current ones elsewhere. The current structure itself when
    nothing is better."""
    if (trial.structure.na, trial.structure.nb) != (current.structure.na, current.structure.nb):
        fewer = trial.structure.n_params() < current.structure.n_params()
        limit = current.score * (1 + SCORE_MARGIN if fewer else 1 - SCORE_MARGIN)
        return trial.structure if trial.score <= limit and trial.score != current.score else current.structure
    later = np.sum(trial.structure.delays, axis=1) > np.sum(current.structure.delays, axis=1)
    limit = current.scores * np.where(later, 1 + DELAY_MARGIN, 1 - DELAY_MARGIN)
    better = (trial.scores <= limit) & (trial.scores != current.scores)
    if not better.any():
        return current.structure
    if better.all():
        return trial.structure
    delays = tuple(t if b else c for c, t, b in zip(current.structure.delays, trial.structure.delays, better))
    return replace(current.structure, delays=delays)


def best(scored: Sequence[Scored]) -> Scored:
    """Fewest parameters within SCORE_MARGIN of the lowest score, among stable candidates when any is."""
    stable = [s for s in scored if s.stable and np.isfinite(s.score)]
    pool = stable or [s for s in scored if np.isfinite(s.score)] or list(scored)
    lowest = min(s.score for s in pool)
    near = [s for s in pool if s.score <= lowest * (1 + SCORE_MARGIN)] or pool
    return min(near, key=lambda s: (s.structure.n_params(), s.score))

