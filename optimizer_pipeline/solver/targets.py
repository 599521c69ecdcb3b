"""Two layers: a move plan steered to the steady-state layer's economic target.

A `linear_mpc_quadratic@1` binding with costs, or with a CV without a target, has no complete set
of CV targets to track. As in the usual two-layer structure of an industrial MPC, the steady-state
layer decides where to go — the binding's steady_response@1 problem (costs, targets where given,
limits, the move reach of the plan's N moves; priorities in solver/steady.py) — and the move plan
tracks that point: its CV targets become the layer's CVs and it also tracks the layer's MVs
(problem.py `compile_problem(steering=...)`). The layer is a QP in as many variables as MVs and CVs
(a few, ~1 ms with its verification): it is solved here, in the caller's process, with the
candidate rule of a published steady target (recommend.choose_candidate: robust, else nominal);
the steered plan is then solved like any other.
"""

from dataclasses import replace
from typing import Any

from optimizer_pipeline.contracts import BindingSpec, ModelArtifact, ProblemIR, Template
from optimizer_pipeline.problem import ProblemError, compile_problem, needs_steady_layer
from optimizer_pipeline.recommend import choose_candidate
from optimizer_pipeline.solver.solve import SolverCache, solve_problem


def steady_layer(binding: BindingSpec) -> BindingSpec:
    """The binding's steady-state layer: the same spec as steady_response@1, reach of the plan's N moves."""
    return replace(binding, profile=replace(binding.profile, template=Template.STEADY_RESPONSE))


def compile_steered(binding: BindingSpec, artifact: ModelArtifact, x0: Any, bias: Any, u_now: Any, d_now: Any,
                    band: Any = None, layer_band: Any = None) -> ProblemIR:
    """compile_problem's problem, steered to the steady-state layer's target when the binding needs it
    (a move plan with costs or a CV without a target); the same arguments, and layer_band (ny,
    normalised), the band of the settled response the layer's robust limits are tightened by
    (pipeline.steady_layer_evidence; None: the plan's band). Raises ProblemError when the layer
    finds no feasible target."""
    if binding.profile.template is Template.STEADY_RESPONSE or not needs_steady_layer(binding):
        return compile_problem(binding, artifact, x0, bias, u_now, d_now, band)
    layer = compile_problem(steady_layer(binding), artifact, x0, bias, u_now, d_now,
                            band if layer_band is None else layer_band)
    result = solve_problem(layer, SolverCache(max_entries=1))
    chosen = choose_candidate(result) if result.ok else None
    if chosen is None:
        found = ", ".join(f"{c.kind.value} {c.solver_status}" for c in result.candidates) or result.error_message
        raise ProblemError(f"problem[{binding.id}].steering: the steady-state layer has no feasible target ({found})")
    return compile_problem(binding, artifact, x0, bias, u_now, d_now, band,
                           steering=(chosen.controls[0], chosen.predicted[0]))
