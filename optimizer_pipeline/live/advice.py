"""Advice out over OPC UA (opcua.write_advice): after each publication of the live service, a verified
recommendation's advised MV values go to the binding's advisory nodes, each in the node's own data type,
and its status, id and validity to the status node; any other status writes the status only, a lapsed
one `status=expired`, a stopping service `status=offline` (docs/ARCHITECTURE.md, "Live samples over
OPC UA"). The writes use the OPC UA source's connections (live/opcua.py) and never hold a solve."""

import asyncio
import logging
from concurrent.futures import Future
from dataclasses import dataclass

from optimizer_pipeline.contracts import Recommendation, RecommendationStatus, Template
from optimizer_pipeline.live.opcua import OpcUaSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Advice:
    """What goes to a binding's advisory nodes after a publication: its status, id and validity, and
    per advised MV the value to set now (a move plan's first move; a steady plan's target), None when
    the recommendation is not verified (then only the status is written)."""

    binding_id: str
    status: str
    recommendation_id: str
    valid_until: str
    values: dict[str, float] | None

    @classmethod
    def of(cls, rec: Recommendation) -> "Advice":
        values = None
        if rec.status is RecommendationStatus.VERIFIED and rec.controls:
            row = rec.controls[-1] if rec.template is Template.STEADY_RESPONSE else rec.controls[0]
            values = dict(zip(rec.mv_tags, map(float, row)))
        return cls(rec.binding_id, rec.status.value, rec.id, rec.valid_until, values)

    def status_text(self) -> str:
        return f"status={self.status} recommendation={self.recommendation_id} valid_until={self.valid_until}"


class AdvisoryWriter:
    """The live service's Reporter that writes verified advice to the bindings' advisory nodes over
    `source`'s connections (opcua.write_advice). Writes are sent to the connections' thread and not
    waited for: a slow or failing write never holds a solve; a failed one is logged and counted. A
    status node whose recommendation reaches its valid_until with no newer one written says
    `status=expired`."""

    def __init__(self, source: OpcUaSource):
        self.source = source
        self.failures = 0
        self._types: dict[tuple[str, str], object] = {}  # (endpoint, node) -> its VariantType
        self._latest: dict[str, str] = {}  # binding -> the recommendation its status node shows
        self._lapse: dict[str, Future] = {}  # binding -> its verified advice waiting to lapse (`_expire`)

    def report(self, published) -> None:
        for item in published:
            self.write(Advice.of(item.solved.decision.recommendation))

    def write(self, advice: Advice) -> None:
        spec = self.source.specs.get(advice.binding_id)
        if spec is None or spec.opcua.advisory is None:
            return
        values = {} if advice.values is None else {spec.opcua.advisory.nodes[tag]: value
                                                   for tag, value in advice.values.items()
                                                   if tag in spec.opcua.advisory.nodes}
        status = spec.opcua.advisory.status
        self._latest[advice.binding_id] = advice.recommendation_id
        self.source.submit(self._write(spec.opcua.endpoint, values, status, advice.status_text()))
        waiting = self._lapse.pop(advice.binding_id, None)
        if waiting is not None:  # a newer recommendation: the older one's status no longer lapses
            waiting.cancel()
        if status is not None and advice.values is not None:  # verified advice lapses
            lapse = self.source.submit(self._expire(advice, spec.opcua.endpoint, status))
            if lapse is not None:
                self._lapse[advice.binding_id] = lapse

    def offline(self) -> None:
        """Say "offline" on every status node (the service stops), waiting for the writes."""
        for spec in self.source.specs.values():
            if spec.opcua.advisory is not None and spec.opcua.advisory.status is not None:
                self.source.submit(self._write(spec.opcua.endpoint, {}, spec.opcua.advisory.status,
                                               "status=offline"), wait=True)

    async def _expire(self, advice: Advice, url: str, status_node: str) -> None:
        """At the advice's valid_until: `status=expired` when no newer recommendation was written since."""
        from optimizer_pipeline.contracts import parse_iso_utc

        await asyncio.sleep(max(0.0, parse_iso_utc(advice.valid_until).timestamp() - self.source.clock()))
        if self._latest.get(advice.binding_id) == advice.recommendation_id:
            await self._write(url, {}, status_node, f"status=expired recommendation={advice.recommendation_id} "
                                                    f"valid_until={advice.valid_until}")

    async def _write(self, url: str, values: dict[str, float], status_node: str | None, status: str) -> None:
        from asyncua import ua

        client = self.source.clients.get(url)
        writes = list(values.items()) + ([(status_node, status)] if status_node else [])
        for node_id, value in writes:
            try:
                if client is None:
                    raise ConnectionError("not connected")
                node = client.get_node(node_id)
                kind = self._types.get((url, node_id))
                if kind is None:
                    kind = self._types[(url, node_id)] = await node.read_data_type_as_variant_type()
                await node.write_value(ua.DataValue(ua.Variant(_as(kind, value), kind)))
            except Exception as exc:  # noqa: BLE001 - a write that fails is counted and said, never raised
                self.failures += 1
                log.warning("opcua %s: writing %s failed (%s: %s)", url, node_id, type(exc).__name__, exc)


def _as(kind, value):
    """`value` in the node's own data type (a Float node refuses a Double; an Int node a float)."""
    from asyncua import ua

    if kind is ua.VariantType.String:
        return str(value)
    if kind in (ua.VariantType.Float, ua.VariantType.Double):
        return float(value)
    if kind is ua.VariantType.Boolean:
        return bool(value)
    return int(round(float(value)))
