"""How a recommendation reads in a terminal (`optimizer-pipeline recommendation`, `demo`): its status
and reasons, each MV from its live value through the first move to the plan's end (with its limits),
each CV from its live value to its predicted end with its band and target or limits, evidence,
economic cost, and the live service's newest summarised advice where there is one. Also how a
number (`num`) and a duration (`duration`) read wherever a person reads them: the conditions for
`verified` and their reasons, the UI's tables."""

from typing import Any

from optimizer_pipeline.economics import economic_value


def num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def duration(seconds: float) -> str:
    """`seconds` as a person reads an age: seconds to a tenth below 2 h ("12.3 s"), hours to 3 significant
    digits below 2 days ("41.3 h"), then days (3 significant digits, whole days from 100 on: "2.5 days",
    "335 days")."""
    if abs(seconds) < 7200:
        return f"{round(seconds, 1) or 0.0:g} s"  # `or`: -0.0 reads "0 s"
    if abs(seconds) < 172800:
        return f"{num(seconds / 3600)} h"
    days = seconds / 86400
    return f"{num(days) if abs(days) < 100 else round(days)} days"


def _describe(doc: dict[str, Any], spec: Any) -> str:
    lines = [f"{doc['id']}  binding {doc['binding_id']}@r{doc['binding_revision']}  {doc['template']}",
             f"status: {doc['status']} — {doc['status_label']}"]
    lines += [f"  - {reason}" for reason in doc["reasons"]]
    lines.append(f"valid until {doc['valid_until']}; created {doc['created_at']}")
    if doc["controls"]:
        live = doc["evidence"].get("live_state") or {}
        now_mv, now_cv = live.get("mvs") or {}, live.get("cvs") or {}
        mvs, cvs = {m.tag: m for m in spec.mvs}, {c.tag: c for c in spec.cvs}
        lines.append(f"MVs: now -> first move -> end of plan ({len(doc['controls'])} steps)  [limits]")
        lines += [f"  {t}: {num(now_mv.get(t), 4)} -> {first:.4g} -> {end:.4g}  [{mvs[t].lo:g}, {mvs[t].hi:g}]"
                  for t, first, end in zip(doc["mv_tags"], doc["controls"][0], doc["controls"][-1])]
        calibrated = doc.get("band_steps")  # a move plan's band is a calibrated claim for its first P steps only
        beyond = calibrated is not None and calibrated < len(doc["predicted"])
        lines.append(f"CVs: now -> predicted at the end of the horizon ({len(doc['predicted'])} steps) ± band, "
                     f"target or [limits]" + (f" (the band is calibrated for the first {calibrated} steps only)"
                                               if beyond else ""))
        lines += [f"  {t}: {num(now_cv.get(t), 4)} -> {end:.4g} ± {num(band)}, "
                  f"{'limits' if cvs[t].target is None else 'target'} {_target_text(cvs[t])}"
                  for t, end, band in zip(doc["cv_tags"], doc["predicted"][-1], doc["band"])]
    lines.append(f"evidence: source {doc['evidence']['source']}, input distance "
                 f"{num(doc['evidence']['input_distance'])}, calibration fresh {doc['evidence']['calibration_fresh']}")
    return "\n".join(lines)


def _target_text(cv: Any) -> str:
    """A CV's target, or its limits when it has none (kept inside them only)."""
    return f"[{cv.lo:g}, {cv.hi:g}]" if cv.target is None else f"{cv.target:g}"


def demo_table(docs: list[dict[str, Any]], plants: list[Any]) -> str:
    specs = {p.spec.id: p.spec for p in plants}
    header = (f"{'binding':<13} {'template':<24} {'status':<11} {'first move (MV values)':<30} "
              f"{'CV end vs target or [limits] (± band)'}")
    rows = [header, "-" * len(header)]
    for doc in docs:
        spec = specs[doc["binding_id"]]
        if doc["controls"]:
            moves = ", ".join(f"{t} {v:.3g}" for t, v in zip(doc["mv_tags"], doc["controls"][0]))
            cvs = ", ".join(f"{c.tag} {v:.3g}/{_target_text(c)} (±{num(b, 2)})"
                            for c, v, b in zip(spec.cvs, doc["predicted"][-1], doc["band"]))
            value = economic_value(spec, doc["controls"][-1], doc["predicted"][-1])
            if value is not None:
                cvs += f"; economic cost {value:.4g}"
        else:
            moves, cvs = "(no plan)", "-"
        rows.append(f"{doc['binding_id']:<13} {doc['template']:<24} {doc['status']:<11} {moves:<30} {cvs}")
    return "\n".join(rows)


def recommendation_text(doc: dict[str, Any], spec: Any) -> str:
    """The recommendation JSON `doc` of the binding `spec` as `recommendation` prints it."""
    lines = [_describe(doc, spec)]
    value = economic_value(spec, doc["controls"][-1], doc["predicted"][-1]) if doc["controls"] else None
    if value is not None:
        lines.append(f"economic cost J at the plan's end: {value:.6g}")
    if "live_advice" in doc:
        newest = doc["live_advice"]
        lines.append(f"newest advice of the live service (samples up to {newest['live_t']}, same status, "
                     f"summarised): " + ", ".join(f"{tag} = {value:.6g}" for tag, value in newest["advice"].items()))
    return "\n".join(lines)
