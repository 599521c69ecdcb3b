"""Problem compilation: binding + model artifact + current state -> ProblemIR (normalised units), and its checks.

Owns the translation from engineering units to the model's normalised units (z = (x - mean) / std
with the artifact's train normalisation), the validation of a ProblemIR (also one arriving as JSON
from another process) and the one definition of the robust CV limits (nominal limits tightened by
the UQ band). The canonical JSON and its sha256 (`ProblemIR.hash`) live in contracts/problem.py;
the field checks and their messages in validation.py.
"""

import math
import operator
from itertools import chain
from typing import Any, Mapping

import numpy as np

from optimizer_pipeline.contracts import BindingSpec, ContractError, CVTransform, ModelArtifact, ProblemIR, Template
from optimizer_pipeline.contracts.transform import KINDS
from optimizer_pipeline.contracts.problem import ECONOMIC_FIELDS
from optimizer_pipeline.data.flags import MAD_TO_SIGMA
from optimizer_pipeline.economics import normalised_costs
from optimizer_pipeline.model.statespace import balance_rows, disturbance_gain, integrating_outputs, steady_state
from optimizer_pipeline.validation import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    check_choice,
    check_integer,
    check_matrix,
    check_number,
    check_ordered,
    check_vector,
    refuse,
    refuse_missing,
    unknown,
)

# Soft CV limit penalty per normalised unit (form in solver/mpc.py). 1e3 is far above the CV limit
# multipliers of normalised problems (tracking gradients ~2 w |y - target|, i.e. O(1..100)), so
# the penalty stays exact; 1e4 was measured to cost OSQP 3x the cold-start iterations on the
# quadruple-tank problem (a q of 1e4 dominates its cost scaling) and "solved inaccurate" at 4000.
DEFAULT_SLACK_WEIGHT = 1e3


# a trailing stretch of a DV is one level while no split of it into older and newer samples has means
# further apart than this many standard errors; within it, a line's slope this many standard errors from
# 0 is a drift, and the line's newest value is held instead of the stretch's mean. Measured
# (tests/test_held_dvs.py, noise sigma 0.3, rms error against the newest level): a steady DV over 40
# samples 0.057 (the mean alone 0.055; the newest sample 0.3), a step of 7 sigmas 10 samples ago 0.110 (the
# 10 samples' mean: 0.095), a DV drifting a thirtieth of its noise per sample 0.139 (the mean alone lags:
# 0.245), a sixth 0.190 (0.426). A trend test at 2 costs a steady DV 0.078; a split at 3 cuts it short: 0.100
DV_LEVEL_SIGMAS = 4.0
DV_TREND_SIGMAS = 3.0


class ProblemError(ContractError):
    """A problem (its inputs or a ProblemIR document) is inconsistent; the message names the field."""


def held_dvs(d: np.ndarray, longest: int) -> np.ndarray:
    """(nd,) the DVs' current values a plan holds over its horizon, from the live run's DVs `d` (n, nd):
    per DV the mean of its newest samples that sit at one level (at most `longest`), not its newest
    sample alone. A measured DV is noisy, and the plan holds it for the whole horizon: one sample's
    noise becomes an offset of every CV it drives, and of an integrating CV a drift that grows with
    time (a surge tank balanced against one noisy feed sample ends 0.3-0.5 % of its valve off).
    The stretch grows back from the newest sample while no split of it into older and newer samples
    has means more than DV_LEVEL_SIGMAS standard errors apart, the noise from the DV's second
    differences over the run (their median absolute value: a drift has none, a step is two outliers
    among them): a step or a drift ends the stretch, and a DV without noise (a constant, a noise-free
    step or ramp) is held at its newest sample. A drift too slow to end it is a trend of the stretch
    (its least-squares slope beyond DV_TREND_SIGMAS standard errors): then the line's newest value is
    held, not the mean, which lags half the stretch behind."""
    d = np.asarray(d, float)
    held = d[-1].copy() if len(d) else np.zeros(d.shape[1])
    for j in range(d.shape[1]):
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(np.diff(d[:, j], 2)))) / math.sqrt(6.0) if len(d) > 2 else 0.0
        newest = d[-min(longest, len(d)):, j][::-1]
        stretch = newest[:_level_stretch(newest, sigma)]
        count = len(stretch)
        held[j] = stretch.mean()
        if count >= 3 and sigma > 0:
            age = np.arange(count, dtype=float)  # 0: the newest sample
            slope = float(np.polyfit(age, stretch, 1)[0])
            if abs(slope) > DV_TREND_SIGMAS * sigma * math.sqrt(12.0 / (count ** 3 - count)):
                held[j] -= slope * age.mean()  # the line at the newest sample
    return held


