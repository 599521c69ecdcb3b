"""What-if solves (docs/ARCHITECTURE.md, "What-if solves"): a binding solved with overridden limits,
targets or costs, without changing the binding, recorded beside its open recommendation.

An override is `PATH=VALUE` text (the CLI's `--set`, the launchpad's `whatif` list):

    mvs.<tag>.<field>    lo, hi, max_move, cost, cost_quadratic
    cvs.<tag>.<field>    lo, hi, target, weight, cost, cost_quadratic   (target=none: no target)
    profile.<field>      horizon, move_weight

The overrides are applied to the stored spec's document (BindingSpec.to_dict(), items by tag) and
the result is validated by `binding_from_dict`, so a what-if spec obeys every rule a binding file
does (lo < hi, target within the limits, ...); a refusal is one line naming the override. The spec
lives in memory only: no binding revision is written. It is compiled from the live state with the
binding revision's model artifact and calibration, solved, verified and decided by the same code as
a normal solve (`pipeline.solve_and_decide`), and written as a what-if run (run + candidates + the
overrides, the spec and the decision; `Ledger.record_whatif`): never a recommendation, so the open
one is neither superseded nor expired and stays the binding's latest recommendation.

Economic value: J(u, y) of a plan's final row (economics.economic_value, in the binding's
money-per-time unit), for both sides under the what-if's costs, so that the two plans are valued
with one yardstick (None when the what-if spec has no costs).
"""

import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import (
    BindingSpec,
    Calibration,
    Condition,
    ContractError,
    HistorySplit,
    ModelArtifact,
    ProblemIR,
    SolveResult,
    StoredBinding,
    binding_from_dict,
    iso_utc,
)
from optimizer_pipeline.economics import economic_value
from optimizer_pipeline.ledger import Ledger, RecommendationRecord, WhatIfRecord
from optimizer_pipeline.recommendation_text import num
from optimizer_pipeline.settings import Settings
from optimizer_pipeline.validation import did_you_mean, read_number

log = logging.getLogger(__name__)

MV_FIELDS = ("lo", "hi", "max_move", "cost", "cost_quadratic")
CV_FIELDS = ("lo", "hi", "target", "weight", "cost", "cost_quadratic")
PROFILE_FIELDS = ("horizon", "move_weight")
INTEGER_FIELDS = ("horizon",)
SECTIONS = {"mvs": ("MV", MV_FIELDS), "cvs": ("CV", CV_FIELDS), "profile": ("profile", PROFILE_FIELDS)}
NO_TARGET = ("none", "null")  # cvs.<tag>.target=none: the CV is kept inside [lo, hi] only
OVERRIDE_FORMS = "mvs.<tag>.<field>, cvs.<tag>.<field> or profile.<field>"


class OverrideError(ContractError):
    """An override that cannot be applied; the message is one line naming it."""


@dataclass(frozen=True)
class Override:
    """One override: `section` mvs | cvs | profile, `tag` (None for the profile), `field`, `value`
    (engineering units; None only for a CV target dropped)."""

    text: str  # as given, stripped: "cvs.y1.hi=9.8"
    section: str
    tag: str | None
    field: str
    value: float | int | None

    @property
    def path(self) -> str:
        return ".".join(p for p in (self.section, self.tag, self.field) if p is not None)

    def to_json_dict(self) -> dict[str, Any]:
        return {"path": self.path, "value": self.value}


def _refuse(text: str, problem: str) -> OverrideError:
    return OverrideError(f"override {text!r}: {problem}")


