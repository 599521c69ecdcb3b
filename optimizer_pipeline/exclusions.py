"""Slices of a binding's history excluded by hand (`optimizer-pipeline exclude`): checked here, recorded
in the ledger (append-only: a later record revokes one), applied by the next recalibration, whose
cleaning counts their samples as missing (data/flags.py). Bad input (an unknown tag, from >= to, no
reason, an unknown exclusion) is refused with one line and writes nothing."""

from datetime import datetime
from typing import Any, Sequence

from optimizer_pipeline.contracts import ContractError, StoredBinding, iso_utc
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.validation import did_you_mean


def exclude(ledger: Ledger, stored: StoredBinding, start: datetime, end: datetime, tags: Sequence[str],
            reason: str) -> dict[str, Any]:
    """Record an exclusion of the binding's samples start <= t < end of `tags` (none: every tag); returns
    what was recorded. ContractError naming the field when the input is wrong."""
    spec, where = stored.spec, f"exclude {stored.spec.id}"
    for tag in tags:
        if tag not in spec.tags:
            raise ContractError(f"{where}: --tags: binding {spec.id!r} has no tag {tag!r}"
                                f"{did_you_mean(tag, spec.tags)} (its tags: {', '.join(spec.tags)})")
    if start >= end:
        raise ContractError(f"{where}: --from {iso_utc(start)} must be before --to {iso_utc(end)}")
    reason = _reason(reason, where)
    exclusion_id = ledger.record_exclusion(spec.id, start.timestamp(), end.timestamp(), tuple(dict.fromkeys(tags)),
                                           reason)
    return {"exclusion_id": exclusion_id, "binding_id": spec.id, "from": iso_utc(start), "to": iso_utc(end),
            "tags": list(dict.fromkeys(tags)) or "every tag", "reason": reason, **_applies(spec.id)}


def revoke(ledger: Ledger, stored: StoredBinding, exclusion_id: str, reason: str) -> dict[str, Any]:
    """Record the revocation of one of the binding's exclusions in force; returns what was recorded."""
    reason = _reason(reason, f"exclude {stored.spec.id} --revoke {exclusion_id}")
    revocation = ledger.revoke_exclusion(stored.spec.id, exclusion_id, reason)
    return {"exclusion_id": revocation, "binding_id": stored.spec.id, "revokes": exclusion_id, "reason": reason,
            **_applies(stored.spec.id)}


def _reason(reason: str, where: str) -> str:
    if not reason or not reason.strip():
        raise ContractError(f"{where}: --reason must say why (it is kept with the record)")
    return reason.strip()


def _applies(binding_id: str) -> dict[str, str]:
    return {"applies": f"from the next recalibration (optimizer-pipeline materialize {binding_id} --job recalibrate)"}
