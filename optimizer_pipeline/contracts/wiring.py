"""The OPC UA wiring of a binding: where its tags live on an OPC UA server and where advice goes
(OpcUaWiring, AdvisoryWiring, NodeIds), validated from a binding document's `opcua` section and
stored as canonical JSON (docs/ARCHITECTURE.md, "Binding file": wiring, not model).
"""

import json
from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping

from optimizer_pipeline.contracts.canonical import ContractError, canonical_json
from optimizer_pipeline.validation import (
    check_keys,
    check_mapping,
    check_opc_endpoint,
    did_you_mean,
    get_field,
    node_identity,
)


class NodeIds(Mapping[str, str]):
    """Tag -> OPC UA node id, read-only: a wiring's mapping, equal to any mapping of the same items,
    and hashable, copyable and picklable like the rest of a frozen spec (a MappingProxyType is none
    of the three)."""

    def __init__(self, nodes: Mapping[str, str]):
        self._nodes = dict(nodes)

    def __getitem__(self, tag: str) -> str:
        return self._nodes[tag]

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __hash__(self) -> int:
        return hash(frozenset(self._nodes.items()))

    def __repr__(self) -> str:
        return f"NodeIds({self._nodes!r})"


@dataclass(frozen=True)
class AdvisoryWiring:
    """Where verified advice is written: an advisory node per advised MV tag (a subset of the MVs,
    never a node the binding reads) and, optionally, a status node."""

    nodes: Mapping[str, str]
    status: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", NodeIds(self.nodes))


@dataclass(frozen=True)
class OpcUaWiring:
    """How a binding is wired to an OPC UA server: its endpoint (opc.tcp://...), the node id of every
    MV, CV and DV tag (e.g. "ns=2;s=Tanks.y1"), and where advice goes. Wiring, not model: it is not
    part of the spec's hash, so changing it alone keeps the revision and its recommendations.
    Its mappings are kept as NodeIds (read-only copies of those given)."""

    endpoint: str
    nodes: Mapping[str, str]
    advisory: AdvisoryWiring | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", NodeIds(self.nodes))

    def canonical_json(self) -> str:
        """The wiring as the ledger stores it (`wiring_from_json` reads it back)."""
        advisory = None if self.advisory is None else {"nodes": dict(self.advisory.nodes),
                                                        "status": self.advisory.status}
        return canonical_json({"endpoint": self.endpoint, "nodes": dict(self.nodes), "advisory": advisory})


def wiring_from_json(text: str) -> OpcUaWiring:
    """A wiring as `OpcUaWiring.canonical_json` wrote it to the ledger, validated against its binding
    then (not again: it is the binding's latest wiring, and an older revision read with it may lack
    a tag it names)."""
    doc = json.loads(text)
    advisory = doc["advisory"]
    return OpcUaWiring(doc["endpoint"], doc["nodes"],
                       None if advisory is None else AdvisoryWiring(advisory["nodes"], advisory["status"]))


# The required keys of each level (the rest of its dataclass fields is optional); any other key is refused.
REQUIRED_KEYS = {OpcUaWiring: ("endpoint", "nodes"), AdvisoryWiring: ("nodes",)}
# the similarity an unknown tag needs to its suggestion: tags are often two or three characters
# (y1, v2), where one wrong character is a ratio of 0.5 (validation.closest)
TAG_HINT_CUTOFF = 0.5
# the nodes of an `opcua` section taken so far: node (validation.node_identity) -> the key path, from
# `opcua`, that it serves
Claimed = dict[tuple[int, str, str], str]


def _check_keys(doc: Mapping[str, Any], spec: type, where: str) -> None:
    check_keys(doc, tuple(f.name for f in fields(spec)), where, required=REQUIRED_KEYS[spec])


def wiring_from_dict(section: Any, mv_tags: tuple[str, ...], tags: tuple[str, ...],
                     source: str) -> OpcUaWiring | None:
    """The optional `opcua` section (None: absent) of the binding document `source`, whose MV tags
    are `mv_tags` and whose tags are `tags`, in order: an opc.tcp endpoint, the node of every tag and
    of nothing else, and optionally where advice goes (`_advisory`). A node serves one key only, so
    two tags never read one node. Raises ContractError whose message starts with `source`."""
    if section is None:
        return None
    at = f"{source}.opcua"
    check_mapping(section, at, what="a mapping like {endpoint: opc.tcp://..., nodes: {tag: node id}}")
    _check_keys(section, OpcUaWiring, at)
    endpoint = check_opc_endpoint(get_field(section, "endpoint", at), f"{at}.endpoint")
    claimed: Claimed = {}
    nodes = _nodes(check_mapping(get_field(section, "nodes", at), f"{at}.nodes", what="a mapping of tag to node id"),
                   "opcua.nodes", tags, "tag", claimed, source)
    for tag in tags:
        if tag not in nodes:
            raise ContractError(f"{at}.nodes.{tag}: required field is missing (every MV, CV and DV tag needs its "
                                "node)")
    return OpcUaWiring(endpoint, nodes, _advisory(section, mv_tags, tags, claimed, source))


def _advisory(section: Mapping[str, Any], mv_tags: tuple[str, ...], tags: tuple[str, ...],
              claimed: Claimed, w: str) -> AdvisoryWiring | None:
    """`opcua.advisory` (AdvisoryWiring): the advisory node of at least one MV and an optional status
    node, none of them a node the binding reads (advice is never written to a measurement)."""
    doc = get_field(section, "advisory", f"{w}.opcua", None)
    if doc is None:
        return None
    at = f"{w}.opcua.advisory"
    check_mapping(doc, at, what="a mapping like {nodes: {MV tag: node id}, status: node id}")
    _check_keys(doc, AdvisoryWiring, at)
    advised = check_mapping(get_field(doc, "nodes", at), f"{at}.nodes", what="a mapping of MV tag to node id")
    for tag in advised:
        if tag in tags and tag not in mv_tags:
            raise ContractError(f"{at}.nodes.{tag}: not an MV (advice is written for MVs only: "
                                f"{', '.join(mv_tags)})")
    nodes = _nodes(advised, "opcua.advisory.nodes", mv_tags, "MV tag", claimed, w)
    if not nodes:
        raise ContractError(f"{at}.nodes: at least one MV's advisory node is required")
    status = get_field(doc, "status", at, None)
    return AdvisoryWiring(nodes, None if status is None else _claim(status, "opcua.advisory.status", claimed, w))


def _nodes(value: Mapping[Any, Any], path: str, known: tuple[str, ...], what: str, claimed: Claimed,
           w: str) -> dict[str, str]:
    """The mapping at `path` of `known` tags (`what`: "tag", "MV tag") to node ids, each node claimed."""
    for tag, node in value.items():
        if tag not in known:
            hint = did_you_mean(tag, known, TAG_HINT_CUTOFF) or f" ({what}s: {', '.join(known)})"
            raise ContractError(f"{w}.{path}.{tag}: unknown {what}{hint}")
        _claim(node, f"{path}.{tag}", claimed, w)
    return dict(value)


def _claim(node: Any, path: str, claimed: Claimed, w: str) -> str:
    """`node`, a node id, claimed for the key at `path`: refused when another key has it, and said so
    when that key reads it and this one would write it."""
    other = claimed.setdefault(node_identity(node, f"{w}.{path}"), path)
    if other == path:
        return node
    if other.startswith("opcua.nodes.") and not path.startswith("opcua.nodes."):
        raise ContractError(f"{w}.{path}: {node!r} is the node {other} reads (advice is never written to a "
                            "measurement node)")
    raise ContractError(f"{w}.{path}: {node!r} is already the node of {other}")
