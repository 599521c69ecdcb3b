"""`optimizer-pipeline ui` under a service manager (issue 16, process hygiene): it runs Dagster's webserver
and daemon (not `dagster dev`, which warns that `dg dev` supersedes it); SIGTERM to the command stops
both and every process they started; nothing of the tree is left."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from servers import alive as _alive
from servers import descendants as _descendants
from servers import free_port


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigterm_to_ui_leaves_no_process_of_its_tree(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(tmp_path / "home"),
                                 "ui", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:  # up when the webserver answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"ui exited before the webserver came up: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, "the UI did not come up within 180 s"
                time.sleep(0.5)
        tree = _descendants(proc.pid)
        lines = [_command_line(pid) for pid in tree]
        assert any("dagster_webserver" in line for line in lines) and any("dagster-daemon" in line for line in lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        text = log.read_text(errors="replace")
        assert "Dagster UI for home" in text and "SupersessionWarning" not in text and "dg dev" not in text
        left = {pid for pid in tree if _alive(pid)}
        assert left == set(), f"processes of the ui tree left after SIGTERM: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
