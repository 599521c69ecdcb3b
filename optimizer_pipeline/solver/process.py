"""One solver worker process: its environment, its pipes and reader threads, the NDJSON v1 framing.

docs/ARCHITECTURE.md, "Solver worker protocol". The pool (solver/pool.py) decides when a worker starts, serves and
stops, and counts its failures; this module owns everything about one process:
* Environment (`worker_env`): a whitelist of the parent's variables (no inherited secrets) + the
  thread budget + the size of its solver cache + PYTHONHASHSEED=0.
* Start (`WorkerProcess.wait_ready`): a ready frame with another protocol version or no positive pid,
  an exit before it, or silence for the start timeout -> SolverError(WORKER_START_FAILED).
* One request in flight (`WorkerProcess.request`): no answer within the hard timeout -> WorkerTimeout
  (the pool cancels, kills, raises SOLVE_TIMEOUT); EOF with the request in flight -> WORKER_INTERRUPTED.
* Stop: `close_stdin`, then `close` waits, terminates, kills and returns the exit code (the pool
  closes every stdin first, so the waits overlap); `kill` for a worker given up on.
Frames are encoded by solver/codec.py (orjson). A reader thread per worker reads every stdout frame
(responses, heartbeats, logs, EOF) and wakes the caller; a caller reading its own reply instead saved
~12 us of a 40-60 us no-op round trip on the 2-core dev box (issue 8), too little for a second owner
of the pipe (idle heartbeats, EOF and worker-death accounting would need a hand-over protocol).
"""

import logging
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from optimizer_pipeline import THREAD_VARS
from optimizer_pipeline.solver import codec, errors
from optimizer_pipeline.solver.errors import PROTOCOL_VERSION, SolverError

log = logging.getLogger(__name__)

# Parent variables a worker may see; everything else (credentials, tokens, DAGSTER_* ...) stays out.
# PATH / HOME / locale / temp dirs: what Python and BLAS need to run and find a writable place;
# PYTHONPATH / VIRTUAL_ENV: to import this package the way the parent does; SYSTEMROOT / WINDIR:
# Windows' Python cannot initialise its random source or sockets without them.
ENV_WHITELIST = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TEMP", "TMP", "TZ",
                 "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT", "WINDIR")
