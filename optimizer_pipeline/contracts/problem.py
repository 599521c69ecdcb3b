"""ProblemIR: a fully compiled optimisation problem in normalised model units, and its hash."""

import json
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from optimizer_pipeline.contracts.binding import Template
from optimizer_pipeline.contracts.canonical import ContractError, canonical_json, sha256_hex, tuple1, tuple2
from optimizer_pipeline.contracts.model import StateSpace
from optimizer_pipeline.contracts.transform import CVTransform, forward_columns, inverse_columns


@dataclass(frozen=True)
class ProblemIR:
    """A fully compiled optimisation problem in normalised model units.

    Dynamics: `model` (x+ = A x + B u + E d + f, y = C x) with the disturbance `bias` (the constant
    that best explains the live run's recent open-loop prediction error: model/arx.py
    `fit_disturbance`) added as C' bias to every state update, held over the horizon
    (offset-free: model/statespace.py). Step k holds u[k] (k = 0 starts now) and predicts y at the
    end of step k. For steady_response@1 the steady-state relation y_ss = G u + Gd d + y0 is used
    (`steady_gain` G (ny, nu), `steady_dv_gain` Gd (ny, nd), `steady_offset` y0 (ny,): the model's
    offset plus the held disturbance's steady effect, compiled in).
    Limits `y_lo` / `y_hi` are soft (slack penalty `slack_weight`); `u_lo` / `u_hi` / `du_max` hard.
    A CV with a transform (`y_transform`, contracts.transform) is modelled, limited and tracked in
    transformed units: its engineering value is transform.inverse(y_mean + y_std * y) (`cv_engineering`).

    Economics (None without costs; optimizer_pipeline/economics.py): the steady-state template adds
    econ_u @ u + econ_uu @ u**2 + econ_y @ y + econ_yy @ y**2 and holds each CV with `target_hold`
    1 exactly at its `y_target` (a hard equality: the value the targets-first stage reached,
    solver/targets.py), so the costs only spend the freedom the targets leave (solver/steady.py,
    "Priorities"). A move plan steered by the steady-state layer (two layers, solver/targets.py
    `compile_steered`) also tracks the layer's MV target `u_target` with weight `u_target_weight`.
    """

    template: Template
    binding_id: str
    binding_revision: int
    profile_id: str
    profile_version: int
    model_artifact_hash: str
    horizon: int
    mv_tags: tuple[str, ...]
    cv_tags: tuple[str, ...]
    dv_tags: tuple[str, ...]
    model: StateSpace
    x0: tuple[float, ...]
    u_prev: tuple[float, ...]  # MVs held now (normalised)
    d: tuple[float, ...]  # DVs, held over the horizon (normalised)
    bias: tuple[float, ...]  # (ny,)
    u_lo: tuple[float, ...]
    u_hi: tuple[float, ...]
    du_max: tuple[float, ...]  # per step
    y_lo: tuple[float, ...]
    y_hi: tuple[float, ...]
    y_target: tuple[float, ...]
    y_weight: tuple[float, ...]
    move_weight: float
    slack_weight: float
    band: tuple[float, ...] | None  # UQ half-width per CV (normalised), None without evidence
    u_mean: tuple[float, ...]  # engineering = mean + std * normalised
    u_std: tuple[float, ...]
    y_mean: tuple[float, ...]
    y_std: tuple[float, ...]
    steady_gain: tuple[tuple[float, ...], ...] | None = None
    steady_dv_gain: tuple[tuple[float, ...], ...] | None = None
    steady_offset: tuple[float, ...] | None = None
    econ_u: tuple[float, ...] | None = None
    econ_uu: tuple[float, ...] | None = None
    econ_y: tuple[float, ...] | None = None
    econ_yy: tuple[float, ...] | None = None
    target_hold: tuple[float, ...] | None = None  # 1.0: the CV is held at y_target, 0.0: not
    u_target: tuple[float, ...] | None = None
    u_target_weight: float = 0.0
    y_transform: tuple[CVTransform | None, ...] | None = None  # per CV; None: no CV is transformed

    def cv_engineering(self, y: Any) -> np.ndarray:
        """Normalised CVs (..., ny) -> engineering units (through each CV's transform)."""
        values = np.asarray(self.y_mean, float) + np.asarray(self.y_std, float) * np.asarray(y, float)
        return values if self.y_transform is None else inverse_columns(self.y_transform, values)

    def cv_normalised(self, values: Any) -> np.ndarray:
        """Engineering CVs (..., ny) -> normalised units (through each CV's transform)."""
        values = np.asarray(values, float) if self.y_transform is None else forward_columns(self.y_transform, values)
        return (values - np.asarray(self.y_mean, float)) / np.asarray(self.y_std, float)

    @property
    def economic(self) -> bool:
        """Whether the problem carries an economic objective (steady-state template)."""
        return self.econ_u is not None

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.canonical_json())

    def canonical_json(self) -> str:
        """Canonical JSON; the economic and steering fields are left out at their defaults, and the CV
        transforms without any, so a problem without them keeps the JSON (and hash) it had before they
        existed."""
        left_out = set()
        if self.u_target is None and self.u_target_weight == 0.0 and self.econ_u is None:
            left_out |= OPTIONAL_FIELDS
        if self.y_transform is None:
            left_out.add("y_transform")
        if not left_out:
            return canonical_json(self)
        return canonical_json({f.name: getattr(self, f.name) for f in fields(self) if f.name not in left_out})

    @property
    def hash(self) -> str:
        """problem_ir_hash, computed once per instance (a changed problem is a new one: dataclasses.replace)
        and kept as `_hash`: orjson, which writes a problem for the worker (solver/codec.py), skips
        attributes whose names start with "_"."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = sha256_hex(self.canonical_json())
            object.__setattr__(self, "_hash", cached)
        return cached

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "ProblemIR":
        def opt2(v: Any) -> Any:
            return None if v is None else tuple2(v)

        def opt1(v: Any) -> Any:
            return None if v is None else tuple1(v)

        m = doc["model"]
        return ProblemIR(
            template=Template(doc["template"]), binding_id=doc["binding_id"],
            binding_revision=int(doc["binding_revision"]), profile_id=doc["profile_id"],
            profile_version=int(doc["profile_version"]), model_artifact_hash=doc["model_artifact_hash"],
            horizon=int(doc["horizon"]), mv_tags=tuple(doc["mv_tags"]), cv_tags=tuple(doc["cv_tags"]),
            dv_tags=tuple(doc["dv_tags"]),
            model=StateSpace(tuple2(m["A"]), tuple2(m["B"]), tuple2(m["E"]), tuple1(m["f"]), tuple2(m["C"])),
            x0=tuple1(doc["x0"]), u_prev=tuple1(doc["u_prev"]), d=tuple1(doc["d"]), bias=tuple1(doc["bias"]),
            u_lo=tuple1(doc["u_lo"]), u_hi=tuple1(doc["u_hi"]), du_max=tuple1(doc["du_max"]),
            y_lo=tuple1(doc["y_lo"]), y_hi=tuple1(doc["y_hi"]), y_target=tuple1(doc["y_target"]),
            y_weight=tuple1(doc["y_weight"]), move_weight=float(doc["move_weight"]),
            slack_weight=float(doc["slack_weight"]), band=opt1(doc.get("band")),
            u_mean=tuple1(doc["u_mean"]), u_std=tuple1(doc["u_std"]),
            y_mean=tuple1(doc["y_mean"]), y_std=tuple1(doc["y_std"]),
            steady_gain=opt2(doc.get("steady_gain")), steady_dv_gain=opt2(doc.get("steady_dv_gain")),
            steady_offset=opt1(doc.get("steady_offset")),
            **{name: opt1(doc.get(name)) for name in ECONOMIC_FIELDS + ("u_target",)},
            u_target_weight=float(doc.get("u_target_weight", 0.0)),
            y_transform=_transforms(doc.get("y_transform")),
        )


def _transforms(value: Any) -> tuple[CVTransform | None, ...] | None:
    """y_transform from JSON: None, or a list with per CV null or a transform mapping."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ContractError(f"problem.y_transform: expected a list (one entry per CV), got {value!r}")
    return tuple(None if t is None else CVTransform.from_dict(t, f"problem.y_transform[{j}]")
                 for j, t in enumerate(value))


# the economic objective's vectors: all present or all None
ECONOMIC_FIELDS = ("econ_u", "econ_uu", "econ_y", "econ_yy", "target_hold")
OPTIONAL_FIELDS = frozenset(ECONOMIC_FIELDS + ("u_target", "u_target_weight"))
