"""OPC UA sampling at site scale (issue 36): `--bindings` bindings x 4 tags (the tanks binding's v1, v2,
y1, y2) as monitored items of one asyncua server on loopback (a process of its own, every value moving
every period), read by the live service's OPC UA source (optimizer_pipeline/live/opcua.py) with the
period compressed (`--period`), its samples stored in a DuckDB ledger, for `--seconds`.

Prints: the grid times and samples formed against those expected (every binding, every grid time),
how late after its grid time each poll finished (p50 / p99 / max), the CPU the sampling process used
(cores: the source's asyncua thread, the polls and the ledger writes) and the server's, and the
sampling process's resident memory before and after the source started.

Usage: .venv/bin/python bench/bench_opcua.py [--bindings 1000] [--period 2] [--seconds 60]
"""

import argparse
import asyncio
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

TAGS = ("v1", "v2", "y1", "y2")


def _rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(bindings: int, port: int, period: float) -> None:
    """The server process: bindings x 4 variables, each moved every period."""
    from asyncua import Server, ua

    async def main() -> None:
        server = Server()
        await server.init()
        server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/plant")
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        index = await server.register_namespace("urn:bench")
        folder = await server.nodes.objects.add_folder(index, "Plant")
        nodes = [await folder.add_variable(ua.NodeId(f"b{i}.{tag}", index), f"b{i}.{tag}", 1.0)
                 for i in range(bindings) for tag in TAGS]
        rng = np.random.default_rng(0)
        async with server:
            print("ready", flush=True)
            while True:
                values = 5.0 + rng.normal(0.0, 0.1, len(nodes))
                for node, value in zip(nodes, values):
                    await node.write_value(ua.Variant(float(value), ua.VariantType.Double))
                await asyncio.sleep(period)

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=1000)
    parser.add_argument("--period", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process's port
    args = parser.parse_args()
    if args.serve:
        return serve(args.bindings, args.serve, args.period)

    from optimizer_pipeline.contracts import OpcUaWiring
    from optimizer_pipeline.ledger import Ledger
    from optimizer_pipeline.live.opcua import OpcUaSource
    from optimizer_pipeline.plants import get_plant

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--bindings", str(args.bindings),
                               "--period", str(args.period)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        url = f"opc.tcp://127.0.0.1:{port}/plant"
        tanks = get_plant("tanks").spec
        specs = [replace(tanks, id=f"tanks-{i:04d}", sample_period_s=args.period,
                         opcua=OpcUaWiring(url, {tag: f"ns=2;s=b{i}.{tag}" for tag in TAGS}))
                 for i in range(args.bindings)]
        with tempfile.TemporaryDirectory() as folder:
            ledger = Ledger(Path(folder) / "optimizer.duckdb")
            for spec in specs:
                ledger.upsert_binding(spec)
            rss_before = _rss_mib()
            source = OpcUaSource(specs)
            t0 = time.monotonic()
            source.start()
            while not (source.endpoints[url].connected and len(source.endpoints[url].readings) == 4 * len(specs)):
                time.sleep(0.1)
            connect_s = time.monotonic() - t0
            formed, late, grids = 0, [], set()
            cpu0, server_cpu0, wall0 = time.process_time(), _cpu_s(server.pid), time.monotonic()
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                if source.ready(time.monotonic()):
                    got = source.poll(ledger)
                    now = time.time()
                    for frames in got.values():
                        for frame in frames:
                            formed += len(frame)
                            grids.update(frame["timestamp"])
                    if got:
                        late.append(now - max(grids))
                time.sleep(0.01)
            wall = time.monotonic() - wall0
            cpu, server_cpu = time.process_time() - cpu0, _cpu_s(server.pid) - server_cpu0
            rss_after = _rss_mib()
            source.stop()
        expected = len(grids) * len(specs)
        print(f"{args.bindings} bindings x {len(TAGS)} tags = {len(TAGS) * args.bindings} monitored items, period "
              f"{args.period:g} s, {wall:.0f} s; connected and every item read {connect_s:.1f} s after start")
        print(f"samples formed {formed} of {expected} ({100 * formed / max(expected, 1):.2f} %) over {len(grids)} "
              f"grid times; poll done after its grid time p50 {1000 * np.median(late):.0f} ms, p99 "
              f"{1000 * np.percentile(late, 99):.0f} ms, max {1000 * max(late):.0f} ms")
        print(f"CPU: sampling process {cpu / wall:.2f} cores ({1000 * cpu / max(formed, 1):.3f} ms per sample), "
              f"server {server_cpu / wall:.2f} cores; sampling process RSS {rss_before:.0f} -> {rss_after:.0f} MiB "
              f"(+{rss_after - rss_before:.0f} MiB, {1024 * (rss_after - rss_before) / args.bindings:.0f} kB per "
              f"binding)")
        assert math.isfinite(cpu)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
