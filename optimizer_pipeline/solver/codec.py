"""Wire codec of the solver protocol: JSON bytes of frames and their payloads (orjson), NaN / inf refused.

docs/ARCHITECTURE.md, "Solver worker protocol" fixes the frames (NDJSON, protocol v1); this module only decides
how they are encoded. orjson is ~10x faster than the json module on a SolveResult (~15 kB), which was
most of the pool's overhead over an in-process solve (issue 8). Two differences from json.dumps that
matter here:
* orjson writes NaN / inf as `null` without complaint; `encode` refuses them first
  (contracts.fast_json: an exact check) with canonical_json's ContractError naming where the number is.
* key order is the dataclass field order, not sorted: nothing hashes wire bytes (ProblemIR.hash is
  computed from canonical_json by whoever needs it), so only the decoded values must be equal, and
  orjson writes floats as the shortest text that reads back to the same double.
* a dataclass is written from its __dict__ minus names starting with "_" (orjson's rule): a
  contracts field named so would not reach the worker (tests/test_pool_codec.py compares the
  ProblemIR the worker rebuilds with the original).

Size limit (docs/history.md, "Limits"): a problem document (the ProblemIR JSON of a solve request) is at most
MAX_PROBLEM_BYTES. The pool refuses a larger one before sending (`check_problem_size`), the worker
reads at most MAX_REQUEST_BYTES of a request line and refuses a longer line without decoding it.
"""

from typing import Any

import orjson

from optimizer_pipeline.contracts import ContractError, fast_json

# The demo problems are ~2 kB; a binding with 20 MVs and 20 CVs, na = nb = 3 and delay 6 (a state of
# 200) is ~1 MB. 8 MiB is far above any problem OSQP solves within a request timeout, and small
# enough that a worker never buffers more than that of one request line.
MAX_PROBLEM_BYTES = 8 * 1024 * 1024
# A request line: the problem document plus the frame around it (protocolVersion, reqId, op, deadlineMs).
MAX_REQUEST_BYTES = MAX_PROBLEM_BYTES + 4096


class ProblemTooLarge(ContractError):
    """A problem document over MAX_PROBLEM_BYTES; the message names the size and the limit."""


def encode(value: Any) -> bytes:
    """Compact JSON of `value` (contracts.fast_json): ContractError if it holds NaN / inf or a type
    with no JSON form."""
    return fast_json(value)


def decode(data: bytes | str) -> Any:
    """The value of one JSON text; ValueError (orjson.JSONDecodeError) if it is not JSON or not UTF-8."""
    return orjson.loads(data)


def check_problem_size(problem_json: bytes, what: str = "problem") -> None:
    """ProblemTooLarge when the encoded problem document is over MAX_PROBLEM_BYTES."""
    if len(problem_json) > MAX_PROBLEM_BYTES:
        raise ProblemTooLarge(f"{what}: problem document is {len(problem_json)} bytes, over the limit of "
                              f"{MAX_PROBLEM_BYTES} bytes (MAX_PROBLEM_BYTES, {MAX_PROBLEM_BYTES >> 20} MiB); "
                              f"not sent to a solver worker")
