"""Solver worker pool: long-lived worker processes, slot reservation, timeouts, restarts, degradation.

DESIGN.md "Solver worker protocol". Rules implemented here:
* 1-4 workers, one request in flight per worker; a caller reserves a free worker under the pool's
  lock, so two callers never share one. No free worker within `queue_wait_s` -> SOLVER_QUEUE_FULL.
* The capability probe (`python -m optimizer_pipeline.solver.probe`) runs once per start(), not
  per solve; a missing numpy / scipy / osqp -> ENV_MISSING_DEP.
* A ready frame with another protocol version or no positive pid, an exit before it, or silence
  for `start_timeout_s` -> the worker is killed and the start counts as a failure.
* Hard timeout -> cancel frame, kill, retire, SOLVE_TIMEOUT. Worker death with a request in flight
  -> WORKER_INTERRUPTED; the request is never replayed (a solve is cheap to ask again, a replayed
  one could be acted on twice).
* Failures (failed start, death, timeout) are counted; any answered request resets the count.
  After the n-th consecutive failure the worker is restarted after `backoff_s[n-1]` (1 s, 2 s, 4 s);
  past the schedule no automatic restart. From the 3rd consecutive failure on the pool is degraded:
  every call raises SOLVER_UNAVAILABLE until reset().
* Worker environment: a whitelist of the parent's variables (no inherited secrets) + the thread
  budget + PYTHONHASHSEED=0. shutdown() closes stdin, waits, terminates, kills and reports the exit
  code of every worker.
Frames are encoded by solver/codec.py (orjson). A reader thread per worker reads every stdout frame
(responses, heartbeats, logs, EOF) and wakes the caller; a caller reading its own reply instead saved
~12 us of a 40-60 us no-op round trip on the 2-core dev box (issue 8), too little for a second owner
of the pipe (idle heartbeats, EOF and worker-death accounting would need a hand-over protocol).
"""

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from optimizer_pipeline.contracts import ContractError, ProblemIR
from optimizer_pipeline.solver import codec, errors
from optimizer_pipeline.solver.errors import PROTOCOL_VERSION, SolverError

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
DEFAULT_BACKOFF_S = (1.0, 2.0, 4.0)

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
# Thread budget: each worker's BLAS / OpenMP pools get `threads` threads, so size x threads bounds
# the CPU the pool can take.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


class SolverConfigError(ContractError):
    """A pool setting is out of range; the message names the setting, its range and the value."""


