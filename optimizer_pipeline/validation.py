"""Field checks of user-supplied input and their one-line messages: what is checked at the boundary, once.

Every refusal names the input, what was expected and what came, in one of two shapes: a field of
a document by its path, or an argument / setting by its name after the place it came from:

    binding.mvs[0].hi: expected a number, got 'six'
    binding.mvs[0].max_move: must be > 0, got 0
    settings.yaml: solver.pool_size must be an integer from 1 to 4, got 9
    block scores: block length h must be >= 1, got 0

A value of the wrong form is told the whole expectation ("expected a number > 0"); a value of the
right form but out of bounds is told the bound ("must be > 0"). Refusals are ContractError, or the
caller's subclass of it (`error=`: ProblemError, SettingsError, UQInputError, ...). In the manner of
scikit-learn's utils/validation.py: callers check what comes in here and trust it afterwards. No
imports from the rest of the package: the contracts use this module, not the other way round.
Refusals are raised `from None`: the message is the whole story (the parse error a check caught on
the way is not the user's business).
"""

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, NoReturn, Sequence

import numpy as np

SHOWN_MAX = 80  # characters of a refused value shown in a message (one line to a user)


class ContractError(ValueError):
    """A user-supplied document (binding file, frame, setting) breaks a contract.

    The message names the source and the field; it is meant to be shown as one line to a user.
    Defined here with the checks that raise it; optimizer_pipeline.contracts re-exports it.
    """


# --------------------------------------------------------------------------- bounds and messages


@dataclass(frozen=True)
class Interval:
    """Bounds of a number: `low` / `high` (None: unbounded); `closed` says which ends belong to it
    ("both", "left", "right" or "neither"). `x in interval` is the test, `str(interval)` its text."""

    low: float | None = None
    high: float | None = None
    closed: str = "both"

    def __contains__(self, x: Any) -> bool:
        left = self.low is None or (x >= self.low if self.closed in ("both", "left") else x > self.low)
        return left and (self.high is None or (x <= self.high if self.closed in ("both", "right") else x < self.high))

    def __str__(self) -> str:
        low_in, high_in = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.high is None:
            return f"{'>=' if low_in else '>'} {_number_text(self.low)}"
        if self.low is None:
            return f"{'<=' if high_in else '<'} {_number_text(self.high)}"
        if low_in and high_in:
            return f"from {_number_text(self.low)} to {_number_text(self.high)}"
        low, high = _number_text(self.low), _number_text(self.high)
        return f"in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"


POSITIVE = Interval(0, closed="neither")
NON_NEGATIVE = Interval(0)
AT_LEAST_ONE = Interval(1)
OPEN_UNIT = Interval(0, 1, closed="neither")


def _number_text(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _shown(value: Any) -> str:
    text = repr(float(value)) if isinstance(value, np.floating) else repr(value)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX - 3] + "..."


def expectation(noun: str, interval: Interval | None) -> str:
    """What a number must be: "a number", "an integer >= 1", "a number in (0, 1)"."""
    return noun if interval is None else f"{noun} {interval}"


def refuse(where: str, expected: str, value: Any, *, name: str = "", got: str | None = None,
           error: type[ContractError] = ContractError) -> NoReturn:
    """Raise `error`: "<where>: expected <expected>, got <value>", or with a `name`
    "<where>: <name> must be <expected>, got <value>". `got` replaces the value's repr (a shape, a length)."""
    clause = f"{name} must be {expected}" if name else f"expected {expected}"
    raise error(f"{where}: {clause}, got {_shown(value) if got is None else got}") from None


def refuse_bound(where: str, bound: Interval, value: Any, *, name: str = "",
                 error: type[ContractError] = ContractError) -> NoReturn:
    """Raise `error`: "<where>: [<name> ]must be <bound>, got <value>" (a value of the right form)."""
    raise error(f"{where}: {name + ' ' if name else ''}must be {bound}, got {_shown(value)}") from None


def refuse_missing(where: str, key: str, *, error: type[ContractError] = ContractError) -> NoReturn:
    """Raise `error`: "<where>.<key>: required field is missing"."""
    raise error(f"{where}.{key}: required field is missing") from None


