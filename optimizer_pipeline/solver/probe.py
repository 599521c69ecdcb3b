"""Capability probe: can this interpreter import the solver stack? (`python -m optimizer_pipeline.solver.probe`)

Both ends live here: `main()` runs in the probed interpreter, `run_probe()` in the pool's process.
Prints one JSON object on stdout and exits:
  0  {"python": "3.11.7", "numpy": "…", "scipy": "…", "osqp": "…"}
  3  {"error": "ENV_MISSING_DEP", "missing": "osqp", "message": "…"} — the first module that failed.
The pool runs it once per start, in the workers' environment, so a missing dependency is one clear
error instead of every worker dying at import. Imports only the standard library at module level
(subprocess, for `run_probe`, is one the probed interpreter imports anyway with scipy).
"""

import importlib
import json
import platform
import subprocess
import sys
from collections.abc import Mapping

from optimizer_pipeline.solver.errors import ENV_MISSING_DEP, SolverError

REQUIRED = ("numpy", "scipy", "osqp")  # numpy first: scipy and osqp import it
EXIT_MISSING_DEP = 3


def probe() -> tuple[int, dict[str, str]]:
    """(exit code, report) — report holds versions, or the missing module and why."""
    report = {"python": platform.python_version()}
    for name in REQUIRED:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # an ImportError, or a broken install raising anything at import
            return EXIT_MISSING_DEP, {"error": ENV_MISSING_DEP, "missing": name,
                                      "message": f"cannot import {name}: {type(exc).__name__}: {exc}"}
        report[name] = str(getattr(module, "__version__", "unknown"))
    return 0, report


def run_probe(python: str, env: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, str]:
    """Versions from the capability probe run by `python` in `env`; SolverError(ENV_MISSING_DEP) otherwise."""
    cmd = [python, "-m", "optimizer_pipeline.solver.probe"]
    try:
        done = subprocess.run(cmd, env=dict(env), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise SolverError(ENV_MISSING_DEP, f"cannot run the solver interpreter {python!r}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise SolverError(ENV_MISSING_DEP, f"capability probe with {python!r} did not finish in {timeout_s:g} s") from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if done.returncode == 0 and isinstance(report, dict):
        return report
    if isinstance(report, dict) and "missing" in report:
        raise SolverError(ENV_MISSING_DEP, f"{python}: {report.get('message', report['missing'])}")
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    raise SolverError(ENV_MISSING_DEP, f"capability probe with {python!r} exited {done.returncode}: {tail[0]}")


def main() -> int:
    code, report = probe()
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
