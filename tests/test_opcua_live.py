"""The live loop through OPC UA, as a user runs it (issue 36, a smoke test; the closed-loop figures are
in the bench): `simulate heater --apply-advice` serves the plant at 20 x real time, its history and
wired binding are ingested and materialized, `live` with opcua.write_advice samples it, publishes
verified recommendations and writes the advice, which the simulated operator follows: the outlet
temperature leaves its held value toward the target. SIGTERM stops both cleanly."""

import os
import signal
import subprocess
import sys
import time

import pytest

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import ledger_path

from servers import free_port
from test_cli import cli

SPEED = 20.0  # the heater's 10 s sample period every 0.5 s
WAIT_S = 120.0


def _start(*args, log):
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    return subprocess.Popen([sys.executable, "-m", "optimizer_pipeline.cli", *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _wait(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {WAIT_S:g} s waiting for {what}"
        time.sleep(0.5)
    return value


def test_simulate_ingest_live_closes_the_loop_over_opcua(tmp_path):
    endpoint = f"opc.tcp://127.0.0.1:{free_port()}/plant"
    history, binding, home = tmp_path / "history.csv", tmp_path / "heater.yaml", tmp_path / "home"
    sim_log, live_log = (tmp_path / "simulate.log").open("wb"), (tmp_path / "live.log").open("wb")
    simulator = _start("simulate", "heater", "--opcua", endpoint, "--speed", str(SPEED), "--apply-advice",
                       "--history", str(history), "--binding", str(binding), log=sim_log)
    live = None
    try:
        _wait(lambda: binding.exists() and "simulating heater-1" in (tmp_path / "simulate.log").read_text(),
              "the simulator")
        assert cli(home, "ingest", str(binding), str(history), "--source", "simulation").returncode == 0
        done = cli(home, "materialize", "heater-1")
        assert done.returncode == 0, done.stderr
        (home / "settings.yaml").write_text("opcua: {write_advice: true}\n")
        held = Ledger(ledger_path(home)).history_frame("heater-1", ("q_heat", "t_out", "t_in"))["q_heat"].iloc[-1]
        live = _start("--home", str(home), "live", log=live_log)
        ledger = Ledger(ledger_path(home))
        verified = "SELECT count(*) AS n FROM live_publications WHERE binding_id = 'heater-1' AND status = 'verified'"
        _wait(lambda: ledger.query(verified)["n"].iloc[0] >= 3, "3 verified publications")
        moved = lambda: (ledger.history_frame("heater-1", ("q_heat",))["q_heat"].tail(5) != held).all()  # noqa: E731
        _wait(moved, "the MV to follow the advice")
    finally:
        codes = [_stop(p) for p in (live, simulator) if p is not None]
    assert codes == [0, 0], (tmp_path / "live.log").read_text()[-3000:]
    samples = Ledger(ledger_path(home)).history_frame("heater-1", ("q_heat", "t_out", "t_in"))
    newest = samples[samples["run_id"] == samples["run_id"].iloc[-1]]
    period = 10.0 / SPEED
    assert (newest["timestamp"].diff().dropna() % period).abs().max() == pytest.approx(0.0, abs=1e-6)  # on the grid
    text = (tmp_path / "live.log").read_text()
    assert "opcua " + endpoint + ": connected" in text and "Traceback" not in text

