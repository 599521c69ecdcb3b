"""Wire codec of the solver protocol: JSON bytes of frames and their payloads (orjson), NaN / inf refused.

DESIGN.md "Solver worker protocol" fixes the frames (NDJSON, protocol v1); this module only decides
how they are encoded. orjson is ~10x faster than the json module on a SolveResult (~15 kB), which was
most of the pool's overhead over an in-process solve (issue 8). Two differences from json.dumps that
matter here:
* orjson writes NaN / inf as `null` without complaint; `encode` refuses them first (`all_finite`, an
  exact check) with canonical_json's ContractError naming where the number is.
* key order is the dataclass field order, not sorted: nothing hashes wire bytes (ProblemIR.hash is
  computed from canonical_json by whoever needs it), so only the decoded values must be equal, and
  orjson writes floats as the shortest text that reads back to the same double.
* a dataclass is written from its __dict__ minus names starting with "_" (orjson's rule): a
  contracts field named so would not reach the worker (tests/test_pool_codec.py compares the
  ProblemIR the worker rebuilds with the original).
"""

import math
from itertools import chain
from typing import Any

import numpy as np
import orjson

from optimizer_pipeline.contracts import canonical_json

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # dataclasses, enums, tuples and numpy scalars are native
_isfinite = math.isfinite
_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})  # exact types: enums and numpy scalars go the long way


def all_finite(value: Any) -> bool:
    """Whether every number in `value` is finite (no NaN, no inf); exact. ~35 us on a SolveResult, where
    canonical_json's walk takes ~0.6-1.2 ms and an item-by-item walk ~0.1 ms.

    Walks dataclasses, mappings, lists, tuples and numpy arrays; other leaves (str, int, bool, None,
    enums) cannot be non-finite. A sequence of numbers, or of rows of numbers, whose sum is finite
    holds only finite numbers (a NaN or inf addend makes every later partial sum non-finite), so one
    C-level sum clears it; a sum that is not finite (or fails: None, strings, deeper nesting, an int
    too large for a float) sends the walk item by item, which decides exactly.
    """
    kind = type(value)
    if kind is float:
        return _isfinite(value)
    if kind in _PLAIN_LEAVES:
        return True
    if kind is tuple or kind is list:
        if not value:
            return True
        try:
            rows = type(value[0]) in (tuple, list)
            if _isfinite(sum(chain.from_iterable(value)) if rows else sum(value)):
                return True
        except (TypeError, OverflowError):
            pass
        return all(map(all_finite, value))
    if kind is dict:
        return all(map(all_finite, value.values()))
    if hasattr(value, "__dataclass_fields__"):
        # orjson writes a dataclass's __dict__ (its slots when it has no __dict__)
        if hasattr(value, "__dict__"):
            return all(map(all_finite, value.__dict__.values()))
        return all(all_finite(getattr(value, name)) for name in value.__dataclass_fields__)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            return bool(np.isfinite(value).all())
        return value.dtype.kind != "O" or all_finite(value.tolist())
    if isinstance(value, (float, np.floating)):
        return bool(np.isfinite(value))
    if isinstance(value, (list, tuple)):
        return all_finite(list(value))
    if isinstance(value, dict):
        return all_finite(dict(value))
    return True


def encode(value: Any) -> bytes:
    """Compact JSON of `value`; ContractError if it holds NaN / inf, TypeError if a type has no JSON form."""
    if not all_finite(value):
        canonical_json(value)  # the slow, exact walk that raises a ContractError naming where the NaN / inf is
    return orjson.dumps(value, option=_OPTIONS)


def decode(data: bytes | str) -> Any:
    """The value of one JSON text; ValueError (orjson.JSONDecodeError) if it is not JSON or not UTF-8."""
    return orjson.loads(data)
