"""Solver protocol constants: the protocol version, stable error codes (defined once), SolverError.

The codes travel in worker frames (`{"ok":false,"error":{"code":…}}`), in pool exceptions and in
the ledger's run diagnostics, so they never change meaning. docs/ARCHITECTURE.md, "Solver worker protocol".
No imports: the capability probe uses these codes before it knows numpy can be imported, and the
pool reads them without importing the worker's solver stack.
"""

PROTOCOL_VERSION = 1  # NDJSON frames, docs/ARCHITECTURE.md, "Solver worker protocol"

# Pool-side outcomes of a request.
SOLVE_TIMEOUT = "SOLVE_TIMEOUT"  # no answer within the request's hard timeout; the worker was killed
WORKER_INTERRUPTED = "WORKER_INTERRUPTED"  # the worker died with the request in flight (never replayed)
SOLVER_UNAVAILABLE = "SOLVER_UNAVAILABLE"  # pool degraded (consecutive failures), not started or shut down
SOLVER_QUEUE_FULL = "SOLVER_QUEUE_FULL"  # no free worker within the pool's queue wait
ENV_MISSING_DEP = "ENV_MISSING_DEP"  # the capability probe could not import numpy / scipy / osqp
WORKER_START_FAILED = "WORKER_START_FAILED"  # no valid ready frame (wrong protocol version, bad pid, exit, silence)

# Worker-side answers to a frame.
BAD_FRAME = "BAD_FRAME"  # the line is not a JSON object
UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"  # protocolVersion missing or not 1
BAD_REQUEST = "BAD_REQUEST"  # a field of the frame or its payload is missing or invalid
UNKNOWN_OP = "UNKNOWN_OP"  # op not in the protocol (test ops count as unknown unless enabled)
WORKER_BUSY = "WORKER_BUSY"  # a second solve while one is in flight (the pool never does this)
CANCELLED = "CANCELLED"  # the in-flight request was cancelled by a "cancel" frame
SOLVE_FAILED = "SOLVE_FAILED"  # the solver raised; the message names the exception

# Caller-side: a steady-state stage solved before the problem goes to a worker (solver/targets.py).
STEADY_STAGE_INFEASIBLE = "STEADY_STAGE_INFEASIBLE"  # targets-first stage or steering layer: no feasible point


class SolverError(Exception):
    """A solve did not produce a result; `code` is one of the constants above."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