def parse_override(text: Any) -> Override:
    """`PATH=VALUE` as an Override; OverrideError naming the text when it is malformed, names an
    unknown section or field, or its value is not a finite number (an integer for a horizon)."""
    if not isinstance(text, str) or "=" not in text:
        raise _refuse(str(text), f"expected PATH=VALUE with PATH {OVERRIDE_FORMS} (e.g. cvs.y1.hi=9.8)")
    text = text.strip()
    path, _, raw = (part.strip() for part in text.partition("="))
    section, _, rest = path.partition(".")
    if section not in SECTIONS:
        raise _refuse(text, f"unknown section {section!r}{did_you_mean(section, SECTIONS)} (known: {', '.join(SECTIONS)})")
    what, fields = SECTIONS[section]
    if section == "profile":
        tag, field = None, rest
    else:
        tag, _, field = rest.rpartition(".")  # a tag may hold dots (FIC101.PV): the field is the last part
        if not tag or not field:
            raise _refuse(text, f"expected {section}.<tag>.<field>, got {path!r}")
    if field not in fields:
        raise _refuse(text, f"unknown {what} field {field!r}{did_you_mean(field, fields)} (known: {', '.join(fields)})")
    if not raw:
        raise _refuse(text, "no value after '='")
    if section == "cvs" and field == "target" and raw.lower() in NO_TARGET:
        return Override(text, section, tag, field, None)
    kind = int if field in INTEGER_FIELDS else float
    try:
        value = read_number(raw, kind)
    except ValueError:
        expected = "an integer" if kind is int else "a finite number" + (" (or none)" if field == "target" else "")
        raise _refuse(text, f"expected {expected}, got {raw!r}") from None
    return Override(text, section, tag, field, value)


def parse_overrides(texts: Iterable[Any]) -> tuple[Override, ...]:
    """Every text parsed, in order; a path given twice is refused (which one would win is not obvious)."""
    overrides, seen = [], {}
    for text in texts:
        override = parse_override(text)
        if override.path in seen:
            raise _refuse(override.text, f"{override.path} is already set by {seen[override.path]!r}")
        seen[override.path] = override.text
        overrides.append(override)
    if not overrides:
        raise OverrideError(f"a what-if needs at least one override PATH=VALUE ({OVERRIDE_FORMS})")
    return tuple(overrides)


_ITEM = re.compile(r"\.(mvs|cvs)\[(\d+)\]|\.profile\b")


def apply_overrides(spec: BindingSpec, overrides: Sequence[Override]) -> BindingSpec:
    """The spec with the overrides applied, validated as a binding document is (binding_from_dict):
    an unknown tag, or a result the binding rules refuse (lo >= hi, a target outside the limits, a
    negative quadratic cost, ...), is one OverrideError line naming the override(s) of that item."""
    doc = spec.to_dict()
    for o in overrides:
        if o.section == "profile":
            doc["profile"][o.field] = o.value
            continue
        items = doc[o.section]
        index = next((i for i, item in enumerate(items) if item["tag"] == o.tag), None)
        if index is None:
            what, _ = SECTIONS[o.section]
            other = "cvs" if o.section == "mvs" else "mvs"
            hint = f"; {o.tag!r} is a{'n' if other == 'mvs' else ''} {SECTIONS[other][0]}: {other}.{o.tag}" \
                if any(item["tag"] == o.tag for item in doc[other]) else ""
            tags = [item["tag"] for item in items]
            raise _refuse(o.text, f"binding {spec.id} has no {what} {o.tag!r}{'' if hint else did_you_mean(o.tag, tags)}"
                                  f" (its {what}s: {', '.join(tags)}){hint}")
        items[index][o.field] = o.value
    source = f"what-if of {spec.id}"
    try:
        return binding_from_dict(doc, source=source)
    except ContractError as exc:
        raise _explained(str(exc), source, doc, overrides) from None


def _explained(message: str, source: str, doc: Mapping[str, Any], overrides: Sequence[Override]) -> OverrideError:
    """The binding rule's message, its item named by tag (`cvs[0]` -> `cvs.y1`), after the overrides
    of that item (all of them when the message names no item)."""
    found = _ITEM.match(message, len(source)) if message.startswith(source) else None
    culprits, detail = list(overrides), message
    if found is not None:
        if found.group(1):
            section, tag = found.group(1), doc[found.group(1)][int(found.group(2))]["tag"]
            culprits = [o for o in overrides if o.section == section and o.tag == tag] or culprits
            detail = f"{section}.{tag}" + message[found.end():]
        else:
            culprits = [o for o in overrides if o.section == "profile"] or culprits
            detail = "profile" + message[found.end():]
    texts = ", ".join(repr(o.text) for o in culprits)
    return OverrideError(f"override{'s' if len(culprits) > 1 else ''} {texts}: {detail}")


