"""Home directory resolution and validated settings (environment > <home>/settings.yaml > defaults)."""

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from optimizer_pipeline.contracts import ContractError

HOME_ENV = "OPTIMIZER_HOME"
DEFAULT_HOME = ".optimizer"
SETTINGS_FILE = "settings.yaml"
LEDGER_FILE = "optimizer.duckdb"


class SettingsError(ContractError):
    """A setting is missing its form or range; the message names the setting and its source."""


def resolve_home(cli_home: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """`--home DIR` > `$OPTIMIZER_HOME` > `./.optimizer` (absolute, not created here)."""
    environ = os.environ if environ is None else environ
    chosen = cli_home or environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()


def ledger_path(home: Path) -> Path:
    return Path(home) / LEDGER_FILE


def dagster_home(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """`$DAGSTER_HOME` when set, else `<home>/dagster`."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("DAGSTER_HOME") or Path(home) / "dagster").resolve()


@dataclass(frozen=True)
class Settings:
    uq_fresh_days: float = 7.0
    uq_max_input_distance: float = 4.0
    uq_alpha: float = 0.1
    uq_gate: str = "seed"  # seed | strict
    solver_pool_size: int = 2
    solver_request_timeout_ms: int = 10_000
    solver_threads: int = 1
    schedule_cron: str = "0 3 * * *"
    schedule_timezone: str = "UTC"


# setting key (dotted, as in settings.yaml) -> (field, parser, check, expectation text)
def _float(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError
    value = float(text)
    if not math.isfinite(value):
        raise ValueError
    return value


def _int(text: Any) -> int:
    if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
        raise ValueError
    return int(str(text).strip()) if isinstance(text, str) else int(text)


def _cron(text: Any) -> str:
    if not isinstance(text, str) or len(text.split()) != 5:
        raise ValueError
    return text


def _timezone(text: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(str(text))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError from None
    return str(text)


_SPEC: dict[str, tuple[str, Any, Any, str]] = {
    "uq.fresh_days": ("uq_fresh_days", _float, lambda v: v > 0, "a number > 0"),
    "uq.max_input_distance": ("uq_max_input_distance", _float, lambda v: v > 0, "a number > 0"),
    "uq.alpha": ("uq_alpha", _float, lambda v: 0 < v < 1, "a number in (0, 1)"),
    "uq.gate": ("uq_gate", str, lambda v: v in ("seed", "strict"), "'seed' or 'strict'"),
    "solver.pool_size": ("solver_pool_size", _int, lambda v: 1 <= v <= 4, "an integer from 1 to 4"),
    "solver.request_timeout_ms": ("solver_request_timeout_ms", _int, lambda v: 100 <= v <= 600_000,
                                  "an integer from 100 to 600000"),
    "solver.threads": ("solver_threads", _int, lambda v: 1 <= v <= 16, "an integer from 1 to 16"),
    "schedule.cron": ("schedule_cron", _cron, lambda v: True, "a 5-field cron expression"),
    "schedule.timezone": ("schedule_timezone", _timezone, lambda v: True, "an IANA time zone such as 'Europe/Berlin'"),
}


def env_name(key: str) -> str:
    """`uq.fresh_days` -> `OPTIMIZER_UQ_FRESH_DAYS`."""
    return "OPTIMIZER_" + key.replace(".", "_").upper()


def _parse(key: str, raw: Any, source: str) -> Any:
    attr, parser, check, expected = _SPEC[key]
    try:
        value = parser(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{source}: {key} must be {expected}, got {raw!r}") from None
    if not check(value):
        raise SettingsError(f"{source}: {key} must be {expected}, got {raw!r}")
    return value


def _flatten(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in doc.items():
        if not isinstance(body, Mapping):
            raise SettingsError(f"{source}: section {section!r} must be a mapping of settings")
        for name, value in body.items():
            key = f"{section}.{name}"
            if key not in _SPEC:
                known = ", ".join(sorted(_SPEC))
                raise SettingsError(f"{source}: unknown setting {key!r} (known: {known})")
            flat[key] = value
    return flat


def load_settings(home: Path, environ: Mapping[str, str] | None = None) -> Settings:
    """Defaults, overridden by `<home>/settings.yaml`, overridden by `OPTIMIZER_*` environment variables."""
    import yaml

    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = Path(home) / SETTINGS_FILE
    if path.exists():
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(doc, Mapping):
            raise SettingsError(f"{path}: expected a mapping such as 'uq: {{fresh_days: 7}}'")
        for key, raw in _flatten(doc, str(path)).items():
            values[_SPEC[key][0]] = _parse(key, raw, str(path))
    for key in _SPEC:
        name = env_name(key)
        if name in environ:
            values[_SPEC[key][0]] = _parse(key, environ[name], f"environment variable {name}")
    return replace(Settings(), **values)
