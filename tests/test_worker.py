"""The solver worker speaks NDJSON protocol v1 (docs/ARCHITECTURE.md, "Solver worker protocol") and survives bad frames."""

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import replace

import numpy
import osqp
import pytest
import scipy

from optimizer_pipeline.solver import codec, errors
from test_pool import _problem

WORKER = [sys.executable, "-m", "optimizer_pipeline.solver.worker"]
FRAME_TIMEOUT_S = 30.0  # generous: a frame that takes this long is a hung worker, not a slow machine


class WorkerProcess:
    """A worker started by hand: write raw lines, read frames (heartbeats kept aside)."""

    def __init__(self, test_ops: bool) -> None:
        env = dict(os.environ)
        env.pop("OPTIMIZER_WORKER_TEST_OPS", None)
        if test_ops:
            env["OPTIMIZER_WORKER_TEST_OPS"] = "1"
        self.proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.heartbeats: list = []  # reqId of every heartbeat read so far
        self._unread = b""
        self.ready = self.next_frame()

    def write(self, line: str | bytes) -> None:
        self.proc.stdin.write(line if isinstance(line, bytes) else line.encode() + b"\n")
        self.proc.stdin.flush()

    def _next_line(self, deadline: float, timeout_s: float) -> bytes:
        """One stdout line; fails at `deadline` (time.monotonic(), `timeout_s` after the wait began)
        without one. The pipe's fd is read directly, so select sees everything not yet read."""
        while b"\n" not in self._unread:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no frame from the worker within {timeout_s:g} s"
            if select.select([self.proc.stdout.fileno()], [], [], remaining)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert chunk, "worker closed stdout"
                self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return line

    def next_frame(self, timeout_s: float = FRAME_TIMEOUT_S) -> dict:
        """The next non-heartbeat frame (every stdout line must be JSON)."""
        deadline = time.monotonic() + timeout_s
        while True:
            frame = json.loads(self._next_line(deadline, timeout_s))
            if frame.get("type") == "heartbeat":
                self.heartbeats.append(frame.get("reqId"))
                continue
            return frame

    def wait_for_heartbeats(self, req_id, n: int, timeout_s: float = FRAME_TIMEOUT_S) -> None:
        """Read frames until `n` heartbeats of `req_id` arrived; any other frame meanwhile fails."""
        deadline = time.monotonic() + timeout_s
        while self.heartbeats.count(req_id) < n:
            frame = json.loads(self._next_line(deadline, timeout_s))
            assert frame.get("type") == "heartbeat", f"expected heartbeats of {req_id!r}, got {frame}"
            self.heartbeats.append(frame.get("reqId"))

    def call(self, op: str, payload: dict | None = None, req_id: int = 1, **extra) -> dict:
        self.write(json.dumps({"protocolVersion": 1, "reqId": req_id, "op": op, "payload": payload or {}, **extra}))
        return self.next_frame()

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def worker():
    w = WorkerProcess(test_ops=True)
    yield w
    w.close()


def _assert_still_serving(worker: WorkerProcess) -> None:
    assert worker.call("ping", req_id="after") == {"reqId": "after", "ok": True,
                                                   "result": {"pid": worker.proc.pid, "busy": False}}


def test_ready_frame_names_protocol_pid_and_versions(worker):
    assert worker.ready == {"type": "ready", "protocolVersion": 1, "diag": {
        "pid": worker.proc.pid, "python": ".".join(map(str, sys.version_info[:3])),
        "numpy": numpy.__version__, "scipy": scipy.__version__, "osqp": osqp.__version__}}


def test_ping_round_trip_echoes_the_request_id(worker):
    assert worker.call("ping", req_id="r-7") == {"reqId": "r-7", "ok": True, "result": {"pid": worker.proc.pid, "busy": False}}


@pytest.mark.parametrize("line, code, req_id", [
    (b"this is not json", errors.BAD_FRAME, None),
    (b"\xff\xfe{", errors.BAD_FRAME, None),
    (b"[1, 2, 3]", errors.BAD_FRAME, None),
    (b'{"protocolVersion": 2, "reqId": 5, "op": "ping"}', errors.UNSUPPORTED_PROTOCOL, 5),
    (b'{"reqId": 6, "op": "ping"}', errors.UNSUPPORTED_PROTOCOL, 6),
    (b'{"protocolVersion": 1, "op": "ping"}', errors.BAD_REQUEST, None),
    (b'{"protocolVersion": 1, "reqId": true, "op": "ping"}', errors.BAD_REQUEST, None),
    (b'{"protocolVersion": 1, "reqId": 8, "op": "explode"}', errors.UNKNOWN_OP, 8),
    (b'{"protocolVersion": 1, "reqId": 9, "op": "solve", "payload": [1]}', errors.BAD_REQUEST, 9),
    (b'{"protocolVersion": 1, "reqId": 10, "op": "solve", "payload": {}}', errors.BAD_REQUEST, 10),
    (b'{"protocolVersion": 1, "reqId": 11, "op": "solve", "payload": {"problemIr": {"template": "x"}}}', errors.BAD_REQUEST, 11),
    (b'{"protocolVersion": 1, "reqId": 12, "op": "sleep", "payload": {"seconds": "long"}}', errors.BAD_REQUEST, 12),
    (b'{"protocolVersion": 1, "reqId": 13, "op": "ping", "deadlineMs": -1}', errors.BAD_REQUEST, 13),
])
def test_malformed_frame_gets_an_error_response_and_the_worker_keeps_serving(worker, line, code, req_id):
    worker.write(line + b"\n")
    frame = worker.next_frame()
    assert (frame["reqId"], frame["ok"], frame["error"]["code"]) == (req_id, False, code)
    assert frame["error"]["message"]
    _assert_still_serving(worker)


