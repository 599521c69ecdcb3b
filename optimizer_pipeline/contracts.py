"""Contracts: the frozen vocabulary of the product (DESIGN.md "Vocabulary") and its canonical JSON.

Units are stated per field. "Engineering units" are the plant's own; "normalised units" are
z = (x - mean) / std with the train statistics of the model artifact.
"""

import hashlib
import json
import math
import operator
import re
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from itertools import chain, repeat
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import orjson

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class ContractError(ValueError):
    """A user-supplied document (binding file, frame, setting) breaks a contract.

    The message names the source and the field; it is meant to be shown as one line to a user.
    """


# --------------------------------------------------------------------------- canonical JSON


def _canonical(value: Any, path: str) -> Any:
    # Exact-type fast paths first (this runs on every solver frame); the error path text is built
    # only when a value is refused.
    kind = type(value)
    if kind is float:
        if value != value or value in (math.inf, -math.inf):
            raise ContractError(f"canonical JSON: non-finite number {value!r} at {path or '<root>'}")
        return 0.0 if value == 0.0 else value  # -0.0 and 0.0 are one value
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is tuple or kind is list:
        return [_canonical(v, f"{path}[{i}]") if type(v) is not float or not math.isfinite(v) or v == 0.0
                else v for i, v in enumerate(value)]
    if kind is dict:
        return {str(k): _canonical(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _canonical(float(value), path)
    if isinstance(value, np.ndarray):
        return _canonical(value.tolist(), path)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _canonical(getattr(value, f.name), f"{path}.{f.name}") for f in fields(value)}
    raise ContractError(f"canonical JSON: unsupported type {type(value).__name__} at {path or '<root>'}")


def _reference_json(value: Any, path: str) -> str:
    """canonical JSON text of `value` the plain way: normalise the tree, then json.dumps it (the definition)."""
    return json.dumps(_canonical(value, path), sort_keys=True, separators=(",", ":"), allow_nan=False)


# JSON text of tuples (of tuples) of exact finite floats already written: model matrices, limits and
# scalings repeat from one re-solve to the next, and float repr (~0.4 us a number) is most of the
# time of a ProblemIR's text. Equal keys give equal text: only exact floats are stored, NaN never
# is, and -0.0 == 0.0 are written alike.
_FLOATS_TEXT: dict[tuple, str] = {}
_FLOATS_TEXT_MAX = 4096  # entries; the memo starts over when full
_FLOAT_ONLY, _STR_ONLY, _TUPLE_ONLY, _SEQUENCES = {float}, {str}, {tuple}, {tuple, list}
# per dataclass type: None when the reference path treats its instances as something else (a str, a
# Mapping, ... subclass), else (field names in declaration order, (name, JSON key text) sorted by name)
_DATACLASS_KEYS: dict[type, tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None] = {}
_NOT_PLAIN_DATACLASS = (Enum, str, int, float, np.bool_, np.integer, np.floating, np.ndarray, Mapping, list, tuple)
_encode_str = json.encoder.encode_basestring_ascii  # json.dumps's own string writer (ensure_ascii)


def _remember(key: tuple, text: str) -> None:
    if len(_FLOATS_TEXT) >= _FLOATS_TEXT_MAX:
        _FLOATS_TEXT.clear()
    _FLOATS_TEXT[key] = text


def _floats_text(values: tuple | list) -> str | None:
    """JSON text of a list / tuple of exact finite floats; None when it is not one."""
    if not values:
        return "[]"
    if set(map(type, values)) != _FLOAT_ONLY:
        return None
    is_tuple = type(values) is tuple  # hashable: memoised
    if is_tuple:
        text = _FLOATS_TEXT.get(values)
        if text is not None:
            return text
    plain = map(operator.add, values, repeat(0.0)) if 0.0 in values else values  # -0.0 + 0.0 is 0.0, x + 0.0 is x
    text = "[" + ",".join(map(float.__repr__, plain)) + "]"
    if "n" in text:  # "nan" / "inf": refused by the reference path, which names where
        return None
    if is_tuple:
        _remember(values, text)
    return text


def _rows_text(rows: tuple | list) -> str | None:
    """JSON text of a list / tuple of lists / tuples of exact finite floats; None when it is not one."""
    is_tuple = type(rows) is tuple and set(map(type, rows)) == _TUPLE_ONLY
    if is_tuple and set(map(type, chain.from_iterable(rows))) <= _FLOAT_ONLY:  # hashable, exact floats: memoised
        text = _FLOATS_TEXT.get(rows)
        if text is not None:
            return text
    else:
        is_tuple = False
    texts = list(map(_floats_text, rows))
    if None in texts:
        return None
    text = "[" + ",".join(texts) + "]"
    if is_tuple:
        _remember(rows, text)
    return text


def _dataclass_keys(kind: type) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None:
    """`_DATACLASS_KEYS[kind]`, computed on first use."""
    if kind not in _DATACLASS_KEYS:
        names = tuple(f.name for f in fields(kind))
        _DATACLASS_KEYS[kind] = None if issubclass(kind, _NOT_PLAIN_DATACLASS) else (
            names, tuple((name, _encode_str(name)) for name in sorted(names)))
    return _DATACLASS_KEYS[kind]


def _json_text(value: Any, path: str) -> str:
    """canonical JSON text of `value`, byte for byte `_reference_json`'s; faster on dataclasses, exact
    scalars, str-valued enums, tuples / lists of exact strings, of exact floats or of rows of exact
    floats. Anything else, and anything refused, goes
    the reference way, which also raises the reference's error for a non-finite number or an
    unsupported type, at the same place (fields are visited in declaration order, as there)."""
    kind = type(value)
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value + 0.0)
    elif kind is str:
        return _encode_str(value)
    elif kind is int:
        return int.__repr__(value)
    elif kind is bool:
        return "true" if value else "false"
    elif value is None:
        return "null"
    elif kind is tuple or kind is list:
        kinds = set(map(type, value))
        if kinds <= _FLOAT_ONLY:
            text = _floats_text(value)
            if text is not None:
                return text
        elif kinds <= _SEQUENCES:  # rows
            text = _rows_text(value)
            if text is not None:
                return text
        elif kinds == _STR_ONLY:
            return "[" + ",".join(map(_encode_str, value)) + "]"
    elif isinstance(value, Enum) and type(value.value) is str:
        return _encode_str(value.value)
    elif hasattr(value, "__dataclass_fields__") and not isinstance(value, type) and _dataclass_keys(kind):
        names, ordered = _dataclass_keys(kind)
        texts = {name: _json_text(getattr(value, name), f"{path}.{name}") for name in names}
        return "{" + ",".join(key + ":" + texts[name] for name, key in ordered) + "}"
    return _reference_json(value, path)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, floats as Python's shortest round-trip repr; NaN / inf rejected."""
    return _json_text(value, "")


