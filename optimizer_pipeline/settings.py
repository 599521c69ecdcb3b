"""Home directory resolution and validated settings (environment > <home>/settings.yaml > defaults)."""

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from optimizer_pipeline.contracts import ContractError
from optimizer_pipeline.validation import (
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    Interval,
    Rule,
    bool_rule,
    check_choice,
    check_mapping,
    check_rule,
    choice_rule,
    number_rule,
    refuse,
)

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
    # a move plan's predicted end error widened by the band, at most this fraction of holding's
    # predicted error (recommend.improvement_conditions; bench/judge.py: the plans on the column with
    # saturating outputs scored 0.29-1.0, those of the linear-ish variants <= 0.21; BENCHMARKS.md, issue 15)
    uq_max_band_fraction: float = 0.25
    uq_alpha: float = 0.1
    uq_gate: str = "seed"  # seed | strict
    solver_pool_size: int = 2
    solver_request_timeout_ms: int = 10_000
    solver_threads: int = 1
    # problem structures each solver worker keeps factorised (a warm start; ~0.6 MB each for the demo's
    # tanks at horizon 50): the live service re-solves every binding, once or twice per sample, and a
    # structure not kept is built and solved cold (solver/pool.py)
    solver_cache_entries: int = 256
    schedule_cron: str = "0 3 * * *"
    schedule_timezone: str = "UTC"
    live_max_age_s: float | None = None  # unset: max(10 x sample_period_s, 300 s) per binding (recommend.max_live_age_s)
    # the live service reports a binding's publication to Dagster at most this often, a status change at
    # once; 0 reports every publication (optimizer_pipeline/live/service.py)
    live_report_interval_s: float = 300.0
    # a live publication with the status of the binding's open recommendation is summarised (its status,
    # reasons and advice kept in live_publications) unless that one is older than this (or than 0.9 x
    # the binding's valid_for_s): then it is written whole (optimizer_pipeline/ledger/live_rows.py)
    live_whole_every_s: float = 3600.0
    ledger_url: str | None = None  # postgresql://... ; unset: the DuckDB file <home>/optimizer.duckdb
    dagster_postgres_url: str | None = None  # the Dagster instance's storage; unset: SQLite under <home>/dagster
    dagster_run_launcher: str = "in_process"  # in_process | celery
    dagster_broker: str | None = None  # redis://... for the celery run launcher
    dagster_max_partitions_per_run: int = 25  # bindings per run of a refresh launched through the instance
    # an OPC UA reading whose StatusCode is Uncertain is a sample value (else missing, as a Bad one)
    opcua_accept_uncertain: bool = False
    # the live service writes verified advice to the bindings' advisory nodes (off: it only reads)
    opcua_write_advice: bool = False


