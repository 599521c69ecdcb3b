"""A command run several times beside one CPU-bound process per core (issue "Sharing the ledger": a suite
that holds on a loaded machine).

Usage:
    .venv/bin/python bench/loaded.py [--times 3] [--burners N] -- COMMAND ...

    .venv/bin/python bench/loaded.py --times 3 -- .ci/run          # in a clean clone: the suite, loaded
    .venv/bin/python bench/loaded.py --times 20 -- .venv/bin/python -m pytest -q -p no:cacheprovider \\
        "tests/test_live_service.py::test_samples_arriving_during_a_solve_are_coalesced_into_the_next_one"

The burners (`while True: pass`, one per core unless --burners) run for the whole series and are
stopped at its end, also when it is interrupted. Prints each run's exit code, its wall time and the
1-minute load average at its end, then the series; exits non-zero when any run failed.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    results = []
    try:
        for k in range(args.times):
            started = time.monotonic()
            rc = subprocess.run(command).returncode
            results.append((rc, time.monotonic() - started, _load1()))
            print(f"run {k + 1}/{args.times}: exit {rc}, {results[-1][1]:.0f} s, load average {results[-1][2]:.1f} "
                  f"({args.burners} burners)", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    failed = sum(rc != 0 for rc, _, _ in results)
    print(f"{len(results)} runs beside {args.burners} CPU-bound processes: {len(results) - failed} passed, "
          f"{failed} failed; times {', '.join(f'{s:.0f}' for _, s, _ in results)} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
