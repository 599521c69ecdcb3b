"""The binding's `opcua` section (issue 36): validated like every field, and stored as wiring, not
model: changing only it keeps the revision and the open recommendation (docs/ARCHITECTURE.md,
"Binding file" and "Ledger rules")."""

import copy
import pickle

import pandas as pd
import pytest

from optimizer_pipeline import automation, cli
from optimizer_pipeline.contracts import ContractError, binding_from_dict, wiring_from_json
from optimizer_pipeline.inbox import ingest_history
from optimizer_pipeline.ledger import open_ledger
from optimizer_pipeline.plants import demo_plants, get_plant

from ledger_helpers import solve

OPCUA = {
    "endpoint": "opc.tcp://127.0.0.1:4840/plant",
    "nodes": {"v1": "ns=2;s=Tanks.v1", "v2": "ns=2;s=Tanks.v2", "y1": "ns=2;s=Tanks.y1", "y2": "ns=2;s=Tanks.y2"},
    "advisory": {"nodes": {"v1": "ns=2;s=Tanks.v1.advice", "v2": "ns=2;s=Tanks.v2.advice"},
                 "status": "ns=2;s=Tanks.advice.status"},
}


@pytest.fixture
def wired(binding_doc):
    """The tanks binding with the `opcua` section of docs/binding-file.md, a fresh copy a test may modify."""
    return {**binding_doc, "opcua": copy.deepcopy(OPCUA)}


def refusal(doc) -> str:
    with pytest.raises(ContractError) as refused:
        binding_from_dict(doc, source="tanks.yaml")
    return str(refused.value)


# ---------------------------------------------------------------------------------------------- reading


def test_the_opcua_section_is_read_as_the_bindings_wiring(wired):
    wiring = binding_from_dict(wired).opcua
    assert wiring.endpoint == "opc.tcp://127.0.0.1:4840/plant"
    assert dict(wiring.nodes) == OPCUA["nodes"] and wiring.nodes["y2"] == "ns=2;s=Tanks.y2"
    assert dict(wiring.advisory.nodes) == OPCUA["advisory"]["nodes"]
    assert wiring.advisory.status == "ns=2;s=Tanks.advice.status"


def test_a_binding_without_an_opcua_section_has_no_wiring(binding_doc):
    assert binding_from_dict(binding_doc).opcua is None


def test_the_advisory_part_and_its_status_node_are_optional(wired):
    without_status = copy.deepcopy(wired)
    del without_status["opcua"]["advisory"]["status"]
    del wired["opcua"]["advisory"]
    assert binding_from_dict(wired).opcua.advisory is None
    assert binding_from_dict(without_status).opcua.advisory.status is None


def test_the_wiring_is_no_part_of_the_spec_hash(binding_doc, wired):
    moved = copy.deepcopy(wired)
    moved["opcua"]["endpoint"] = "opc.tcp://other-host:4841"
    hashes = {binding_from_dict(doc).spec_hash for doc in (binding_doc, wired, moved)}
    assert len(hashes) == 1
    assert "opcua" not in binding_from_dict(wired).canonical_json()


def test_wirings_with_the_same_nodes_in_another_order_are_equal_and_hash_alike(wired):
    reordered = copy.deepcopy(wired)
    reordered["opcua"]["nodes"] = dict(reversed(list(OPCUA["nodes"].items())))
    a, b = binding_from_dict(wired), binding_from_dict(reordered)
    assert a == b and hash(a) == hash(b)
    reordered["opcua"]["nodes"]["y2"] = "ns=2;s=Tanks.y2b"
    assert binding_from_dict(reordered) != a


def test_a_wirings_nodes_are_its_own_and_read_only(wired):
    nodes = dict(OPCUA["nodes"])
    wiring = binding_from_dict({**wired, "opcua": {**OPCUA, "nodes": nodes}}).opcua
    nodes["y1"] = "ns=2;s=Changed"
    assert wiring.nodes["y1"] == "ns=2;s=Tanks.y1"
    with pytest.raises(TypeError):
        wiring.nodes["y1"] = "ns=2;s=Changed"


def test_a_wired_spec_copies_and_pickles_equal(wired):
    spec = binding_from_dict(wired)
    assert copy.deepcopy(spec) == spec and pickle.loads(pickle.dumps(spec)) == spec


def test_the_stored_wiring_reads_back_equal(wired):
    for doc in (wired, {**wired, "opcua": {**OPCUA, "advisory": None}}):
        wiring = binding_from_dict(doc).opcua
        assert wiring_from_json(wiring.canonical_json()) == wiring