# the five cron fields: (lowest, highest, names counted from the lowest); Sunday is 0 or 7
_CRON_FIELDS = ((0, 59, ()), (0, 23, ()), (1, 31, ()),
                (1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
                (0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")))
_CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _cron(text: Any) -> str:
    """A macro (`@daily`) or five fields (minute hour day month weekday) of `*`, `?`, values, names,
    ranges, `/n` steps, comma lists, `L` and `#n`, every value within its field: what Dagster's
    schedule accepts, refused here with the setting's name instead of by the schedule when Dagster
    loads the definitions."""
    if not isinstance(text, str):
        raise ValueError
    if text.strip().lower() in _CRON_MACROS:
        return text
    fields = text.split()
    if len(fields) != 5:
        raise ValueError
    for field, (lo, hi, names) in zip(fields, _CRON_FIELDS):
        for part in field.lower().split(","):
            span, _, step = part.partition("/")
            span, _, nth = span.partition("#")
            if (step and not (step.isdigit() and int(step) > 0)) or (nth and not (nth.isdigit() and 1 <= int(nth) <= 5)):
                raise ValueError
            for bound in span.split("-"):
                if not (bound in ("*", "?", "l") or bound in names or (bound.isdigit() and lo <= int(bound) <= hi)):
                    raise ValueError
    return text


def _postgres_url(text: Any) -> str:
    from urllib.parse import urlsplit

    if not isinstance(text, str) or urlsplit(text).scheme not in ("postgresql", "postgres") \
            or not urlsplit(text).hostname:
        raise ValueError
    return text


def _redis_url(text: Any) -> str:
    from urllib.parse import urlsplit

    if not isinstance(text, str) or urlsplit(text).scheme not in ("redis", "rediss") or not urlsplit(text).hostname:
        raise ValueError
    return text


def _timezone(text: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(str(text))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError from None
    return str(text)


# setting key (dotted, as in settings.yaml) -> (Settings field, what its value must be)
_SPEC: dict[str, tuple[str, Rule]] = {
    "uq.fresh_days": ("uq_fresh_days", number_rule(float, POSITIVE)),
    "uq.max_input_distance": ("uq_max_input_distance", number_rule(float, POSITIVE)),
    "uq.max_band_fraction": ("uq_max_band_fraction", number_rule(float, POSITIVE)),
    "uq.alpha": ("uq_alpha", number_rule(float, OPEN_UNIT)),
    "uq.gate": ("uq_gate", choice_rule(("seed", "strict"))),
    "solver.pool_size": ("solver_pool_size", number_rule(int, Interval(1, 4))),
    "solver.request_timeout_ms": ("solver_request_timeout_ms", number_rule(int, Interval(100, 600_000))),
    "solver.threads": ("solver_threads", number_rule(int, Interval(1, 16))),
    "solver.cache_entries": ("solver_cache_entries", number_rule(int, Interval(1, 100_000))),
    "schedule.cron": ("schedule_cron", Rule(_cron, "a 5-field cron expression (minute hour day month weekday)")),
    "schedule.timezone": ("schedule_timezone", Rule(_timezone, "an IANA time zone such as 'Europe/Berlin'")),
    "live.max_age_s": ("live_max_age_s", number_rule(float, POSITIVE)),
    "live.report_interval_s": ("live_report_interval_s", number_rule(float, NON_NEGATIVE)),
    "live.whole_every_s": ("live_whole_every_s", number_rule(float, NON_NEGATIVE)),
    "ledger.url": ("ledger_url", Rule(_postgres_url, "a URL such as 'postgresql://user@host:5432/optimizer'")),
    "dagster.postgres_url": ("dagster_postgres_url",
                             Rule(_postgres_url, "a URL such as 'postgresql://user@host:5432/dagster'")),
    "dagster.run_launcher": ("dagster_run_launcher", choice_rule(("in_process", "celery"))),
    "dagster.broker": ("dagster_broker", Rule(_redis_url, "a URL such as 'redis://host:6379/0'")),
    "dagster.max_partitions_per_run": ("dagster_max_partitions_per_run", number_rule(int, Interval(1, 1000))),
    "opcua.accept_uncertain": ("opcua_accept_uncertain", bool_rule()),
    "opcua.write_advice": ("opcua_write_advice", bool_rule()),
}


SECRET_KEYS = frozenset({"ledger.url", "dagster.postgres_url", "dagster.broker"})  # may hold a password


def env_name(key: str) -> str:
    """`uq.fresh_days` -> `OPTIMIZER_UQ_FRESH_DAYS`."""
    return "OPTIMIZER_" + key.replace(".", "_").upper()


def _parse(key: str, raw: Any, source: str) -> Any:
    rule = _SPEC[key][1]
    if key in SECRET_KEYS:  # refused without echoing a password
        try:
            return rule.read(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{source}: {key} must be {rule.text}, got {redact_url(str(raw))!r}") from None
    return check_rule(raw, rule, source, key, error=SettingsError)


def redact_url(url: str) -> str:
    """The URL with its password replaced by `***`: what messages, logs and metadata show."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if not password:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{password}@", ":***@", 1)))


def _flatten(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in doc.items():
        if not isinstance(body, Mapping):
            refuse(source, "a mapping of settings", body, name=f"section {section!r}", error=SettingsError)
        for name, value in body.items():
            key = f"{section}.{name}"
            check_choice(key, sorted(_SPEC), source, what="setting", error=SettingsError)
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
        check_mapping(doc, str(path), what="a mapping such as 'uq: {fresh_days: 7}'", error=SettingsError)
        for key, raw in _flatten(doc, str(path)).items():
            values[_SPEC[key][0]] = _parse(key, raw, str(path))
    for key in _SPEC:
        name = env_name(key)
        if name in environ:
            values[_SPEC[key][0]] = _parse(key, environ[name], f"environment variable {name}")
    settings = replace(Settings(), **values)
    if settings.dagster_run_launcher == "celery" and not (settings.dagster_broker and settings.dagster_postgres_url):
        sources = [str(path)] if path.exists() else []
        sources += [env_name(key) for key in ("dagster.run_launcher", "dagster.broker", "dagster.postgres_url")
                    if env_name(key) in environ]
        raise SettingsError(f"{' and '.join(sources)}: dagster.run_launcher 'celery' needs dagster.broker (a redis:// "
                            f"URL) and dagster.postgres_url (the Dagster instance the workers share)")
    return settings


FULL_DISK_TEXTS = ("no space left on device", "database or disk is full", "disk full")
IO_ERROR_TEXTS = ("disk i/o error", "i/o error")
NEARLY_FULL_BYTES = 1 << 20  # an I/O error with less than this free under the home is a full disk


def disk_full(exc: BaseException | None, home: Path) -> bool:
    """Whether `exc` (or what caused it) is a full filesystem: ENOSPC, DuckDB's WAL write failing with
    'No space left on device', SQLite's 'database or disk is full' (Dagster's instance), or an I/O
    error (SQLite's journal on a full disk) while the home's filesystem has (almost) no space left."""
    import errno
    import shutil

    seen, io_error = set(), False
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc).lower()
        if getattr(exc, "errno", None) == errno.ENOSPC or any(t in text for t in FULL_DISK_TEXTS):
            return True
        io_error = io_error or any(t in text for t in IO_ERROR_TEXTS)
        exc = exc.__cause__ or exc.__context__
    if not io_error:
        return False
    existing = next((p for p in (home, *home.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free < NEARLY_FULL_BYTES
