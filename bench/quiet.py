"""Waiting for a quiet machine before a bench measures (the 1-minute load average), shared by
bench/run.py and the benches that take --max-load."""

import argparse
import time
from pathlib import Path


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_for_quiet(max_load: float, max_wait_s: float) -> tuple[float, float]:
    """Poll the 1-minute load every 10 s until it is below max_load or max_wait_s passed: (load, waited s)."""
    started = time.monotonic()
    while load1() >= max_load and time.monotonic() - started < max_wait_s:
        time.sleep(10)
    return load1(), time.monotonic() - started


def add_quiet_arguments(parser: argparse.ArgumentParser) -> None:
    """--max-load / --wait-max-s of a bench that can first wait for a quiet machine (`wait_if_asked`)."""
    parser.add_argument("--max-load", type=float, default=None,
                        help="first wait (at most --wait-max-s) for the 1-minute load average to drop below this")
    parser.add_argument("--wait-max-s", type=float, default=600.0)


def wait_if_asked(args: argparse.Namespace) -> None:
    """With --max-load: wait for the load average as bench/run.py's topics do, and say so."""
    if args.max_load is not None:
        quiet, waited = wait_for_quiet(args.max_load, args.wait_max_s)
        print(f"waited {waited:.0f} s for the load average to drop below {args.max_load:g}: {quiet:.2f}", flush=True)
