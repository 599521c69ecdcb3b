"""Problem compilation: binding + model artifact + current state -> ProblemIR (normalised units), and its checks.

Owns the translation from engineering units to the model's normalised units (z = (x - mean) / std
with the artifact's train normalisation), the validation of a ProblemIR (also one arriving as JSON
from another process) and the one definition of the robust CV limits (nominal limits tightened by
the UQ band). The canonical JSON and its sha256 (`ProblemIR.hash`) live in contracts.py.
"""

import math
import operator
from itertools import chain
from typing import Any, Mapping, Sequence

import numpy as np

from optimizer_pipeline.contracts import BindingSpec, ContractError, ModelArtifact, ProblemIR, Template
from optimizer_pipeline.model.statespace import steady_state

# Soft CV limit penalty per normalised unit (form in solver/mpc.py). 1e3 is far above the CV limit
# multipliers of normalised problems (tracking gradients ~2 w |y - target|, i.e. O(1..100)), so
# the penalty stays exact; 1e4 was measured to cost OSQP 3x the cold-start iterations on the
# quadruple-tank problem (a q of 1e4 dominates its cost scaling) and "solved inaccurate" at 4000.
DEFAULT_SLACK_WEIGHT = 1e3


class ProblemError(ContractError):
    """A problem (its inputs or a ProblemIR document) is inconsistent; the message names the field."""


# --------------------------------------------------------------------------- validation helpers


