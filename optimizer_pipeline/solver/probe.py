"""Capability probe: can this interpreter import the solver stack? (`python -m optimizer_pipeline.solver.probe`)

Prints one JSON object on stdout and exits:
  0  {"python": "3.11.7", "numpy": "…", "scipy": "…", "osqp": "…"}
  3  {"error": "ENV_MISSING_DEP", "missing": "osqp", "message": "…"} — the first module that failed.
The pool runs it once per start, in the workers' environment, so a missing dependency is one clear
error instead of every worker dying at import. Imports only the standard library at module level.
"""

import importlib
import json
import platform
import sys

from optimizer_pipeline.solver.errors import ENV_MISSING_DEP

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


def main() -> int:
    code, report = probe()
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
