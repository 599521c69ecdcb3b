"""The binding: which plant tags an optimiser reads and moves, their limits, the model settings and
the optimisation profile (docs/ARCHITECTURE.md, "Binding file"), validated from a YAML / JSON document;
how its tags are wired to an OPC UA server (its `opcua` section) is contracts/wiring.py's.

Units: limits, targets and max moves in the plant's engineering units; max_move per sample.
Economic costs (optional): `cost` per engineering unit and `cost_quadratic` per unit squared of an
MV or a CV at steady state, in whatever money-per-time unit the plant uses (a profit is a negative
cost); a CV without `target` is only kept inside [lo, hi] (optimizer_pipeline/economics.py).
"""

import json
import re
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from optimizer_pipeline.contracts.canonical import ContractError, canonical_json, sha256_hex
from optimizer_pipeline.contracts.transform import KINDS, CVTransform
from optimizer_pipeline.contracts.wiring import OpcUaWiring, wiring_from_dict
from optimizer_pipeline.validation import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    Interval,
    bool_rule,
    check_choice,
    check_integer,
    check_keys,
    check_list,
    check_mapping,
    check_match,
    check_number,
    check_ordered,
    check_rule,
    check_text,
    get_field,
    refuse,
)

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
    cost: float = 0.0  # economic cost per engineering unit at steady state
    cost_quadratic: float = 0.0  # economic cost per engineering unit squared, >= 0


@dataclass(frozen=True)
class CVSpec:
    tag: str
    lo: float
    hi: float
    target: float | None  # None: kept inside [lo, hi] only
    weight: float = 1.0
    cost: float = 0.0
    cost_quadratic: float = 0.0
    transform: CVTransform | None = None  # identified and planned in transformed units (contracts.transform)
    integrating: bool = False  # a level or inventory: integrates its inputs' imbalance (model/fit.py)
    range: tuple[float, float] | None = None  # the transmitter's range: a value at its end is pinned (data/flags.py)


@dataclass(frozen=True)
class DVSpec:
    tag: str
    range: tuple[float, float] | None = None  # the transmitter's range (data/flags.py)


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
    opcua: OpcUaWiring | None = None  # wiring, not model (contracts/wiring.py)

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

    @property
    def has_costs(self) -> bool:
        """Whether any MV or CV carries an economic cost."""
        return any(s.cost or s.cost_quadratic for s in self.mvs + self.cvs)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.canonical_json())

    def canonical_json(self) -> str:
        """The spec as canonical JSON; zero costs, absent CV transforms and ranges are left out, so a binding
        written before they existed keeps its hash (and its revision), and so is the OPC UA wiring (not
        the model: see OpcUaWiring)."""
        doc = asdict(self)
        del doc["opcua"]
        for kind in ("mvs", "cvs"):
            for item in doc[kind]:
                for key in COST_FIELDS:
                    if not item[key]:
                        del item[key]
                if kind == "cvs" and item["transform"] is None:
                    del item["transform"]
                if kind == "cvs" and not item["integrating"]:
                    del item["integrating"]
        for item in doc["cvs"] + doc["dvs"]:
            if item["range"] is None:
                del item["range"]
        return canonical_json(doc)

    @property
    def spec_hash(self) -> str:
        return sha256_hex(self.canonical_json())


COST_FIELDS = ("cost", "cost_quadratic")


def _keys(spec: type) -> tuple[str, ...]:
    """The keys a binding document may give for `spec`: its dataclass fields."""
    return tuple(f.name for f in fields(spec))


# The required keys of each level (the rest of _keys(...) is optional); any other key is refused.
REQUIRED_KEYS = {BindingSpec: ("id", "sample_period_s", "mvs", "cvs", "profile"),
                 MVSpec: ("tag", "lo", "hi", "max_move"), CVSpec: ("tag", "lo", "hi"), DVSpec: ("tag",),
                 ModelSettings: (), Profile: ("id", "template"), CVTransform: ("kind", "lo", "hi")}


def _check_keys(doc: Mapping[str, Any], spec: type, where: str) -> None:
    check_keys(doc, _keys(spec), where, required=REQUIRED_KEYS[spec])

# the history file's key columns (data/ingest.py RUN_ID, TIMESTAMP): not available as tag names
RESERVED_TAGS = ("run_id", "timestamp")


def _tag(value: Any, where: str) -> str:
    tag = check_text(value, where, what="a non-empty tag name", empty=False)
    if tag in RESERVED_TAGS:
        refuse(where, f"a tag name other than {' and '.join(map(repr, RESERVED_TAGS))} (the history file's columns)",
               tag)
    return tag


def _items(doc: Mapping[str, Any], key: str, spec: type, where: str, *,
           required: bool) -> list[Mapping[str, Any]]:
    """doc[key]: a list of mappings with the keys of `spec` ([] when absent and not required)."""
    items = check_list(get_field(doc, key, where) if required else get_field(doc, key, where, []), f"{where}.{key}")
    for i, item in enumerate(items):
        check_mapping(item, f"{where}.{key}[{i}]", what="a mapping like {tag: ...}")
        _check_keys(item, spec, f"{where}.{key}[{i}]")
    return items


