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
"""

from typing import Any

import orjson

from optimizer_pipeline.contracts import fast_json


def encode(value: Any) -> bytes:
    """Compact JSON of `value` (contracts.fast_json): ContractError if it holds NaN / inf or a type
    with no JSON form."""
    return fast_json(value)


def decode(data: bytes | str) -> Any:
    """The value of one JSON text; ValueError (orjson.JSONDecodeError) if it is not JSON or not UTF-8."""
    return orjson.loads(data)
