"""A demo plant served over OPC UA (`optimizer-pipeline simulate`): the plant's MV, CV and DV values as
variables of an asyncua server, advanced in real time x `speed` with measurement noise, with an
advisory node per MV and a status node the live service writes its advice to; with `apply_advice`
the MVs follow a verified advice (an operator who accepts every one, rate-limited by the binding's
max_move), closing the loop.

Time: the plant advances one of its own sample periods T every T / speed wall seconds, so the binding
that reads it (`binding_doc`) has `sample_period_s` T / speed and `valid_for_s` scaled alike; its
history (`history`) is the plant's demo history with time compressed the same way, ending at the
moment the simulation starts from (its live state). Node ids: `ns=2;s=<binding>.<tag>`, the
advice `ns=2;s=<binding>.<tag>.advice`, the status `ns=2;s=<binding>.advice.status`. The server keeps
the measurements' history (HistoryRead).
"""

import asyncio
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from optimizer_pipeline.plants.base import LiveState, Plant

log = logging.getLogger(__name__)

NAMESPACE = "urn:optimizer-pipeline:simulator"
HISTORY_KEPT = timedelta(days=1)
VERIFIED_STATUS = "status=verified"
STOP_TIMEOUT_S = 5.0


@dataclass
class Simulation:
    """`plant` served at `endpoint` (opc.tcp://host:port/path), advanced at `speed` times real time."""

    plant: Plant
    endpoint: str
    speed: float = 1.0
    apply_advice: bool = False
    seed: int = 1
    state: LiveState | None = field(default=None, init=False)
    moves: int = field(default=0, init=False)  # MV moves made by following advice

    @property
    def binding_id(self) -> str:
        return self.plant.spec.id

    @property
    def period_s(self) -> float:
        """Wall seconds per plant sample period."""
        return self.plant.sample_period_s / self.speed

    def node(self, tag: str) -> str:
        return f"ns=2;s={self.binding_id}.{tag}"

    def advice_node(self, tag: str) -> str:
        return f"ns=2;s={self.binding_id}.{tag}.advice"

    @property
    def status_node(self) -> str:
        return f"ns=2;s={self.binding_id}.advice.status"

    def binding_doc(self) -> dict[str, Any]:
        """The plant's binding as the live service reads it here: period and validity in wall time,
        wired to this server's nodes."""
        doc = self.plant.binding_doc()
        doc["sample_period_s"] = self.period_s
        doc["profile"]["valid_for_s"] = doc["profile"].get("valid_for_s", 3600) / self.speed
        doc["opcua"] = {"endpoint": self.endpoint, "nodes": {tag: self.node(tag) for tag in self.plant.spec.tags},
                        "advisory": {"nodes": {tag: self.advice_node(tag) for tag in self.plant.spec.mv_tags},
                                     "status": self.status_node}}
        return doc

    def history(self, end_at: float | None = None) -> pd.DataFrame:
        """The plant's demo history in wall time (T / speed per sample), its last sample at `end_at`
        (default: now, on the grid); the simulation continues from its live state."""
        end_at = math.floor(time.time() / self.period_s) * self.period_s if end_at is None else end_at
        demo = self.plant.history(self.seed)
        frame = demo.frame.copy()
        frame["timestamp"] = end_at + (frame["timestamp"] - demo.live.t) / self.speed
        self.state = LiveState(demo.live.x, demo.live.u, demo.live.d, demo.live.y, end_at)
        return frame

    def write_files(self, history: str | None, binding: str | None) -> list[str]:
        """Write the history (`history`, .csv / .parquet) and the binding (`binding`, YAML) a user ingests
        before serving; returns what was written, a line each."""
        import yaml

        from optimizer_pipeline.data.export import write_history

        written = []
        if history:
            write_history(self.history(), history)
            written.append(f"history of {self.binding_id} written to {history}")
        if binding:
            Path(binding).write_text(yaml.safe_dump(self.binding_doc(), sort_keys=False), encoding="utf-8")
            written.append(f"its binding, wired to {self.endpoint}, written to {binding}")
        return written

    def describe(self) -> str:
        return (f"simulating {self.binding_id} at {self.endpoint}: a sample period every {self.period_s:g} s "
                f"({self.speed:g} x real time{', following verified advice' if self.apply_advice else ''}; "
                f"SIGTERM / Ctrl-C stops it)")

    async def serve(self, stop: asyncio.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until `stop` is set: one plant step per period, its values written to the nodes."""
        from asyncua import Server, ua

        if self.state is None:
            self.history()
        plant, spec = self.plant, self.plant.spec
        rng = np.random.default_rng(self.seed + 1)
        server = Server()
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name(f"optimizer-pipeline simulator: {spec.id}")
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        index = await server.register_namespace(NAMESPACE)
        folder = await server.nodes.objects.add_folder(index, spec.id)

        async def variable(node_id: str, name: str, value: Any, kind) -> Any:
            return await folder.add_variable(ua.NodeId.from_string(node_id), name, ua.Variant(value, kind))

        values = self._values(plant, rng)
        measured = {tag: await variable(self.node(tag), tag, value, ua.VariantType.Double)
                    for tag, value in values.items()}
        advice = {tag: await variable(self.advice_node(tag), f"{tag}.advice", float(value), ua.VariantType.Double)
                  for tag, value in zip(spec.mv_tags, self.state.u)}
        status = await variable(self.status_node, "advice.status", "status=none", ua.VariantType.String)
        for node in (*advice.values(), status):
            await node.set_writable()
        await server.historize_node_data_change(list(measured.values()), period=HISTORY_KEPT)
        await server.start()
        try:
            log.info("simulator %s at %s: one step per %.3g s (%g x real time)", spec.id, self.endpoint,
                     self.period_s, self.speed)
            if on_ready is not None:
                on_ready()
            next_t = self.state.t + self.period_s
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, next_t - time.time()))
                    break
                except asyncio.TimeoutError:
                    pass
                if self.apply_advice and (await status.read_value()).startswith(VERIFIED_STATUS):
                    self._follow([float(await advice[tag].read_value()) for tag in spec.mv_tags])
                self._step(plant)
                now = datetime.now(timezone.utc)  # the source time its history keeps
                for tag, value in self._values(plant, rng).items():
                    await measured[tag].write_value(ua.DataValue(ua.Variant(value, ua.VariantType.Double),
                                                                 SourceTimestamp=now, ServerTimestamp=now))
                next_t += self.period_s
        finally:  # asyncua's stop waits for its connections, and a client reconnecting keeps one open
            try:
                await asyncio.wait_for(server.stop(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("simulator %s: the server did not stop within %g s; leaving anyway", spec.id,
                            STOP_TIMEOUT_S)

    def _follow(self, advised: list[float]) -> None:
        """Move the MVs toward the advice, at most max_move each, inside their limits."""
        spec = self.plant.spec
        u = np.array(self.state.u, float)
        target = np.clip(advised, [m.lo for m in spec.mvs], [m.hi for m in spec.mvs])
        step = np.clip(target - u, [-m.max_move for m in spec.mvs], [m.max_move for m in spec.mvs])
        if np.any(step != 0):
            self.moves += 1
        self.state = LiveState(self.state.x, u + step, self.state.d, self.state.y, self.state.t)

    def _step(self, plant: Plant) -> None:
        states, y = plant.simulate(self.state.x, self.state.u[None, :], self.state.d[None, :], noise=False)
        self.state = LiveState(states[-1], self.state.u, self.state.d, y[-1], self.state.t + self.period_s)

    def _values(self, plant: Plant, rng: np.random.Generator) -> dict[str, float]:
        """The tags' values now: MVs as held, CVs and DVs as measured (with the plant's noise)."""
        spec, state = plant.spec, self.state
        cvs = state.y + rng.normal(0.0, plant.cv_noise)
        dvs = state.d + (rng.normal(0.0, plant.dv_noise) if plant.nd else 0.0)
        return {**dict(zip(spec.mv_tags, map(float, state.u))), **dict(zip(spec.cv_tags, map(float, cvs))),
                **dict(zip(spec.dv_tags, map(float, np.atleast_1d(dvs))))}


def run(simulation: Simulation, on_ready: Callable[[], None] | None = None) -> None:
    """Serve `simulation` until SIGTERM / SIGINT (then the server stops and this returns). asyncua's own
    warnings about the server's open endpoint (a simulator on loopback has no security) are silenced."""
    logging.getLogger("asyncua").setLevel(logging.ERROR)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await simulation.serve(stop, on_ready)

    asyncio.run(main())