def _limits(doc: Mapping[str, Any], where: str) -> tuple[float, float]:
    lo = check_number(get_field(doc, "lo", where), f"{where}.lo")
    hi = check_number(get_field(doc, "hi", where), f"{where}.hi")
    check_ordered(lo, hi, where, strict=True)
    return lo, hi


def _costs(doc: Mapping[str, Any], where: str) -> dict[str, float]:
    """The optional economic costs of an MV / CV item: cost any number, cost_quadratic >= 0 (convex)."""
    return {"cost": check_number(get_field(doc, "cost", where, 0.0), f"{where}.cost"),
            "cost_quadratic": check_number(get_field(doc, "cost_quadratic", where, 0.0), f"{where}.cost_quadratic",
                                           NON_NEGATIVE)}


def _transform(item: Mapping[str, Any], lo: float, hi: float, costs: Mapping[str, float],
               where: str) -> CVTransform | None:
    """A CV's optional `transform` (contracts.transform): kind, and the limits lo < hi the CV saturates
    toward, with the CV's own [lo, hi] strictly inside them (its limits and target must exist in
    transformed units). Economic costs on a transformed CV are refused: its steady-state cost is not
    quadratic in the units the problem is solved in."""
    doc = get_field(item, "transform", where, None)
    if doc is None:
        return None
    at = f"{where}.transform"
    check_mapping(doc, at, what="a mapping like {kind: logit, lo: ..., hi: ...}")
    _check_keys(doc, CVTransform, at)
    kind = check_choice(get_field(doc, "kind", at), list(KINDS), f"{at}.kind", what="transform kind")
    t_lo, t_hi = _limits(doc, at)
    if not (t_lo < lo and hi < t_hi):
        refuse(at, f"limits outside the CV's own [{lo:g}, {hi:g}] (the CV saturates toward them and never "
                   "reaches them)", None, got=f"[{t_lo:g}, {t_hi:g}]")
    for key, value in costs.items():
        if value:
            raise ContractError(f"{where}.{key}: an economic cost on a transformed CV is not supported (its "
                                "steady-state cost is not quadratic in the transformed units the problem is solved in)")
    return CVTransform(kind, t_lo, t_hi)