def _level_stretch(newest: np.ndarray, sigma: float) -> int:
    """How many of `newest` (newest first) sit at one level: the longest stretch k from the first no split
    of which into its s newest and k - s older samples has means more than DV_LEVEL_SIGMAS standard
    errors apart (at once for every k and s: on the live service's re-solve path)."""
    sums = np.cumsum(newest)
    k = np.arange(1, len(newest) + 1)[:, None]  # stretch length
    s = np.arange(1, len(newest) + 1)[None, :]  # its newer part's length
    with np.errstate(divide="ignore", invalid="ignore"):  # s = k and beyond are not splits
        gap = np.abs(sums[s - 1] / s - (sums[k - 1] - sums[s - 1]) / (k - s))
        two_levels = np.any((s < k) & (gap > DV_LEVEL_SIGMAS * sigma * np.sqrt(1.0 / s + 1.0 / (k - s))), axis=1)
    return int(np.argmax(two_levels)) if two_levels.any() else len(newest)  # the stretch before the first split


# --------------------------------------------------------------------------- validation


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
    if problem.u_target is not None or problem.u_target_weight != 0.0 or problem.y_transform is not None or any(
            getattr(problem, name) is not None for name in ECONOMIC_FIELDS):
        return False  # economics, steering and CV transforms: checked field by field
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
    p, error = "problem", ProblemError
    if not isinstance(problem.template, Template):
        unknown(problem.template, [t.value for t in Template], f"{p}.template", what="template", error=error)
    check_integer(problem.horizon, f"{p}.horizon", AT_LEAST_ONE, error=error)
    nu, ny, nd = len(problem.mv_tags), len(problem.cv_tags), len(problem.dv_tags)
    if nu == 0 or ny == 0:
        raise ProblemError(f"{p}: needs at least one MV and one CV (got {nu} MVs, {ny} CVs)")
    m = problem.model
    if not isinstance(m.A, (tuple, list, np.ndarray)) or len(m.A) == 0:
        refuse(f"{p}.model.A", "a state matrix with at least one state", m.A, error=error)
    nx = len(m.A)
    check_matrix(m.A, f"{p}.model.A", nx, nx, error=error)
    check_matrix(m.B, f"{p}.model.B", nx, nu, error=error)
    check_matrix(m.E, f"{p}.model.E", nx, nd, error=error)
    check_vector(m.f, f"{p}.model.f", nx, error=error)
    check_matrix(m.C, f"{p}.model.C", ny, nx, error=error)
    for name, length, bounds in (("x0", nx, None), ("u_prev", nu, None), ("d", nd, None), ("bias", ny, None),
                                 ("u_lo", nu, None), ("u_hi", nu, None), ("du_max", nu, POSITIVE),
                                 ("y_lo", ny, None), ("y_hi", ny, None), ("y_target", ny, None),
                                 ("y_weight", ny, NON_NEGATIVE), ("u_mean", nu, None), ("u_std", nu, POSITIVE),
                                 ("y_mean", ny, None), ("y_std", ny, POSITIVE)):
        check_vector(getattr(problem, name), f"{p}.{name}", length, bounds, error=error)
    check_ordered(problem.u_lo, problem.u_hi, p, names=("u_lo", "u_hi"), error=error)
    check_ordered(problem.y_lo, problem.y_hi, p, names=("y_lo", "y_hi"), error=error)
    check_number(problem.move_weight, f"{p}.move_weight", NON_NEGATIVE, error=error)
    check_number(problem.slack_weight, f"{p}.slack_weight", POSITIVE, error=error)  # CV limits are soft
    if problem.band is not None:
        check_vector(problem.band, f"{p}.band", ny, NON_NEGATIVE, name="a half-width", error=error)
    if problem.template is Template.STEADY_RESPONSE:
        for name in ("steady_gain", "steady_dv_gain", "steady_offset"):
            if getattr(problem, name) is None:
                raise ProblemError(f"{p}.{name}: required for {Template.STEADY_RESPONSE.value}")
        check_matrix(problem.steady_gain, f"{p}.steady_gain", ny, nu, error=error)
        check_matrix(problem.steady_dv_gain, f"{p}.steady_dv_gain", ny, nd, error=error)
        check_vector(problem.steady_offset, f"{p}.steady_offset", ny, error=error)
    _check_economics(problem, nu, ny)
    _check_transforms(problem, ny)


