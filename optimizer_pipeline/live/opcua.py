"""OPC UA as a sample source of the live service: subscriptions in, one sample per binding per sample
period out (docs/ARCHITECTURE.md, "Live samples over OPC UA").

One client per endpoint, shared by the bindings wired to it (`BindingSpec.opcua`), runs in an asyncio
loop on a thread of its own; the live service's loop only reads what it gathered. Every node is
monitored once per endpoint: sampling interval at most the smallest sample period that reads it, no
deadband, queue size 1, trigger StatusValueTimestamp. A notification sets the node's latest reading:
its value when the StatusCode is Good (or Uncertain where `accept_uncertain` says so), else missing.

Samples are formed on each binding's period grid, SETTLE_S after a grid time so that a change made at
the boundary has arrived, stamped with the grid time: each tag's latest reading (sample-and-hold:
OPC UA reports changes only, so a healthy constant value keeps giving samples however old its source
timestamp). No value yet, or a Bad one: NaN, never an older value presented as new. While an
endpoint's connection is down no sample is formed for its bindings: the gap stays a gap, and a new
client connects and subscribes anew with a capped backoff (asyncua's own reconnect, which restores
the old subscription, lost monitored items after a server restart). The samples are
stored in one batch per poll, continuing the binding's newest stored run (a gap cuts it into pieces
in cleaning, as for any history).
"""

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from optimizer_pipeline.contracts import BindingSpec, EvidenceSource
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import EndpointSecurity

log = logging.getLogger(__name__)

SETTLE_S = 0.2  # a grid time's sample is formed this long after it (notifications in flight arrive)
PUBLISH_MAX_MS = 1000.0  # the subscriptions publish at least this often (and 4 times per smallest period)
CONNECT_TIMEOUT_S = 4.0
# reconnect / first-connect retries: from, doubling up to; reset once a connection has held for the longest
BACKOFF_S = (1.0, 60.0)
STOP_TIMEOUT_S = 10.0
MAX_BACKFILL = 2000  # missed grid samples filled from a server's history after a gap (the live window's length)
# asyncua's session logs each failed PublishRequest with its traceback at ERROR, once a second while a
# connection is down
PUBLISH_LOGGER = "asyncua.client.ua_session.UaSession"


class _QuietPublishFailures(logging.Filter):
    """asyncua's traceback of a failed PublishRequest (it retries in 1 s): dropped while the connection is
    down (a ConnectionError: `_serve` says the loss once), else one WARNING line naming the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.exc_info and str(record.msg).startswith("Publish iteration crashed")):
            return True
        error = record.exc_info[1]
        if isinstance(error, ConnectionError):
            return False
        record.msg, record.args = "opcua: a PublishRequest failed (%s: %s); asyncua retries it in 1 s", \
            (type(error).__name__, error)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


_QUIET_PUBLISH_FAILURES = _QuietPublishFailures()


@dataclass
class _Reading:
    """The latest notification of one node: value (NaN when not usable) and its quality."""

    value: float
    quality: str  # good | uncertain | bad


def quality_of(status) -> str:
    """An OPC UA StatusCode's quality: good, uncertain or bad (its two top bits)."""
    return "good" if status.is_good() else "uncertain" if status.is_uncertain() else "bad"


def usable(value, quality: str, accept_uncertain: bool) -> float:
    """A reading as a sample value: the number for Good (and Uncertain if accepted), else NaN."""
    if quality == "bad" or (quality == "uncertain" and not accept_uncertain):
        return math.nan
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


@dataclass
class _Endpoint:
    """One server: its URL, the nodes read there (node id -> smallest sample period reading it), the
    latest reading per node id, and whether the connection is up."""

    url: str
    periods: dict[str, float] = field(default_factory=dict)
    readings: dict[str, _Reading] = field(default_factory=dict)
    connected: bool = False
    up_since: float = math.inf  # when the connection came up (wall clock); samples are formed for later times
    error: str | None = None
    history: bool = True  # whether the server may keep history (False once a HistoryRead failed or held nothing)