# ---------------------------------------------------------------------------------------------- keys


@pytest.mark.parametrize("level, meant, misspelt, message", [
    ((), "endpoint", "endpont", "tanks.yaml.opcua.endpont: unknown key; did you mean 'endpoint' (required, missing)?"),
    ((), "advisory", "advisroy", "tanks.yaml.opcua.advisroy: unknown key; did you mean 'advisory'?"),
    (("advisory",), "status", "statuss", "tanks.yaml.opcua.advisory.statuss: unknown key; did you mean 'status'?"),
    (("advisory",), "nodes", "node", "tanks.yaml.opcua.advisory.node: unknown key; did you mean 'nodes' (required, "
                                     "missing)?"),
])
def test_an_unknown_key_of_the_opcua_section_is_refused_with_the_closest_known_key(wired, level, meant, misspelt,
                                                                                    message):
    section = wired["opcua"]
    for key in level:
        section = section[key]
    section[misspelt] = section.pop(meant)
    assert refusal(wired) == message


@pytest.mark.parametrize("level, key", [((), "endpoint"), ((), "nodes"), (("advisory",), "nodes")])
def test_a_required_key_of_the_opcua_section_is_named_when_missing(wired, level, key):
    section = wired["opcua"]
    for name in level:
        section = section[name]
    del section[key]
    assert refusal(wired) == f"tanks.yaml.opcua.{''.join(f'{n}.' for n in level)}{key}: required field is missing"


def test_an_opcua_section_that_is_not_a_mapping_is_refused(wired):
    wired["opcua"] = "opc.tcp://127.0.0.1:4840"
    assert refusal(wired).startswith("tanks.yaml.opcua: expected a mapping like {endpoint: opc.tcp://..., ")


# ---------------------------------------------------------------------------------------------- endpoint


@pytest.mark.parametrize("endpoint", ["opc.tcp://127.0.0.1:4840/plant", "opc.tcp://plant-host", "opc.tcp://[::1]:4840",
                                      "opc.tcp://historian.site.example:65535/a/b", "opc.tcp://h:1"])
def test_an_opc_tcp_endpoint_is_accepted(wired, endpoint):
    wired["opcua"]["endpoint"] = endpoint
    assert binding_from_dict(wired).opcua.endpoint == endpoint


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:4840", "opc.tcp://", "opc.tcp:/host:4840", "opc.tcp://host:0",
                                      "opc.tcp://host:65536", "opc.tcp://plant host:4840", "OPC.TCP://host", 4840,
                                      "opc.tcp://host:port"])
def test_an_endpoint_other_than_an_opc_tcp_url_is_refused(wired, endpoint):
    wired["opcua"]["endpoint"] = endpoint
    assert refusal(wired) == (f"tanks.yaml.opcua.endpoint: expected an opc.tcp://host[:port][/path] URL (port 1 to "
                              f"65535), got {endpoint!r}")


def test_an_endpoint_with_credentials_is_refused_without_showing_them(wired):
    wired["opcua"]["endpoint"] = "opc.tcp://operator:s3cret@127.0.0.1:4840/plant"
    message = refusal(wired)
    assert message == ("tanks.yaml.opcua.endpoint: a user name or password does not belong here (credentials go in "
                       "the host's settings)")
    assert "s3cret" not in message


# ---------------------------------------------------------------------------------------------- node ids


@pytest.mark.parametrize("node", ["ns=2;s=Tanks.y1", "i=2258", "ns=0;i=4294967295", "ns=65535;s=a;b=c", "s=x",
                                  "ns=3;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63", "ns=1;b=M/RbKBsRVkePCePcx24oRA==",
                                  "b=AAAA", "s=Tanks y1 (°C)"])
def test_a_node_id_in_opc_uas_string_form_is_accepted(wired, node):
    wired["opcua"]["nodes"]["y1"] = node
    assert binding_from_dict(wired).opcua.nodes["y1"] == node


@pytest.mark.parametrize("node", ["Tanks.y1", "ns=2;Tanks.y1", "ns=2,s=Tanks.y1", "ns=2;x=5", "ns=65536;i=1",
                                  "i=4294967296", "i=-1", "ns=-1;i=1", "s=", "b=", "b=abc", "g=not-a-guid",
                                  "s=Tanks\ny1", " ns=2;s=Tanks.y1", "i=" + "9" * 5000, 5, None])
