"""PostgreSQL restarted while a writer records solves (issue 14, faults): the writes in flight are
retried (or refused with a clear message), nothing partial is left, every commit the writer
reported is there, and the binding still has exactly one open recommendation."""

import subprocess
import sys
import time
from pathlib import Path

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