def unknown(value: Any, known: Collection[Any], where: str, *, what: str,
            error: type[ContractError] = ContractError) -> NoReturn:
    """Raise `error`: "<where>: unknown <what> <value>; did you mean 'b'? (known: a, b)" (the hint
    when a known name is close, `did_you_mean`)."""
    raise error(f"{where}: unknown {what} {_shown(value)}{did_you_mean(value, known)} "
                f"(known: {', '.join(map(str, known))})") from None


def closest(name: Any, known: Collection[Any], cutoff: float = 0.6) -> str | None:
    """The known name `name` was most likely meant to be: one that differs only in case, else the
    closest by difflib's similarity ratio (>= `cutoff`, by default difflib's 0.6: `targte` -> `target`,
    `dv` -> `dvs`); None for a name that is not text or is close to nothing."""
    if not isinstance(name, str):
        return None
    names = [k for k in known if isinstance(k, str)]
    same_but_case = [k for k in names if k.lower() == name.lower()]
    if same_but_case:
        return same_but_case[0]
    close = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
    return close[0] if close else None


def nearest(name: str, known: Collection[str], n: int = 3) -> list[str]:
    """The `n` known names most like `name` (difflib's similarity ratio, best first), however far."""
    return difflib.get_close_matches(name, list(known), n=n, cutoff=0.0)


def did_you_mean(name: Any, known: Collection[Any], cutoff: float = 0.6) -> str:
    """"; did you mean 'target'?" for the `closest` known name, "" when none is close."""
    match = closest(name, known, cutoff)
    return "" if match is None else f"; did you mean {match!r}?"


# --------------------------------------------------------------------------- fields of a document


_REQUIRED = object()


def get_field(doc: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED, *,
              error: type[ContractError] = ContractError) -> Any:
    """doc[key]; `default` when it is absent or null, refused as missing when there is no default."""
    value = doc.get(key)
    if value is None:
        if default is _REQUIRED:
            refuse_missing(where, key, error=error)
        return default
    return value


def check_keys(doc: Mapping[Any, Any], known: Collection[str], where: str, *, required: Collection[str] = (),
               error: type[ContractError] = ContractError) -> None:
    """Refuse the first key of `doc` that is not in `known`, naming its path and the closest known
    key: "<where>.targte: unknown key; did you mean 'target'?", with " (required, missing)" when
    that key is a required one the document lacks, or the known keys when none is close. A key
    dropped silently would leave its default in force (a CV's target misspelt: a plan that ignores it)."""
    for key in doc:
        if key in known:
            continue
        match = closest(key, known)
        if match is None:
            raise error(f"{where}.{key}: unknown key (known: {', '.join(known)})") from None
        missing = " (required, missing)" if match in required and doc.get(match) is None else ""
        raise error(f"{where}.{key}: unknown key; did you mean {match!r}{missing}?") from None


def check_mapping(value: Any, where: str, *, what: str = "a mapping",
                  error: type[ContractError] = ContractError) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        refuse(where, what, value, error=error)
    return value


def check_list(value: Any, where: str, *, error: type[ContractError] = ContractError) -> list:
    if not isinstance(value, list):
        refuse(where, "a list", value, error=error)
    return value


def check_text(value: Any, where: str, *, what: str = "text", empty: bool = True,
               error: type[ContractError] = ContractError) -> str:
    """A str; with empty=False one with something besides blanks."""
    if not isinstance(value, str) or not (empty or value.strip()):
        refuse(where, what, value, error=error)
    return value


def check_match(value: Any, pattern: Any, where: str, *, error: type[ContractError] = ContractError) -> str:
    """A str that `pattern` (a compiled regular expression) matches in full."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise error(f"{where}: {_shown(value)} does not match {pattern.pattern}") from None
    return value


def check_choice(value: Any, known: Collection[Any], where: str, *, what: str,
                 error: type[ContractError] = ContractError) -> Any:
    if value not in known:
        unknown(value, known, where, what=what, error=error)
    return value


def check_number(value: Any, where: str, interval: Interval | None = None, *, name: str = "",
                 error: type[ContractError] = ContractError) -> float:
    """A finite int or float (not a bool) within `interval`, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        refuse(where, expectation("a number", interval), value, name=name, error=error)
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        number = math.inf
    if not math.isfinite(number):
        refuse(where, expectation("a finite number", interval), value, name=name, error=error)
    if interval is not None and number not in interval:
        refuse_bound(where, interval, value, name=name, error=error)
    return number