def test_a_node_id_not_in_opc_uas_string_form_is_refused_naming_its_tag(wired, node):
    wired["opcua"]["nodes"]["y1"] = node
    message = refusal(wired)
    if node is None:  # a YAML key with no value
        assert message == "tanks.yaml.opcua.nodes.y1: expected an OPC UA node id: optional ns=<0..65535>; then " \
                          "i=<0..4294967295>, s=<text>, g=<GUID> or b=<base64>, got None"
    else:
        assert message.startswith("tanks.yaml.opcua.nodes.y1: expected an OPC UA node id: optional ns=<0..65535>; "
                                  "then i=<0..4294967295>, s=<text>, g=<GUID> or b=<base64>, got ")


# ---------------------------------------------------------------------------------------------- the tags' nodes


def test_every_tag_needs_its_node(wired):
    del wired["opcua"]["nodes"]["y2"]
    assert refusal(wired) == "tanks.yaml.opcua.nodes.y2: required field is missing (every MV, CV and DV tag needs " \
                             "its node)"


def test_a_dv_needs_its_node_too(wired):
    wired["dvs"] = [{"tag": "d1"}]
    assert refusal(wired).startswith("tanks.yaml.opcua.nodes.d1: required field is missing")
    wired["opcua"]["nodes"]["d1"] = "ns=2;s=Tanks.d1"
    assert binding_from_dict(wired).opcua.nodes["d1"] == "ns=2;s=Tanks.d1"


def test_a_node_of_an_unknown_tag_is_refused_with_the_closest_tag(wired):
    wired["opcua"]["nodes"]["y3"] = "ns=2;s=Tanks.y3"
    assert refusal(wired) == "tanks.yaml.opcua.nodes.y3: unknown tag; did you mean 'y2'?"


def test_a_node_of_a_tag_close_to_none_is_refused_listing_the_tags(wired):
    wired["opcua"]["nodes"]["flow"] = "ns=2;s=Tanks.flow"
    assert refusal(wired) == "tanks.yaml.opcua.nodes.flow: unknown tag (tags: v1, v2, y1, y2)"


def test_two_tags_may_not_share_a_node(wired):
    wired["opcua"]["nodes"]["y2"] = "ns=2;s=Tanks.y1"
    assert refusal(wired) == "tanks.yaml.opcua.nodes.y2: 'ns=2;s=Tanks.y1' is already the node of opcua.nodes.y1"


def test_two_spellings_of_one_node_are_one_node(wired):
    wired["opcua"]["nodes"].update(y1="i=5", y2="ns=0;i=05")
    assert refusal(wired) == "tanks.yaml.opcua.nodes.y2: 'ns=0;i=05' is already the node of opcua.nodes.y1"
    wired["opcua"]["nodes"].update(y1="ns=3;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63",
                                   y2="ns=3;g=72962b91-fa75-4ae6-8d28-b404dc7daf63")
    assert refusal(wired).startswith("tanks.yaml.opcua.nodes.y2: 'ns=3;g=72962b91")
    wired["opcua"]["nodes"].update(y1="ns=1;i=5", y2="ns=2;i=5")  # another namespace: another node
    assert binding_from_dict(wired).opcua.nodes["y2"] == "ns=2;i=5"


# ---------------------------------------------------------------------------------------------- advisory nodes


def test_advice_may_go_to_some_of_the_mvs(wired):
    del wired["opcua"]["advisory"]["nodes"]["v2"]
    assert dict(binding_from_dict(wired).opcua.advisory.nodes) == {"v1": "ns=2;s=Tanks.v1.advice"}


@pytest.mark.parametrize("tag", ["y1", "d1"])  # a CV, a DV
def test_advice_for_a_cv_or_a_dv_is_refused(wired, tag):
    wired["dvs"] = [{"tag": "d1"}]
    wired["opcua"]["nodes"]["d1"] = "ns=2;s=Tanks.d1"
    wired["opcua"]["advisory"]["nodes"][tag] = f"ns=2;s=Tanks.{tag}.advice"
    assert refusal(wired) == (f"tanks.yaml.opcua.advisory.nodes.{tag}: not an MV (advice is written for MVs only: "
                              "v1, v2)")


def test_advice_for_an_unknown_tag_is_refused_with_the_closest_mv(wired):
    wired["opcua"]["advisory"]["nodes"]["v3"] = "ns=2;s=Tanks.v3.advice"
    assert refusal(wired) == "tanks.yaml.opcua.advisory.nodes.v3: unknown MV tag; did you mean 'v2'?"


def test_an_advisory_section_needs_an_mv_to_advise(wired):
    wired["opcua"]["advisory"]["nodes"] = {}
    assert refusal(wired) == "tanks.yaml.opcua.advisory.nodes: at least one MV's advisory node is required"


