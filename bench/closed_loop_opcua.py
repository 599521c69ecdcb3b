"""Closed loop through OPC UA (issue 36): each demo plant served by `optimizer-pipeline simulate
--apply-advice` (its MVs follow every verified advice), its history and wired binding ingested and
materialized, then `optimizer-pipeline live` with opcua.write_advice for `--periods` sample periods.

Reports per plant: the CVs' tracking error at the end (norm over the targeted CVs of |y - target| /
|target|, the mean of the last `--tail` measured samples) of the closed loop and of holding the MVs
(the live state the history ends with), closed / hold (target <= 0.05), the publications by status,
the advice the simulated operator followed, and the live service's latency (p50 / p90 from its log).

Usage: .venv/bin/python bench/closed_loop_opcua.py [--plants tanks,heater,blend] [--speed 20]
                                                   [--periods 240] [--tail 20]
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from closed_loop import stop_daemon
from optimizer_pipeline.contracts import load_binding_file
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import ledger_path

CLI = [sys.executable, "-m", "optimizer_pipeline.cli"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}


def _start(args, log: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], env=_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _error(values: np.ndarray, spec) -> float:
    """Norm over the targeted CVs of |y - target| / |target| of `values` (n_cv,)."""
    parts = [(y - cv.target) / abs(cv.target) for y, cv in zip(values, spec.cvs) if cv.target is not None]
    return float(np.linalg.norm(parts))


def run_plant(plant: str, speed: float, periods: int, tail: int, folder: Path) -> dict:
    endpoint = f"opc.tcp://127.0.0.1:{_port()}/plant"
    history, binding, home = folder / "history.csv", folder / "binding.yaml", folder / "home"
    simulator = _start(["simulate", plant, "--opcua", endpoint, "--speed", str(speed), "--apply-advice",
                        "--history", str(history), "--binding", str(binding)], folder / "simulate.log")
    live = None
    try:
        while not (binding.exists() and "simulating" in (folder / "simulate.log").read_text()):
            assert simulator.poll() is None, (folder / "simulate.log").read_text()
            time.sleep(0.2)
        spec = load_binding_file(binding)
        for args in (["ingest", str(binding), str(history), "--source", "simulation"], ["materialize", spec.id]):
            done = subprocess.run([*CLI, "--home", str(home), *args], env=_env(), capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        (home / "settings.yaml").write_text(yaml.safe_dump({"opcua": {"write_advice": True}}))
        ledger = Ledger(ledger_path(home))
        held = ledger.history_frame(spec.id, spec.tags)[list(spec.cv_tags)].tail(tail).mean().to_numpy()
        started = time.time()
        live = _start(["--home", str(home), "live"], folder / "live.log")
        time.sleep(periods * spec.sample_period_s)
    finally:
        for proc in (live, simulator):
            if proc is not None:
                stop_daemon(proc)  # SIGTERM, then kill: as for the daemon there
    samples = ledger.history_frame(spec.id, spec.tags)
    after = samples[samples["timestamp"] > started]
    closed = after[list(spec.cv_tags)].tail(tail).mean().to_numpy()
    statuses = ledger.query("SELECT status, count(*) AS n FROM live_publications WHERE binding_id = ? "
                            "GROUP BY status", [spec.id])
    latencies = [float(x) for x in re.findall(r"latency (\d+) ms", (folder / "live.log").read_text())]
    moves = int((after[list(spec.mv_tags)].diff().abs().sum(axis=1) > 0).sum())
    hold_error, closed_error = _error(held, spec), _error(closed, spec)
    return {"plant": plant, "samples": len(after), "hold": hold_error, "closed": closed_error,
            "ratio": closed_error / hold_error if hold_error else float("nan"),
            "statuses": dict(zip(statuses["status"], statuses["n"])), "mv_moves": moves,
            "latency_p50_ms": statistics.median(latencies) if latencies else float("nan"),
            "latency_p90_ms": float(np.percentile(latencies, 90)) if latencies else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", default="tanks,heater,blend")
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--periods", type=int, default=240)
    parser.add_argument("--tail", type=int, default=20)
    args = parser.parse_args()
    print(f"closed loop over OPC UA: {args.periods} periods at {args.speed:g} x real time, error = mean of the "
          f"last {args.tail} samples")
    print(f"{'plant':<8} {'samples':>7} {'hold':>8} {'closed':>8} {'closed/hold':>11}  {'p50 ms':>6} {'p90 ms':>6}"
          f"  {'MV moves':>8}  publications")
    for plant in args.plants.split(","):
        with tempfile.TemporaryDirectory(prefix=f"closed-opcua-{plant}-") as folder:
            r = run_plant(plant, args.speed, args.periods, args.tail, Path(folder))
        verdict = "ok" if r["ratio"] <= 0.05 else "over 0.05"
        print(f"{r['plant']:<8} {r['samples']:>7} {r['hold']:>8.4f} {r['closed']:>8.4f} {r['ratio']:>11.3f}  "
              f"{r['latency_p50_ms']:>6.0f} {r['latency_p90_ms']:>6.0f}  {r['mv_moves']:>8}  {r['statuses']}  {verdict}",
              flush=True)


if __name__ == "__main__":
    main()