def _range(item: Mapping[str, Any], where: str,
           limits: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """A CV's or DV's optional transmitter `range` [lo, hi], lo < hi: values at its ends are pinned, not
    measured (data/flags.py). A CV's limits lie inside it (a limit beyond it could never be measured)."""
    value = get_field(item, "range", where, None)
    if value is None:
        return None
    at = f"{where}.range"
    pair = check_list(value, at)
    if len(pair) != 2:
        refuse(at, "two numbers [lo, hi], the transmitter's range", value)
    lo, hi = (check_number(v, f"{at}[{i}]") for i, v in enumerate(pair))
    check_ordered(lo, hi, at, strict=True)
    if limits is not None and not (lo < limits[0] and limits[1] < hi):
        refuse(at, f"a range with the CV's limits [{limits[0]:g}, {limits[1]:g}] strictly inside it (a value at "
                   "the range's end is not measured)", None, got=f"[{lo:g}, {hi:g}]")
    return lo, hi


def binding_from_dict(doc: Any, source: str = "binding") -> BindingSpec:
    """Validate a binding document (docs/ARCHITECTURE.md, "Binding file") into a BindingSpec.

    Raises ContractError whose message starts with `source` and names the offending field; a key
    the document has at any level that the contract does not know is refused too.
    """
    w = source
    check_mapping(doc, w, what="a mapping at the top level")
    _check_keys(doc, BindingSpec, w)
    binding_id = check_match(get_field(doc, "id", w), ID_PATTERN, f"{w}.id")
    period = check_number(get_field(doc, "sample_period_s", w), f"{w}.sample_period_s", POSITIVE)
    unit = check_text(get_field(doc, "unit", w, ""), f"{w}.unit")

    mvs = []
    for i, item in enumerate(_items(doc, "mvs", MVSpec, w, required=True)):
        at = f"{w}.mvs[{i}]"
        lo, hi = _limits(item, at)
        mvs.append(MVSpec(_tag(get_field(item, "tag", at), f"{at}.tag"), lo, hi,
                          check_number(get_field(item, "max_move", at), f"{at}.max_move", POSITIVE),
                          **_costs(item, at)))
    if not mvs:
        raise ContractError(f"{w}.mvs: at least one MV is required")

    cvs = []
    for i, item in enumerate(_items(doc, "cvs", CVSpec, w, required=True)):
        at = f"{w}.cvs[{i}]"
        lo, hi = _limits(item, at)
        target = get_field(item, "target", at, None)  # omitted: kept inside [lo, hi] only
        target = None if target is None else check_number(target, f"{at}.target", Interval(lo, hi))
        weight = check_number(get_field(item, "weight", at, 1.0), f"{at}.weight", NON_NEGATIVE)
        costs = _costs(item, at)
        integrating = check_rule(get_field(item, "integrating", at, False), bool_rule(), at, "integrating")
        cvs.append(CVSpec(_tag(get_field(item, "tag", at), f"{at}.tag"), lo, hi, target, weight, **costs,
                          transform=_transform(item, lo, hi, costs, at), integrating=integrating,
                          range=_range(item, at, (lo, hi))))
    if not cvs:
        raise ContractError(f"{w}.cvs: at least one CV is required")

    dvs = [DVSpec(_tag(get_field(item, "tag", f"{w}.dvs[{i}]"), f"{w}.dvs[{i}].tag"), _range(item, f"{w}.dvs[{i}]"))
           for i, item in enumerate(_items(doc, "dvs", DVSpec, w, required=False))]

    seen: dict[str, str] = {}
    for kind, specs in (("mvs", mvs), ("cvs", cvs), ("dvs", dvs)):
        for i, spec in enumerate(specs):
            if spec.tag in seen:
                raise ContractError(f"{w}.{kind}[{i}].tag: {spec.tag!r} is already used by {seen[spec.tag]}")
            seen[spec.tag] = f"{kind}[{i}]"

    at = f"{w}.model"
    model_doc = check_mapping(get_field(doc, "model", w, {}), at)
    _check_keys(model_doc, ModelSettings, at)

    def order(key: str) -> int | None:  # None: chosen from the data
        value = get_field(model_doc, key, at, None)
        return None if value is None else check_integer(value, f"{at}.{key}", AT_LEAST_ONE)

    model = ModelSettings(na=order("na"), nb=order("nb"), delay=order("delay"),
                          horizon=check_integer(get_field(model_doc, "horizon", at, 10), f"{at}.horizon", AT_LEAST_ONE))

    at = f"{w}.profile"
    profile_doc = check_mapping(get_field(doc, "profile", w), at)
    _check_keys(profile_doc, Profile, at)
    template = Template(check_choice(get_field(profile_doc, "template", at), [t.value for t in Template],
                                     f"{at}.template", what="template"))
    profile = Profile(
        id=check_match(get_field(profile_doc, "id", at), ID_PATTERN, f"{at}.id"),
        version=check_integer(get_field(profile_doc, "version", at, 1), f"{at}.version", AT_LEAST_ONE),
        template=template,
        horizon=check_integer(get_field(profile_doc, "horizon", at, 1 if template is Template.STEADY_RESPONSE else 30),
                              f"{at}.horizon", AT_LEAST_ONE),
        move_weight=check_number(get_field(profile_doc, "move_weight", at, 0.1), f"{at}.move_weight", NON_NEGATIVE),
        valid_for_s=check_number(get_field(profile_doc, "valid_for_s", at, 3600), f"{at}.valid_for_s", POSITIVE),
    )

    _check_integrating(cvs, template, w)
    return BindingSpec(id=binding_id, sample_period_s=period, mvs=tuple(mvs), cvs=tuple(cvs), dvs=tuple(dvs),
                       model=model, profile=profile, unit=unit,
                       opcua=wiring_from_dict(get_field(doc, "opcua", w, None), tuple(m.tag for m in mvs),
                                              tuple(seen), w))  # seen: every tag, in order


def _check_integrating(cvs: list[CVSpec], template: Template, w: str) -> None:
    """An integrating CV has no steady value, only a balance: it is planned by a move plan that ends balanced
    (solver/mpc.py) toward its target, if it has one; the steady-state layer a plan with costs or a CV
    without a target steers to holds its balance (problem.py). A steady target would publish a balance and
    no level, and a cost on it would price a level it does not settle at: both refused."""
    for i, cv in enumerate(cvs):
        if not cv.integrating:
            continue
        at = f"{w}.cvs[{i}].integrating"
        if cv.transform is not None:
            raise ContractError(f"{at}: an integrating CV takes no transform (its balance is a rate in its own units)")
        if template is Template.STEADY_RESPONSE:
            raise ContractError(f"{at}: an integrating CV has no steady state, only a balance; plan it with "
                                f"{Template.LINEAR_MPC.value}")
        if cv.cost or cv.cost_quadratic:
            raise ContractError(f"{at}: an integrating CV takes no cost (it settles at no steady value to price; "
                                f"its balance is held, its target tracked)")


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
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise ContractError(f"{path}: not valid {kind} ({detail})") from None
    if doc is None:
        raise ContractError(f"{path}: binding file is empty")
    return binding_from_dict(doc, source=str(path))


def binding_from_json(text: str, source: str = "binding") -> BindingSpec:
    return binding_from_dict(json.loads(text), source=source)


@dataclass(frozen=True)
class StoredBinding:
    """One revision of a binding as the ledger stores it (every change to the spec is a new revision)."""

    spec: BindingSpec
    revision: int
    spec_hash: str
    created_at: datetime
