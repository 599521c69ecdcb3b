"""The live loop through OPC UA, as a user runs it (issue 36, a smoke test; the closed-loop figures are
in the bench)."""

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import numpy as np
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


@pytest.mark.timeout(1200)  # its waits: 4 x 120 s, two commands of 180 s, 4 stops of up to 60 s: 1080 s
def test_simulate_ingest_live_closes_the_loop_over_opcua_and_rides_out_a_server_restart(tmp_path):
    """`simulate heater --apply-advice` serves the plant at 20 x real time, its history and wired binding
    are ingested and materialized, `live` with opcua.write_advice samples it, publishes verified
    recommendations and writes the advice, which the simulated operator follows: the heat input leaves
    its held value. Then the simulator stops and starts again on its port (its plant and history anew):
    the service reconnects, forms no sample while the server was gone, publishes "warming up: n of N"
    (unverified, n rising with each sample; the samples the new server stamped before the service came
    back, filled from its history, counted) until the samples since the gap hold the model's window, and
    verified recommendations again. SIGTERM stops every process cleanly."""
    endpoint = f"opc.tcp://127.0.0.1:{free_port()}/plant"
    history, binding, home = tmp_path / "history.csv", tmp_path / "heater.yaml", tmp_path / "home"
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("first", "second", "live")}
    simulate = ["simulate", "heater", "--opcua", endpoint, "--speed", str(SPEED), "--apply-advice"]
    first = _start(*simulate, "--history", str(history), "--binding", str(binding), log=logs["first"])
    second = live = None
    published = ("SELECT status, reasons_json FROM live_publications WHERE binding_id = 'heater-1' AND published_at > ?"
                 " ORDER BY live_t")
    try:
        _wait(lambda: binding.exists() and "simulating heater-1" in (tmp_path / "first.log").read_text(),
              "the simulator")
        assert cli(home, "ingest", str(binding), str(history), "--source", "simulation").returncode == 0
        done = cli(home, "materialize", "heater-1")
        assert done.returncode == 0, done.stderr
        (home / "settings.yaml").write_text("opcua: {write_advice: true}\n")
        held = Ledger(ledger_path(home)).history_frame("heater-1", ("q_heat", "t_out", "t_in"))["q_heat"].iloc[-1]
        live = _start("--home", str(home), "live", log=logs["live"])
        ledger = Ledger(ledger_path(home))
        since = lambda at: ledger.query(published, [at])  # noqa: E731
        _wait(lambda: (since(datetime(2000, 1, 1))["status"] == "verified").sum() >= 3, "3 verified publications")
        moved = lambda: (ledger.history_frame("heater-1", ("q_heat",))["q_heat"].tail(5) != held).all()  # noqa: E731
        _wait(moved, "the MV to follow the advice")
        assert _stop(first) == 0  # the server goes away ...
        down = time.time()
        # the outage itself (the scenario's time): its checks below are against `down` and `up` as measured,
        # so a longer pause on a loaded machine only widens the gap they look at
        time.sleep(3.0)
        up = time.time()
        second = _start(*simulate, log=logs["second"])  # ... and comes back, a new plant and history
        back = datetime.now(timezone.utc).replace(tzinfo=None)
        _wait(lambda: (since(back)["status"] == "verified").sum() >= 3, "verified publications after the restart")
        after = since(back)
    finally:
        codes = [_stop(p) for p in (live, second, first) if p is not None]
    assert codes == [0, 0, 0], (tmp_path / "live.log").read_text()[-3000:]
    samples = Ledger(ledger_path(home)).history_frame("heater-1", ("q_heat", "t_out", "t_in"))
    period = 10.0 / SPEED
    before = samples[samples["timestamp"] < down]
    newest = before[before["run_id"] == before["run_id"].iloc[-1]]
    assert (newest["timestamp"].diff().dropna() % period).abs().max() == pytest.approx(0.0, abs=1e-6)  # on the grid
    times = samples["timestamp"]
    assert not times[(times > down + 2 * period) & (times < up - period)].size  # no sample invented for the gap
    warming = [re.search(r"warming up: (\d+) of (\d+) samples", reasons) for reasons in after["reasons_json"]]
    counts = [int(m.group(1)) for m in warming if m]
    first_verified = int(np.argmax(after["status"].to_numpy() == "verified"))
    assert counts == sorted(counts) and len(set(counts)) == len(counts)  # each sample counted
    assert (after["status"][:first_verified] == "unverified").all() and all(warming[:first_verified])
    text = (tmp_path / "live.log").read_text()
    # The service retries the lost server after 1, 3, 7, 15, 31 s: back in time, it warms up sample by sample;
    # later (a slow start of the second server on a loaded machine), the samples the new server stamped since
    # it started come from its history first and count toward the window (live/opcua.py, `_backfill`)
    after_restart = text[text.find("reconnected"):] if "reconnected" in text else ""
    filled = [int(n) for n in re.findall(r"(\d+) of \d+ missed sample\(s\) filled from the server's history",
                                         after_restart)]
    assert len(counts) >= 3 or (filled and (not counts or counts[0] > filled[-1])), (counts, filled)
    assert "opcua " + endpoint + ": connected" in text and "reconnected" in text
    assert "Traceback" not in text and " ERROR " not in text  # a lost connection is said once, a stop is clean
