"""OPC UA as the live service's sample source (issue 36, "Sampling"), against a real asyncua server on
loopback: one sample per binding per period on the grid, a constant value kept giving samples, Good /
Uncertain / Bad qualities, nothing formed while the connection is down, the samples stored in the
ledger; an unreachable endpoint is said once and retried while the others serve."""

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from asyncua import ua

from optimizer_pipeline.contracts import OpcUaWiring
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.live.opcua import SETTLE_S, OpcUaSource
from optimizer_pipeline.plants import get_plant

from opcua_server import INITIAL, PlantServer
from servers import free_port

PERIOD_S = 0.5
HEATER = get_plant("heater").spec  # tags q_heat (MV), t_out (CV), t_in (DV)


def _wired(server_url: str, binding_id: str = "heater-1", prefix: str = "", nodes: dict | None = None):
    nodes = nodes or {tag: f"ns=2;s={prefix}{tag}" for tag in HEATER.tags}
    return replace(HEATER, id=binding_id, sample_period_s=PERIOD_S, opcua=OpcUaWiring(server_url, nodes))


# how long a test waits for an event (a connection, a value, a write): a bound, not a pause. A
# connection to the loopback server takes well under 1 s quiet; a reconnection waits out the source's
# back-off (BACKOFF_S: 1 s doubling up to 60 s) first.
EVENT_TIMEOUT_S = 60.0


