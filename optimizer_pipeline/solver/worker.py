"""Solver worker process: NDJSON protocol v1 on stdin / stdout (`python -m optimizer_pipeline.solver.worker`).

docs/ARCHITECTURE.md, "Solver worker protocol". One JSON object per line.

  worker -> pool on start  {"type":"ready","protocolVersion":1,"diag":{"pid","python","numpy","scipy","osqp"}}
  pool -> worker           {"protocolVersion":1,"reqId":…,"op":…,"payload":{…},"deadlineMs":…}
      op "solve"     payload {"problemIr": ProblemIR dict}; deadlineMs (optional, > 0) is the time budget
                     in milliseconds from receipt, handed to OSQP as its time limit
      op "cancel"    payload {"reqId": id of the in-flight request}; answered at once
      op "ping"      answered at once, also while a solve runs: {"pid", "busy"}
      op "shutdown"  answered, the in-flight request is cancelled, the worker exits
      op "sleep"     TEST ONLY, accepted only when OPTIMIZER_WORKER_TEST_OPS=1: payload {"seconds"},
                     a cancellable stand-in for a slow solve; result {"slept", "pid"}
  worker -> pool           {"reqId":…,"ok":true,"result":{…}} | {"reqId":…,"ok":false,"error":{"code","message"}}
                           {"type":"heartbeat","reqId":…} every HEARTBEAT_S while a request runs

A line that is not a valid frame gets an error response (reqId null when it cannot be read) and the
worker keeps serving. A request line over codec.MAX_REQUEST_BYTES is not decoded: the worker reads at
most that much of it, skips the rest and answers BAD_REQUEST naming the limit (with the reqId when
it can be read from the start of the line). The worker exits on stdin EOF or "shutdown", so it cannot outlive its owner.
One SolverCache lives for the process lifetime: re-solves of the same structure are warm starts; it
keeps the number of structures the pool's environment names (process.CACHE_ENTRIES_VAR).
Frames are encoded by solver/codec.py (orjson; a result holding NaN / inf is answered SOLVE_FAILED).
Threads: the main thread reads stdin and answers ping / cancel at once; solves run on a solver thread.
(Running a solve on the thread that read it, with a second thread taking over stdin, measured no
faster: no-op request round trips 64-154 us either way on the 2-core dev box, issue 8.)
Imports stay light (no dagster, no pandas): the pool waits for the ready frame.
"""

import functools
import logging
import os
import platform
import queue
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import numpy
import osqp
import scipy

from optimizer_pipeline.contracts import ProblemIR
from optimizer_pipeline.solver import codec, errors
from optimizer_pipeline.solver.errors import PROTOCOL_VERSION
from optimizer_pipeline.solver.process import CACHE_ENTRIES_VAR, DEFAULT_CACHE_ENTRIES
from optimizer_pipeline.solver.solve import SolverCache, solve_problem

HEARTBEAT_S = 0.5
TEST_OPS_ENV = "OPTIMIZER_WORKER_TEST_OPS"
PROTOCOL_OPS = ("solve", "cancel", "ping", "shutdown")
TEST_OPS = ("sleep",)

log = logging.getLogger(__name__)


class FrameError(Exception):
    """A request line that cannot be served; becomes an error response."""

    def __init__(self, code: str, message: str, req_id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.req_id = req_id


@dataclass(frozen=True)
class Request:
    req_id: str | int
    op: str
    payload: dict[str, Any]
    deadline_ms: float | None
    received_at: float  # time.monotonic() at receipt


def parse_request(line: bytes, test_ops: bool) -> Request:
    """Validate one request line; raises FrameError naming the field that is wrong."""
    try:
        frame = codec.decode(line)
    except ValueError as exc:  # orjson.JSONDecodeError, also for a line that is not UTF-8
        raise FrameError(errors.BAD_FRAME, f"line is not JSON ({exc})") from None
    if not isinstance(frame, dict):
        raise FrameError(errors.BAD_FRAME, f"frame must be a JSON object, got {type(frame).__name__}")
    req_id = frame.get("reqId")
    # bool is an int in Python, but not a usable request id
    known_id = req_id if isinstance(req_id, (str, int)) and not isinstance(req_id, bool) else None
    version = frame.get("protocolVersion")
    if version != PROTOCOL_VERSION:
        raise FrameError(errors.UNSUPPORTED_PROTOCOL,
                         f"protocolVersion must be {PROTOCOL_VERSION}, got {version!r}", known_id)
    if known_id is None:
        raise FrameError(errors.BAD_REQUEST, f"reqId must be a string or an integer, got {req_id!r}")
    op = frame.get("op")
    allowed = PROTOCOL_OPS + (TEST_OPS if test_ops else ())
    if op not in allowed:
        hint = f" (test op: set {TEST_OPS_ENV}=1 in the worker's environment)" if op in TEST_OPS else ""
        raise FrameError(errors.UNKNOWN_OP, f"op {op!r} is not one of {list(allowed)}{hint}", req_id)
    payload = frame.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise FrameError(errors.BAD_REQUEST, f"payload must be an object, got {type(payload).__name__}", req_id)
    deadline = frame.get("deadlineMs")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not deadline > 0):
        raise FrameError(errors.BAD_REQUEST, f"deadlineMs must be a number > 0, got {deadline!r}", req_id)
    return Request(req_id, op, payload, None if deadline is None else float(deadline), time.monotonic())


