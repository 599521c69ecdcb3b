"""Solver worker pool: slot reservation, hard timeouts, failure accounting, restart back-off, degradation.

docs/ARCHITECTURE.md, "Solver worker protocol". One worker process (environment, framing, reader threads, the
stop steps) is solver/process.py; the capability probe is solver/probe.py; the keep-alive registry
that shares a pool across runs is solver/shared.py. Rules implemented here:
* 1-4 workers, one request in flight per worker; a caller reserves a free worker under the pool's
  lock, so two callers never share one. No free worker within `queue_wait_s` -> SOLVER_QUEUE_FULL.
* A binding's problems go to the worker its id hashes to when it is free within AFFINITY_WAIT_S, else
  to any free one: a worker's solver cache then holds its share of the bindings' structures (a cached
  structure is a warm start; a new one builds its matrices, factorises and solves cold, ~5x the CPU
  on the demo's tanks). Each worker keeps `cache_entries` structures.
* The capability probe (`python -m optimizer_pipeline.solver.probe`) runs once per start(), not
  per solve; a missing numpy / scipy / osqp -> ENV_MISSING_DEP.
* A worker without a valid ready frame within `start_timeout_s` (WORKER_START_FAILED) is killed and
  the start counts as a failure.
* Hard timeout -> cancel frame, kill, retire, SOLVE_TIMEOUT. Worker death with a request in flight
  -> WORKER_INTERRUPTED; the request is never replayed (a solve is cheap to ask again, a replayed
  one could be acted on twice).
* Failures (failed start, death, timeout) are counted; any answered request resets the count.
  After the n-th consecutive failure the worker is restarted after `backoff_s[n-1]` (1 s, 2 s, 4 s);
  past the schedule no automatic restart. From the 3rd consecutive failure on the pool is degraded:
  every call raises SOLVER_UNAVAILABLE until reset().
* shutdown() closes stdin, waits, terminates, kills and reports the exit code of every worker.
* A problem document over codec.MAX_PROBLEM_BYTES is refused before sending (codec.ProblemTooLarge).
"""

import itertools
import logging
import sys
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optimizer_pipeline.contracts import ContractError, ProblemIR
from optimizer_pipeline.solver import codec, errors
from optimizer_pipeline.solver.errors import PROTOCOL_VERSION, SolverError
from optimizer_pipeline.solver.probe import run_probe
from optimizer_pipeline.solver.process import DEFAULT_CACHE_ENTRIES, WorkerProcess, WorkerTimeout, worker_env
from optimizer_pipeline.validation import POSITIVE, Interval, check_integer, check_number

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
# how long a binding's problem waits for the worker its id hashes to before it takes any free one: about
# a warm solve of the demo's tanks (a cold one on another worker costs ~30 ms more CPU)
AFFINITY_WAIT_S = 0.01
DEFAULT_BACKOFF_S = (1.0, 2.0, 4.0)


class SolverConfigError(ContractError):
    """A pool setting is out of range; the message names the setting, its range and the value."""


@dataclass
class _Slot:
    index: int
    worker: WorkerProcess | None = None
    busy: bool = False  # a caller holds this slot
    starting: bool = False  # a restart (back-off, then spawn) owns this slot
    spawning: WorkerProcess | None = None  # the process being started, so shutdown can stop it
    wake: threading.Event = field(default_factory=threading.Event)  # cuts a back-off short