_isfinite = math.isfinite
_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})  # exact types: enums and numpy scalars go the long way


def all_finite(value: Any) -> bool:
    """Whether every number in `value` is finite (no NaN, no inf); exact. ~35 us on a SolveResult, where
    canonical_json's walk takes ~0.6-1.2 ms and an item-by-item walk ~0.1 ms.

    Walks dataclasses, mappings, lists, tuples and numpy arrays; other leaves (str, int, bool, None,
    enums) cannot be non-finite. A sequence of numbers, or of rows of numbers, whose sum is finite
    holds only finite numbers (a NaN or inf addend makes every later partial sum non-finite), so one
    C-level sum clears it; a sum that is not finite (or fails: None, strings, deeper nesting, an int
    too large for a float) sends the walk item by item, which decides exactly.
    """
    kind = type(value)
    if kind is float:
        return _isfinite(value)
    if kind in _PLAIN_LEAVES:
        return True
    if kind is tuple or kind is list:
        if not value:
            return True
        try:
            rows = type(value[0]) in (tuple, list)
            if _isfinite(sum(chain.from_iterable(value)) if rows else sum(value)):
                return True
        except (TypeError, OverflowError):
            pass
        return all(map(all_finite, value))
    if kind is dict:
        return all(map(all_finite, value.values()))
    if hasattr(value, "__dataclass_fields__"):
        # orjson writes a dataclass's __dict__ (its slots when it has no __dict__)
        if hasattr(value, "__dict__"):
            return all(map(all_finite, value.__dict__.values()))
        return all(all_finite(getattr(value, name)) for name in value.__dataclass_fields__)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            return bool(np.isfinite(value).all())
        return value.dtype.kind != "O" or all_finite(value.tolist())
    if isinstance(value, (float, np.floating)):
        return bool(np.isfinite(value))
    if isinstance(value, (list, tuple)):
        return all_finite(list(value))
    if isinstance(value, dict):
        return all_finite(dict(value))
    return True