class _Handler:
    """asyncua's subscription handler: every data change sets the node's latest reading."""

    def __init__(self, endpoint: _Endpoint, accept_uncertain: bool, lock: threading.Lock):
        self.endpoint, self.accept_uncertain, self.lock = endpoint, accept_uncertain, lock

    def datachange_notification(self, node, val, data) -> None:
        quality = quality_of(data.monitored_item.Value.StatusCode)
        with self.lock:
            self.endpoint.readings[node.nodeid.to_string()] = _Reading(usable(val, quality, self.accept_uncertain),
                                                                       quality)

    def status_change_notification(self, status) -> None:
        log.warning("opcua %s: subscription status %s", self.endpoint.url, status.Status)


class OpcUaSource:
    """The SampleSource of the bindings wired to OPC UA (`specs`, each with `spec.opcua`): start() connects
    (in the background), ready() says whether a grid time of any binding is due, poll() forms and stores
    the due samples of the bindings the service `takes` (those it holds the lease of), stop() disconnects.
    `security` gives an endpoint's security and credentials (Settings.opcua_security); a connection the
    server refuses for them is said once and retried every BACKOFF_S[1] only. `clock` is the wall clock
    (seconds since the epoch)."""

    name = "opcua"

    def __init__(self, specs: Iterable[BindingSpec], *, accept_uncertain: bool = False,
                 takes: Callable[[str], bool] = lambda binding_id: True,
                 security: Callable[[str], EndpointSecurity] = EndpointSecurity, clock=time.time):
        from asyncua import ua

        self.specs = {spec.id: spec for spec in specs if spec.opcua is not None}
        self.accept_uncertain, self.takes, self.clock = accept_uncertain, takes, clock
        self.security = security  # endpoint URL -> how to connect to it (the host's opcua.endpoints)
        self.endpoints: dict[str, _Endpoint] = {}
        # binding id -> the node id of each tag, in the form notifications name it ("ns=2;s=Tanks.v1")
        self.nodes = {b: tuple(ua.NodeId.from_string(spec.opcua.nodes[tag]).to_string() for tag in spec.tags)
                      for b, spec in self.specs.items()}
        for binding_id, spec in self.specs.items():
            endpoint = self.endpoints.setdefault(spec.opcua.endpoint, _Endpoint(spec.opcua.endpoint))
            for node in self.nodes[binding_id]:
                endpoint.periods[node] = min(endpoint.periods.get(node, math.inf), spec.sample_period_s)
        self._lock = threading.Lock()
        self._next: dict[str, float] = {b: self._grid_after(b, self.clock()) for b in self.specs}
        self._runs: dict[str, str] = {}  # binding -> the run its samples continue
        self._last: dict[str, float | None] = {}  # binding -> its newest stored sample time
        self._sources: dict[str, str] = {}  # binding -> the source its samples are stored as
        self._stored: dict[str, tuple[str, float, str]] | None = None  # ledger.live_runs(), read once
        self.clients: dict[str, object] = {}  # endpoint -> its connected asyncua Client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    # ------------------------------------------------------------------ the service's side

    def _grid_after(self, binding_id: str, t: float) -> float:
        period = self.specs[binding_id].sample_period_s
        return (math.floor(t / period) + 1) * period

    def ready(self, now_m: float) -> bool:
        now = self.clock()
        return any(now >= t + SETTLE_S for t in self._next.values())

    def due_at(self) -> float:
        """The next grid time of a binding, settled, on the monotonic clock."""
        if not self._next:
            return math.inf
        return time.monotonic() + max(0.0, min(self._next.values()) + SETTLE_S - self.clock())

    def poll(self, ledger: Ledger) -> dict[str, list[pd.DataFrame]]:
        """Form the samples of every binding whose grid time passed (the newest grid time only: a poll
        late by periods does not invent the ones between), after the grid times missing since the
        binding's newest stored sample filled from the server's history where it keeps one
        (`_backfill`); store them in one batch, return them."""
        now = self.clock()
        items = []
        for binding_id, due in self._next.items():
            if now < due + SETTLE_S:
                continue
            spec = self.specs[binding_id]
            grid_t = math.floor((now - SETTLE_S) / spec.sample_period_s) * spec.sample_period_s
            self._next[binding_id] = grid_t + spec.sample_period_s
            if not self.takes(binding_id):  # another service holds it (and samples it)
                continue
            row = self.sample(spec, grid_t)
            if row is None:  # its endpoint was down at the grid time: a gap, nothing invented
                continue
            if binding_id not in self._runs:
                self._continue(ledger, binding_id, grid_t)
            frame = pd.DataFrame([[grid_t, *row]], columns=["timestamp", *spec.tags])
            missed = self._backfill(spec, self._last[binding_id], grid_t)
            frame = pd.concat([missed, frame], ignore_index=True) if missed is not None else frame
            frame.insert(0, "run_id", self._runs[binding_id])
            self._last[binding_id] = grid_t
            items.append((binding_id, frame, spec.tags))
        if not items:
            return {}
        by_source: dict[str, list] = {}
        for item in items:
            by_source.setdefault(self._sources[item[0]], []).append(item)
        for source, part in by_source.items():
            ledger.append_samples_many(part, source)
        return {binding_id: [frame] for binding_id, frame, _ in items}

    def _continue(self, ledger: Ledger, binding_id: str, grid_t: float) -> None:
        """What a binding's first samples continue: its live run and newest sample time, and the source
        its samples are stored as ('real' unless its stored samples are all simulated); read for every
        binding at once (ledger.live_runs) the first time one is needed."""
        if self._stored is None:
            self._stored = ledger.live_runs()
        run_id, last_t, source = self._stored.pop(binding_id, (None, None, EvidenceSource.REAL.value))
        self._runs[binding_id] = run_id or f"opcua-{pd.Timestamp(grid_t, unit='s', tz='UTC'):%Y%m%dT%H%M%S}"
        self._last[binding_id], self._sources[binding_id] = last_t, source

    def _backfill(self, spec: BindingSpec, last_t: float | None, grid_t: float) -> pd.DataFrame | None:
        """The grid times between the binding's newest stored sample (`last_t`) and `grid_t`, at most
        MAX_BACKFILL of the newest, as samples from the server's history (HistoryRead, bounds included):
        each tag's latest historical value at or before the grid time, NaN where the history holds none
        (never a value carried over a time the server does not vouch for). None without a gap, or when
        the server keeps no history of these nodes (said once per endpoint: the gap stays)."""
        period = spec.sample_period_s
        if last_t is None or grid_t - last_t < 1.5 * period:
            return None
        endpoint = self.endpoints[spec.opcua.endpoint]
        if not endpoint.history:
            return None
        first = max(last_t + period, grid_t - MAX_BACKFILL * period)
        times = first + period * np.arange(int(round((grid_t - first) / period)))
        try:
            history = self.submit(self._read_history(endpoint.url, self.nodes[spec.id], last_t, grid_t), wait=True,
                                  raise_errors=True)
        except Exception as exc:  # noqa: BLE001 - no history kept (or not readable): the gap stays
            endpoint.history = False
            log.warning("opcua %s: no history to fill the gap before t=%.3f from (%s: %s); %s warms up from "
                        "its live samples", endpoint.url, grid_t, type(exc).__name__, exc, spec.id)
            return None
        columns = {}
        for tag, (stamps, values) in zip(spec.tags, history):
            at = np.searchsorted(stamps, times, side="right") - 1
            columns[tag] = np.where(at >= 0, values[np.maximum(at, 0)] if len(values) else np.nan, np.nan)
        frame = pd.DataFrame({"timestamp": times, **columns})
        frame = frame[frame[list(spec.tags)].notna().any(axis=1)]
        if frame.empty:  # a server keeping no history of these nodes: not asked again
            endpoint.history = False
            log.warning("opcua %s: the server's history holds nothing of the gap before t=%.3f; %s warms up from "
                        "its live samples (the server is not asked for history again)", endpoint.url, grid_t, spec.id)
            return None
        log.info("opcua %s: %s: %d of %d missed sample(s) filled from the server's history", endpoint.url, spec.id,
                 len(frame), len(times))
        return frame

    async def _read_history(self, url: str, nodes: tuple[str, ...], start: float, end: float) -> list:
        """Per node: (source times in s since the epoch, sample values) of its raw history in [start, end]."""
        from datetime import datetime, timezone

        client = self.clients.get(url)
        if client is None:
            raise ConnectionError("not connected")
        out = []
        for node_id in nodes:
            values = await client.get_node(node_id).read_raw_history(
                datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))
            points = sorted((_seconds(v.SourceTimestamp or v.ServerTimestamp),
                             usable(v.Value.Value if v.Value is not None else None, quality_of(v.StatusCode),
                                    self.accept_uncertain)) for v in values)
            out.append((np.array([t for t, _ in points], float), np.array([x for _, x in points], float)))
        return out

    def sample(self, spec: BindingSpec, at: float | None = None) -> list[float] | None:
        """The binding's tags' latest readings (NaN without a usable one) as its sample at time `at`
        (default: now); None when its endpoint is not connected, or was not yet at `at`."""
        endpoint = self.endpoints[spec.opcua.endpoint]
        with self._lock:
            if not endpoint.connected or endpoint.up_since > (self.clock() if at is None else at):
                return None
            readings = [endpoint.readings.get(node) for node in self.nodes[spec.id]]
        return [math.nan if r is None else r.value for r in readings]

    # ------------------------------------------------------------------ the connections (asyncio thread)

    def start(self) -> None:
        """Connect every endpoint in the background (a failing one is retried; the others serve)."""
        started = threading.Event()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            self._stopping = asyncio.Event()
            started.set()
            self._loop.run_until_complete(self._serve_all())
            pending = asyncio.all_tasks(self._loop)  # e.g. advice waiting to lapse: ended, not left pending
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.wait(pending))
            self._loop.close()

        logging.getLogger(PUBLISH_LOGGER).addFilter(_QUIET_PUBLISH_FAILURES)  # once: the same filter

        self._thread = threading.Thread(target=main, name="opcua", daemon=True)
        self._thread.start()
        started.wait()

    def submit(self, coroutine, wait: bool = False, raise_errors: bool = False):
        """Run `coroutine` on the connections' thread; `wait`: until it is done (STOP_TIMEOUT_S at most)
        and return its result (its error raised with `raise_errors`, else logged at debug level); else its
        concurrent Future (cancel() cancels it), None when the connections are not running."""
        if self._loop is None or self._thread is None:
            coroutine.close()
            if raise_errors:
                raise ConnectionError("the OPC UA connections are not running")
            return None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        if not wait:
            return future
        try:
            return future.result(STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - said by the coroutine itself, or by the caller
            if raise_errors:
                raise
            log.debug("opcua: a waited-for call failed", exc_info=True)
            return None

    def stop(self) -> None:
        """Disconnect every endpoint and end the thread."""
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

    async def _serve_all(self) -> None:
        await asyncio.gather(*(self._serve(endpoint) for endpoint in self.endpoints.values()))

    async def _serve(self, endpoint: _Endpoint) -> None:
        """Connect (retrying with a capped backoff), subscribe, then follow the connection until stopped; a
        lost connection is given up, and a new client connects and subscribes as at the start."""
        from asyncua import Client

        from optimizer_pipeline.live.opcua_security import configure, permanent_failure

        security = self.security(endpoint.url)
        delay, connected_before = BACKOFF_S[0], False
        while not self._stopping.is_set():
            client = Client(endpoint.url, timeout=CONNECT_TIMEOUT_S, watchdog_intervall=1.0)
            try:
                await configure(client, security)  # may ask the server for its endpoints
                await client.connect()
                self.clients[endpoint.url] = client  # before `connected`: advice may be written from then on
                await self._subscribe(client, endpoint)
            except Exception as exc:  # noqa: BLE001 - any failure to reach the server is retried, said once
                refused = permanent_failure(exc, security)  # credentials or certificates: not a storm of retries
                message = refused or f"opcua {endpoint.url}: cannot connect ({type(exc).__name__}: {exc}".strip() + \
                    f"); retrying every {BACKOFF_S[1]:.0f} s at most"
                if message != endpoint.error:
                    log.warning("%s", message)
                endpoint.error = message
                self.clients.pop(endpoint.url, None)
                await _quietly(client.disconnect())
                if await _wait(self._stopping, BACKOFF_S[1] if refused else delay):
                    return
                delay = min(BACKOFF_S[1], 2 * delay)
                continue
            endpoint.error = None
            log.info("opcua %s: %s, %d node(s) monitored", endpoint.url,
                     "reconnected" if connected_before else "connected", len(endpoint.periods))
            connected_before, up_at = True, time.monotonic()
            try:
                lost = await self._follow(client)
            finally:
                with self._lock:
                    endpoint.connected = False
                    endpoint.readings.clear()  # a value read before a gap is not the value after it
                await asyncio.sleep(0)  # writes sent before the stop go out first
                self.clients.pop(endpoint.url, None)
                await _quietly(client.disconnect())
            if not lost:
                return
            log.warning("opcua %s: connection lost; no samples until it is back", endpoint.url)
            if time.monotonic() - up_at >= BACKOFF_S[1]:  # it had held: reconnect at once, backoff anew
                delay = BACKOFF_S[0]
            else:  # a server that accepts and drops sessions is not asked again every second
                if await _wait(self._stopping, delay):
                    return
                delay = min(BACKOFF_S[1], 2 * delay)

    async def _subscribe(self, client, endpoint: _Endpoint) -> None:
        from asyncua import ua

        smallest_ms = 1000.0 * min(endpoint.periods.values())
        subscription = await client.create_subscription(min(PUBLISH_MAX_MS, smallest_ms / 4),
                                                        _Handler(endpoint, self.accept_uncertain, self._lock))
        requests = []
        for handle, (node_id, period) in enumerate(sorted(endpoint.periods.items()), start=1):
            item = ua.MonitoredItemCreateRequest()
            item.ItemToMonitor = ua.ReadValueId(NodeId=ua.NodeId.from_string(node_id),
                                                AttributeId=ua.AttributeIds.Value)
            item.MonitoringMode = ua.MonitoringMode.Reporting
            item.RequestedParameters = ua.MonitoringParameters(
                ClientHandle=handle, SamplingInterval=min(PUBLISH_MAX_MS, 1000.0 * period / 4), QueueSize=1,
                DiscardOldest=True, Filter=ua.DataChangeFilter(Trigger=ua.DataChangeTrigger.StatusValueTimestamp,
                                                               DeadbandType=0, DeadbandValue=0.0))
            requests.append(item)
        results = await subscription.create_monitored_items(requests)
        refused = [f"{node} ({r.name})" for (node, _), r in zip(sorted(endpoint.periods.items()), results)
                   if isinstance(r, ua.StatusCode)]
        if refused:
            log.warning("opcua %s: the server refused to monitor %s; their tags stay missing", endpoint.url,
                        ", ".join(refused))
        with self._lock:
            endpoint.connected, endpoint.up_since = True, self.clock()

    async def _follow(self, client) -> bool:
        """Wait until stopped (False) or until the client's watchdog finds the connection lost (True)."""
        from asyncua.client.ua_client import UaClientState

        while not await _wait(self._stopping, 0.2):
            if client.state is not UaClientState.CONNECTED:
                return True
        return False


def _seconds(moment) -> float:
    """An OPC UA DateTime (asyncua: a datetime, naive meaning UTC) as seconds since the epoch."""
    from datetime import timezone

    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Whether `event` was set within `seconds`."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def _quietly(coroutine) -> None:
    try:
        await coroutine
    except Exception:  # noqa: BLE001 - closing a connection that failed: nothing to do about it
        log.debug("opcua: disconnect failed", exc_info=True)