@pytest.mark.parametrize("key", ["v1", "v2"])
def test_advice_is_never_written_to_a_node_the_binding_reads(wired, key):
    wired["opcua"]["advisory"]["nodes"][key] = "ns=2;s=Tanks.y1"
    assert refusal(wired) == (f"tanks.yaml.opcua.advisory.nodes.{key}: 'ns=2;s=Tanks.y1' is the node opcua.nodes.y1 "
                              "reads (advice is never written to a measurement node)")


def test_the_status_is_never_written_to_a_node_the_binding_reads(wired):
    wired["opcua"]["advisory"]["status"] = "ns=2;s=Tanks.v1"
    assert refusal(wired) == ("tanks.yaml.opcua.advisory.status: 'ns=2;s=Tanks.v1' is the node opcua.nodes.v1 reads "
                              "(advice is never written to a measurement node)")


def test_two_advisory_nodes_may_not_be_one_node(wired):
    wired["opcua"]["advisory"]["status"] = "ns=2;s=Tanks.v2.advice"
    assert refusal(wired) == ("tanks.yaml.opcua.advisory.status: 'ns=2;s=Tanks.v2.advice' is already the node of "
                              "opcua.advisory.nodes.v2")
    wired["opcua"]["advisory"]["status"] = "ns=2;s=Tanks.advice.status"
    wired["opcua"]["advisory"]["nodes"]["v2"] = "ns=2;s=Tanks.v1.advice"
    assert refusal(wired).startswith("tanks.yaml.opcua.advisory.nodes.v2: 'ns=2;s=Tanks.v1.advice' is already the "
                                     "node of opcua.advisory.nodes.v1")


# ---------------------------------------------------------------------------------------------- the ledger


@pytest.fixture
def ledger(any_ledger):
    """Every ledger test of this module runs on both backends (DuckDB file, PostgreSQL database)."""
    return any_ledger


def test_a_binding_without_wiring_writes_no_wiring_row(ledger, binding_doc):
    upsert = ledger.upsert_binding(binding_from_dict(binding_doc))
    assert upsert.wiring_changed is False and ledger.counts()["binding_wiring"] == 0
    assert ledger.get_binding("tanks-1").spec.opcua is None


def test_changing_only_the_wiring_keeps_the_revision_and_the_open_recommendation(ledger, binding_doc, wired):
    ledger.upsert_binding(binding_from_dict(binding_doc))
    _, rec_id = solve(ledger, revision=1)
    upsert = ledger.upsert_binding(binding_from_dict(wired))
    assert (upsert.revision, upsert.changed, upsert.expired, upsert.wiring_changed) == (1, False, 0, True)
    assert ledger.get_recommendation(rec_id).status == "verified"
    assert ledger.counts()["binding_revisions"] == 1
    assert ledger.get_binding("tanks-1").spec.opcua == binding_from_dict(wired).opcua


def test_a_changed_wiring_is_stored_and_the_newest_returned(ledger, wired):
    ledger.upsert_binding(binding_from_dict(wired))
    wired["opcua"]["endpoint"] = "opc.tcp://plant-2:4840/plant"
    moved = ledger.upsert_binding(binding_from_dict(wired))
    again = ledger.upsert_binding(binding_from_dict(wired))
    assert (moved.revision, moved.wiring_changed, again.wiring_changed) == (1, True, False)
    assert ledger.counts()["binding_wiring"] == 2
    assert ledger.get_binding("tanks-1").spec.opcua.endpoint == "opc.tcp://plant-2:4840/plant"


def test_a_binding_stored_without_opcua_after_one_with_it_has_no_wiring(ledger, binding_doc, wired):
    ledger.upsert_binding(binding_from_dict(wired))
    _, rec_id = solve(ledger, revision=1)
    unwired = ledger.upsert_binding(binding_from_dict(binding_doc))
    assert (unwired.revision, unwired.wiring_changed) == (1, True)
    assert ledger.get_recommendation(rec_id).status == "verified"
    assert ledger.get_binding("tanks-1").spec.opcua is None and ledger.list_bindings()[0].spec.opcua is None
    assert ledger.counts()["binding_wiring"] == 2  # append-only: the removal is a row of its own


def test_changing_a_limit_makes_a_new_revision_and_keeps_the_wiring(ledger, wired):
    ledger.upsert_binding(binding_from_dict(wired))
    _, rec_id = solve(ledger, revision=1)
    wired["mvs"][0]["hi"] = 5.5
    bumped = ledger.upsert_binding(binding_from_dict(wired))
    assert (bumped.revision, bumped.changed, bumped.expired, bumped.wiring_changed) == (2, True, 1, False)
    assert ledger.get_recommendation(rec_id).status == "expired"
    assert ledger.get_binding("tanks-1").spec.opcua == binding_from_dict(wired).opcua


