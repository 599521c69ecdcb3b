"""Running long-lived child process trees for the CLI (`ui`: the webserver and the daemon; `daemon`;
`worker`): SIGTERM / SIGINT forwarded to every tree, and nothing left behind when the command ends.

Each child leads its own process group (so a signal reaches its children too) and starts with the
default signal dispositions: a shell that starts us in the background leaves SIGINT ignored, and
Dagster copies an ignored SIGINT to SIGTERM, after which the tree would ignore our stop. On a
signal, or when one child exits, every group gets SIGTERM, a bounded wait, then SIGKILL.
"""

import os
import signal
import subprocess
import time
from typing import Callable, Mapping, Sequence

STOP_GRACE_S = 20.0  # after SIGTERM, how long the group may take before SIGKILL


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's process group, wait up to `grace_s` for all of it, then SIGKILL what is left."""
    pgid = proc.pid
    if not group_alive(pgid):
        proc.poll()
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_supervised(cmds: Sequence[Sequence[str]], env: Mapping[str, str], grace_s: float = STOP_GRACE_S,
                   on_death: Callable[[int], None] | None = None) -> int:
    """Run each command of `cmds` as its own process group until one of them exits or we get SIGTERM /
    SIGINT; then stop every group. When a child ends on its own with a non-zero code (e.g. it was
    SIGKILLed), `on_death(code)` runs after the groups are stopped. Returns that child's exit code
    (0 when we stopped them on a signal)."""
    procs = []
    stopping = []

    def forward(signum: int, _frame) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(list(cmd), env=dict(env), start_new_session=True,
                                          preexec_fn=_default_signals))
        while all(proc.poll() is None for proc in procs) and not stopping:
            time.sleep(0.1)
    finally:
        for proc in procs:
            stop_group(proc, grace_s)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping:
        return 0
    ended = next(proc for proc in procs if proc.returncode is not None)
    code = int(ended.returncode or 0)
    if code != 0 and on_death is not None:
        on_death(code)
    return code