@pytest.mark.parametrize("over", [1, codec.MAX_REQUEST_BYTES + 10])
def test_request_line_over_the_size_limit_is_refused_unread_naming_the_limit(worker, over):
    head = b'{"protocolVersion": 1, "reqId": "big", "op": "ping", "payload": {}'
    at_limit = head + b" " * (codec.MAX_REQUEST_BYTES - len(head) - 1) + b"}"  # JSON allows the blanks
    assert len(at_limit) == codec.MAX_REQUEST_BYTES
    worker.write(at_limit + b"\n")
    assert worker.next_frame() == {"reqId": "big", "ok": True, "result": {"pid": worker.proc.pid, "busy": False}}
    size = codec.MAX_REQUEST_BYTES + over
    worker.write(head + b" " * (size - len(head) - 1) + b"}\n")
    assert worker.next_frame() == {"reqId": "big", "ok": False, "error": {"code": errors.BAD_REQUEST, "message": (
        f"request line of {size} bytes is over the limit of {codec.MAX_REQUEST_BYTES} bytes (MAX_REQUEST_BYTES: "
        f"a problem document of at most {codec.MAX_PROBLEM_BYTES} bytes, MAX_PROBLEM_BYTES, plus the frame); not read")}}
    _assert_still_serving(worker)


def test_cancel_stops_the_in_flight_request_with_heartbeats_meanwhile(worker):
    worker.write(json.dumps({"protocolVersion": 1, "reqId": "slow", "op": "sleep", "payload": {"seconds": 30}}))
    worker.wait_for_heartbeats("slow", 3)  # the request is running and says so; nothing else is sent meanwhile
    worker.write(json.dumps({"protocolVersion": 1, "reqId": "c", "op": "cancel", "payload": {"reqId": "slow"}}))
    frames = {}
    for _ in range(2):
        frame = worker.next_frame()
        frames[frame["reqId"]] = frame
    assert frames["c"] == {"reqId": "c", "ok": True, "result": {"cancelled": True}}
    assert frames["slow"]["error"]["code"] == errors.CANCELLED
    _assert_still_serving(worker)


def test_second_request_while_busy_is_refused_not_queued(worker):
    # "a" runs until cancelled, so "b" arrives while it is in flight however slow the machine is
    worker.write(json.dumps({"protocolVersion": 1, "reqId": "a", "op": "sleep", "payload": {"seconds": 60}}))
    busy = worker.call("sleep", {"seconds": 0}, req_id="b")
    assert (busy["reqId"], busy["error"]["code"]) == ("b", errors.WORKER_BUSY)
    assert "'a' is still in flight" in busy["error"]["message"]
    worker.write(json.dumps({"protocolVersion": 1, "reqId": "c", "op": "cancel", "payload": {"reqId": "a"}}))
    frames = {frame["reqId"]: frame for frame in (worker.next_frame(), worker.next_frame())}
    assert frames["c"]["result"] == {"cancelled": True} and frames["a"]["error"]["code"] == errors.CANCELLED
    # "b" was refused, not queued: the next answer is to the next request, and the worker is idle
    _assert_still_serving(worker)
    assert worker.call("sleep", {"seconds": 0}, req_id="d") == {"reqId": "d", "ok": True,
                                                                "result": {"slept": 0, "pid": worker.proc.pid}}


def test_test_op_is_refused_without_the_environment_flag():
    plain = WorkerProcess(test_ops=False)
    try:
        frame = plain.call("sleep", {"seconds": 0}, req_id=1)
        assert frame["error"]["code"] == errors.UNKNOWN_OP
        assert "OPTIMIZER_WORKER_TEST_OPS" in frame["error"]["message"]
    finally:
        assert plain.close() == 0


def test_shutdown_is_answered_and_the_worker_exits_cleanly():
    w = WorkerProcess(test_ops=False)
    assert w.call("shutdown", req_id="bye") == {"reqId": "bye", "ok": True, "result": {}}
    assert w.proc.wait(timeout=10) == 0


def test_stdin_eof_ends_the_worker():
    w = WorkerProcess(test_ops=False)
    assert w.close() == 0


def test_result_holding_a_non_finite_number_is_refused_as_solve_failed_naming_it(worker):
    # a real overflow: tracking a target of 1e200 costs (1e200)^2 = inf for the HOLD candidate
    problem = replace(_problem(), y_target=(1e200, 0.0), y_lo=(-1e300, -3.0), y_hi=(1e300, 3.0))
    frame = worker.call("solve", {"problemIr": problem.to_dict()}, req_id="inf")
    assert (frame["reqId"], frame["ok"], frame["error"]["code"]) == ("inf", False, errors.SOLVE_FAILED)
    assert "non-finite number inf at .candidates[0].cost" in frame["error"]["message"]
    _assert_still_serving(worker)
