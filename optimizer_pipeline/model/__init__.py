"""Linear process model of a binding: ARX identification, state-space realisation, rollout, gates.

Public entry points: `identify(split, binding, revision) -> ModelArtifact`, `current_state(artifact,
run) -> (x0, bias)`, `arx_of(artifact)`, `stack_for(artifact, runs)`; arrays-level tools in
`model.arx`, the regression by structure and the multi-step refinement in `model.fit`, the choice of
structure (one delay, or a delay per channel) in `model.select`, simulation and settling horizon in
`model.statespace`, the step-response matrix an artifact records in `model.step_response`.

The identification names are imported on first use (PEP 562): the solver worker imports
`model.statespace` and must not pay for scipy.optimize at start.
"""

from importlib import import_module
from typing import Any

from optimizer_pipeline.model.statespace import rollout, steady_state

_LAZY = {
    "artifact_from_model": "artifact", "arx_of": "artifact", "current_state": "artifact", "identify": "artifact",
    "predicted_run": "artifact", "quality_gates": "artifact", "stack_for": "artifact",
    "ArxModel": "arx", "Orders": "arx", "Stacked": "arx", "rollout_windows": "arx", "stack_runs": "arx",
}

__all__ = sorted([*_LAZY, "rollout", "steady_state"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"optimizer_pipeline.model.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