def test_every_revision_is_read_with_the_bindings_latest_wiring(ledger, binding_doc, wired):
    ledger.upsert_binding(binding_from_dict(binding_doc))
    binding_doc["mvs"][0]["hi"] = 5.5
    ledger.upsert_binding(binding_from_dict(binding_doc))
    wired["mvs"][0]["hi"] = 5.5
    assert ledger.upsert_binding(binding_from_dict(wired)).revision == 2
    first = ledger.get_binding("tanks-1", revision=1)
    assert first.revision == 1 and first.spec.mvs[0].hi == 6.0
    assert first.spec.opcua == binding_from_dict(wired).opcua


def test_list_bindings_carries_each_bindings_latest_wiring(ledger, binding_doc, wired):
    ledger.upsert_binding(binding_from_dict({**binding_doc, "id": "plain"}))
    ledger.upsert_binding(binding_from_dict(wired))
    wired["opcua"]["endpoint"] = "opc.tcp://plant-2:4840"
    ledger.upsert_binding(binding_from_dict(wired))
    listed = {b.spec.id: b.spec.opcua for b in ledger.list_bindings()}
    assert listed == {"plain": None, "tanks-1": binding_from_dict(wired).opcua}


def _history(tmp_path) -> str:
    path = tmp_path / "history.csv"
    pd.DataFrame({"run_id": ["r1"] * 3, "timestamp": [0.0, 5.0, 10.0], "v1": [1.0, 2.0, 3.0], "v2": [1.0] * 3,
                  "y1": [7.0] * 3, "y2": [7.5] * 3}).to_csv(path, index=False)
    return str(path)


def test_the_ingest_summary_says_whether_the_wiring_changed(ledger, binding_doc, wired, tmp_path):
    history = _history(tmp_path)
    plain = ingest_history(lambda: ledger, binding_from_dict(binding_doc), history, "real")
    rewired = ingest_history(lambda: ledger, binding_from_dict(wired), history, "real")
    assert (plain["revision"], plain["wiring_changed"]) == (1, False)
    assert (rewired["revision"], rewired["changed"], rewired["wiring_changed"]) == (1, False, True)
    assert rewired["expired_recommendations"] == 0


def test_a_refused_ingest_stores_no_wiring(ledger, binding_doc, wired, tmp_path):
    frame = pd.read_csv(_history(tmp_path))
    ledger.ingest(binding_from_dict(binding_doc), frame, "real")
    with pytest.raises(ContractError, match="sample source"):
        ledger.ingest(binding_from_dict(wired), frame, "historian")  # refused after the binding was written
    assert ledger.counts()["binding_wiring"] == 0 and ledger.get_binding("tanks-1").spec.opcua is None


# ---------------------------------------------------------------------------------------------- the demo


@pytest.mark.parametrize("seeded", [False, True], ids=["before-its-history", "after-its-history"])
def test_demo_keeps_the_wiring_a_user_gave_a_demo_binding(tmp_path, monkeypatch, capsys, seeded):
    """`demo` stores the demo specs, which have no `opcua` section, again: a demo binding wired through
    ingest keeps its wiring, whether `demo` then seeds its history or finds it seeded (a second demo on
    a home keeps its history: no second copy of it)."""
    monkeypatch.setattr(automation, "run_partitions", lambda home, binding_ids: [])  # Dagster's refresh: not under test
    home = tmp_path / "home"
    if seeded:
        assert cli.main(["--home", str(home), "demo"]) == 0
    ledger = open_ledger(home)
    wired = binding_from_dict({**get_plant("tanks").binding_doc(), "opcua": OPCUA})
    ledger.upsert_binding(wired)
    samples = ledger.counts()["plant_samples"]
    capsys.readouterr()
    assert cli.main(["--home", str(home), "demo"]) == 0
    out = capsys.readouterr().out
    if seeded:
        assert out.count("already seeded") == len(demo_plants()) and "new samples" not in out
        assert ledger.counts()["plant_samples"] == samples
    else:
        assert out.count("new samples") == len(demo_plants()) and ledger.counts()["plant_samples"] > samples
    assert ledger.get_binding("tanks-1").spec.opcua == wired.opcua
    assert ledger.counts()["binding_wiring"] == 1  # no row unwiring it in between
