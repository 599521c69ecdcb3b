"""What `optimizer-pipeline ledger` prints: the runs (a what-if run marked), what-ifs, candidates,
recommendations, outcomes, binding failures, exclusions and the samples the latest split flagged, of the
ledger or of one binding, as text or JSON."""

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable

from optimizer_pipeline.contracts import iso_from_seconds, iso_utc
from optimizer_pipeline.ledger import ExclusionRecord, Ledger
from optimizer_pipeline.recommendation_text import num

Section = tuple[list, Callable[[Any], str]]


def _override_text(override: dict[str, Any]) -> str:
    """A recorded what-if override as it was given: PATH=VALUE."""
    return f"{override['path']}={override['value']}"


@dataclass(frozen=True)
class FlagSpan:
    """A stretch of one tag's samples a cleaning rule flagged (data/flags.py), of a binding's latest split."""

    binding_id: str
    binding_revision: int
    run_id: str
    tag: str
    rule: str
    start: str  # ISO 8601 UTC
    end: str
    samples: int

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def flag_spans(ledger: Ledger, binding: str | None) -> list[FlagSpan]:
    """The flagged stretches of each binding's (or one binding's) latest split of its current revision."""
    spans = []
    for stored in ledger.list_bindings():
        split = None if binding not in (None, stored.spec.id) else ledger.latest_split(stored.spec.id, stored.revision)
        for s in [] if split is None else split.report.get("cleaning", {}).get("flags", []):
            spans.append(FlagSpan(stored.spec.id, stored.revision, s["run_id"], s["tag"], s["rule"],
                                  iso_from_seconds(s["start_s"]), iso_from_seconds(s["end_s"]), s["samples"]))
    return spans


def _exclusion_text(e: ExclusionRecord) -> str:
    if e.revokes:
        return f"{e.exclusion_id}  {e.binding_id}  revokes {e.revokes}  {e.reason}"
    return (f"{e.exclusion_id}  {e.binding_id}  {iso_from_seconds(e.start_s)} .. {iso_from_seconds(e.end_s)}  "
            f"{' '.join(e.tags) or 'every tag'}  {e.reason}"
            + (f"  (revoked by {e.revoked_by})" if e.revoked_by else ""))


def _sections(ledger: Ledger, binding: str | None) -> dict[str, Section]:
    """Each section's rows (oldest first) and how one of them reads as a line."""
    whatifs = ledger.list_whatifs(binding)
    whatif_runs = {w.run_id for w in whatifs}
    return {
        "runs": (ledger.list_runs(binding),
                 lambda r: f"{r.id}  {r.binding_id}@r{r.binding_revision}  {r.status.value:<9}  {iso_utc(r.started_at)}"
                           + ("  what-if" if r.id in whatif_runs else "")),
        "whatifs": (whatifs,
                    lambda w: f"{w.run_id}  {w.binding_id}@r{w.binding_revision}  {w.result.get('status')}  "
                              f"{' '.join(_override_text(o) for o in w.overrides)}  "
                              f"beside {w.compared_recommendation_id or '(no recommendation)'}"),
        "candidates": (ledger.list_candidates(binding_id=binding),
                       lambda c: f"{c.id}  {c.kind:<7}  {c.solver_status:<10}  cost {num(c.cost)}  "
                                 f"verified {c.verified}" + ("  what-if" if c.run_id in whatif_runs else "")),
        "recommendations": (ledger.list_recommendations(binding),
                            lambda r: f"{r.id}  {r.binding_id}@r{r.binding_revision}  {r.status.value:<10}  "
                                      f"valid until {iso_utc(r.valid_until)}"),
        "outcomes": (ledger.list_outcomes(binding),
                     lambda o: f"{o.id}  {o.recommendation_id}  {o.verdict and o.verdict.value}  "
                               f"applied {iso_utc(o.applied_at)}"),
        "failures": (ledger.list_failures(binding),
                     lambda f: f"{f.id}  {f.binding_id}@r{f.binding_revision}  {f.stage}  {iso_utc(f.created_at)}  "
                               f"{f.error}: {f.message}"),
        "exclusions": (ledger.list_exclusions(binding), _exclusion_text),
        "flagged": (flag_spans(ledger, binding),
                    lambda s: f"{s.binding_id}@r{s.binding_revision}  {s.run_id}  {s.tag}  {s.rule}  {s.start} .. "
                              f"{s.end}  {s.samples} sample(s)"),
    }


def listing_text(ledger: Ledger, binding: str | None) -> str:
    lines = [f"ledger {ledger.path}"]
    for name, (rows, line) in _sections(ledger, binding).items():
        lines.append(f"{name} ({len(rows)})")
        lines += [f"  {line(row)}" for row in rows]
    return "\n".join(lines)


def listing_json(ledger: Ledger, binding: str | None) -> str:
    return json.dumps({name: [row.to_json_dict() for row in rows] for name, (rows, _) in
                       _sections(ledger, binding).items()}, indent=2, default=str)
