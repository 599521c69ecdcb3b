"""The binding: which plant tags an optimiser reads and moves, their limits, the model settings and
the optimisation profile (DESIGN.md "Binding file"), validated from a YAML / JSON document.

Units: limits, targets and max moves in the plant's engineering units; max_move per sample.
"""

import json
import math
import re
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from optimizer_pipeline.contracts.canonical import ContractError, canonical_json, sha256_hex

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class Template(str, Enum):
    LINEAR_MPC = "linear_mpc_quadratic@1"
    STEADY_RESPONSE = "steady_response@1"


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
