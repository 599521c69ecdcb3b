"""Linear process model of a binding: ARX identification, state-space realisation, rollout, gates.

Public entry points: `identify(split, binding, revision) -> ModelArtifact`, `current_state(artifact,
run) -> (x0, bias)`, `arx_of(artifact)`, `stack_for(artifact, runs)`; arrays-level tools in
`model.arx`, simulation in `model.statespace`.
"""

from optimizer_pipeline.model.artifact import artifact_from_model, arx_of, current_state, identify, quality_gates, stack_for
from optimizer_pipeline.model.arx import ArxModel, Orders, Stacked, rollout_windows, stack_runs
from optimizer_pipeline.model.statespace import rollout, steady_state

__all__ = ["ArxModel", "artifact_from_model", "Orders", "Stacked", "arx_of", "current_state", "identify", "quality_gates", "rollout",
           "rollout_windows", "stack_for", "stack_runs", "steady_state"]