# Passed through only when set: OPTIMIZER_WORKER_TEST_OPS enables the worker's test-only ops (the
# test suite sets it in its own process); OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE override OpenBLAS's
# CPU detection, which crashes or picks slow kernels on some VMs and ARM boards. None is a secret.
ENV_PASS_THROUGH = ("OPTIMIZER_WORKER_TEST_OPS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# How many problem structures (their OSQP objects, factorised) a worker keeps (solver.solve.SolverCache).
CACHE_ENTRIES_VAR = "OPTIMIZER_SOLVER_CACHE_ENTRIES"
DEFAULT_CACHE_ENTRIES = 32


def worker_env(threads: int, parent: Mapping[str, str] | None = None,
               cache_entries: int = DEFAULT_CACHE_ENTRIES) -> dict[str, str]:
    """The environment of a worker: whitelist + pass-through from `parent` (default os.environ) + budget
    + the size of its solver cache. The budget: each worker's BLAS / OpenMP pools get `threads` threads
    (THREAD_VARS), so size x threads bounds the CPU the pool can take."""
    parent = os.environ if parent is None else parent
    env = {k: parent[k] for k in ENV_WHITELIST + ENV_PASS_THROUGH if k in parent}
    env.update({k: str(threads) for k in THREAD_VARS})
    env[CACHE_ENTRIES_VAR] = str(cache_entries)
    env["PYTHONHASHSEED"] = "0"  # same set / dict iteration order in every worker and every run
    return env



class WorkerTimeout(Exception):
    """No response within the hard timeout (the pool turns it into SOLVE_TIMEOUT after the kill)."""


@dataclass
class _Pending:
    req_id: int
    done: threading.Event = field(default_factory=threading.Event)
    frame: dict[str, Any] | None = None
    interrupted: str | None = None  # why the worker went away


class WorkerProcess:
    """One worker process and its two reader threads (stdout frames, stderr log lines)."""

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], on_exit: Callable[["WorkerProcess"], None]) -> None:
        self._on_exit = on_exit
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=dict(env), close_fds=True)
        self.pid = self.proc.pid
        self.ready = threading.Event()  # set by the ready frame or by EOF
        self.ready_frame: dict[str, Any] | None = None
        self.ready_ms: float | None = None  # spawn -> ready frame, milliseconds
        self.exited = threading.Event()
        self.retired = False  # guarded by the pool lock: its exit is expected, not a failure
        self.last_heartbeat: float | None = None
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: _Pending | None = None
        self._readers = [threading.Thread(target=self._read_frames, name=f"solver-worker-{self.pid}-out", daemon=True),
                         threading.Thread(target=self._read_stderr, name=f"solver-worker-{self.pid}-err", daemon=True)]
        for reader in self._readers:
            reader.start()

    # ------------------------------------------------------------------ reader threads

    def _read_frames(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            self._dispatch(line)
        try:  # reap it (no zombie, exit code known); a worker that closed stdout but lives on is useless
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.exited.set()
        self.ready.set()
        self._on_exit(self)  # failure accounting first, so a caller woken below sees it in stats()
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.interrupted = f"worker {self.pid} exited with the request in flight"
            pending.done.set()

    def _read_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self.stderr_tail.append(line)
            log.info("worker %d: %s", self.pid, line)

    def _dispatch(self, line: bytes) -> None:
        try:
            frame = codec.decode(line)
        except ValueError:
            log.warning("worker %d: ignored a non-JSON stdout line: %r", self.pid, line[:200])
            return
        if not isinstance(frame, dict):
            log.warning("worker %d: ignored a non-object frame: %r", self.pid, line[:200])
            return
        kind = frame.get("type")
        if kind == "ready" and self.ready_frame is None:
            self.ready_ms = (time.monotonic() - self.started_at) * 1000.0
            self.ready_frame = frame
            self.ready.set()
        elif kind == "heartbeat":
            self.last_heartbeat = time.monotonic()
        elif kind == "log":
            log.info("worker %d: %s", self.pid, frame.get("message"))
        elif "reqId" in frame and "ok" in frame:  # a response; another frame naming a request is ignored
            with self._lock:
                pending = self._pending
                if pending is not None and pending.req_id == frame["reqId"]:
                    self._pending = None
                else:
                    pending = None
            if pending is None:  # a cancel acknowledgement, or the answer to a request given up on
                log.debug("worker %d: unmatched response %r", self.pid, line[:200])
                return
            pending.frame = frame
            pending.done.set()
        else:
            log.warning("worker %d: ignored an unknown frame: %r", self.pid, line[:200])

    # ------------------------------------------------------------------ caller side

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The ready frame's diag; SolverError(WORKER_START_FAILED) if it is missing or invalid."""
        if not self.ready.wait(timeout_s):
            raise SolverError(errors.WORKER_START_FAILED, f"worker {self.pid} sent no ready frame within {timeout_s:g} s")
        frame = self.ready_frame
        if frame is None:
            code = self.proc.wait(timeout=5)
            tail = " | ".join(list(self.stderr_tail)[-3:]) or "no stderr"
            raise SolverError(errors.WORKER_START_FAILED, f"worker {self.pid} exited with code {code} before its ready frame ({tail})")
        if frame.get("protocolVersion") != PROTOCOL_VERSION:
            raise SolverError(errors.WORKER_START_FAILED, f"worker {self.pid} speaks protocolVersion "
                                                          f"{frame.get('protocolVersion')!r}, the pool speaks {PROTOCOL_VERSION}")
        diag = frame.get("diag")
        pid = diag.get("pid") if isinstance(diag, dict) else None
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise SolverError(errors.WORKER_START_FAILED, f"worker {self.pid}: ready frame has no positive diag.pid ({pid!r})")
        return diag

    def send(self, frame: bytes) -> None:
        with self._write_lock:
            self.proc.stdin.write(frame + b"\n")
            self.proc.stdin.flush()

    def request(self, req_id: int, frame: bytes, timeout_s: float) -> dict[str, Any]:
        """The response frame of `req_id`; raises WorkerTimeout or SolverError(WORKER_INTERRUPTED)."""
        pending = _Pending(req_id)
        with self._lock:
            self._pending = pending
        if self.exited.is_set():
            raise SolverError(errors.WORKER_INTERRUPTED, f"worker {self.pid} had exited before request {req_id}")
        try:
            self.send(frame)
        except (BrokenPipeError, ValueError, OSError) as exc:  # ValueError: stdin already closed
            raise SolverError(errors.WORKER_INTERRUPTED, f"worker {self.pid} stopped reading requests ({exc})") from None
        if not pending.done.wait(timeout_s):
            with self._lock:
                if self._pending is pending:
                    self._pending = None
            if not pending.done.is_set():  # the answer may have landed between the wait and the lock
                raise WorkerTimeout()
        if pending.interrupted is not None:
            raise SolverError(errors.WORKER_INTERRUPTED, pending.interrupted)
        return pending.frame

    def kill(self) -> None:
        self.proc.kill()  # Popen ignores an already reaped process
        self.proc.wait()
        self._join_readers()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass  # already broken with the process

    def close(self, deadline: float) -> int | None:
        """Stop the worker by the gentlest step that works (stdin closed by the caller); its exit code."""
        try:
            self.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                try:
                    self.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    log.error("worker %d survived SIGKILL for 5 s", self.pid)
        self._join_readers()
        self._close_pipes()
        return self.proc.returncode

    def close_stdin(self) -> None:
        with self._write_lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass  # the worker is already gone: the pipe was broken

    def _join_readers(self) -> None:
        for reader in self._readers:
            if reader is not threading.current_thread():
                reader.join(timeout=2.0)
