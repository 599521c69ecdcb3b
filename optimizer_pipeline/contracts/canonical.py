"""Canonical JSON of the vocabulary (sorted keys, shortest float repr, no NaN / inf), its sha256,
the orjson writer of what nobody hashes, the finite-number check, and ContractError (re-exported
from optimizer_pipeline.validation, where the field checks that raise it live).

canonical_json is defined by `_reference_json` (normalise the tree, json.dumps it); `_json_text`
writes the same bytes faster on what the solver frames and the ledger write again and again.
"""

import hashlib
import json
import math
import operator
from dataclasses import fields
from enum import Enum
from itertools import chain, repeat
from typing import Any, Mapping, Sequence

import numpy as np
import orjson

from optimizer_pipeline.validation import ContractError  # defined with the field checks that raise it


# --------------------------------------------------------------------------- canonical JSON


def _canonical(value: Any, path: str) -> Any:
    # Exact-type fast paths first (this runs on every solver frame); the error path text is built
    # only when a value is refused.
    kind = type(value)
    if kind is float:
        if value != value or value in (math.inf, -math.inf):
            raise ContractError(f"canonical JSON: non-finite number {value!r} at {path or '<root>'}")
        return 0.0 if value == 0.0 else value  # -0.0 and 0.0 are one value
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is tuple or kind is list:
        return [_canonical(v, f"{path}[{i}]") if type(v) is not float or not math.isfinite(v) or v == 0.0
                else v for i, v in enumerate(value)]
    if kind is dict:
        return {str(k): _canonical(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _canonical(float(value), path)
    if isinstance(value, np.ndarray):
        return _canonical(value.tolist(), path)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _canonical(getattr(value, f.name), f"{path}.{f.name}") for f in fields(value)}
    raise ContractError(f"canonical JSON: unsupported type {type(value).__name__} at {path or '<root>'}")


def _reference_json(value: Any, path: str) -> str:
    """canonical JSON text of `value` the plain way: normalise the tree, then json.dumps it (the definition)."""
    return json.dumps(_canonical(value, path), sort_keys=True, separators=(",", ":"), allow_nan=False)


# JSON text of tuples (of tuples) of exact finite floats already written: model matrices, limits and
# scalings repeat from one re-solve to the next, and float repr (~0.4 us a number) is most of the
# time of a ProblemIR's text. Equal keys give equal text: only exact floats are stored, NaN never
# is, and -0.0 == 0.0 are written alike.
_FLOATS_TEXT: dict[tuple, str] = {}
_FLOATS_TEXT_MAX = 4096  # entries; the memo starts over when full
_FLOAT_ONLY, _STR_ONLY, _TUPLE_ONLY, _SEQUENCES = {float}, {str}, {tuple}, {tuple, list}
# per dataclass type: None when the reference path treats its instances as something else (a str, a
# Mapping, ... subclass), else (field names in declaration order, (name, JSON key text) sorted by name)
_DATACLASS_KEYS: dict[type, tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None] = {}
_NOT_PLAIN_DATACLASS = (Enum, str, int, float, np.bool_, np.integer, np.floating, np.ndarray, Mapping, list, tuple)
_encode_str = json.encoder.encode_basestring_ascii  # json.dumps's own string writer (ensure_ascii)


def _remember(key: tuple, text: str) -> None:
    if len(_FLOATS_TEXT) >= _FLOATS_TEXT_MAX:
        _FLOATS_TEXT.clear()
    _FLOATS_TEXT[key] = text


def _floats_text(values: tuple | list) -> str | None:
    """JSON text of a list / tuple of exact finite floats; None when it is not one."""
    if not values:
        return "[]"
    if set(map(type, values)) != _FLOAT_ONLY:
        return None
    is_tuple = type(values) is tuple  # hashable: memoised
    if is_tuple:
        text = _FLOATS_TEXT.get(values)
        if text is not None:
            return text
    plain = map(operator.add, values, repeat(0.0)) if 0.0 in values else values  # -0.0 + 0.0 is 0.0, x + 0.0 is x
    text = "[" + ",".join(map(float.__repr__, plain)) + "]"
    if "n" in text:  # "nan" / "inf": refused by the reference path, which names where
        return None
    if is_tuple:
        _remember(values, text)
    return text


def _rows_text(rows: tuple | list) -> str | None:
    """JSON text of a list / tuple of lists / tuples of exact finite floats; None when it is not one."""
    is_tuple = type(rows) is tuple and set(map(type, rows)) == _TUPLE_ONLY
    if is_tuple and set(map(type, chain.from_iterable(rows))) <= _FLOAT_ONLY:  # hashable, exact floats: memoised
        text = _FLOATS_TEXT.get(rows)
        if text is not None:
            return text
    else:
        is_tuple = False
    texts = list(map(_floats_text, rows))
    if None in texts:
        return None
    text = "[" + ",".join(texts) + "]"
    if is_tuple:
        _remember(rows, text)
    return text


def _dataclass_keys(kind: type) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None:
    """`_DATACLASS_KEYS[kind]`, computed on first use."""
    if kind not in _DATACLASS_KEYS:
        names = tuple(f.name for f in fields(kind))
        _DATACLASS_KEYS[kind] = None if issubclass(kind, _NOT_PLAIN_DATACLASS) else (
            names, tuple((name, _encode_str(name)) for name in sorted(names)))
    return _DATACLASS_KEYS[kind]


def _json_text(value: Any, path: str) -> str:
    """canonical JSON text of `value`, byte for byte `_reference_json`'s; faster on dataclasses, exact
    scalars, str-valued enums, tuples / lists of exact strings, of exact floats or of rows of exact
    floats. Anything else, and anything refused, goes
    the reference way, which also raises the reference's error for a non-finite number or an
    unsupported type, at the same place (fields are visited in declaration order, as there)."""
    kind = type(value)
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value + 0.0)
    elif kind is str:
        return _encode_str(value)
    elif kind is int:
        return int.__repr__(value)
    elif kind is bool:
        return "true" if value else "false"
    elif value is None:
        return "null"
    elif kind is tuple or kind is list:
        kinds = set(map(type, value))
        if kinds <= _FLOAT_ONLY:
            text = _floats_text(value)
            if text is not None:
                return text
        elif kinds <= _SEQUENCES:  # rows
            text = _rows_text(value)
            if text is not None:
                return text
        elif kinds == _STR_ONLY:
            return "[" + ",".join(map(_encode_str, value)) + "]"
    elif isinstance(value, Enum) and type(value.value) is str:
        return _encode_str(value.value)
    elif hasattr(value, "__dataclass_fields__") and not isinstance(value, type) and _dataclass_keys(kind):
        names, ordered = _dataclass_keys(kind)
        texts = {name: _json_text(getattr(value, name), f"{path}.{name}") for name in names}
        return "{" + ",".join(key + ":" + texts[name] for name, key in ordered) + "}"
    return _reference_json(value, path)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, floats as Python's shortest round-trip repr; NaN / inf rejected."""
    return _json_text(value, "")


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


def fast_json(value: Any) -> bytes:
    """Compact JSON bytes of `value` by orjson (~10x faster than canonical_json): the same values as
    canonical_json, not its bytes (dataclass field order, orjson's shortest float text), for what
    nobody hashes: solver protocol frames, the ledger's report columns.

    orjson writes NaN / inf as `null` without a word: `all_finite` refuses them first, and
    canonical_json raises its ContractError naming where. A value orjson cannot write (an int beyond
    64 bits, an unknown type) is written by canonical_json, or refused by it with a ContractError.
    """
    if not all_finite(value):
        canonical_json(value)  # raises, naming the path of the NaN / inf
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return canonical_json(value).encode()


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def tuple2(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Rows of numbers (a matrix read back from JSON) as the vocabulary's tuples of float tuples."""
    return tuple(tuple(float(x) for x in row) for row in rows)


def tuple1(values: Sequence[float]) -> tuple[float, ...]:
    """Numbers (a vector read back from JSON) as the vocabulary's tuple of floats."""
    return tuple(float(x) for x in values)
