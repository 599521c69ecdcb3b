"""The steady-state stages of an economic solve, done before the problem goes to a worker.

Targets first. A steady target with costs is solved lexicographically (solver/steady.py,
"Priorities"): the binding without its costs (targets, limits, move reach) is solved first, and
the CVs its published candidate reaches (recommend.choose_candidate: robust, else nominal) are
then held exactly while the costs spend the freedom left (problem.py `compile_problem(held=...)`).
One weighted objective cannot rank targets above costs on an ill-conditioned plant: the weight a
target would need grows with the gain's condition number, and OSQP stalls on it.

Two layers. A `linear_mpc_quadratic@1` binding with costs, or with a CV without a target, has no
complete set of CV targets to track. As in the usual two-layer structure of an industrial MPC, the
steady-state layer decides where to go — the binding as a steady target (costs, targets where
given, limits, the move reach of the plan's N moves), compiled as above — and the move plan tracks
that point: its CV targets become the layer's CVs and it also tracks the layer's MVs
(`compile_problem(steering=...)`). The layer's robust limits use the band of the settled response
when the caller has one (pipeline.settled_evidence).

Each stage is a QP in nu + ny variables (~1 ms with its verification), solved here in the caller's
process; the problem that goes to a worker is an ordinary one. A stage that finds no feasible
point raises SteadyLayerError with its problem and result, which the caller records as a rejected
solve (pipeline.solve_and_decide).
"""

from dataclasses import replace
from typing import Any

from optimizer_pipeline.contracts import BindingSpec, ModelArtifact, ProblemIR, SolveCandidate, SolveResult, Template
from optimizer_pipeline.problem import ProblemError, compile_problem, needs_steady_layer
from optimizer_pipeline.recommend import choose_candidate
from optimizer_pipeline.solver.solve import SolverCache, solve_problem


class SteadyLayerError(ProblemError):
    """A steady-state stage (targets first, or the layer a plan steers to) found no feasible point;
    `problem` and `result` are that stage's."""

    def __init__(self, message: str, problem: ProblemIR, result: SolveResult):
        super().__init__(message)
        self.problem, self.result = problem, result


def steady_layer(binding: BindingSpec) -> BindingSpec:
    """The binding's steady-state layer: the same spec as steady_response@1, reach of the plan's N moves."""
    return replace(binding, profile=replace(binding.profile, template=Template.STEADY_RESPONSE))


def without_costs(binding: BindingSpec) -> BindingSpec:
    """The binding with every cost 0: the targets-first stage."""
    return replace(binding, mvs=tuple(replace(m, cost=0.0, cost_quadratic=0.0) for m in binding.mvs),
                   cvs=tuple(replace(c, cost=0.0, cost_quadratic=0.0) for c in binding.cvs))


def _published(problem: ProblemIR, stage: str) -> SolveCandidate:
    """The candidate a steady target of `problem` would publish; SteadyLayerError without one."""
    result = solve_problem(problem, SolverCache(max_entries=1))
    chosen = choose_candidate(result) if result.ok else None
    if chosen is None:
        found = ", ".join(f"{c.kind.value} {c.solver_status}" for c in result.candidates) or result.error_message
        raise SteadyLayerError(f"problem[{problem.binding_id}]: the {stage} found no feasible steady state ({found})",
                               problem, result)
    return chosen


def compile_steady(binding: BindingSpec, artifact: ModelArtifact, x0: Any, bias: Any, u_now: Any, d_now: Any,
                   band: Any = None, model_hash: str | None = None) -> ProblemIR:
    """A steady target's problem (compile_problem's arguments); with costs, the targets-first stage
    solved and its CVs held."""
    if not binding.has_costs:
        return compile_problem(binding, artifact, x0, bias, u_now, d_now, band, model_hash=model_hash)
    first = compile_problem(without_costs(binding), artifact, x0, bias, u_now, d_now, band, model_hash=model_hash)
    reached = _published(first, "targets-first stage").predicted[0]
    return compile_problem(binding, artifact, x0, bias, u_now, d_now, band, held=reached, model_hash=model_hash)


def compile_steered(binding: BindingSpec, artifact: ModelArtifact, x0: Any, bias: Any, u_now: Any, d_now: Any,
                    band: Any = None, layer_band: Any = None, model_hash: str | None = None) -> ProblemIR:
    """The problem of `binding` at "now" as the pipeline solves it (compile_problem's arguments): a
    steady target with costs through its targets-first stage; a move plan with costs or a CV
    without a target steered to its steady-state layer, whose robust limits are tightened by
    layer_band (ny, normalised: the band of the settled response; None: the plan's band). Raises
    SteadyLayerError when a stage finds no feasible steady state."""
    if binding.profile.template is Template.STEADY_RESPONSE:
        return compile_steady(binding, artifact, x0, bias, u_now, d_now, band, model_hash)
    if not needs_steady_layer(binding):
        return compile_problem(binding, artifact, x0, bias, u_now, d_now, band, model_hash=model_hash)
    layer = compile_steady(steady_layer(binding), artifact, x0, bias, u_now, d_now,
                           band if layer_band is None else layer_band, model_hash)
    target = _published(layer, "steady-state layer")
    return compile_problem(binding, artifact, x0, bias, u_now, d_now, band,
                           steering=(target.controls[0], target.predicted[0]), model_hash=model_hash)
