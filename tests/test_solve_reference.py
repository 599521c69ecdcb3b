"""solve_problem's fast paths give the results of the plain composition (issue 8: faster, same results).

`reference_solve` is solve_problem written the straightforward way: the field-by-field checks, the
hash of the normalise-then-json.dumps canonical text, the template's `vectors` for every candidate's
limits, cost and plan recomputed for every candidate, each candidate verified alone. Both run the
same problem sequences (receding horizon, so warm starts matter) on their own SolverCache, and the
full results must be equal to the bit (compared by repr), timings aside.
"""

import hashlib
import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from optimizer_pipeline.contracts import CandidateKind, CVTransform, SolveCandidate, SolveResult, _canonical
from optimizer_pipeline.contracts.problem import OPTIONAL_FIELDS
from optimizer_pipeline.problem import _check_fields, compile_problem, robust_limits
from optimizer_pipeline.solver import mpc, steady
from optimizer_pipeline.solver.solve import (
    TEMPLATES,
    SolverCache,
    _objective,
    _run_qp,
    _still_optimal,
    solve_problem,
)
from optimizer_pipeline.solver.targets import compile_steered
from optimizer_pipeline.solver.verify import verify_candidate
from test_solver_qp_support import scalar_artifact, scalar_binding, tank_artifact, tank_binding, tank_problem

TIMINGS = {"elapsed_s", "solve_time_s"}


def reference_hash(problem):
    doc = _canonical(problem, "")
    if problem.econ_u is None and problem.u_target is None and problem.u_target_weight == 0.0:
        doc = {k: v for k, v in doc.items() if k not in OPTIONAL_FIELDS}  # left out at their defaults
    if problem.y_transform is None:
        del doc["y_transform"]  # no CV transformed: left out too
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def reference_candidate(problem, seq, kind, status, z, cost, y_lo, y_hi, report):
    constraints = dict(report, y_lo=y_lo.tolist(), y_hi=y_hi.tolist())
    if z is None:
        return SolveCandidate(seq, kind, status, (), (), None, constraints)
    u, y, s = TEMPLATES[problem.template].plan(problem, z)
    controls = np.asarray(problem.u_mean) + np.asarray(problem.u_std) * u
    predicted = np.asarray(problem.y_mean) + np.asarray(problem.y_std) * y
    for j, transform in enumerate(problem.y_transform or ()):  # a transformed CV: its logit's inverse
        if transform is not None:
            centre, radius = (transform.lo + transform.hi) / 2, (transform.hi - transform.lo) / 2
            predicted[:, j] = centre + radius * np.tanh(predicted[:, j] / radius)
    constraints.update(slack_max=float(s.max()), slack_sum=float(s.sum()))
    return SolveCandidate(seq, kind, status, tuple(map(tuple, controls.tolist())),
                          tuple(map(tuple, predicted.tolist())), cost, constraints)


def reference_solve(problem, cache):
    """solve_problem (no deadline, no cancel) the plain way."""
    _check_fields(problem)
    builder = TEMPLATES[problem.template]
    y_lo, y_hi = np.asarray(problem.y_lo, float), np.asarray(problem.y_hi, float)
    q, l, u, constant = builder.vectors(problem, y_lo, y_hi)
    entry, hit = cache.entry(problem, q, l, u)
    diagnostics = {"template": problem.template.value, "cache_hit": hit, "cache_size": len(cache),
                   "osqp_setups": cache.setups}
    hold = builder.hold_point(problem, entry.A, l, y_lo, y_hi, entry.memo)
    candidates = [reference_candidate(problem, 0, CandidateKind.HOLD, "hold", hold,
                                      _objective(entry, q, constant, hold), y_lo, y_hi, {})]
    runs = [(1, CandidateKind.NOMINAL, y_lo, y_hi)]
    if problem.band is not None:
        runs.append((2, CandidateKind.ROBUST, *robust_limits(problem)))
    solved = None
    for seq, kind, lo, hi in runs:
        q_k, l_k, u_k, constant_k = builder.vectors(problem, lo, hi)
        if solved is not None and _still_optimal(entry, solved[1], q, constant, q_k, constant_k, l_k, u_k):
            status, z, report = solved[0], solved[1], dict(solved[2], shared_with_nominal=True)
        else:
            status, z, report = _run_qp(entry, q_k, l_k, u_k, None)
        z = None if z is None else builder.settle(problem, z, lo, hi)
        if kind is CandidateKind.NOMINAL and z is not None:
            solved = (status, z, report)
        cost = None if z is None else _objective(entry, q_k, constant_k, z)
        candidates.append(reference_candidate(problem, seq, kind, status, z, cost, lo, hi, report))
        diagnostics.setdefault("qp", {})[kind.value] = {k: report.get(k) for k in ("osqp_status", "iterations",
                                                                                 "solve_time_s")}
    verified = tuple(verify_candidate(problem, c) for c in candidates)
    return SolveResult(reference_hash(problem), True, verified, diagnostics)


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, (list, tuple)):
        return [without_timings(v) for v in value]
    return value