def whatif_spec(spec: BindingSpec, texts: Iterable[Any]) -> tuple[tuple[Override, ...], BindingSpec]:
    """Parse the override texts and apply them to `spec` (OverrideError: one line, nothing else done)."""
    overrides = parse_overrides(texts)
    return overrides, apply_overrides(spec, overrides)


# ---------------------------------------------------------------------------- the solve


@dataclass(frozen=True)
class WhatIfSolve:
    """A recorded what-if solve: its ledger row and every condition for `verified` it was judged on."""

    record: WhatIfRecord
    conditions: tuple[Condition, ...]


def plan_value(spec: BindingSpec, doc: Mapping[str, Any]) -> float | None:
    """Economic value of a recommendation-like document's final row under `spec`'s costs; None without
    a plan, without costs, or for a plan of other tags than the spec's."""
    if not doc.get("controls") or tuple(doc.get("mv_tags", ())) != spec.mv_tags \
            or tuple(doc.get("cv_tags", ())) != spec.cv_tags:
        return None
    return economic_value(spec, doc["controls"][-1], doc["predicted"][-1])


def solve_whatif(stored: StoredBinding, overrides: Sequence[Override], artifact: ModelArtifact, split: HistorySplit,
                 calibration: Calibration, solve: Callable[[ProblemIR], SolveResult], ledger: Ledger,
                 settings: Settings, source: str, now: datetime, *, requested_by: str,
                 dagster_run_id: str | None = None) -> WhatIfSolve:
    """Solve the stored binding with `overrides` applied (in memory) through the normal solve path
    and record it as a what-if run. No housekeeping and no publish: the binding's recommendations
    are only read (the latest one, to be shown beside it)."""
    spec = apply_overrides(stored.spec, overrides)
    compared = ledger.latest_recommendation(stored.spec.id)
    solved = pipeline.solve_and_decide(spec, stored, artifact, split, calibration, solve, settings, source, now,
                                       outcomes=ledger.list_verdicts(stored.spec.id))
    result, rec, chosen = solved.result, solved.decision.recommendation, solved.decision.chosen
    run = replace(solved.run, context=dict(solved.run.context, whatif=True,
                                           overrides=[o.to_json_dict() for o in overrides]))
    # the decision as a recommendation JSON holds it, less what only a published recommendation has
    doc = {k: v for k, v in rec.to_json_dict().items() if k not in ("id", "valid_until")}
    doc["economic_value"] = plan_value(spec, doc)
    run_id = ledger.record_whatif(
        run, result.candidates, artifact.artifact_hash, overrides=[o.to_json_dict() for o in overrides],
        spec=spec.to_dict(), compared_recommendation_id=None if compared is None else compared.id, result=doc,
        run_status=pipeline.run_status(result), independent_cost=None if chosen is None else chosen.independent_cost,
        diagnostics=dict(result.diagnostics, error_code=result.error_code, error_message=result.error_message),
        requested_by=requested_by, dagster_run_id=dagster_run_id)
    log.info("binding %s: what-if %s (%s) is %s", stored.spec.id, run_id, ", ".join(o.text for o in overrides),
             rec.status.value)
    return WhatIfSolve(ledger.get_whatif(run_id), solved.decision.conditions)


# ---------------------------------------------------------------------------- side by side


def comparison(ledger: Ledger, record: WhatIfRecord) -> dict[str, Any]:
    """The what-if beside the recommendation it was compared with (the binding's latest when it was
    solved; `open` is null when there was none), both as JSON: the recommendation document and the
    what-if's decision, each with `economic_value` under the what-if's costs, and the stored spec's
    value of every overridden path."""
    spec = binding_from_dict(record.spec, source=f"what-if {record.run_id}")
    stored = ledger.get_binding(record.binding_id, record.binding_revision).spec
    rec: RecommendationRecord | None = None
    if record.compared_recommendation_id is not None:
        rec = ledger.get_recommendation(record.compared_recommendation_id)
    open_doc = None if rec is None else dict(rec.document(), economic_value=plan_value(spec, rec.payload))
    return {
        "binding_id": record.binding_id, "binding_revision": record.binding_revision, "whatif_run_id": record.run_id,
        "created_at": iso_utc(record.created_at), "requested_by": record.requested_by,
        "overrides": [dict(o, stored=stored_value(stored, o["path"])) for o in record.overrides],
        "economic_value_basis": "J(u, y) of each plan's final row under the what-if's costs",
        "open": open_doc,
        "whatif": dict(record.result, run_id=record.run_id),
    }