def worker_env(threads: int, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: whitelist + pass-through from `parent` (default os.environ) + budget."""
    parent = os.environ if parent is None else parent
    env = {k: parent[k] for k in ENV_WHITELIST + ENV_PASS_THROUGH if k in parent}
    env.update({k: str(threads) for k in THREAD_VARS})
    env["PYTHONHASHSEED"] = "0"  # same set / dict iteration order in every worker and every run
    return env


def run_probe(python: str, env: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, str]:
    """Versions from the capability probe run by `python` in `env`; SolverError(ENV_MISSING_DEP) otherwise."""
    cmd = [python, "-m", "optimizer_pipeline.solver.probe"]
    try:
        done = subprocess.run(cmd, env=dict(env), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise SolverError(errors.ENV_MISSING_DEP, f"cannot run the solver interpreter {python!r}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise SolverError(errors.ENV_MISSING_DEP, f"capability probe with {python!r} did not finish in {timeout_s:g} s") from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if done.returncode == 0 and isinstance(report, dict):
        return report
    if isinstance(report, dict) and "missing" in report:
        raise SolverError(errors.ENV_MISSING_DEP, f"{python}: {report.get('message', report['missing'])}")
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    raise SolverError(errors.ENV_MISSING_DEP, f"capability probe with {python!r} exited {done.returncode}: {tail[0]}")


class _Timeout(Exception):
    """No response within the hard timeout (the pool turns it into SOLVE_TIMEOUT after the kill)."""


@dataclass
class _Pending:
    req_id: int
    done: threading.Event = field(default_factory=threading.Event)
    frame: dict[str, Any] | None = None
    interrupted: str | None = None  # why the worker went away


class _Worker:
    """One worker process and its two reader threads (stdout frames, stderr log lines)."""

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], on_exit: Callable[["_Worker"], None]) -> None:
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
        elif "reqId" in frame:
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
        """The response frame of `req_id`; raises _Timeout or SolverError(WORKER_INTERRUPTED)."""
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
                raise _Timeout()
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


@dataclass
class _Slot:
    index: int
    worker: _Worker | None = None
    busy: bool = False  # a caller holds this slot
    starting: bool = False  # a restart (back-off, then spawn) owns this slot
    spawning: _Worker | None = None  # the process being started, so shutdown can stop it
    wake: threading.Event = field(default_factory=threading.Event)  # cuts a back-off short


class SolverPool:
    """Long-lived solver workers behind a thread-safe `solve()`.

    size: 1-4 workers. request_timeout_ms: default hard timeout per request. threads: 1-16, the
    BLAS / OpenMP thread budget of each worker. python: interpreter for the probe and workers.
    queue_wait_s: how long a caller waits for a free worker before SOLVER_QUEUE_FULL.
    start_timeout_s: how long a worker may take to send its ready frame.
    backoff_s: restart delays after the 1st, 2nd, 3rd consecutive failure (DESIGN: 1, 2, 4 s);
    tests pass shorter ones. worker_cmd: the worker command line instead of
    `python -m optimizer_pipeline.solver.worker` (tests use it to start a misbehaving fake worker).
    """

    def __init__(self, size: int = 1, request_timeout_ms: int = 10_000, threads: int = 1,
                 python: str = sys.executable, queue_wait_s: float = 5.0, *, start_timeout_s: float = 30.0,
                 backoff_s: Sequence[float] = DEFAULT_BACKOFF_S, worker_cmd: Sequence[str] | None = None) -> None:
        _check_int("size", size, 1, 4)
        _check_int("threads", threads, 1, 16)
        _check_positive("request_timeout_ms", request_timeout_ms)
        _check_positive("queue_wait_s", queue_wait_s)
        _check_positive("start_timeout_s", start_timeout_s)
        if not backoff_s or any(isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0 for b in backoff_s):
            raise SolverConfigError(f"solver pool backoff_s: expected a non-empty sequence of seconds >= 0, got {backoff_s!r}")
        self.size = size
        self.request_timeout_ms = request_timeout_ms
        self.threads = threads
        self.python = python
        self.queue_wait_s = float(queue_wait_s)
        self.start_timeout_s = float(start_timeout_s)
        self.backoff_s = tuple(float(b) for b in backoff_s)
        self.worker_cmd = list(worker_cmd) if worker_cmd else [python, "-m", "optimizer_pipeline.solver.worker"]
        self.probe_report: dict[str, str] | None = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # slot freed, worker ready or lost, degraded, closed
        self._slots = [_Slot(i) for i in range(size)]
        self._state = "new"  # -> "running" -> "closed"
        self._failures = 0
        self._degraded = False
        self._last_failure = ""
        self._restarts: list[threading.Thread] = []
        self._req_ids = itertools.count(1)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "SolverPool":
        """Probe the interpreter once, then start every worker; raises if not one became ready."""
        with self._lock:
            if self._state != "new":
                raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool already {self._state}; create a new one")
            self._state = "running"
        try:
            self._env = worker_env(self.threads)
            self.probe_report = run_probe(self.python, self._env)
            spawners = [threading.Thread(target=self._spawn, args=(slot,), name=f"solver-spawn-{slot.index}")
                        for slot in self._slots]
            for spawner in spawners:
                spawner.start()
            for spawner in spawners:
                spawner.join()
            with self._lock:
                live = sum(slot.worker is not None for slot in self._slots)
                reason = self._last_failure
            if live == 0:
                raise SolverError(errors.SOLVER_UNAVAILABLE, f"no solver worker became ready: {reason}")
        except BaseException:
            self.shutdown()
            raise
        log.info("solver pool started: %s probe=%s", self.stats(), self.probe_report)
        return self

    def shutdown(self, timeout_s: float = 5.0) -> dict[int, int | None]:
        """Stop every worker (close stdin, wait, terminate, kill); {pid: exit code}, None = not confirmed."""
        with self._lock:
            self._state = "closed"
            workers = []
            for slot in self._slots:
                for worker in (slot.worker, slot.spawning):
                    if worker is not None:
                        worker.retired = True
                        workers.append(worker)
                slot.worker = None
                slot.wake.set()
            restarts, self._restarts = self._restarts, []
            self._changed.notify_all()
        deadline = time.monotonic() + timeout_s
        for worker in workers:  # all at once: the waits below overlap
            worker.close_stdin()
        exits = {worker.pid: worker.close(deadline) for worker in workers}
        for restart in restarts:  # a restart that was spawning sees "closed" and stops its worker
            restart.join(timeout=self.start_timeout_s)
        unconfirmed = [pid for pid, code in exits.items() if code is None]
        if unconfirmed:
            log.error("solver pool shutdown: workers %s did not exit", unconfirmed)
        elif exits:
            log.info("solver pool shut down; worker exit codes %s", exits)
        return exits

    def reset(self) -> dict[str, Any]:
        """Leave the degraded state: zero the failure count, restart missing workers now, wait for them."""
        with self._lock:
            if self._state != "running":
                raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool is {self._state}; reset needs a started pool")
            self._failures = 0
            self._degraded = False
            for slot in self._slots:
                if slot.starting:
                    slot.wake.set()
                elif slot.worker is None:
                    self._schedule_restart(slot, 0.0)
            deadline = time.monotonic() + self.start_timeout_s
            while any(slot.starting for slot in self._slots) and self._state == "running":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        log.info("solver pool reset: %s", self.stats())
        return self.stats()

    def __enter__(self) -> "SolverPool":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests

    def solve(self, problem: ProblemIR | Mapping[str, Any], timeout_ms: int | None = None) -> dict[str, Any]:
        """The SolveResult (as its JSON dict) of `problem`; SolverError with a stable code otherwise.

        ContractError (nothing sent) if the problem holds NaN / inf or a value without a JSON form.
        The worker rebuilds an equal ProblemIR and hashes it itself (the wire carries no hash)."""
        try:
            problem_json = codec.encode(problem if isinstance(problem, ProblemIR) else dict(problem))
        except TypeError as exc:  # orjson's JSONEncodeError
            raise ContractError(f"problem: {exc}") from None
        return self._call("solve", b'{"problemIr":' + problem_json + b"}", timeout_ms)

    def ping(self, timeout_ms: int | None = None) -> dict[str, Any]:
        """{"pid", "busy"} of the worker that answered."""
        return self._call("ping", b"{}", timeout_ms)

    def request(self, op: str, payload: Mapping[str, Any] | None = None, timeout_ms: int | None = None) -> dict[str, Any]:
        """Any protocol op (the worker's test ops when it enables them); solve() is the product path."""
        return self._call(op, codec.encode(dict(payload or {})), timeout_ms)

    def _call(self, op: str, payload_json: bytes, timeout_ms: int | None) -> dict[str, Any]:
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        _check_positive("timeout_ms", timeout_ms)
        req_id = next(self._req_ids)
        # the worker's budget ends before the hard timeout: after OSQP's time limit it still verifies,
        # encodes and writes its answer, and a late answer would count as a killed worker
        budget_ms = max(1, int(timeout_ms - min(500, 0.2 * timeout_ms)))
        frame = (b'{"protocolVersion":%d,"reqId":%d,"op":%s,"deadlineMs":%d,"payload":%s}'
                 % (PROTOCOL_VERSION, req_id, codec.encode(op), budget_ms, payload_json))
        slot, worker = self._reserve()
        try:
            answer = worker.request(req_id, frame, timeout_ms / 1000.0)
        except _Timeout:
            self._kill_on_timeout(slot, worker, req_id)
            raise SolverError(errors.SOLVE_TIMEOUT, f"{op} request {req_id}: no answer within {timeout_ms} ms "
                                                    f"(last heartbeat {_ago(worker.last_heartbeat)}); worker {worker.pid} killed") from None
        finally:
            with self._lock:
                slot.busy = False
                self._changed.notify_all()
        with self._lock:
            self._failures = 0  # the worker answered: the failure streak is over (degraded stays until reset)
        if answer.get("ok") is True and isinstance(answer.get("result"), dict):
            return answer["result"]
        error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
        raise SolverError(str(error.get("code", errors.BAD_FRAME)),
                          str(error.get("message", f"malformed response from worker {worker.pid}: {answer!r}")))

    def _reserve(self) -> tuple[_Slot, _Worker]:
        deadline = time.monotonic() + self.queue_wait_s
        with self._lock:
            while True:
                if self._state != "running":
                    raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool is {self._state}")
                if self._degraded:
                    raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool degraded after {self._failures} "
                                                                 f"consecutive failures (last: {self._last_failure}); reset() to retry")
                for slot in self._slots:
                    if slot.worker is not None and not slot.busy and not slot.worker.exited.is_set():
                        slot.busy = True
                        return slot, slot.worker
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    busy = sum(slot.busy for slot in self._slots)
                    raise SolverError(errors.SOLVER_QUEUE_FULL, f"no free solver worker within {self.queue_wait_s:g} s "
                                                                f"({busy} of {self.size} busy)")
                self._changed.wait(remaining)

    # ------------------------------------------------------------------ failures and restarts

    def _kill_on_timeout(self, slot: _Slot, worker: _Worker, req_id: int) -> None:
        try:  # DESIGN: cancel, then kill: the cancel lets a live worker log what it was stopped in
            worker.send(codec.encode({"protocolVersion": PROTOCOL_VERSION, "reqId": f"cancel-{req_id}",
                                    "op": "cancel", "payload": {"reqId": req_id}}))
        except (OSError, ValueError):
            pass
        with self._lock:
            if not worker.retired:  # else its death was already counted by the reader
                worker.retired = True
                self._fail(slot, worker, f"worker {worker.pid} timed out on request {req_id}")
        worker.kill()

    def _on_worker_exit(self, worker: _Worker) -> None:
        """Reader thread, at EOF of a worker's stdout."""
        with self._lock:
            if worker.retired:
                return
            for slot in self._slots:
                if slot.worker is worker:
                    worker.retired = True
                    self._fail(slot, worker, f"worker {worker.pid} exited unexpectedly (code {worker.proc.poll()})")
                    return
        # not in a slot yet: _spawn sees the exit and counts it

    def _fail(self, slot: _Slot, worker: _Worker | None, reason: str) -> None:
        """Count a failure, retire the slot's worker, schedule its restart. Caller holds the lock."""
        self._failures += 1
        self._last_failure = reason
        if slot.worker is worker:
            slot.worker = None
        log.warning("solver pool failure %d in a row: %s", self._failures, reason)
        if self._failures >= MAX_CONSECUTIVE_FAILURES and not self._degraded:
            self._degraded = True
            log.error("solver pool degraded: %d consecutive failures; calls raise %s until reset()",
                      self._failures, errors.SOLVER_UNAVAILABLE)
        if self._failures <= len(self.backoff_s):
            self._schedule_restart(slot, self.backoff_s[self._failures - 1])
        self._changed.notify_all()

    def _schedule_restart(self, slot: _Slot, delay_s: float) -> None:
        """Caller holds the lock."""
        if self._state != "running" or slot.starting:
            return
        slot.starting = True
        slot.wake.clear()
        restart = threading.Thread(target=self._restart, args=(slot, delay_s), name=f"solver-restart-{slot.index}", daemon=True)
        self._restarts = [t for t in self._restarts if t.is_alive()] + [restart]
        restart.start()

    def _restart(self, slot: _Slot, delay_s: float) -> None:
        slot.wake.wait(delay_s)
        self._spawn(slot)

    def _spawn(self, slot: _Slot) -> None:
        """Start a worker into `slot` and wait for its ready frame; a failure is counted (and may restart)."""
        with self._lock:
            if self._state != "running":  # shut down during the back-off
                slot.starting = False
                self._changed.notify_all()
                return
        try:
            worker = _Worker(self.worker_cmd, self._env, self._on_worker_exit)
        except OSError as exc:
            with self._lock:
                slot.starting = False
                if self._state == "running":
                    self._fail(slot, None, f"cannot start a solver worker {self.worker_cmd}: {exc}")
                self._changed.notify_all()
            return
        with self._lock:
            closed = self._state != "running"
            if closed:
                worker.retired = True
            else:
                slot.spawning = worker  # shutdown() stops it while we wait for its ready frame
        failure: SolverError | None = None
        if not closed:
            try:
                diag = worker.wait_ready(self.start_timeout_s)
            except SolverError as exc:
                failure = exc
        with self._lock:
            slot.spawning = None
            slot.starting = False
            closed = closed or self._state != "running"
            if not closed and failure is None and worker.exited.is_set():
                failure = SolverError(errors.WORKER_START_FAILED, f"worker {worker.pid} exited right after its ready frame")
            if closed or failure is not None:
                worker.retired = True
            if not closed and failure is not None:
                self._fail(slot, None, failure.message)
            elif not closed:
                slot.worker = worker
            self._changed.notify_all()
        if closed or failure is not None:
            worker.kill()
        else:
            log.info("solver worker %d ready in %.0f ms (slot %d, %s)", worker.pid, worker.ready_ms, slot.index, diag)

    # ------------------------------------------------------------------ diagnostics

    def stats(self) -> dict[str, Any]:
        """size, ready (live workers), busy (requests in flight), degraded, pids, consecutive_failures, ready_ms."""
        with self._lock:
            live = [slot.worker for slot in self._slots if slot.worker is not None and not slot.worker.exited.is_set()]
            return {"size": self.size, "ready": len(live), "busy": sum(slot.busy for slot in self._slots),
                    "degraded": self._degraded, "pids": [w.pid for w in live],
                    "consecutive_failures": self._failures, "state": self._state,
                    "ready_ms": [round(w.ready_ms, 1) for w in live if w.ready_ms is not None]}


def _ago(moment: float | None) -> str:
    return "never" if moment is None else f"{time.monotonic() - moment:.1f} s ago"


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SolverConfigError(f"solver pool {name}: expected an integer in [{lo}, {hi}], got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SolverConfigError(f"solver pool {name}: expected a number > 0, got {value!r}")


# ------------------------------------------------------------------ one pool across runs of a process

_shared_lock = threading.Lock()
_keepers = 0
_shared: dict[tuple[int, int, int], SolverPool] = {}


@contextmanager
def kept_alive() -> Iterator[None]:
    """While inside, a pool from `acquire` outlives the run that started it and serves the next run
    with the same settings (the CLI and benchmarks run many partitions in one process; a pool start
    costs ~0.6 s). On leaving the outermost block every shared pool is shut down."""
    global _keepers
    with _shared_lock:
        _keepers += 1
    try:
        yield
    finally:
        with _shared_lock:
            _keepers -= 1
            pools = list(_shared.values()) if _keepers == 0 else []
            if _keepers == 0:
                _shared.clear()
        for pool in pools:
            pool.shutdown()


def acquire(size: int, request_timeout_ms: int, threads: int) -> tuple[SolverPool, bool]:
    """A started pool and whether the caller owns it (and must shut it down).

    Outside `kept_alive` every call starts a pool of its own. Inside, pools are shared by settings;
    a shared pool left degraded by an earlier run is reset, since a new run is a new start."""
    key = (size, request_timeout_ms, threads)
    with _shared_lock:
        shared = _keepers > 0
        pool = _shared.get(key) if shared else None
    if pool is not None and pool.stats()["state"] == "running":
        if pool.stats()["degraded"]:
            pool.reset()
        return pool, False
    pool = SolverPool(size=size, request_timeout_ms=request_timeout_ms, threads=threads).start()
    if not shared:
        return pool, True
    with _shared_lock:
        _shared[key] = pool
    return pool, False
