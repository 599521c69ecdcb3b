"""PostgreSQL restarted while a writer records solves, and during a refresh (issue 14, faults): the
writes in flight are retried (or refused with a clear message), nothing partial is left, every
commit the writer reported is there, and each binding still has exactly one open recommendation."""

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.plants import get_plant

from ledger_helpers import ledger_at
from reliability_helpers import check_ledger_whole

TESTS = Path(__file__).resolve().parent

# records solves in a loop; prints each run id once committed, and a refused write as "ERR <message>"
WRITER = """\
import sys
sys.path.insert(0, sys.argv[2])
from optimizer_pipeline.ledger import LedgerError
from ledger_helpers import ledger_at, solve
ledger = ledger_at(sys.argv[1])
while True:
    try:
        print(solve(ledger, binding_id="restart")[0], flush=True)
    except LedgerError as exc:
        print("ERR " + str(exc), flush=True)
"""


def _read_until(proc: subprocess.Popen, lines: list[str], count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for line in lines if not line.startswith("ERR")) < count:
        assert time.monotonic() < deadline, f"only {lines} after {timeout_s:g} s"
        line = proc.stdout.readline()
        assert line, f"the writer exited: {proc.stderr.read()[-2000:]}"
        lines.append(line.strip())


def test_a_server_restart_mid_writes_leaves_only_whole_runs_and_loses_no_commit(postgres):
    url = postgres.new_database()
    ledger_at(url)  # the schema
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url, str(TESTS)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        _read_until(proc, lines, 3, timeout_s=60)
        postgres.restart()
        before = len(lines)
        _read_until(proc, lines, before + 3, timeout_s=120)  # it writes again after the restart
    finally:
        proc.kill()
        proc.wait()
    errors = [line for line in lines if line.startswith("ERR")]
    committed = [line for line in lines if not line.startswith("ERR")]
    # a refused write names the ledger in one line (retries exhausted, or no pooled connection back yet)
    assert all(e.startswith("ERR ledger postgresql://") and "\n" not in e for e in errors), errors
    ledger = ledger_at(url)
    assert check_ledger_whole(ledger, committed) >= len(committed)
    assert [r.status for r in ledger.list_recommendations("restart")].count("verified") == 1


def test_a_server_restart_during_a_refresh_fails_or_retries_cleanly_and_the_next_refresh_completes(postgres,
                                                                                                     tmp_path):
    """`materialize --all` on a PostgreSQL ledger while the server restarts: the command ends with
    exit 0, or exit 2 and one `error:` line naming the bindings whose writes were in flight (no
    traceback); the ledger holds only whole runs; the next refresh gives every binding its one
    open recommendation."""
    url = postgres.new_database()
    ledger = ledger_at(url)
    plant = get_plant("heater")
    bindings = [f"heater-{i}" for i in range(4)]
    for binding_id in bindings:
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), plant.history(1).frame,
                      "simulation")
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_text(yaml.safe_dump({"ledger": {"url": url}}))
    command = [sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), "materialize", "--all"]
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ledger.list_recommendations(bindings[0]):  # the refresh is writing
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no recommendation written after 300 s"
            time.sleep(0.2)
        postgres.restart()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 2), err[-3000:]
    assert "Traceback" not in err
    if proc.returncode == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err[-5000:]
        [line] = lines
        assert line.startswith("error: materialize: ") and "binding(s) failed" in line, line
    check_ledger_whole(ledger, candidates_per_run=None)

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    for binding_id in bindings:
        statuses = [r.status for r in ledger.list_recommendations(binding_id)]
        assert statuses.count("verified") == 1, (binding_id, statuses)
    assert check_ledger_whole(ledger, candidates_per_run=None) >= len(bindings)