_REQ_ID = re.compile(rb'"reqId"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")')


def oversized_error(head: bytes, size: int) -> bytes:
    """The answer to a request line of `size` bytes (over codec.MAX_REQUEST_BYTES) starting with `head`."""
    req_id = None
    match = _REQ_ID.search(head)
    if match:
        try:
            req_id = codec.decode(match.group(1))
        except ValueError:
            req_id = None
    return error_frame(req_id, errors.BAD_REQUEST,
                       f"request line of {size} bytes is over the limit of {codec.MAX_REQUEST_BYTES} bytes "
                       f"(MAX_REQUEST_BYTES: a problem document of at most {codec.MAX_PROBLEM_BYTES} bytes, "
                       f"MAX_PROBLEM_BYTES, plus the frame); not read")


def ok_frame(req_id: Any, result_json: bytes) -> bytes:
    """Response line without its newline; `result_json` is already JSON (spliced in, not re-encoded)."""
    return b'{"reqId":' + codec.encode(req_id) + b',"ok":true,"result":' + result_json + b"}"


def error_frame(req_id: Any, code: str, message: str) -> bytes:
    return codec.encode({"reqId": req_id, "ok": False, "error": {"code": code, "message": message}})


class Channel:
    """The protocol output: whole lines, one writer at a time (reader, solver and heartbeat threads share it)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, frame: bytes) -> None:
        data = frame + b"\n"
        with self._lock:
            self._stream.write(data)
            self._stream.flush()


class Worker:
    """Serves frames from `handle_line` (the stdin thread); solves run on a solver thread, one at a time."""

    def __init__(self, out: Channel, test_ops: bool, cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self.out = out
        self.test_ops = test_ops
        self.cache = SolverCache(cache_entries)
        self._lock = threading.Lock()
        self._in_flight: Request | None = None
        self._cancel = threading.Event()  # set: the in-flight request should stop (read by should_cancel)
        self._jobs: queue.Queue[Request | None] = queue.Queue()
        self._stop = threading.Event()
        self._solver = threading.Thread(target=self._run_jobs, name="solver", daemon=True)
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._solver.start()
        self._heartbeat.start()

    def stop(self, join_s: float = 5.0) -> None:
        """Cancel the in-flight request and wait (bounded) for the solver thread."""
        self._cancel.set()
        self._stop.set()
        self._jobs.put(None)
        self._solver.join(join_s)

    # ------------------------------------------------------------------ stdin thread

    def handle_line(self, line: bytes) -> bool:
        """Serve one line; False when the worker should exit ("shutdown")."""
        if not line.strip():
            return True
        try:
            request = parse_request(line, self.test_ops)
        except FrameError as exc:
            self.out.send(error_frame(exc.req_id, exc.code, exc.message))
            return True
        if request.op == "ping":
            self.out.send(ok_frame(request.req_id, codec.encode({"pid": os.getpid(), "busy": self.busy})))
        elif request.op == "cancel":
            self.out.send(ok_frame(request.req_id, codec.encode({"cancelled": self._cancel_request(request)})))
        elif request.op == "shutdown":
            self.out.send(ok_frame(request.req_id, b"{}"))
            return False
        else:
            self._submit(request)
        return True

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._in_flight is not None

    def _cancel_request(self, request: Request) -> bool:
        target = request.payload.get("reqId")
        with self._lock:
            if self._in_flight is None or self._in_flight.req_id != target:
                return False
            self._cancel.set()
            return True

    def _submit(self, request: Request) -> None:
        with self._lock:
            running = self._in_flight
            if running is None:
                self._in_flight = request
                self._cancel.clear()
        if running is not None:
            self.out.send(error_frame(request.req_id, errors.WORKER_BUSY,
                                      f"request {running.req_id!r} is still in flight; one solve at a time"))
            return
        self._jobs.put(request)

    # ------------------------------------------------------------------ solver thread

    def _run_jobs(self) -> None:
        while (request := self._jobs.get()) is not None:
            try:
                response = ok_frame(request.req_id, self._execute(request))
            except FrameError as exc:
                response = error_frame(request.req_id, exc.code, exc.message)
            except Exception as exc:  # the solver failed on this input: answer, log, keep serving
                log.exception("request %r failed", request.req_id)
                code = errors.CANCELLED if self._cancel.is_set() else errors.SOLVE_FAILED
                response = error_frame(request.req_id, code, f"{type(exc).__name__}: {exc}")
            # free the slot before answering: the pool may send the next request the moment it reads this
            with self._lock:
                self._in_flight = None
            self.out.send(response)

    def _execute(self, request: Request) -> bytes:
        """The result as JSON."""
        if request.op == "sleep":
            return self._sleep(request)
        problem_doc = request.payload.get("problemIr")
        if not isinstance(problem_doc, dict):
            raise FrameError(errors.BAD_REQUEST, f"payload.problemIr must be an object, got {type(problem_doc).__name__}")
        try:
            problem = ProblemIR.from_dict(problem_doc)
        except (KeyError, TypeError, ValueError) as exc:  # ContractError is a ValueError
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise FrameError(errors.BAD_REQUEST, f"payload.problemIr: {what}") from None
        result = solve_problem(problem, self.cache, time_limit_s=_remaining_s(request),
                               should_cancel=self._cancel.is_set)
        try:
            # the wire needs valid JSON, not the canonical form (nothing hashes a result); NaN / inf are refused
            return codec.encode(result)
        except (TypeError, ValueError) as exc:  # ContractError is a ValueError, orjson's JSONEncodeError a TypeError
            raise FrameError(errors.SOLVE_FAILED, f"result is not encodable: {exc}") from None

    def _sleep(self, request: Request) -> bytes:
        seconds = request.payload.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise FrameError(errors.BAD_REQUEST, f"payload.seconds must be a number >= 0, got {seconds!r}")
        if self._cancel.wait(seconds):
            raise FrameError(errors.CANCELLED, f"request {request.req_id!r} cancelled")
        return codec.encode({"slept": seconds, "pid": os.getpid()})

    # ------------------------------------------------------------------ heartbeat thread

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                running = self._in_flight
            if running is not None:
                self.out.send(codec.encode({"type": "heartbeat", "reqId": running.req_id}))


def _remaining_s(request: Request) -> float | None:
    if request.deadline_ms is None:
        return None
    # never hand OSQP a zero or negative budget: it would mean "no limit"
    return max(request.deadline_ms / 1000.0 - (time.monotonic() - request.received_at), 1e-3)


def ready_frame() -> bytes:
    return codec.encode({"type": "ready", "protocolVersion": PROTOCOL_VERSION, "diag": {
        "pid": os.getpid(), "python": platform.python_version(), "numpy": numpy.__version__,
        "scipy": scipy.__version__, "osqp": osqp.__version__}})


def protocol_stream() -> BinaryIO:
    """Take fd 1 for the protocol and point fd 1 (and sys.stdout) at stderr.

    OSQP's C code and any stray print write to fd 1; mixed into the protocol stream they could
    split a frame. After this, only Channel writes reach the pool's stdout pipe.
    """
    stream = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def serve(read_line: Callable[[], bytes], out: Channel, test_ops: bool,
          cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
    """`read_line` returns at most codec.MAX_REQUEST_BYTES + 1 bytes of a line (the rest on the next call)."""
    worker = Worker(out, test_ops, cache_entries)
    worker.start()
    out.send(ready_frame())
    try:
        while line := read_line():
            if len(line) > codec.MAX_REQUEST_BYTES and not line.endswith(b"\n"):
                head, size = line[:512], len(line)
                while not line.endswith(b"\n") and (line := read_line()):  # skip the rest of the line
                    size += len(line)
                out.send(oversized_error(head, size - line.endswith(b"\n")))
            elif not worker.handle_line(line):
                break
    finally:
        worker.stop()


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"worker[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    # The worker's life is tied to stdin: a Ctrl-C to the owner's process group is the owner's to
    # handle (it closes our stdin), not a reason to die mid-frame with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = Channel(protocol_stream())
    serve(functools.partial(sys.stdin.buffer.readline, codec.MAX_REQUEST_BYTES + 1), out,
          test_ops=os.environ.get(TEST_OPS_ENV) == "1",
          cache_entries=int(os.environ.get(CACHE_ENTRIES_VAR, DEFAULT_CACHE_ENTRIES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