def fast_json(value: Any) -> bytes:
    """Compact JSON bytes of `value` by orjson (~10x faster than canonical_json): the same values as
    canonical_json, not its bytes (dataclass field order, orjson's shortest float text), for what
    nobody hashes: solver protocol frames, the ledger's report columns.

    orjson writes NaN / inf as `null` without a word: `all_finite` refuses them first, and
    canonical_json raises its ContractError naming where. A value orjson cannot write (an int beyond
    64 bits, an unknown type) is written by canonical_json, or refused by it with a ContractError.
    """
    if not all_finite(value):
        canonical_json(value)  # raises, naming the path of the NaN / inf
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return canonical_json(value).encode()

def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def _tuple2(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in rows)


def _tuple1(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in values)


# --------------------------------------------------------------------------- statuses


class Template(str, Enum):
    LINEAR_MPC = "linear_mpc_quadratic@1"
    STEADY_RESPONSE = "steady_response@1"


class RecommendationStatus(str, Enum):
    VERIFIED = "verified"
    UNVERIFIED = "unverified"
    REJECTED = "rejected"
    EXPIRED = "expired"

    @property
    def label(self) -> str:
        return _STATUS_LABELS[self]


_STATUS_LABELS = {
    RecommendationStatus.VERIFIED: "Verified: evidence supports acting on this plan",
    RecommendationStatus.UNVERIFIED: "Unverified: feasible plan, but the evidence is incomplete; review before acting",
    RecommendationStatus.REJECTED: "Rejected: no feasible plan; do not act",
    RecommendationStatus.EXPIRED: "Expired: superseded or out of date; do not act",
}


class OutcomeVerdict(str, Enum):
    CONFIRMED = "confirmed"
    DEVIATED = "deviated"
    INCONCLUSIVE = "inconclusive"


class EvidenceSource(str, Enum):
    SIMULATION = "simulation"
    REAL = "real"
    UNASSESSED = "unassessed"


# --------------------------------------------------------------------------- binding


@dataclass(frozen=True)
class MVSpec:
    tag: str
    lo: float
    hi: float
    max_move: float  # engineering units per sample


@dataclass(frozen=True)
class CVSpec:
    tag: str
    lo: float
    hi: float
    target: float
    weight: float = 1.0


@dataclass(frozen=True)
class DVSpec:
    tag: str


@dataclass(frozen=True)
class ModelSettings:
    """ARX orders; None means "choose from the data" (the choice is recorded in the artifact)."""

    na: int | None = None
    nb: int | None = None
    delay: int | None = None  # input delay in samples, >= 1: u[t - delay] is the newest input seen by y[t]
    horizon: int = 10  # training horizon P (samples); also the UQ block length


@dataclass(frozen=True)
class Profile:
    id: str
    version: int
    template: Template
    horizon: int  # optimisation horizon N (samples); 1 for steady_response@1 is allowed
    move_weight: float = 0.1
    valid_for_s: float = 3600.0


@dataclass(frozen=True)
class BindingSpec:
    id: str
    sample_period_s: float
    mvs: tuple[MVSpec, ...]
    cvs: tuple[CVSpec, ...]
    dvs: tuple[DVSpec, ...]
    model: ModelSettings
    profile: Profile
    unit: str = ""

    @property
    def mv_tags(self) -> tuple[str, ...]:
        return tuple(m.tag for m in self.mvs)

    @property
    def cv_tags(self) -> tuple[str, ...]:
        return tuple(c.tag for c in self.cvs)

    @property
    def dv_tags(self) -> tuple[str, ...]:
        return tuple(d.tag for d in self.dvs)

    @property
    def tags(self) -> tuple[str, ...]:
        return self.mv_tags + self.cv_tags + self.dv_tags

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(asdict(self)))

    def canonical_json(self) -> str:
        return canonical_json(asdict(self))

    @property
    def spec_hash(self) -> str:
        return sha256_hex(self.canonical_json())