def comparable(result):
    doc = asdict(result)
    doc["diagnostics"].pop("osqp_version", None)
    return repr(without_timings(doc))  # repr: floats to the bit, -0.0 included


def receding_horizon(first, steps, rng):
    """Problems of a closed loop on `first`'s model: the nominal plan's first move applied, a new state."""
    cache, problems, problem = SolverCache(), [], first
    A, B, _, _, _ = first.model.arrays()
    x = np.asarray(first.x0)
    for _ in range(steps):
        problems.append(problem)
        nominal = solve_problem(problem, cache).candidates[1]
        u_now = nominal.controls[0] if nominal.controls else problem.u_prev
        u_norm = (np.asarray(u_now) - np.asarray(problem.u_mean)) / np.asarray(problem.u_std)
        x = A @ x + B @ u_norm + rng.normal(0.0, 0.05, x.shape)
        problem = replace(problem, x0=tuple(map(float, x)), u_prev=tuple(map(float, u_norm)))
    return problems


def sequences():
    rng = np.random.default_rng(8)
    yield "mpc tank, band", receding_horizon(tank_problem(band=(0.2, 0.1)), 25, rng)
    yield "mpc tank, DV, wide band", receding_horizon(
        tank_problem(band=(1.5, 2.5), with_dv=True, x0=(1.0, -0.5, 0.3, 0.0)), 15, rng)
    yield "mpc tank, tight limits", receding_horizon(
        tank_problem(band=(0.3, 0.3), cv_lo=6.8, cv_hi=7.8, targets=(7.0, 7.5), x0=(2.0, 2.0, 1.0, 1.0)), 15, rng)
    yield "steady tank", [tank_problem(band=(0.2, 0.4), template="steady_response@1", horizon=h,
                                       u_now=tuple(rng.uniform(1, 5, 2))) for h in (1, 3, 8)]
    economic = replace(tank_binding(template="steady_response@1", horizon=3),
                       mvs=tuple(replace(m, cost=c) for m, c in zip(tank_binding().mvs, (-1.0, 0.5))))
    economic = replace(economic, cvs=(replace(economic.cvs[0], target=None), economic.cvs[1]))
    yield "steady tank, economics", [compile_steered(economic, tank_artifact(), [0.0] * 4, [0.0, 0.0],
                                                     tuple(rng.uniform(1, 5, 2)), [], band=(0.2, 0.4))
                                     for _ in range(3)]
    yield "scalar, infeasible and band wider than the limits", [
        compile_problem(scalar_binding(u_lo=-1.0, u_hi=1.0, max_move=0.01, horizon=5), scalar_artifact(),
                        [0.0], [0.0], [20.0], [], band=[0.1]),
        compile_problem(scalar_binding(lo=-0.2, hi=0.2, target=0.0), scalar_artifact(), [0.5], [0.0], [0.3], [],
                        band=[0.5]),
    ]
    transformed = replace(tank_problem(band=(0.2, 0.1)), y_transform=(CVTransform("logit", -2.0, 14.0), None))
    yield "mpc tank, a transformed CV", receding_horizon(transformed, 10, rng)


@pytest.mark.parametrize("name,problems", list(sequences()), ids=lambda v: v if isinstance(v, str) else "")
def test_solve_problem_equals_the_plain_composition(name, problems):
    fast, plain = SolverCache(), SolverCache()
    kinds = set()
    for problem in problems:
        result = solve_problem(problem, fast)
        assert comparable(result) == comparable(reference_solve(problem, plain)), name
        kinds |= {(c.kind, c.verified, bool(c.constraints.get("shared_with_nominal"))) for c in result.candidates}
    assert (CandidateKind.NOMINAL, True, False) in kinds or name.startswith("scalar")


@pytest.mark.parametrize("template", [mpc, steady])
def test_cv_limits_swapped_into_l_u_equal_vectors_built_for_them(template):
    rng = np.random.default_rng(2)
    for problem in (tank_problem(band=(0.2, 0.1), template=t, with_dv=dv)
                    for t in ("linear_mpc_quadratic@1", "steady_response@1") for dv in (False, True)):
        if TEMPLATES[problem.template] is not template:
            continue
        q, l, u, constant = template.vectors(problem, np.asarray(problem.y_lo), np.asarray(problem.y_hi))
        lo, hi = rng.normal(0, 1, 2), rng.normal(2, 1, 2)
        l_ref, u_ref = template.vectors(problem, lo, hi)[1:3]
        l_new, u_new = template.with_cv_limits(problem, l, u, lo, hi)
        assert l_new.tobytes() == l_ref.tobytes() and u_new.tobytes() == u_ref.tobytes()
        assert not np.array_equal(l_new, l)  # the limits did change something, on copies
        assert template.vectors(problem, np.asarray(problem.y_lo), np.asarray(problem.y_hi))[1].tobytes() == l.tobytes()