def _until(condition, timeout_s: float = EVENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _drive(source: OpcUaSource, ledger: Ledger, seconds: float, enough=lambda got: True,
           timeout_s: float = EVENT_TIMEOUT_S) -> dict[str, list]:
    """Poll as the live service does, for `seconds`, then on until `enough(got)` holds (at most
    `timeout_s` in all); every frame returned, by binding. `seconds` is the scenario's span (a negative
    check: nothing formed during it); `enough` what the test needs to have seen, which a loaded machine
    may take longer to form (a poll writes to the ledger) than the span."""
    got: dict[str, list] = {}
    started = time.monotonic()
    end, deadline = started + seconds, started + max(seconds, timeout_s)
    while time.monotonic() < end or not enough(got):
        assert time.monotonic() < deadline, f"polled {time.monotonic() - started:.1f} s without enough: {got}"
        if source.ready(time.monotonic()):
            for binding_id, frames in source.poll(ledger).items():
                got.setdefault(binding_id, []).extend(frames)
        time.sleep(0.02)
    return got


def _frames_of(binding_id: str, n: int = 1):
    """`enough` for _drive: at least `n` frames of the binding."""
    return lambda got: len(got.get(binding_id, [])) >= n


class _GridClock:
    """The source's wall clock, moved by the test to each grid time + SETTLE_S in turn, as real time
    reaches it. OpcUaSource.poll forms the newest grid time's sample only (a poll late by a period
    skips that grid time, by design): with this clock every poll sees exactly its grid time, however
    late a loaded machine runs the test's loop, while real time passes as it would."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def step(self, period_s: float) -> float:
        """The next grid time after now; the clock set just past its settle time (10 ms: clear of the
        rounding of grid_t + SETTLE_S - SETTLE_S) once real time is there."""
        grid_t = (math.floor(self.now / period_s) + 1) * period_s
        self.now = grid_t + SETTLE_S + 0.01
        time.sleep(max(0.0, self.now - time.time()))
        return grid_t


def _connected(source: OpcUaSource, url: str) -> bool:
    return source.endpoints[url].connected


@contextmanager
def _serving(url: str, specs, **options):
    """An OPC UA source of `specs` (`options` as OpcUaSource takes them), started and connected to `url`;
    stopped after."""
    source = OpcUaSource(specs, **options)
    source.start()
    try:
        _until(lambda: _connected(source, url))
        yield source
    finally:
        source.stop()


ADVICE_TYPES = {"q_heat.advice": ua.VariantType.Float, "advice.status": ua.VariantType.String}


@pytest.fixture(scope="module")
def plant_server():
    """One real asyncua server for the module's tests that need no server of their own (its start, asyncua
    building its standard address space, takes 3-4 s quiet and twice that loaded): the heater's nodes and
    advisory nodes. Each test gets it reset (`server`)."""
    with PlantServer([*HEATER.tags, *ADVICE_TYPES], types=ADVICE_TYPES) as plant:
        yield plant


@pytest.fixture
def server(plant_server):
    """The module's server with its values as a fresh one's: the heater's Good (100, 45, 15), the advisory
    nodes at their initial values (a client of an earlier test is gone: OpcUaSource.stop disconnects it)."""
    for tag, value in zip(HEATER.tags, (100.0, 45.0, 15.0)):
        plant_server.set(tag, value)
    for name, kind in ADVICE_TYPES.items():  # PlantServer.set writes Doubles only: these in their own type
        initial = ua.Variant(INITIAL.get(kind, 0), kind)
        plant_server._call(plant_server.nodes[name].write_value(initial))
    assert [plant_server.get(name) for name in ADVICE_TYPES] == [(0.0, ua.VariantType.Float),
                                                                ("", ua.VariantType.String)]
    yield plant_server


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "optimizer.duckdb")


def test_one_sample_per_period_on_the_grid_and_a_constant_value_keeps_giving_samples(server, ledger):
    spec = _wired(server.url)
    ledger.upsert_binding(spec)
    clock = _GridClock()
    with _serving(server.url, [spec], clock=clock) as source:
        _until(lambda: source.sample(spec) == [100.0, 45.0, 15.0])
        frames = []
        for _ in range(6):  # six periods, each polled at its grid time as the live service does
            clock.step(PERIOD_S)
            assert source.ready(time.monotonic())
            frames += source.poll(ledger).get("heater-1", [])
    rows = [frame.iloc[0] for frame in frames]
    times = [row["timestamp"] for row in rows]
    assert len(rows) >= 4 and all(len(frame) == 1 for frame in frames)
    assert all(t / PERIOD_S == round(t / PERIOD_S) for t in times)  # stamped with grid times
    assert [b - a for a, b in zip(times, times[1:])] == [PERIOD_S] * (len(times) - 1)  # none skipped
    assert all([row[tag] for tag in HEATER.tags] == [100.0, 45.0, 15.0] for row in rows)
    stored = ledger.history_frame("heater-1", HEATER.tags)
    assert list(stored["timestamp"]) == times and stored["run_id"].nunique() == 1
    assert stored["run_id"].iloc[0].startswith("opcua-")


def test_samples_continue_the_bindings_newest_stored_run(server, ledger):
    spec = _wired(server.url)
    history = get_plant("heater").history(1).frame
    ledger.ingest(spec, history, "real")
    newest = history.loc[history["timestamp"].idxmax(), "run_id"]
    with _serving(server.url, [spec]) as source:
        frames = _drive(source, ledger, 3 * PERIOD_S, _frames_of("heater-1"))["heater-1"]
    assert {frame["run_id"].iloc[0] for frame in frames} == {newest}


@pytest.mark.parametrize("accept_uncertain", [False, True])
def test_good_gives_the_value_uncertain_only_when_accepted_bad_and_unknown_nodes_never(server, accept_uncertain):
    spec = _wired(server.url, nodes={"q_heat": "ns=2;s=q_heat", "t_out": "ns=2;s=t_out", "t_in": "ns=2;s=nowhere"})
    server.set("q_heat", 120.0, ua.StatusCodes.UncertainLastUsableValue)
    server.set("t_out", 47.0, ua.StatusCodes.BadSensorFailure)
    with _serving(server.url, [spec], accept_uncertain=accept_uncertain) as source:
        # the notifications of both served nodes arrived, with their qualities (t_in's node is refused
        # by the server: it never gets one); was a 1.5 s sleep, after which a slow machine might have
        # had none yet (all-NaN passes the check below without accept_uncertain)
        readings = source.endpoints[server.url].readings
        quality = lambda node: getattr(readings.get(node), "quality", None)  # noqa: E731
        _until(lambda: (quality("ns=2;s=q_heat"), quality("ns=2;s=t_out")) == ("uncertain", "bad"))
        q_heat, t_out, t_in = source.sample(spec)
        assert math.isnan(t_out) and math.isnan(t_in)  # Bad, and a node the server does not have
        assert q_heat == 120.0 if accept_uncertain else math.isnan(q_heat)
        server.set("t_out", 48.0)  # Good again: the value at once
        _until(lambda: source.sample(spec)[1] == 48.0)


def test_no_samples_while_the_server_is_down_and_samples_resume_when_it_is_back(ledger):
    port = free_port()
    first = PlantServer(HEATER.tags, port=port).start()
    spec = _wired(first.url)
    ledger.upsert_binding(spec)
    with _serving(first.url, [spec]) as source:
        before = _drive(source, ledger, 3 * PERIOD_S, _frames_of("heater-1"))["heater-1"]
        first.close()
        _until(lambda: not _connected(source, first.url))
        down_at = time.time()
        # a negative check over a fixed span: a slower machine polls less often in it, which can only
        # find less, so load cannot make it fail
        during = _drive(source, ledger, 4 * PERIOD_S)
        assert during == {}  # nothing invented for the gap
        with PlantServer(HEATER.tags, port=port) as second:
            second.set("t_out", 52.0)
            # the source retries after its back-off (1, 2, 4 ... s, at most 60 s): a bound past it
            _until(lambda: _connected(source, second.url), timeout_s=120)
            up_at = time.time()
            _until(lambda: source.sample(spec)[1] == 52.0)
            after = _drive(source, ledger, 3 * PERIOD_S, _frames_of("heater-1"))["heater-1"]
    assert before and after
    times = list(ledger.history_frame("heater-1", HEATER.tags)["timestamp"])
    assert not [t for t in times if down_at + PERIOD_S < t < up_at - PERIOD_S], (down_at, up_at, times)  # a gap
    assert after[-1]["t_out"].iloc[0] == 52.0


def test_an_unreachable_endpoint_is_said_once_and_the_others_keep_being_served(server, ledger, caplog):
    dead = f"opc.tcp://127.0.0.1:{free_port()}/plant"
    good, lost = _wired(server.url), _wired(dead, binding_id="heater-2")
    caplog.set_level(logging.WARNING, logger="optimizer_pipeline.live.opcua")
    with _serving(server.url, [good, lost]) as source:
        got = _drive(source, ledger, 4 * PERIOD_S, _frames_of("heater-1"))
    assert set(got) == {"heater-1"}
    said = [r.getMessage() for r in caplog.records if dead in r.getMessage()]
    assert len(said) == 1 and "cannot connect" in said[0], said


VALID_UNTIL = "2099-12-06T04:00:00+00:00"


def _advice(status: str, values: dict | None):
    from optimizer_pipeline.live.advice import Advice

    return Advice("heater-1", status, "rec-1", VALID_UNTIL, values)


def test_verified_advice_is_written_in_each_nodes_own_type_and_anything_else_writes_the_status_only(server):
    from optimizer_pipeline.contracts import AdvisoryWiring
    from optimizer_pipeline.live.advice import AdvisoryWriter

    plant = server
    nodes = {tag: plant.node_id(tag) for tag in HEATER.tags}
    spec = replace(_wired(plant.url), opcua=OpcUaWiring(plant.url, nodes, AdvisoryWiring(
        {"q_heat": plant.node_id("q_heat.advice")}, plant.node_id("advice.status"))))
    plant.set("q_heat", 100.0)
    with _serving(plant.url, [spec]) as source:
        writer = AdvisoryWriter(source)
        writer.write(_advice("verified", {"q_heat": 108.25}))
        _until(lambda: plant.get("advice.status")[0].startswith("status=verified"))
        assert plant.get("q_heat.advice") == (108.25, ua.VariantType.Float)  # a Float node gets a Float
        assert plant.get("advice.status")[0] == f"status=verified recommendation=rec-1 valid_until={VALID_UNTIL}"
        writer.write(_advice("unverified", None))
        _until(lambda: plant.get("advice.status")[0].startswith("status=unverified"))
        assert plant.get("q_heat.advice")[0] == 108.25  # the advice stays as it was: not overwritten
        assert plant.get("q_heat")[0] == 100.0  # the measurement is never written
        writer.offline()
        assert plant.get("advice.status")[0] == "status=offline"
        assert writer.failures == 0


def test_a_status_whose_recommendation_lapses_says_expired_unless_a_newer_one_came(server):
    from optimizer_pipeline.contracts import AdvisoryWiring, iso_from_seconds, parse_iso_utc
    from optimizer_pipeline.live.advice import Advice, AdvisoryWriter

    plant = server
    nodes = {tag: plant.node_id(tag) for tag in HEATER.tags}
    spec = replace(_wired(plant.url), opcua=OpcUaWiring(plant.url, nodes, AdvisoryWiring(
        {"q_heat": plant.node_id("q_heat.advice")}, plant.node_id("advice.status"))))
    with _serving(plant.url, [spec]) as source:
        writer = AdvisoryWriter(source)
        soon = iso_from_seconds(time.time() + 1.0)
        writer.write(Advice("heater-1", "verified", "rec-1", soon, {"q_heat": 101.0}))
        waiting = writer._lapse["heater-1"]
        later = iso_from_seconds(time.time() + 60.0)
        writer.write(Advice("heater-1", "verified", "rec-2", later, {"q_heat": 102.0}))
        _until(waiting.cancelled)  # one lapse waits per binding, not one per publication
        _until(lambda: plant.get("advice.status")[0].startswith("status=verified recommendation=rec-2"))
        # a negative check: rec-1's valid_until passes and nothing says it expired. The pause is
        # counted from rec-1's valid_until (not from the writes), so it always covers it; on a slow
        # machine a wrongly written "expired" could land after the look, never the other way round
        time.sleep(max(0.0, parse_iso_utc(soon).timestamp() + 0.5 - time.time()))
        assert plant.get("advice.status")[0].startswith("status=verified recommendation=rec-2")
        lapsing = iso_from_seconds(time.time() + 1.0)
        writer.write(Advice("heater-1", "verified", "rec-3", lapsing, {"q_heat": 103.0}))
        _until(lambda: plant.get("advice.status")[0].startswith("status=expired recommendation=rec-3"))
        assert plant.get("q_heat.advice")[0] == 103.0


def test_a_write_that_fails_is_counted_and_does_not_raise(server, caplog):
    from optimizer_pipeline.contracts import AdvisoryWiring
    from optimizer_pipeline.live.advice import AdvisoryWriter

    nodes = {tag: server.node_id(tag) for tag in HEATER.tags}
    spec = replace(_wired(server.url), opcua=OpcUaWiring(server.url, nodes, AdvisoryWiring(
        {"q_heat": "ns=2;s=not.there"})))
    with _serving(server.url, [spec]) as source:
        writer = AdvisoryWriter(source)
        writer.write(_advice("verified", {"q_heat": 1.0}))
        _until(lambda: writer.failures == 1)
    assert any("writing ns=2;s=not.there failed" in r.getMessage() for r in caplog.records)


def test_the_samples_missed_since_the_newest_stored_one_are_filled_from_the_servers_history(ledger):
    with PlantServer(HEATER.tags, historize=True) as plant:
        spec = _wired(plant.url)
        start = math.floor(time.time() / PERIOD_S) * PERIOD_S
        written = []  # (source timestamp, t_out) as the server recorded them
        first_write = plant.set("q_heat", 100.0)
        plant.set("t_in", 15.5)
        # the plant's values change over 3 s: the scenario's own time (a slower machine spreads them
        # more; every check below is against the stamps the server recorded, so none can flip)
        for k in range(6):
            written.append((plant.set("t_out", 40.0 + k), 40.0 + k))
            time.sleep(PERIOD_S)
        # the newest stored sample at `start`, stored after the writes (the source is not running yet):
        # the ledger's write (seconds on a loaded machine) used to sit between `start` and the first
        # write, and put grid times without the written values at the head of the gap
        ledger.ingest(spec, pd.DataFrame({"run_id": "r1", "timestamp": start - PERIOD_S * np.arange(3)[::-1],
                                          "q_heat": 90.0, "t_out": 39.0, "t_in": 15.0}), "real")
        with _serving(plant.url, [spec]) as source:
            frames = _drive(source, ledger, 2 * PERIOD_S, _frames_of("heater-1"))["heater-1"]
    first = frames[0]
    assert len(first) > 4 and (first["run_id"] == "r1").all()  # the run continues
    times = first["timestamp"].to_numpy()
    # every missed grid time from the first at which the server had values (none invented before it)
    assert start < times[0] and times[0] - PERIOD_S < first_write and (np.diff(times) == PERIOD_S).all()
    for t, t_out in zip(times[:-1], first["t_out"].to_numpy()[:-1]):  # the filled ones: held as the server had them
        before = [value for at, value in written if at <= t]
        # before the first write: the node's initial value 0 where the server's history holds it from its start
        assert t_out == before[-1] if before else (math.isnan(t_out) or t_out == 0.0)
    assert (first["q_heat"].iloc[1:-1] == 100.0).all()


def test_without_a_server_history_the_gap_stays_and_it_is_said_once(server, ledger, caplog):
    spec = _wired(server.url)
    start = math.floor(time.time() / PERIOD_S) * PERIOD_S - 5.0
    ledger.ingest(spec, pd.DataFrame({"run_id": "r1", "timestamp": [start], "q_heat": 90.0, "t_out": 39.0,
                                      "t_in": 15.0}), "real")
    with _serving(server.url, [spec]) as source:
        frames = _drive(source, ledger, 3 * PERIOD_S, _frames_of("heater-1"))["heater-1"]
    assert all(len(frame) == 1 for frame in frames)  # the current sample only
    said = [r.getMessage() for r in caplog.records if "history" in r.getMessage() and "warms up" in r.getMessage()]
    assert len(said) == 1 and server.url in said[0]