def _field(doc: Mapping[str, Any], key: str, where: str, *, required: bool = True, default: Any = None) -> Any:
    if key not in doc or doc[key] is None:
        if required:
            raise ContractError(f"{where}.{key}: required field is missing")
        return default
    return doc[key]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"{where}: expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ContractError(f"{where}: expected a finite number, got {value!r}")
    return number


def _integer(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise ContractError(f"{where}: must be >= {minimum}, got {value}")
    return int(value)


def _positive(value: Any, where: str) -> float:
    number = _number(value, where)
    if number <= 0:
        raise ContractError(f"{where}: must be > 0, got {value!r}")
    return number


def _identifier(value: Any, where: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ContractError(f"{where}: {value!r} does not match [a-z0-9][a-z0-9_-]{{0,62}}")
    return value


def _tag(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ContractError(f"{where}: expected a non-empty tag name, got {value!r}")
    if value in ("run_id", "timestamp"):
        raise ContractError(f"{where}: tag name {value!r} is reserved for the history file")
    return value


def _limits(doc: Mapping[str, Any], where: str) -> tuple[float, float]:
    lo = _number(_field(doc, "lo", where), f"{where}.lo")
    hi = _number(_field(doc, "hi", where), f"{where}.hi")
    if not lo < hi:
        raise ContractError(f"{where}: lo ({lo:g}) must be < hi ({hi:g})")
    return lo, hi


def _items(doc: Mapping[str, Any], key: str, where: str, *, required: bool) -> list[Mapping[str, Any]]:
    items = _field(doc, key, where, required=required, default=[])
    if not isinstance(items, list):
        raise ContractError(f"{where}.{key}: expected a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ContractError(f"{where}.{key}[{i}]: expected a mapping like {{tag: ...}}, got {item!r}")
    return items


def binding_from_dict(doc: Any, source: str = "binding") -> BindingSpec:
    """Validate a binding document (DESIGN.md "Binding file") into a BindingSpec.

    Raises ContractError whose message starts with `source` and names the offending field.
    """
    if not isinstance(doc, Mapping):
        raise ContractError(f"{source}: expected a mapping at the top level, got {type(doc).__name__}")
    w = source
    binding_id = _identifier(_field(doc, "id", w), f"{w}.id")
    period = _positive(_field(doc, "sample_period_s", w), f"{w}.sample_period_s")
    unit = _field(doc, "unit", w, required=False, default="")
    if not isinstance(unit, str):
        raise ContractError(f"{w}.unit: expected text, got {unit!r}")

    mvs = []
    for i, item in enumerate(_items(doc, "mvs", w, required=True)):
        at = f"{w}.mvs[{i}]"
        lo, hi = _limits(item, at)
        mvs.append(MVSpec(_tag(_field(item, "tag", at), f"{at}.tag"), lo, hi,
                          _positive(_field(item, "max_move", at), f"{at}.max_move")))
    if not mvs:
        raise ContractError(f"{w}.mvs: at least one MV is required")

    cvs = []
    for i, item in enumerate(_items(doc, "cvs", w, required=True)):
        at = f"{w}.cvs[{i}]"
        lo, hi = _limits(item, at)
        target = _number(_field(item, "target", at), f"{at}.target")
        if not lo <= target <= hi:
            raise ContractError(f"{at}.target: {target:g} is outside the limits [{lo:g}, {hi:g}]")
        weight = _number(_field(item, "weight", at, required=False, default=1.0), f"{at}.weight")
        if weight < 0:
            raise ContractError(f"{at}.weight: must be >= 0, got {weight:g}")
        cvs.append(CVSpec(_tag(_field(item, "tag", at), f"{at}.tag"), lo, hi, target, weight))
    if not cvs:
        raise ContractError(f"{w}.cvs: at least one CV is required")

    dvs = [DVSpec(_tag(_field(item, "tag", f"{w}.dvs[{i}]"), f"{w}.dvs[{i}].tag"))
           for i, item in enumerate(_items(doc, "dvs", w, required=False))]

    seen: dict[str, str] = {}
    for kind, specs in (("mvs", mvs), ("cvs", cvs), ("dvs", dvs)):
        for i, spec in enumerate(specs):
            if spec.tag in seen:
                raise ContractError(f"{w}.{kind}[{i}].tag: {spec.tag!r} is already used by {seen[spec.tag]}")
            seen[spec.tag] = f"{kind}[{i}]"

    model_doc = _field(doc, "model", w, required=False, default={})
    if not isinstance(model_doc, Mapping):
        raise ContractError(f"{w}.model: expected a mapping, got {model_doc!r}")
    at = f"{w}.model"
    na = _field(model_doc, "na", at, required=False)
    nb = _field(model_doc, "nb", at, required=False)
    delay = _field(model_doc, "delay", at, required=False)
    model = ModelSettings(
        na=None if na is None else _integer(na, f"{at}.na", 1),
        nb=None if nb is None else _integer(nb, f"{at}.nb", 1),
        delay=None if delay is None else _integer(delay, f"{at}.delay", 1),
        horizon=_integer(_field(model_doc, "horizon", at, required=False, default=10), f"{at}.horizon", 1),
    )

    profile_doc = _field(doc, "profile", w)
    if not isinstance(profile_doc, Mapping):
        raise ContractError(f"{w}.profile: expected a mapping, got {profile_doc!r}")
    at = f"{w}.profile"
    template_text = _field(profile_doc, "template", at)
    try:
        template = Template(template_text)
    except ValueError:
        known = ", ".join(t.value for t in Template)
        raise ContractError(f"{at}.template: unknown template {template_text!r} (known: {known})") from None
    profile = Profile(
        id=_identifier(_field(profile_doc, "id", at), f"{at}.id"),
        version=_integer(_field(profile_doc, "version", at, required=False, default=1), f"{at}.version", 1),
        template=template,
        horizon=_integer(_field(profile_doc, "horizon", at, required=False,
                                default=1 if template is Template.STEADY_RESPONSE else 30), f"{at}.horizon", 1),
        move_weight=_number(_field(profile_doc, "move_weight", at, required=False, default=0.1), f"{at}.move_weight"),
        valid_for_s=_positive(_field(profile_doc, "valid_for_s", at, required=False, default=3600), f"{at}.valid_for_s"),
    )
    if profile.move_weight < 0:
        raise ContractError(f"{at}.move_weight: must be >= 0, got {profile.move_weight:g}")

    return BindingSpec(id=binding_id, sample_period_s=period, mvs=tuple(mvs), cvs=tuple(cvs), dvs=tuple(dvs),
                       model=model, profile=profile, unit=unit)


def load_binding_file(path: str | Path) -> BindingSpec:
    """Read a YAML or JSON binding file; every failure is a ContractError naming the file."""
    import yaml  # local: only file loading needs it

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ContractError(f"{path}: binding file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path}: cannot read binding file ({exc})") from None
    try:
        doc = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ContractError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} ({detail})") from None
    if doc is None:
        raise ContractError(f"{path}: binding file is empty")
    return binding_from_dict(doc, source=str(path))


def binding_from_json(text: str, source: str = "binding") -> BindingSpec:
    return binding_from_dict(json.loads(text), source=source)


# --------------------------------------------------------------------------- history


@dataclass(frozen=True, eq=False)
class RunSeries:
    """One run aligned to the binding's sample grid, engineering units.

    t: (n,) seconds since epoch; u: (n, n_mv); y: (n, n_cv); d: (n, n_dv) (n_dv may be 0).
    Row k holds the samples at t[k]; u[k] is the MV value held from t[k] to t[k+1].
    """

    run_id: str
    t: np.ndarray
    u: np.ndarray
    y: np.ndarray
    d: np.ndarray

    def __len__(self) -> int:
        return int(self.t.shape[0])


# A train std below this means the tag never moved: normalised units are undefined and any distance
# from the training data is infinite (DESIGN UQ rule "sigma < 1e-9 -> inf").
MIN_STD = 1e-9


@dataclass(frozen=True)
class Normalisation:
    """Train statistics per tag: z = (x - mean) / std."""

    tags: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def of(self, tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        index = {t: i for i, t in enumerate(self.tags)}
        idx = [index[t] for t in tags]
        return np.asarray(self.mean, float)[idx], np.asarray(self.std, float)[idx]


# --------------------------------------------------------------------------- model


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
        return StateSpace(_tuple2(A), _tuple2(B), _tuple2(E), _tuple1(np.asarray(f, float).reshape(nx)), _tuple2(C))

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

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(self))

    @property
    def artifact_hash(self) -> str:
        return content_hash(self)

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
            state_space=StateSpace(_tuple2(ss["A"]), _tuple2(ss["B"]), _tuple2(ss["E"]), _tuple1(ss["f"]), _tuple2(ss["C"])),
            normalisation=Normalisation(tuple(doc["normalisation"]["tags"]), _tuple1(doc["normalisation"]["mean"]),
                                        _tuple1(doc["normalisation"]["std"])),
            gates=tuple(Gate(**g) for g in doc["gates"]),
            splits={k: tuple(v) for k, v in doc["splits"].items()},
            training_data_hash=doc["training_data_hash"], selection=doc.get("selection", {}),
        )


# --------------------------------------------------------------------------- problem / solve


@dataclass(frozen=True)
class ProblemIR:
    """A fully compiled optimisation problem in normalised model units.

    Dynamics: `model` (x+ = A x + B u + E d + f, y = C x) with the output bias added to every
    predicted y (offset-free: bias = measured - predicted now, held over the horizon).
    Step k holds u[k] (k = 0 starts now) and predicts y at the end of step k.
    For steady_response@1 the steady-state relation y_ss = G u + Gd d + y0 + bias is used
    (`steady_gain` G (ny, nu), `steady_dv_gain` Gd (ny, nd), `steady_offset` y0 (ny,)).
    Limits `y_lo` / `y_hi` are soft (slack penalty `slack_weight`); `u_lo` / `u_hi` / `du_max` hard.
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

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(self))

    def canonical_json(self) -> str:
        return canonical_json(self)

    @property
    def hash(self) -> str:
        return sha256_hex(self.canonical_json())

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "ProblemIR":
        def opt2(v: Any) -> Any:
            return None if v is None else _tuple2(v)

        def opt1(v: Any) -> Any:
            return None if v is None else _tuple1(v)

        m = doc["model"]
        return ProblemIR(
            template=Template(doc["template"]), binding_id=doc["binding_id"],
            binding_revision=int(doc["binding_revision"]), profile_id=doc["profile_id"],
            profile_version=int(doc["profile_version"]), model_artifact_hash=doc["model_artifact_hash"],
            horizon=int(doc["horizon"]), mv_tags=tuple(doc["mv_tags"]), cv_tags=tuple(doc["cv_tags"]),
            dv_tags=tuple(doc["dv_tags"]),
            model=StateSpace(_tuple2(m["A"]), _tuple2(m["B"]), _tuple2(m["E"]), _tuple1(m["f"]), _tuple2(m["C"])),
            x0=_tuple1(doc["x0"]), u_prev=_tuple1(doc["u_prev"]), d=_tuple1(doc["d"]), bias=_tuple1(doc["bias"]),
            u_lo=_tuple1(doc["u_lo"]), u_hi=_tuple1(doc["u_hi"]), du_max=_tuple1(doc["du_max"]),
            y_lo=_tuple1(doc["y_lo"]), y_hi=_tuple1(doc["y_hi"]), y_target=_tuple1(doc["y_target"]),
            y_weight=_tuple1(doc["y_weight"]), move_weight=float(doc["move_weight"]),
            slack_weight=float(doc["slack_weight"]), band=opt1(doc.get("band")),
            u_mean=_tuple1(doc["u_mean"]), u_std=_tuple1(doc["u_std"]),
            y_mean=_tuple1(doc["y_mean"]), y_std=_tuple1(doc["y_std"]),
            steady_gain=opt2(doc.get("steady_gain")), steady_dv_gain=opt2(doc.get("steady_dv_gain")),
            steady_offset=opt1(doc.get("steady_offset")),
        )


class CandidateKind(str, Enum):
    HOLD = "hold"  # seq 0: current MVs held
    NOMINAL = "nominal"  # seq 1
    ROBUST = "robust"  # seq 2: CV limits tightened by the UQ band


@dataclass(frozen=True)
class SolveCandidate:
    """One solution of a ProblemIR. controls (N, nu) and predicted (N, ny) in engineering units."""

    seq: int
    kind: CandidateKind
    solver_status: str  # osqp status text, or "hold" for the baseline
    controls: tuple[tuple[float, ...], ...]
    predicted: tuple[tuple[float, ...], ...]
    cost: float | None  # solver objective (normalised units, constant terms included)
    constraints: Mapping[str, Any]  # solver-side constraint report (slack used, ...)
    feasible: bool = False  # set by the verifier
    verified: bool = False  # feasible and independent cost agrees
    independent_cost: float | None = None
    verify_report: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "SolveCandidate":
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        return SolveCandidate(
            seq=int(doc["seq"]), kind=CandidateKind(doc["kind"]), solver_status=doc["solver_status"],
            controls=_tuple2(doc["controls"]), predicted=_tuple2(doc["predicted"]), cost=opt(doc.get("cost")),
            constraints=doc.get("constraints", {}), feasible=bool(doc.get("feasible", False)),
            verified=bool(doc.get("verified", False)), independent_cost=opt(doc.get("independent_cost")),
            verify_report=doc.get("verify_report", {}))


@dataclass(frozen=True)
class SolveResult:
    problem_ir_hash: str
    ok: bool
    candidates: tuple[SolveCandidate, ...]
    diagnostics: Mapping[str, Any]
    error_code: str | None = None
    error_message: str | None = None

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "SolveResult":
        """The inverse of canonical_json(result) (what a solver worker sends back)."""
        return SolveResult(
            problem_ir_hash=doc["problem_ir_hash"], ok=bool(doc["ok"]),
            candidates=tuple(SolveCandidate.from_dict(c) for c in doc.get("candidates", ())),
            diagnostics=doc.get("diagnostics", {}), error_code=doc.get("error_code"),
            error_message=doc.get("error_message"))


# --------------------------------------------------------------------------- recommendation / outcome


@dataclass(frozen=True)
class Condition:
    """One condition for `verified`: the value it was judged on, its limit, whether it holds, and the
    user-facing reason listed in `reasons` when it does not."""

    name: str
    value: str
    limit: str
    holds: bool
    reason: str = ""


@dataclass(frozen=True)
class Recommendation:
    """The candidate chosen for action (DESIGN.md "Recommendation JSON")."""

    id: str
    binding_id: str
    binding_revision: int
    run_id: str
    candidate_id: str | None
    template: Template
    status: RecommendationStatus
    reasons: tuple[str, ...]
    created_at: str  # ISO 8601 UTC
    valid_until: str
    mv_tags: tuple[str, ...]
    cv_tags: tuple[str, ...]
    controls: tuple[tuple[float, ...], ...]
    predicted: tuple[tuple[float, ...], ...]
    band: tuple[float | None, ...]
    cost: float | None
    independent_cost: float | None
    problem_ir_hash: str
    model_artifact_hash: str
    evidence: Mapping[str, Any]

    @property
    def status_label(self) -> str:
        return self.status.label

    def to_json_dict(self) -> dict[str, Any]:
        doc = json.loads(canonical_json(self))
        doc["status_label"] = self.status_label
        return doc


@dataclass(frozen=True)
class Outcome:
    id: str
    recommendation_id: str
    binding_id: str
    applied_at: str
    observed: Mapping[str, Any]
    delta: Mapping[str, Any]
    verdict: OutcomeVerdict | None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class HistorySplit:
    """Cleaned runs of one binding split by run (never by row); normalisation from train only.

    `live` is the run with the latest timestamp (excluded from train / val / test): its last row
    is "now". `report` lists every dropped / split run with its reason (shown in the UI).
    `data_hash` is a sha256 over the cleaned samples of every split (for the artifact).
    """

    train: tuple[RunSeries, ...]
    val: tuple[RunSeries, ...]
    test: tuple[RunSeries, ...]
    live: RunSeries | None
    normalisation: Normalisation
    report: Mapping[str, Any]
    data_hash: str


# --------------------------------------------------------------------------- time


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with an explicit offset, seconds precision kept to microseconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat()


def parse_iso_utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
