"""The identified model: train normalisation, the state-space realisation, the quality gates and
the ModelArtifact that records them (normalised units z = (x - mean) / std)."""

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from optimizer_pipeline.contracts.canonical import canonical_json, content_hash, tuple1, tuple2
from optimizer_pipeline.contracts.transform import CVTransform, forward_columns, inverse_columns


# A train std below this means the tag never moved: normalised units are undefined and any distance
# from the training data is infinite (docs/ARCHITECTURE.md, "UQ evidence rules": sigma < 1e-9 -> inf).
MIN_STD = 1e-9


@dataclass(frozen=True)
class Normalisation:
    """Train statistics per tag: z = (x - mean) / std, where a CV with a transform (contracts.transform)
    has x its transformed value and mean / std those of its transformed train values."""

    tags: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    transforms: Mapping[str, CVTransform] = field(default_factory=dict)  # the transformed CVs' tags

    def of(self, tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        index = {t: i for i, t in enumerate(self.tags)}
        idx = [index[t] for t in tags]
        return np.asarray(self.mean, float)[idx], np.asarray(self.std, float)[idx]

    def transforms_of(self, tags: Sequence[str]) -> tuple[CVTransform | None, ...]:
        return tuple(self.transforms.get(t) for t in tags)

    def normalise(self, tags: Sequence[str], values: Any) -> np.ndarray:
        """values (..., len(tags)) in engineering units -> normalised units (through each tag's transform)."""
        mean, std = self.of(tags)
        return (forward_columns(self.transforms_of(tags), values) - mean) / std

    def engineering(self, tags: Sequence[str], z: Any) -> np.ndarray:
        """z (..., len(tags)) in normalised units -> engineering units (through each tag's transform)."""
        mean, std = self.of(tags)
        return inverse_columns(self.transforms_of(tags), mean + std * np.asarray(z, float))

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> "Normalisation":
        return Normalisation(tuple(doc["tags"]), tuple1(doc["mean"]), tuple1(doc["std"]),
                             {tag: CVTransform.from_dict(t, f"normalisation.transforms.{tag}")
                              for tag, t in doc.get("transforms", {}).items()})


@dataclass(frozen=True)
class StateSpace:
    """Affine discrete-time model in normalised units (the ARX realisation).

    x[k+1] = A x[k] + B u[k] + E d[k] + f ;  y[k] = C x[k]
    A (nx, nx), B (nx, nu), E (nx, nd), f (nx,), C (ny, nx).
    u[k] is held during step k; y[k+1] = C x[k+1] is the CV at the end of step k.
    """

    A: tuple[tuple[float, ...], ...]
    B: tuple[tuple[float, ...], ...]
    E: tuple[tuple[float, ...], ...]
    f: tuple[float, ...]
    C: tuple[tuple[float, ...], ...]

    @staticmethod
    def of(A: Any, B: Any, E: Any, f: Any, C: Any) -> "StateSpace":
        A = np.atleast_2d(np.asarray(A, float))
        nx = A.shape[0]
        B = np.asarray(B, float).reshape(nx, -1)
        E = np.asarray(E, float).reshape(nx, -1)
        C = np.asarray(C, float).reshape(-1, nx)
        return StateSpace(tuple2(A), tuple2(B), tuple2(E), tuple1(np.asarray(f, float).reshape(nx)), tuple2(C))

    def __hash__(self) -> int:
        """The fields' hash, computed once per instance and kept as `_hash` (the fields are not changed after
        it is made): model/statespace.py caches its settling horizon, integrators and their outputs by value,
        and the hash of a long numerator's ~15 000 coefficients took ~0.2 ms on each lookup of a solve."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.A, self.B, self.E, self.f, self.C))
            object.__setattr__(self, "_hash", cached)
        return cached

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        nx = len(self.A)
        return (np.asarray(self.A, float).reshape(nx, nx),
                np.asarray(self.B, float).reshape(nx, -1),
                np.asarray(self.E, float).reshape(nx, -1),
                np.asarray(self.f, float).reshape(nx),
                np.asarray(self.C, float).reshape(-1, nx))


@dataclass(frozen=True)
class Gate:
    name: str  # G1 .. G4
    description: str
    value: float | None  # None when not measurable (the description says why; the gate then fails)
    threshold: float
    passed: bool


@dataclass(frozen=True)
class ModelArtifact:
    """The identified model of one binding revision; `artifact_hash` covers every field."""

    binding_id: str
    binding_revision: int
    mv_tags: tuple[str, ...]
    cv_tags: tuple[str, ...]
    dv_tags: tuple[str, ...]
    na: int
    nb: int
    delay: int
    horizon: int  # training horizon P
    sample_period_s: float
    coefficients: Mapping[str, Any]  # ARX parameters in normalised units (model module's layout)
    state_space: StateSpace
    normalisation: Normalisation
    gates: tuple[Gate, ...]
    splits: Mapping[str, tuple[str, ...]]  # train / val / test / live -> run ids
    training_data_hash: str
    selection: Mapping[str, Any] = field(default_factory=dict)  # order choice record
    # steady-state MV gain G (normalised units): gain, singular_values, condition, ill_conditioned and
    # uncertainty (method, replicates, cov per CV row, std; the parts: jackknife_cov, which the gain condition
    # judges, jackknife_std and operating_range)
    # or None (model.artifact.steady_gain_record)
    steady_gain: Mapping[str, Any] = field(default_factory=dict)
    # the step-response matrix in engineering units (model.step_response.step_response_record); None
    # for an artifact identified before it was recorded, whose JSON and hash then stay as they were
    step_response: Mapping[str, Any] | None = None
    # the rows W the held disturbance is fitted over when the evidence's runs need fewer than the model's
    # own rule gives (model.window.supported_window); None: that rule (model.window.held_window)
    disturbance_rows: int | None = None
    # what cleaning flagged in the history the model was identified from (data/flags.py): {"flags": spans
    # {tag, run_id, rule, start_s, end_s, samples} of the train / val / test runs, "exclusions": the ids of
    # the exclusions applied}; None when nothing was flagged or excluded
    cleaning: Mapping[str, Any] | None = None

    def _doc(self) -> dict[str, Any]:
        """The fields as written and hashed: those added later are left out where unset (no step response,
        no CV transforms, the held disturbance's own window, nothing flagged), so such an artifact keeps the
        JSON and hash it had before they existed."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("step_response", "disturbance_rows", "cleaning"):
            if doc[name] is None:
                del doc[name]
        if not self.normalisation.transforms:
            norm = self.normalisation
            doc["normalisation"] = {"tags": norm.tags, "mean": norm.mean, "std": norm.std}
        return doc

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(self._doc()))

    @property
    def artifact_hash(self) -> str:
        """The content hash, computed once per instance (the fields are not changed after it is made:
        a changed artifact is a new instance, dataclasses.replace) and kept as `_artifact_hash` (a
        private name: orjson leaves it out of a dataclass it writes); a solve reads it a dozen times."""
        cached = self.__dict__.get("_artifact_hash")
        if cached is None:
            cached = content_hash(self._doc())
            object.__setattr__(self, "_artifact_hash", cached)
        return cached

    @property
    def gates_passed(self) -> bool:
        return all(g.passed for g in self.gates)

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "ModelArtifact":
        ss = doc["state_space"]
        return ModelArtifact(
            binding_id=doc["binding_id"], binding_revision=int(doc["binding_revision"]),
            mv_tags=tuple(doc["mv_tags"]), cv_tags=tuple(doc["cv_tags"]), dv_tags=tuple(doc["dv_tags"]),
            na=int(doc["na"]), nb=int(doc["nb"]), delay=int(doc["delay"]), horizon=int(doc["horizon"]),
            sample_period_s=float(doc["sample_period_s"]), coefficients=doc["coefficients"],
            state_space=StateSpace(tuple2(ss["A"]), tuple2(ss["B"]), tuple2(ss["E"]), tuple1(ss["f"]), tuple2(ss["C"])),
            normalisation=Normalisation.from_doc(doc["normalisation"]),
            gates=tuple(Gate(**g) for g in doc["gates"]),
            splits={k: tuple(v) for k, v in doc["splits"].items()},
            training_data_hash=doc["training_data_hash"], selection=doc.get("selection", {}),
            steady_gain=doc.get("steady_gain", {}), step_response=doc.get("step_response"),
            disturbance_rows=None if doc.get("disturbance_rows") is None else int(doc["disturbance_rows"]),
            cleaning=doc.get("cleaning"),
        )
