"""Processes a test starts in a process group of their own (the Dagster UI, chromedriver, nginx), waits
for until they answer, and stops as a whole: SIGTERM to the group, SIGKILL to what is left, nothing
left behind."""

import os
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Callable

STOP_TIMEOUT_S = 30


def _default_signals() -> None:
    """Run in the child before exec: a non-interactive parent may ignore SIGINT, and Dagster copies
    that to SIGTERM (docs/ARCHITECTURE.md, "Running the Dagster UI from scripts"), so the tree would
    ignore our stop."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start_group(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cmd` as the leader of a new session and process group, its output in `log`."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_default_signals, env=env,
                            stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_until_up(proc: subprocess.Popen, log: Path, timeout_s: float, answers: Callable[[], None],
                  what: str) -> None:
    """Until `answers()` returns without OSError: AssertionError with the end of `log` when the process
    exits first or `what` does not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            answers()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{what} did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of process group `pgid`, as 'pid command' lines."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(f"{stat.parent.name} {cmdline[:120]}")
    return members


def stop_group(proc: subprocess.Popen) -> list[str]:
    """SIGTERM the group of `proc` (it leads its own session), then SIGKILL what is left after
    STOP_TIMEOUT_S; returns the processes still alive after that (should be none)."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and group_members(pgid):
        proc.poll()  # reap our direct child; the rest are reaped by their new parent
        time.sleep(0.2)
    if group_members(pgid):
        warnings.warn(f"process group {pgid} ignored SIGTERM for {STOP_TIMEOUT_S} s: {group_members(pgid)}")
        os.killpg(pgid, signal.SIGKILL)
        time.sleep(1.0)
    proc.wait(timeout=10)
    return group_members(pgid)