def check_integer(value: Any, where: str, interval: Interval | None = None, *, name: str = "",
                  error: type[ContractError] = ContractError) -> int:
    """An int (not a bool) within `interval`."""
    if isinstance(value, bool) or not isinstance(value, int):
        refuse(where, expectation("an integer", interval), value, name=name, error=error)
    if interval is not None and value not in interval:
        refuse_bound(where, interval, value, name=name, error=error)
    return int(value)


def check_ordered(lo: Any, hi: Any, where: str, *, names: tuple[str, str] = ("lo", "hi"), strict: bool = False,
                  error: type[ContractError] = ContractError) -> None:
    """lo < hi (strict) or lo <= hi, element by element for vectors: refused naming the first pair."""
    low, high = np.atleast_1d(np.asarray(lo, float)), np.atleast_1d(np.asarray(hi, float))
    wrong = low >= high if strict else low > high
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        at = f"[{i}]" if np.ndim(lo) else ""
        raise error(f"{where}: {names[0]}{at} ({low[i]:g}) must be {'<' if strict else '<='} "
                    f"{names[1]}{at} ({high[i]:g})") from None


def check_vector(value: Any, where: str, length: int | None = None, interval: Interval | None = None, *,
                 name: str = "", error: type[ContractError] = ContractError) -> np.ndarray:
    """A 1-D vector of finite numbers (of `length`, each within `interval`), as a float array; an
    element is named `where[i]`."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        refuse(where, "a vector of numbers", value, error=error)
    if array.ndim != 1:
        refuse(where, "a 1-D vector", value, got=f"shape {array.shape}", error=error)
    if length is not None and array.shape[0] != length:
        refuse(where, f"length {length}", value, got=str(array.shape[0]), error=error)
    finite = np.isfinite(array)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        refuse(f"{where}[{i}]", "a finite number", array[i], error=error)
    if interval is not None:
        inside = np.fromiter((x in interval for x in array.tolist()), bool, array.shape[0])
        if not inside.all():
            i = int(np.flatnonzero(~inside)[0])
            refuse_bound(f"{where}[{i}]", interval, array[i], name=name, error=error)
    return array


def check_matrix(rows: Any, where: str, n_rows: int, n_cols: int, *,
                 error: type[ContractError] = ContractError) -> None:
    """Rows (a sequence of vectors) forming a finite (n_rows, n_cols) matrix; row i is named `where[i]`."""
    if not isinstance(rows, (list, tuple, np.ndarray)):
        refuse(where, "rows of numbers", rows, error=error)
    if len(rows) != n_rows:
        refuse(where, f"{n_rows} rows", rows, got=str(len(rows)), error=error)
    for i, row in enumerate(rows):
        check_vector(row, f"{where}[{i}]", n_cols, error=error)


# --------------------------------------------------------------------------- OPC UA addresses


# OPC UA's binary transport: opc.tcp://host[:port][/path], the host a name, an IPv4 address or a
# bracketed IPv6 one
OPC_TCP_URL = re.compile(r"opc\.tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?)"
                         r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/\S*)?")
OPC_TCP_PORT = 4840  # OPC UA's registered port: what a URL without one means
# A node id in OPC UA's string form (Part 6, "NodeId"): an optional namespace index, then a numeric,
# string (no control characters), GUID or base64 ByteString identifier
NODE_ID = re.compile(r"(?:ns=(?P<ns>[0-9]{1,5});)?(?:i=(?P<i>[0-9]{1,10})|s=(?P<s>[^\x00-\x1f\x7f]+)"
                     r"|g=(?P<g>[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12})"
                     r"|b=(?P<b>(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)))")
UINT16_MAX, UINT32_MAX = 2**16 - 1, 2**32 - 1  # a port or namespace index, a numeric identifier


def check_opc_endpoint(value: Any, where: str, *, error: type[ContractError] = ContractError) -> str:
    """An opc.tcp://host[:port][/path] URL, its port from 1 to 65535. One with a user name or password
    is refused without showing it: credentials belong in the host's settings, never in a document
    that is stored and shown."""
    authority = value.partition("://")[2].partition("/")[0] if isinstance(value, str) else ""
    if "@" in authority:
        raise error(f"{where}: a user name or password does not belong here (credentials go in the host's "
                    "settings)") from None
    match = OPC_TCP_URL.fullmatch(value) if isinstance(value, str) else None
    if match is None or (match["port"] is not None and not 1 <= int(match["port"]) <= UINT16_MAX):
        refuse(where, "an opc.tcp://host[:port][/path] URL (port 1 to 65535)", value, error=error)
    return value


def endpoint_identity(url: str) -> tuple[str, int, str]:
    """Which endpoint `url`, an opc.tcp URL `check_opc_endpoint` accepts, names: (host in lower case, port,
    path without trailing slashes), so that opc.tcp://Plant/ua/ and opc.tcp://plant:4840/ua are one."""
    match = OPC_TCP_URL.fullmatch(url)
    return match["host"].lower(), int(match["port"] or OPC_TCP_PORT), (match["path"] or "").rstrip("/")


