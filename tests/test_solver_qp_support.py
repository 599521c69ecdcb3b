"""Hand-built models, artifacts and bindings for the problem / solver / verifier tests (no model module).

`tank_artifact`: a quadruple-tank-like 2x2 plant, 4 states (two lower tanks fed by both valves
through two upper tanks), optional measured disturbance. `scalar_artifact`: one first-order state.
"""

import numpy as np

from optimizer_pipeline.contracts import ModelArtifact, Normalisation, StateSpace, binding_from_dict
from optimizer_pipeline.problem import compile_problem


def tank_state_space(with_dv: bool = False) -> StateSpace:
    A = np.array([[0.92, 0.0, 0.06, 0.0],
                  [0.0, 0.90, 0.0, 0.05],
                  [0.0, 0.0, 0.95, 0.0],
                  [0.0, 0.0, 0.0, 0.94]])
    B = np.array([[0.08, 0.0], [0.0, 0.09], [0.0, 0.04], [0.05, 0.0]])
    E = np.array([[0.02], [0.01], [0.0], [0.0]]) if with_dv else np.zeros((4, 0))
    C = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    return StateSpace.of(A, B, E, np.zeros(4), C)


def tank_artifact(with_dv: bool = False) -> ModelArtifact:
    tags = ("v1", "v2", "y1", "y2") + (("f1",) if with_dv else ())
    mean = (3.0, 3.0, 6.0, 6.5) + ((1.0,) if with_dv else ())
    std = (1.5, 1.2, 2.0, 1.8) + ((0.5,) if with_dv else ())
    return ModelArtifact(
        binding_id="tanks-1", binding_revision=1, mv_tags=("v1", "v2"), cv_tags=("y1", "y2"),
        dv_tags=("f1",) if with_dv else (), na=1, nb=1, delay=1, horizon=10, sample_period_s=5.0,
        coefficients={}, state_space=tank_state_space(with_dv), normalisation=Normalisation(tags, mean, std),
        gates=(), splits={}, training_data_hash="0" * 64)


def scalar_artifact() -> ModelArtifact:
    ss = StateSpace.of([[0.8]], [[0.2]], np.zeros((1, 0)), [0.0], [[1.0]])
    return ModelArtifact(
        binding_id="one", binding_revision=1, mv_tags=("u",), cv_tags=("y",), dv_tags=(), na=1, nb=1, delay=1,
        horizon=5, sample_period_s=1.0, coefficients={}, state_space=ss,
        normalisation=Normalisation(("u", "y"), (0.0, 0.0), (1.0, 1.0)), gates=(), splits={},
        training_data_hash="1" * 64)


def tank_binding(template: str = "linear_mpc_quadratic@1", horizon: int = 20, move_weight: float = 0.1,
                 max_move: float = 0.5, cv_lo: float = 2.0, cv_hi: float = 10.0, targets=(7.0, 7.5),
                 with_dv: bool = False):
    return binding_from_dict({
        "id": "tanks-1", "sample_period_s": 5,
        "mvs": [{"tag": "v1", "lo": 0.0, "hi": 6.0, "max_move": max_move},
                {"tag": "v2", "lo": 0.0, "hi": 6.0, "max_move": max_move}],
        "cvs": [{"tag": "y1", "lo": cv_lo, "hi": cv_hi, "target": targets[0], "weight": 1.0},
                {"tag": "y2", "lo": cv_lo, "hi": cv_hi, "target": targets[1], "weight": 2.0}],
        "dvs": [{"tag": "f1"}] if with_dv else [],
        "profile": {"id": "tanks-track", "version": 1, "template": template, "horizon": horizon,
                    "move_weight": move_weight},
    })


def scalar_binding(lo: float = -1.0, hi: float = 1.0, target: float = 0.5, u_lo: float = -5.0, u_hi: float = 5.0,
                   max_move: float = 10.0, horizon: int = 6, move_weight: float = 0.1,
                   template: str = "linear_mpc_quadratic@1"):
    return binding_from_dict({
        "id": "one", "sample_period_s": 1,
        "mvs": [{"tag": "u", "lo": u_lo, "hi": u_hi, "max_move": max_move}],
        "cvs": [{"tag": "y", "lo": lo, "hi": hi, "target": target, "weight": 1.0}],
        "profile": {"id": "one", "version": 1, "template": template, "horizon": horizon, "move_weight": move_weight},
    })


def tank_problem(band=None, u_now=(3.0, 3.0), x0=(0.0, 0.0, 0.0, 0.0), bias=(0.0, 0.0), **binding_kw):
    with_dv = binding_kw.get("with_dv", False)
    return compile_problem(tank_binding(**binding_kw), tank_artifact(with_dv), x0, bias, u_now,
                           [1.4] if with_dv else [], band=band)


def test_hand_built_tank_model_is_stable_and_coupled():
    A, B, _, _, C = tank_state_space().arrays()
    assert np.max(np.abs(np.linalg.eigvals(A))) < 1.0
    gain = C @ np.linalg.solve(np.eye(4) - A, B)
    assert np.all(gain > 0) and abs(np.linalg.det(gain)) > 0.1  # both valves reach both tanks