class SolverPool:
    """Long-lived solver workers behind a thread-safe `solve()`.

    size: 1-4 workers. request_timeout_ms: default hard timeout per request. threads: 1-16, the
    BLAS / OpenMP thread budget of each worker. python: interpreter for the probe and workers.
    queue_wait_s: how long a caller waits for a free worker before SOLVER_QUEUE_FULL.
    start_timeout_s: how long a worker may take to send its ready frame. cache_entries: the problem
    structures each worker keeps factorised (solver.solve.SolverCache).
    backoff_s: restart delays after the 1st, 2nd, 3rd consecutive failure (docs/ARCHITECTURE.md, "Solver pool rules": 1, 2, 4 s);
    tests pass shorter ones. worker_cmd: the worker command line instead of
    `python -m optimizer_pipeline.solver.worker` (tests use it to start a misbehaving fake worker).
    """

    def __init__(self, size: int = 1, request_timeout_ms: int = 10_000, threads: int = 1,
                 python: str = sys.executable, queue_wait_s: float = 5.0, *, start_timeout_s: float = 30.0,
                 backoff_s: Sequence[float] = DEFAULT_BACKOFF_S, worker_cmd: Sequence[str] | None = None,
                 cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        check_integer(size, "solver pool", Interval(1, 4), name="size", error=SolverConfigError)
        check_integer(threads, "solver pool", Interval(1, 16), name="threads", error=SolverConfigError)
        check_integer(cache_entries, "solver pool", Interval(1, 100_000), name="cache_entries",
                      error=SolverConfigError)
        for name, value in (("request_timeout_ms", request_timeout_ms), ("queue_wait_s", queue_wait_s),
                            ("start_timeout_s", start_timeout_s)):
            check_number(value, "solver pool", POSITIVE, name=name, error=SolverConfigError)
        if not backoff_s or any(isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0 for b in backoff_s):
            raise SolverConfigError(f"solver pool backoff_s: expected a non-empty sequence of seconds >= 0, got {backoff_s!r}")
        self.size = size
        self.request_timeout_ms = request_timeout_ms
        self.threads = threads
        self.cache_entries = cache_entries
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
        self._last_failure_at: float | None = None  # time.monotonic() of the last counted failure
        self._restarts: list[threading.Thread] = []
        self._req_ids = itertools.count(1)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "SolverPool":
        """Probe the interpreter once, then start every worker. While none is ready, the restarts the
        failed starts scheduled (back-off 1, 2, 4 s) get their turn: raises SOLVER_UNAVAILABLE only
        once the pool is degraded (MAX_CONSECUTIVE_FAILURES in a row) or has nothing left to restart."""
        with self._lock:
            if self._state != "new":
                raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool already {self._state}; create a new one")
            self._state = "running"
        try:
            self._env = worker_env(self.threads, cache_entries=self.cache_entries)
            self.probe_report = run_probe(self.python, self._env)
            spawners = [threading.Thread(target=self._spawn, args=(slot,), name=f"solver-spawn-{slot.index}")
                        for slot in self._slots]
            for spawner in spawners:
                spawner.start()
            for spawner in spawners:
                spawner.join()
            with self._lock:
                while (self._state == "running" and not self._degraded
                       and not any(slot.worker is not None for slot in self._slots)
                       and any(slot.starting for slot in self._slots)):
                    self._changed.wait(1.0)  # woken by a worker ready, a failure or the degraded state
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

        ContractError (nothing sent) if the problem holds NaN / inf or a value without a JSON form;
        codec.ProblemTooLarge (a ContractError, nothing sent) if its JSON is over codec.MAX_PROBLEM_BYTES.
        The worker rebuilds an equal ProblemIR and hashes it itself (the wire carries no hash)."""
        try:
            problem_json = codec.encode(problem if isinstance(problem, ProblemIR) else dict(problem))
        except TypeError as exc:  # orjson's JSONEncodeError
            raise ContractError(f"problem: {exc}") from None
        binding = problem.binding_id if isinstance(problem, ProblemIR) else problem.get("binding_id")
        codec.check_problem_size(problem_json, "problem" if binding is None else f"problem of binding {binding!r}")
        prefer = None if binding is None else zlib.crc32(str(binding).encode()) % self.size
        return self._call("solve", b'{"problemIr":' + problem_json + b"}", timeout_ms, prefer)

    def ping(self, timeout_ms: int | None = None) -> dict[str, Any]:
        """{"pid", "busy"} of the worker that answered."""
        return self._call("ping", b"{}", timeout_ms)

    def request(self, op: str, payload: Mapping[str, Any] | None = None, timeout_ms: int | None = None) -> dict[str, Any]:
        """Any protocol op (the worker's test ops when it enables them); solve() is the product path."""
        return self._call(op, codec.encode(dict(payload or {})), timeout_ms)

    def _call(self, op: str, payload_json: bytes, timeout_ms: int | None, prefer: int | None = None) -> dict[str, Any]:
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        check_number(timeout_ms, "solver pool", POSITIVE, name="timeout_ms", error=SolverConfigError)
        req_id = next(self._req_ids)
        # the worker's budget ends before the hard timeout: after OSQP's time limit it still verifies,
        # encodes and writes its answer, and a late answer would count as a killed worker
        budget_ms = max(1, int(timeout_ms - min(500, 0.2 * timeout_ms)))
        frame = (b'{"protocolVersion":%d,"reqId":%d,"op":%s,"deadlineMs":%d,"payload":%s}'
                 % (PROTOCOL_VERSION, req_id, codec.encode(op), budget_ms, payload_json))
        slot, worker = self._reserve(prefer)
        try:
            answer = worker.request(req_id, frame, timeout_ms / 1000.0)
        except WorkerTimeout:
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

    def _reserve(self, prefer: int | None = None) -> tuple[_Slot, WorkerProcess]:
        """A free worker (slot `prefer`'s, when it is free within AFFINITY_WAIT_S), marked busy."""
        start = time.monotonic()
        deadline, affine_until = start + self.queue_wait_s, start + AFFINITY_WAIT_S
        with self._lock:
            while True:
                if self._state != "running":
                    raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool is {self._state}")
                if self._degraded:
                    raise SolverError(errors.SOLVER_UNAVAILABLE, f"solver pool degraded after {self._failures} "
                                                                 f"consecutive failures (last: {self._last_failure}); reset() to retry")
                free = [slot for slot in self._slots
                        if slot.worker is not None and not slot.busy and not slot.worker.exited.is_set()]
                preferred = [slot for slot in free if slot.index == prefer]
                affine = prefer is not None and self._slots[prefer].worker is not None \
                    and time.monotonic() < affine_until
                if preferred or (free and not affine):
                    slot = (preferred or free)[0]
                    slot.busy = True
                    return slot, slot.worker
                if free:  # only other workers are free: wait for the preferred one, a little
                    self._changed.wait(max(0.0, affine_until - time.monotonic()))
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    busy = sum(slot.busy for slot in self._slots)
                    raise SolverError(errors.SOLVER_QUEUE_FULL, f"no free solver worker within {self.queue_wait_s:g} s "
                                                                f"({busy} of {self.size} busy)")
                self._changed.wait(remaining)

    # ------------------------------------------------------------------ failures and restarts

    def _kill_on_timeout(self, slot: _Slot, worker: WorkerProcess, req_id: int) -> None:
        try:  # the pool rule: cancel, then kill: the cancel lets a live worker log what it was stopped in
            worker.send(codec.encode({"protocolVersion": PROTOCOL_VERSION, "reqId": f"cancel-{req_id}",
                                    "op": "cancel", "payload": {"reqId": req_id}}))
        except (OSError, ValueError):
            pass
        with self._lock:
            if not worker.retired:  # else its death was already counted by the reader
                worker.retired = True
                self._fail(slot, worker, f"worker {worker.pid} timed out on request {req_id}")
        worker.kill()

    def _on_worker_exit(self, worker: WorkerProcess) -> None:
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

    def _fail(self, slot: _Slot, worker: WorkerProcess | None, reason: str) -> None:
        """Count a failure, retire the slot's worker, schedule its restart. Caller holds the lock."""
        self._failures += 1
        self._last_failure = reason
        self._last_failure_at = time.monotonic()
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
            worker = WorkerProcess(self.worker_cmd, self._env, self._on_worker_exit)
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
        """size, ready (live workers), busy (requests in flight), degraded, pids, consecutive_failures, ready_ms,
        restarting (slots whose restart is waiting out its back-off or starting a worker), last_failure_at
        (time.monotonic() of the last counted failure, None before the first)."""
        with self._lock:
            live = [slot.worker for slot in self._slots if slot.worker is not None and not slot.worker.exited.is_set()]
            return {"size": self.size, "ready": len(live), "busy": sum(slot.busy for slot in self._slots),
                    "degraded": self._degraded, "pids": [w.pid for w in live],
                    "consecutive_failures": self._failures, "state": self._state,
                    "restarting": sum(slot.starting for slot in self._slots), "last_failure_at": self._last_failure_at,
                    "ready_ms": [round(w.ready_ms, 1) for w in live if w.ready_ms is not None]}


def _ago(moment: float | None) -> str:
    return "never" if moment is None else f"{time.monotonic() - moment:.1f} s ago"