def node_identity(value: Any, where: str, *, error: type[ContractError] = ContractError) -> tuple[int, str, str]:
    """Which node `value`, an OPC UA node id in string form (optional `ns=<0..65535>;`, then
    `i=<0..4294967295>`, `s=<text>`, `g=<GUID>` or `b=<base64>`), names: (namespace index, kind,
    identifier), a number and a GUID normalised so that two spellings of one node ("i=5", "ns=0;i=05")
    are the same. Refused when it is not a node id."""
    match = NODE_ID.fullmatch(value) if isinstance(value, str) else None
    if (match is None or int(match["ns"] or 0) > UINT16_MAX
            or (match["i"] is not None and int(match["i"]) > UINT32_MAX)):
        refuse(where, "an OPC UA node id: optional ns=<0..65535>; then i=<0..4294967295>, s=<text>, g=<GUID> "
                      "or b=<base64>", value, error=error)
    kind = next(k for k in ("i", "s", "g", "b") if match[k] is not None)
    identifier = match[kind]
    if kind == "i":
        identifier = str(int(identifier))
    elif kind == "g":
        identifier = identifier.lower()
    return int(match["ns"] or 0), kind, identifier


# --------------------------------------------------------------------------- values written as text


@dataclass(frozen=True)
class Rule:
    """What a value written as text (an environment variable, a settings file entry) must be: `read`
    turns the raw value into the value or raises ValueError / TypeError; `text` is the expectation."""

    read: Callable[[Any], Any]
    text: str


def read_number(raw: Any, kind: type = float) -> float | int:
    """`raw` (a number, or text such as " 3 " or "2.5") as a finite number of `kind` (float or int);
    ValueError otherwise (a bool, NaN / inf, a fraction for an int, other text)."""
    if isinstance(raw, bool):
        raise ValueError(raw)
    try:
        if kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw.strip()) if isinstance(raw, str) else int(raw)
        value = float(raw)
    except OverflowError:
        raise ValueError(raw) from None
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def number_rule(kind: type = float, interval: Interval | None = None) -> Rule:
    """A number of `kind` (float or int) within `interval`, as text or as a number."""
    def read(raw: Any) -> float | int:
        value = read_number(raw, kind)
        if interval is not None and value not in interval:
            raise ValueError(raw)
        return value

    return Rule(read, expectation("an integer" if kind is int else "a number", interval))


def bool_rule() -> Rule:
    """true or false: a YAML boolean, or as text (an environment variable) true / false / 1 / 0 / yes / no."""
    def read(raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        text = raw.strip().lower() if isinstance(raw, str) else None
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ValueError(raw)

    return Rule(read, "true or false")


def choice_rule(choices: Sequence[str]) -> Rule:
    """One of `choices`, spelt exactly."""
    def read(raw: Any) -> str:
        if not isinstance(raw, str) or raw not in choices:
            raise ValueError(raw)
        return raw

    quoted = [repr(c) for c in choices]
    return Rule(read, quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}")


def check_rule(raw: Any, rule: Rule, where: str, name: str, *, error: type[ContractError] = ContractError) -> Any:
    """rule.read(raw), or `error` "<where>: <name> must be <rule.text>, got <raw>"."""
    try:
        return rule.read(raw)
    except (TypeError, ValueError):
        refuse(where, rule.text, raw, name=name, error=error)