def _vector(value: Any, name: str, length: int | None = None) -> np.ndarray:
    """A finite 1-D float vector of the expected length, or ProblemError naming `name`."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ProblemError(f"{name}: expected a vector of numbers, got {value!r}") from None
    if array.ndim != 1:
        raise ProblemError(f"{name}: expected a 1-D vector, got shape {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ProblemError(f"{name}: expected length {length}, got {array.shape[0]}")
    if not np.all(np.isfinite(array)):
        bad = np.flatnonzero(~np.isfinite(array))
        raise ProblemError(f"{name}[{bad[0]}]: expected a finite number, got {array[bad[0]]!r}")
    return array


def _matrix(rows: Sequence[Sequence[float]], name: str, n_rows: int, n_cols: int) -> None:
    """Check nested rows form a finite (n_rows, n_cols) matrix, or ProblemError naming `name`."""
    if len(rows) != n_rows:
        raise ProblemError(f"{name}: expected {n_rows} rows, got {len(rows)}")
    for i, row in enumerate(rows):
        _vector(row, f"{name}[{i}]", n_cols)


def validate_problem(problem: ProblemIR) -> ProblemIR:
    """Check every dimension, finiteness and sign of a ProblemIR; returns it unchanged.

    Raises ProblemError naming the first offending field (e.g. "problem.du_max[1]: must be > 0").
    """
    if not _plainly_valid(problem):
        _check_fields(problem)
    return problem


_PLAIN_NUMBERS = {float, int}
_SEQUENCES = (tuple, list)


def _plainly_valid(problem: ProblemIR) -> bool:
    """True only when `_check_fields` finds nothing (every check at once: ~30 us instead of ~180 us
    on a 10-state problem, it runs before every solve); False when unsure (numbers that are not
    exact floats / ints, vectors that are not tuples / lists), which sends the problem through
    `_check_fields` to name the defect."""
    m = problem.model
    if not (isinstance(problem.template, Template) and type(problem.horizon) is int and problem.horizon >= 1
            and type(problem.move_weight) is float and math.isfinite(problem.move_weight) and problem.move_weight >= 0
            and type(problem.slack_weight) is float and math.isfinite(problem.slack_weight)
            and problem.slack_weight > 0):
        return False
    nu, ny, nd = len(problem.mv_tags), len(problem.cv_tags), len(problem.dv_tags)
    nx = len(m.A) if type(m.A) in _SEQUENCES else 0
    if not (nu and ny and nx):
        return False
    steady = problem.template is Template.STEADY_RESPONSE
    vectors = [(m.f, nx), (problem.x0, nx), (problem.d, nd), (problem.bias, ny)]
    vectors += [(getattr(problem, name), nu) for name in ("u_prev", "u_lo", "u_hi", "du_max", "u_mean", "u_std")]
    vectors += [(getattr(problem, name), ny) for name in ("y_lo", "y_hi", "y_target", "y_weight", "y_mean", "y_std")]
    matrices = [(m.A, nx, nx), (m.B, nx, nu), (m.E, nx, nd), (m.C, ny, nx)]
    if problem.band is not None:
        vectors.append((problem.band, ny))
    if steady:
        if problem.steady_gain is None or problem.steady_dv_gain is None or problem.steady_offset is None:
            return False
        vectors.append((problem.steady_offset, ny))
        matrices += [(problem.steady_gain, ny, nu), (problem.steady_dv_gain, ny, nd)]
    for rows, n_rows, n_cols in matrices:
        if type(rows) not in _SEQUENCES or len(rows) != n_rows:
            return False
        vectors += [(row, n_cols) for row in rows]
    if not all(type(v) in _SEQUENCES and len(v) == n for v, n in vectors):
        return False
    numbers = list(chain.from_iterable(v for v, _ in vectors))
    if not set(map(type, numbers)) <= _PLAIN_NUMBERS:
        return False
    try:
        finite = bool(np.isfinite(np.array(numbers, float)).all())
    except OverflowError:  # an int beyond the float range
        return False
    # exact comparisons imply the ones on the float conversions (rounding is monotonic)
    return (finite and min(problem.du_max) > 0 and min(problem.u_std) > 0 and min(problem.y_std) > 0
            and min(problem.y_weight) >= 0 and all(map(operator.le, problem.u_lo, problem.u_hi))
            and all(map(operator.le, problem.y_lo, problem.y_hi)) and (problem.band is None or min(problem.band) >= 0))


def _check_fields(problem: ProblemIR) -> None:
    """validate_problem's checks one field at a time: ProblemError naming the first offending one."""
    p = "problem"
    if not isinstance(problem.template, Template):
        raise ProblemError(f"{p}.template: unknown template {problem.template!r}")
    if isinstance(problem.horizon, bool) or not isinstance(problem.horizon, int) or problem.horizon < 1:
        raise ProblemError(f"{p}.horizon: expected an integer >= 1, got {problem.horizon!r}")
    nu, ny, nd = len(problem.mv_tags), len(problem.cv_tags), len(problem.dv_tags)
    if nu == 0 or ny == 0:
        raise ProblemError(f"{p}: needs at least one MV and one CV (got {nu} MVs, {ny} CVs)")
    nx = len(problem.model.A)
    if nx == 0:
        raise ProblemError(f"{p}.model.A: the model has no states")
    m = problem.model
    _matrix(m.A, f"{p}.model.A", nx, nx)
    _matrix(m.B, f"{p}.model.B", nx, nu)
    _matrix(m.E, f"{p}.model.E", nx, nd)
    _vector(m.f, f"{p}.model.f", nx)
    _matrix(m.C, f"{p}.model.C", ny, nx)
    for name, length in (("x0", nx), ("u_prev", nu), ("d", nd), ("bias", ny), ("u_lo", nu), ("u_hi", nu),
                         ("du_max", nu), ("y_lo", ny), ("y_hi", ny), ("y_target", ny), ("y_weight", ny),
                         ("u_mean", nu), ("u_std", nu), ("y_mean", ny), ("y_std", ny)):
        _vector(getattr(problem, name), f"{p}.{name}", length)
    for name in ("du_max", "u_std", "y_std"):
        values = np.asarray(getattr(problem, name))
        if np.any(values <= 0):
            i = int(np.flatnonzero(values <= 0)[0])
            raise ProblemError(f"{p}.{name}[{i}]: must be > 0, got {values[i]!r}")
    if np.any(np.asarray(problem.y_weight) < 0):
        i = int(np.flatnonzero(np.asarray(problem.y_weight) < 0)[0])
        raise ProblemError(f"{p}.y_weight[{i}]: must be >= 0, got {problem.y_weight[i]!r}")
    for lo_name, hi_name in (("u_lo", "u_hi"), ("y_lo", "y_hi")):
        lo, hi = np.asarray(getattr(problem, lo_name)), np.asarray(getattr(problem, hi_name))
        if np.any(lo > hi):
            i = int(np.flatnonzero(lo > hi)[0])
            raise ProblemError(f"{p}.{lo_name}[{i}]: {lo[i]:g} is above {hi_name}[{i}] = {hi[i]:g}")
    for name in ("move_weight", "slack_weight"):
        value = getattr(problem, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ProblemError(f"{p}.{name}: expected a finite number >= 0, got {value!r}")
    if problem.slack_weight <= 0:
        raise ProblemError(f"{p}.slack_weight: must be > 0 (CV limits are soft), got {problem.slack_weight!r}")
    if problem.band is not None:
        band = _vector(problem.band, f"{p}.band", ny)
        if np.any(band < 0):
            i = int(np.flatnonzero(band < 0)[0])
            raise ProblemError(f"{p}.band[{i}]: a half-width must be >= 0, got {band[i]!r}")
    if problem.template is Template.STEADY_RESPONSE:
        for name in ("steady_gain", "steady_dv_gain", "steady_offset"):
            if getattr(problem, name) is None:
                raise ProblemError(f"{p}.{name}: required for {Template.STEADY_RESPONSE.value}")
        _matrix(problem.steady_gain, f"{p}.steady_gain", ny, nu)
        _matrix(problem.steady_dv_gain, f"{p}.steady_dv_gain", ny, nd)
        _vector(problem.steady_offset, f"{p}.steady_offset", ny)


def problem_from_dict(doc: Any) -> ProblemIR:
    """ProblemIR from its JSON dict (`ProblemIR.to_dict()`), validated; ProblemError on any defect."""
    if not isinstance(doc, Mapping):
        raise ProblemError(f"problem: expected a JSON object, got {type(doc).__name__}")
    try:
        problem = ProblemIR.from_dict(doc)
    except KeyError as exc:
        raise ProblemError(f"problem.{exc.args[0]}: required field is missing") from None
    except ContractError:
        raise
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ProblemError(f"{_malformed_field(doc)}: malformed ({exc})") from None
    return validate_problem(problem)


_TEXT_FIELDS = {"binding_id", "profile_id", "model_artifact_hash", "mv_tags", "cv_tags", "dv_tags"}


def _malformed_field(doc: Mapping[str, Any]) -> str:
    """The dotted name of the first field of `doc` that does not convert (for the error message)."""
    if doc.get("template") not in {t.value for t in Template}:
        return "problem.template"

    def numeric(value: Any) -> bool:
        if isinstance(value, Mapping):
            return all(numeric(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return all(numeric(v) for v in value)
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

    for name, value in doc.items():
        if name in _TEXT_FIELDS or name == "template":
            continue
        if isinstance(value, Mapping):
            for key, inner in value.items():
                if not numeric(inner):
                    return f"problem.{name}.{key}"
        elif not numeric(value):
            return f"problem.{name}"
    return "problem"


# --------------------------------------------------------------------------- robust limits


def robust_limits(problem: ProblemIR) -> tuple[np.ndarray, np.ndarray]:
    """CV limits (normalised, (ny,) each) tightened by the UQ band: [y_lo + band, y_hi - band].

    Where the band is wider than half the limit interval the tightened interval would be empty;
    the limits then collapse onto the interval's midpoint (the point farthest from both nominal
    limits), so the robust problem stays well posed. Without a band the nominal limits are returned.
    """
    lo, hi = np.asarray(problem.y_lo, float), np.asarray(problem.y_hi, float)
    if problem.band is None:
        return lo, hi
    band = np.asarray(problem.band, float)
    t_lo, t_hi = lo + band, hi - band
    empty = t_lo > t_hi
    mid = 0.5 * (lo + hi)
    return np.where(empty, mid, t_lo), np.where(empty, mid, t_hi)


# --------------------------------------------------------------------------- compilation


def compile_problem(binding: BindingSpec, artifact: ModelArtifact, x0: Any, bias: Any, u_now: Any, d_now: Any,
                    band: Any = None, slack_weight: float = DEFAULT_SLACK_WEIGHT) -> ProblemIR:
    """Compile the optimisation problem of one binding revision at "now".

    x0 (nx,) and bias (ny,) are normalised (model module's `current_state`); u_now (nu,) and d_now
    (nd,) are the current MVs / DVs in engineering units; band (ny,) the UQ half-widths in
    normalised units or None without evidence. MV bounds and max moves are scaled by the MV std,
    CV limits and targets normalised with the CV mean / std; weights come from binding.cvs,
    move_weight and horizon N from binding.profile. Raises ProblemError naming the field on a tag
    mismatch, a wrong length or a non-finite value. Deterministic: same inputs, same hash.
    """
    where = f"problem[{binding.id}]"
    for kind in ("mv_tags", "cv_tags", "dv_tags"):
        if tuple(getattr(artifact, kind)) != tuple(getattr(binding, kind)):
            raise ProblemError(f"{where}.{kind}: artifact has {list(getattr(artifact, kind))}, "
                               f"binding has {list(getattr(binding, kind))}")
    nx = len(artifact.state_space.A)
    nu, ny, nd = len(binding.mvs), len(binding.cvs), len(binding.dvs)
    x0 = _vector(x0, f"{where}.x0", nx)
    bias = _vector(bias, f"{where}.bias", ny)
    u_now = _vector(u_now, f"{where}.u_now", nu)
    d_now = _vector(d_now, f"{where}.d_now", nd)
    band = None if band is None else _vector(band, f"{where}.band", ny)
    if not (isinstance(slack_weight, (int, float)) and math.isfinite(slack_weight) and slack_weight > 0):
        raise ProblemError(f"{where}.slack_weight: expected a finite number > 0, got {slack_weight!r}")

    norm = artifact.normalisation
    missing = [t for t in binding.tags if t not in norm.tags]
    if missing:
        raise ProblemError(f"{where}.normalisation: no statistics for tags {missing}")
    u_mean, u_std = norm.of(binding.mv_tags)
    y_mean, y_std = norm.of(binding.cv_tags)
    d_mean, d_std = norm.of(binding.dv_tags)
    for tags, std in ((binding.mv_tags, u_std), (binding.cv_tags, y_std), (binding.dv_tags, d_std)):
        for tag, s in zip(tags, std):
            if not (math.isfinite(s) and s > 0):
                raise ProblemError(f"{where}.normalisation[{tag}]: std must be finite and > 0, got {s!r}")

    mv_lo = np.array([m.lo for m in binding.mvs])
    mv_hi = np.array([m.hi for m in binding.mvs])
    mv_move = np.array([m.max_move for m in binding.mvs])
    cv_lo = np.array([c.lo for c in binding.cvs])
    cv_hi = np.array([c.hi for c in binding.cvs])
    cv_target = np.array([c.target for c in binding.cvs])

    steady: dict[str, Any] = {}
    if binding.profile.template is Template.STEADY_RESPONSE:
        G, Gd, y0 = steady_state(artifact.state_space)
        steady = {"steady_gain": G, "steady_dv_gain": Gd, "steady_offset": y0}
        for name, value in steady.items():
            if not np.all(np.isfinite(value)):
                raise ProblemError(f"{where}.{name}: the model's steady state is not finite")
        steady = {"steady_gain": _rows(G), "steady_dv_gain": _rows(Gd), "steady_offset": _flat(y0)}

    problem = ProblemIR(
        template=binding.profile.template,
        binding_id=binding.id, binding_revision=int(artifact.binding_revision), profile_id=binding.profile.id,
        profile_version=binding.profile.version, model_artifact_hash=artifact.artifact_hash,
        horizon=int(binding.profile.horizon),
        mv_tags=binding.mv_tags, cv_tags=binding.cv_tags, dv_tags=binding.dv_tags,
        model=artifact.state_space,
        x0=_flat(x0), u_prev=_flat((u_now - u_mean) / u_std), d=_flat((d_now - d_mean) / d_std), bias=_flat(bias),
        u_lo=_flat((mv_lo - u_mean) / u_std), u_hi=_flat((mv_hi - u_mean) / u_std), du_max=_flat(mv_move / u_std),
        y_lo=_flat((cv_lo - y_mean) / y_std), y_hi=_flat((cv_hi - y_mean) / y_std),
        y_target=_flat((cv_target - y_mean) / y_std), y_weight=_flat([c.weight for c in binding.cvs]),
        move_weight=float(binding.profile.move_weight), slack_weight=float(slack_weight),
        band=None if band is None else _flat(band),
        u_mean=_flat(u_mean), u_std=_flat(u_std), y_mean=_flat(y_mean), y_std=_flat(y_std),
        **steady,
    )
    return validate_problem(problem)


def _flat(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, float).reshape(-1))


def _rows(matrix: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in np.asarray(matrix, float))