def _check_transforms(problem: ProblemIR, ny: int) -> None:
    """y_transform: None, or per CV None or a CVTransform of a known kind with finite limits lo < hi."""
    if problem.y_transform is None:
        return
    p, error = "problem.y_transform", ProblemError
    if not isinstance(problem.y_transform, (tuple, list)) or len(problem.y_transform) != ny:
        refuse(p, f"one entry per CV ({ny})", problem.y_transform, error=error)
    for j, transform in enumerate(problem.y_transform):
        if transform is None:
            continue
        if not isinstance(transform, CVTransform):
            refuse(f"{p}[{j}]", "a CV transform or null", transform, error=error)
        check_choice(transform.kind, KINDS, f"{p}[{j}].kind", what="transform kind", error=error)
        lo = check_number(transform.lo, f"{p}[{j}].lo", error=error)
        hi = check_number(transform.hi, f"{p}[{j}].hi", error=error)
        check_ordered(lo, hi, f"{p}[{j}]", strict=True, error=error)


def _check_economics(problem: ProblemIR, nu: int, ny: int) -> None:
    """The economic vectors (all or none, steady-state template only) and the MV target of a steered plan."""
    p, error = "problem", ProblemError
    present = [name for name in ECONOMIC_FIELDS if getattr(problem, name) is not None]
    if present:
        if problem.template is not Template.STEADY_RESPONSE:
            raise ProblemError(f"{p}.{present[0]}: economics belong to {Template.STEADY_RESPONSE.value}")
        if len(present) < len(ECONOMIC_FIELDS):
            missing = next(name for name in ECONOMIC_FIELDS if name not in present)
            raise ProblemError(f"{p}.{missing}: required with {present[0]} (economics come whole)")
        for name, length, bounds in (("econ_u", nu, None), ("econ_uu", nu, NON_NEGATIVE), ("econ_y", ny, None),
                                     ("econ_yy", ny, NON_NEGATIVE), ("target_hold", ny, None)):
            check_vector(getattr(problem, name), f"{p}.{name}", length, bounds, error=error)
        for j, flag in enumerate(problem.target_hold):
            if flag not in (0.0, 1.0):
                raise ProblemError(f"{p}.target_hold[{j}]: must be 0 or 1, got {flag!r}")
    check_number(problem.u_target_weight, f"{p}.u_target_weight", NON_NEGATIVE, error=error)
    if problem.u_target is not None:
        check_vector(problem.u_target, f"{p}.u_target", nu, error=error)
    elif problem.u_target_weight:
        raise ProblemError(f"{p}.u_target: required with u_target_weight {problem.u_target_weight:g}")


def problem_from_dict(doc: Any) -> ProblemIR:
    """ProblemIR from its JSON dict (`ProblemIR.to_dict()`), validated; ProblemError on any defect."""
    if not isinstance(doc, Mapping):
        raise ProblemError(f"problem: expected a JSON object, got {type(doc).__name__}")
    try:
        problem = ProblemIR.from_dict(doc)
    except KeyError as exc:
        refuse_missing("problem", exc.args[0], error=ProblemError)
    except ContractError:
        raise
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ProblemError(f"{_malformed_field(doc)}: malformed ({exc})") from None
    return validate_problem(problem)