def stored_value(spec: BindingSpec, path: str) -> float | int | None:
    """The value the stored spec has at an override's path (None: a CV without target)."""
    doc = spec.to_dict()
    section, _, rest = path.partition(".")
    if section == "profile":
        return doc["profile"].get(rest)
    tag, _, field = rest.rpartition(".")
    item = next(item for item in doc[section] if item["tag"] == tag)
    return item.get(field, 0.0 if field in ("cost", "cost_quadratic") else None)


def _live(side: Mapping[str, Any]) -> str:
    return str(((side.get("evidence") or {}).get("live_state") or {}).get("last_sample_at") or "-")


def side_by_side_rows(doc: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The comparison (`comparison`) as (row, open, what-if) text rows: the stored and overridden
    values, status, per MV the plan's step 0 and last row, per CV the predicted end of the plan with
    its band, the plan's length, the live sample it was solved from, the economic value and the
    reasons (engineering units)."""
    open_doc, whatif = doc["open"] or {}, doc["whatif"]
    rows = [("", f"open {open_doc.get('id', '(none)')}", f"what-if {doc['whatif_run_id']}")]
    rows += [(o["path"], num(o["stored"], 4), "none" if o["value"] is None else num(o["value"], 4))
             for o in doc["overrides"]]
    rows.append(("status", open_doc.get("status", "-"), whatif["status"]))

    def plan(side: Mapping[str, Any], key: str, row: int, j: int) -> str:
        values = side.get(key) or []
        return num(values[row][j], 4) if values else "-"

    def banded(side: Mapping[str, Any], j: int) -> str:
        value, band = plan(side, "predicted", -1, j), (side.get("band") or [None] * (j + 1))[j]
        return value if value == "-" or band is None else f"{value} ±{num(band, 4)}"

    for j, tag in enumerate(whatif["mv_tags"]):
        rows.append((f"MV {tag} step 0", plan(open_doc, "controls", 0, j), plan(whatif, "controls", 0, j)))
        rows.append((f"MV {tag} end of plan", plan(open_doc, "controls", -1, j), plan(whatif, "controls", -1, j)))
    for j, tag in enumerate(whatif["cv_tags"]):
        rows.append((f"CV {tag} end of plan", banded(open_doc, j), banded(whatif, j)))
    rows.append(("plan steps", str(len(open_doc.get("controls") or [])) if open_doc else "-",
                 str(len(whatif.get("controls") or []))))
    rows.append(("live state (last sample)", _live(open_doc), _live(whatif)))
    rows.append(("economic value J (a cost)", num(open_doc.get("economic_value"), 4),
                 num(whatif.get("economic_value"), 4)))
    n = max(len(open_doc.get("reasons") or []), len(whatif.get("reasons") or []))
    for i in range(n):
        rows.append(("reasons" if i == 0 else "", *((side.get("reasons") or [])[i] if i < len(side.get("reasons") or [])
                                                    else "" for side in (open_doc, whatif))))
    return rows


def side_by_side_text(doc: Mapping[str, Any]) -> str:
    """The comparison as aligned text lines (the CLI's table): a header, then `side_by_side_rows`."""
    rows = side_by_side_rows(doc)
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    overrides = ", ".join(f"{o['path']}={'none' if o['value'] is None else num(o['value'], 4)}"
                          for o in doc["overrides"])
    lines = [f"what-if {doc['whatif_run_id']}  binding {doc['binding_id']}@r{doc['binding_revision']} "
             f"(unchanged)  overrides: {overrides}"]
    lines += [f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip() for row in rows]
    if doc["open"] is None:
        lines.append("  (the binding has no recommendation yet to compare with)")
    lines.append(f"  economic value: {doc['economic_value_basis']}" if doc["whatif"].get("economic_value") is not None
                 else "  economic value: - (the what-if's binding has no costs)")
    return "\n".join(lines)