# not numbers: skipped when naming a malformed field (y_transform holds each transform's kind)
_TEXT_FIELDS = {"binding_id", "profile_id", "model_artifact_hash", "mv_tags", "cv_tags", "dv_tags", "y_transform"}


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
    A transformed CV (y_transform) is tightened in engineering units, where its band is, and the
    limits mapped back.
    """
    lo, hi = np.asarray(problem.y_lo, float), np.asarray(problem.y_hi, float)
    if problem.band is None:
        return lo, hi
    band = np.asarray(problem.band, float)
    if problem.y_transform is not None:  # the band is in engineering units (x std): tightened there
        lo, hi, band = problem.cv_engineering(lo), problem.cv_engineering(hi), band * np.asarray(problem.y_std)
    t_lo, t_hi = lo + band, hi - band
    empty = t_lo > t_hi
    mid = 0.5 * (lo + hi)
    r_lo, r_hi = np.where(empty, mid, t_lo), np.where(empty, mid, t_hi)
    if problem.y_transform is not None:
        return problem.cv_normalised(r_lo), problem.cv_normalised(r_hi)
    return r_lo, r_hi


def settled_map(problem: ProblemIR) -> tuple[np.ndarray, np.ndarray]:
    """(G (ny, nu), offset (ny,)), normalised: where the CVs settle under MVs u held, G @ u + offset, with
    the problem's DVs and disturbance bias held (statespace.steady_state); an integrating CV's row is its
    settled rate per step instead, 0 where the held MVs balance it."""
    G, Gd, y0 = steady_state(problem.model)
    return G, Gd @ np.asarray(problem.d, float) + y0 + disturbance_gain(problem.model) @ np.asarray(problem.bias, float)


# --------------------------------------------------------------------------- compilation


def compile_problem(binding: BindingSpec, artifact: ModelArtifact, x0: Any, bias: Any, u_now: Any, d_now: Any,
                    band: Any = None, slack_weight: float = DEFAULT_SLACK_WEIGHT,
                    steering: tuple[Any, Any] | None = None, held: Any = None,
                    model_hash: str | None = None) -> ProblemIR:
    """Compile the optimisation problem of one binding revision at "now".

    x0 (nx,) and bias (ny,) are normalised (model module's `current_state`); u_now (nu,) and d_now
    (nd,) are the current MVs / DVs in engineering units; band (ny,) the UQ half-widths in
    normalised units or None without evidence. MV bounds and max moves are scaled by the MV std,
    CV limits and targets normalised with the CV mean / std; weights come from binding.cvs,
    move_weight and horizon N from binding.profile. A CV without a target gets tracking weight 0.
    held (ny,) engineering units, a steady target of a binding with costs only (required there):
    the CVs the targets-first stage reached (solver/targets.py), at which every CV with a target
    and a weight > 0 is held exactly while the costs (`economic_terms`) spend what freedom is left.
    steering (u_ss (nu,), y_ss (ny,), engineering units): the steady-state layer's target a move
    plan steers to (two layers, solver/targets.py): it replaces the CV targets and adds the MV
    target; required for a move plan whose binding has costs or a CV without a target. An integrating
    CV keeps its own target (or none) in a steered plan; in a steady target (the steady-state layer:
    binding files refuse steady_response@1 with one) its row is a balance (`balance_rows`): its drift
    over the horizon under the steady MVs, limits 0 (soft, as every CV limit), no target, no band.
    model_hash: the model artifact the problem names (default: `artifact`'s own hash; a local refit's
    problem names the identified artifact it was refitted from, pipeline.solve_and_decide).
    Raises ProblemError naming the field on a tag mismatch, a wrong length or a non-finite value.
    Deterministic: same inputs, same hash.
    """
    where = f"problem[{binding.id}]"
    for kind in ("mv_tags", "cv_tags", "dv_tags"):
        if tuple(getattr(artifact, kind)) != tuple(getattr(binding, kind)):
            raise ProblemError(f"{where}.{kind}: artifact has {list(getattr(artifact, kind))}, "
                               f"binding has {list(getattr(binding, kind))}")
    nx = len(artifact.state_space.A)
    nu, ny, nd = len(binding.mvs), len(binding.cvs), len(binding.dvs)
    x0 = check_vector(x0, f"{where}.x0", nx, error=ProblemError)
    bias = check_vector(bias, f"{where}.bias", ny, error=ProblemError)
    u_now = check_vector(u_now, f"{where}.u_now", nu, error=ProblemError)
    d_now = check_vector(d_now, f"{where}.d_now", nd, error=ProblemError)
    band = None if band is None else check_vector(band, f"{where}.band", ny, error=ProblemError)
    check_number(slack_weight, f"{where}.slack_weight", POSITIVE, error=ProblemError)
    steady_template = binding.profile.template is Template.STEADY_RESPONSE
    if steady_template and steering is not None:
        raise ProblemError(f"{where}.steering: only a move plan is steered to a steady-state target")
    if (held is None) == (steady_template and binding.has_costs):
        raise ProblemError(f"{where}.held: a steady target with costs needs the targets-first stage's CVs "
                           f"(solver/targets.py), and only it takes them")
    if not steady_template and steering is None and needs_steady_layer(binding):
        raise ProblemError(f"{where}.steering: a move plan with costs or a CV without a target needs the "
                           f"steady-state layer's target (solver/targets.py compile_steered)")

    norm = artifact.normalisation
    missing = [t for t in binding.tags if t not in norm.tags]
    if missing:
        raise ProblemError(f"{where}.normalisation: no statistics for tags {missing}")
    u_mean, u_std = norm.of(binding.mv_tags)
    y_mean, y_std = norm.of(binding.cv_tags)
    d_mean, d_std = norm.of(binding.dv_tags)
    for tags, std in ((binding.mv_tags, u_std), (binding.cv_tags, y_std), (binding.dv_tags, d_std)):
        for tag, s in zip(tags, std):
            check_number(float(s), f"{where}.normalisation[{tag}]", POSITIVE, name="std", error=ProblemError)

    mv_lo = np.array([m.lo for m in binding.mvs])
    mv_hi = np.array([m.hi for m in binding.mvs])
    mv_move = np.array([m.max_move for m in binding.mvs])
    cv_lo = np.array([c.lo for c in binding.cvs])
    cv_hi = np.array([c.hi for c in binding.cvs])
    targeted = np.array([c.target is not None for c in binding.cvs])
    # a CV without a target: weight 0, its "target" the middle of its limits (enters no cost)
    cv_target = np.array([0.5 * (c.lo + c.hi) if c.target is None else c.target for c in binding.cvs])
    weight = np.where(targeted, [c.weight for c in binding.cvs], 0.0)
    ramps = integrating_outputs(artifact.state_space)
    steered: dict[str, Any] = {}
    if steering is not None:
        u_ss = check_vector(steering[0], f"{where}.steering.u", nu, error=ProblemError)
        # an integrating CV keeps its own target (the layer holds its balance, not a level)
        cv_target = np.where(ramps, cv_target, check_vector(steering[1], f"{where}.steering.y", ny,
                                                            error=ProblemError))
        weight = np.where(ramps & ~targeted, 0.0, [c.weight for c in binding.cvs])
        steered = {"u_target": _flat((u_ss - u_mean) / u_std), "u_target_weight": STEERING_MV_WEIGHT}
    y_lo, y_hi = norm.normalise(binding.cv_tags, cv_lo), norm.normalise(binding.cv_tags, cv_hi)

    steady: dict[str, Any] = {}
    if steady_template:
        G, Gd, y0 = steady_state(artifact.state_space)
        y0 = y0 + disturbance_gain(artifact.state_space) @ bias  # the held disturbance, compiled in once
        scale = balance_rows(artifact.state_space, binding.profile.horizon)
        steady = {"steady_gain": G * scale[:, None], "steady_dv_gain": Gd * scale[:, None],
                  "steady_offset": y0 * scale}
        if ramps.any():  # balance rows: a drift over the horizon held at 0, no target, no band
            y_lo, y_hi = np.where(ramps, 0.0, y_lo), np.where(ramps, 0.0, y_hi)
            weight = np.where(ramps, 0.0, weight)
            band = None if band is None else np.where(ramps, 0.0, band)
        for name, value in steady.items():
            if not np.all(np.isfinite(value)):
                raise ProblemError(f"{where}.{name}: the model's steady state is not finite")
        if held is not None:
            held = check_vector(held, f"{where}.held", ny, error=ProblemError)
            hold = targeted & (weight > 0)
            cv_target = np.where(hold, held, cv_target)  # held where the targets-first stage reached
            steady.update(economic_terms(binding, steady["steady_gain"], (mv_lo - u_mean) / u_std,
                                         (mv_hi - u_mean) / u_std, u_mean, u_std, y_mean, y_std, hold))
        steady = {name: _rows(v) if name in ("steady_gain", "steady_dv_gain") else _flat(v)
                  for name, v in steady.items()}

    problem = ProblemIR(
        template=binding.profile.template,
        binding_id=binding.id, binding_revision=int(artifact.binding_revision), profile_id=binding.profile.id,
        profile_version=binding.profile.version,
        model_artifact_hash=artifact.artifact_hash if model_hash is None else model_hash,
        horizon=int(binding.profile.horizon),
        mv_tags=binding.mv_tags, cv_tags=binding.cv_tags, dv_tags=binding.dv_tags,
        model=artifact.state_space,
        x0=_flat(x0), u_prev=_flat((u_now - u_mean) / u_std), d=_flat((d_now - d_mean) / d_std), bias=_flat(bias),
        u_lo=_flat((mv_lo - u_mean) / u_std), u_hi=_flat((mv_hi - u_mean) / u_std), du_max=_flat(mv_move / u_std),
        y_lo=_flat(y_lo), y_hi=_flat(y_hi),
        y_target=_flat(np.where(ramps & steady_template, 0.0, norm.normalise(binding.cv_tags, cv_target))),
        y_weight=_flat(weight),
        move_weight=float(binding.profile.move_weight), slack_weight=float(slack_weight),
        band=None if band is None else _flat(band),
        u_mean=_flat(u_mean), u_std=_flat(u_std), y_mean=_flat(y_mean), y_std=_flat(y_std),
        **steady, **steered,
        y_transform=norm.transforms_of(binding.cv_tags) if norm.transforms else None,
    )
    return validate_problem(problem)


# the MV target's weight of a steered move plan (normalised units): a tenth of a CV's unit tracking
# weight, enough to pick the economic MVs among those reaching the CV targets equally well, small
# enough not to pull the CVs off their targets on the way
STEERING_MV_WEIGHT = 0.1


def needs_steady_layer(binding: BindingSpec) -> bool:
    """A move plan is steered by the steady-state layer when the binding has costs or a CV without a target."""
    return binding.has_costs or any(c.target is None for c in binding.cvs)


def economic_terms(binding: BindingSpec, gain: np.ndarray, u_lo: np.ndarray, u_hi: np.ndarray, u_mean: np.ndarray,
                   u_std: np.ndarray, y_mean: np.ndarray, y_std: np.ndarray,
                   hold: np.ndarray) -> dict[str, np.ndarray]:
    """The ProblemIR's economic vectors: the costs in normalised units (economics.normalised_costs,
    largest gradient 1 per MV over the box) and `target_hold`, 1.0 for every CV held at its target
    (`hold`, (ny,) bool)."""
    costs = normalised_costs(binding, u_mean, u_std, y_mean, y_std, gain, u_lo, u_hi)
    return {"econ_u": costs.u_linear, "econ_uu": costs.u_quadratic, "econ_y": costs.y_linear,
            "econ_yy": costs.y_quadratic, "target_hold": hold.astype(float)}


def _flat(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, float).reshape(-1))


def _rows(matrix: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in np.asarray(matrix, float))
