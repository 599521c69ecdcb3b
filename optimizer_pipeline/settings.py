"""Home directory resolution and validated settings (environment > <home>/settings.yaml > defaults)."""

import os
import re
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
    check_keys,
    check_mapping,
    check_opc_endpoint,
    check_rule,
    choice_rule,
    endpoint_identity,
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


SECURITY_POLICIES = ("None", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss")
SECURITY_MODES = ("Sign", "SignAndEncrypt")


@dataclass(frozen=True)
class EndpointSecurity:
    """How the live service connects to one OPC UA endpoint (`opcua.endpoints` in settings.yaml): the
    security policy and, with one other than None, the message security mode, the client's certificate
    and private key and the one server certificate trusted (None: the one the server presents); the user
    name and the NAME of the environment variable holding its password, read when connecting and never
    kept here. Files are absolute paths, readable when the settings were loaded."""

    url: str
    security_policy: str = "None"  # one of SECURITY_POLICIES
    mode: str | None = None  # one of SECURITY_MODES; None with the policy None
    certificate: Path | None = None
    private_key: Path | None = None
    server_certificate: Path | None = None
    username: str | None = None
    password_env: str | None = None

    def setting(self, name: str) -> str:
        """The path of one of its settings, as messages name it: opcua.endpoints['opc.tcp://...'].mode."""
        return f"{ENDPOINTS_KEY}[{self.url!r}].{name}"


@dataclass(frozen=True)
class Settings:
    uq_fresh_days: float = 7.0
    uq_max_input_distance: float = 4.0
    # a move plan's predicted end error widened by the band, at most this fraction of holding's
    # predicted error (recommend.improvement_conditions; bench/judge.py: the plans on the column with
    # saturating outputs scored 0.29-1.0, those of the linear-ish variants <= 0.21; docs/benchmark-history.md, issue 15)
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
    # unset: max(10 x sample_period_s, 300 s) per binding (recommend.max_live_age_s)
    live_max_age_s: float | None = None
    # the live service reports a binding's publication to Dagster at most this often, a status change at
    # once; 0 reports every publication (optimizer_pipeline/live/service.py)
    live_report_interval_s: float = 300.0
    # a live publication with the status of the binding's open recommendation is summarised (its status,
    # reasons and advice kept in live_publications) unless that one is older than this (or than 0.9 x
    # the binding's valid_for_s): then it is written whole (optimizer_pipeline/ledger/live_rows.py)
    live_whole_every_s: float = 3600.0
    # the newest samples of a CV that may be missing (or refused as bad by their source) and replaced by the
    # model's prediction before a recommendation stops being verified (pipeline.live_run); cleaning holds a
    # run's end for at most data.clean.MAX_GAP_SAMPLES of them, and cuts a longer stretch as a gap
    live_predict_missing: int = 0
    ledger_url: str | None = None  # postgresql://... ; unset: the DuckDB file <home>/optimizer.duckdb
    dagster_postgres_url: str | None = None  # the Dagster instance's storage; unset: SQLite under <home>/dagster
    dagster_run_launcher: str = "in_process"  # in_process | celery
    dagster_broker: str | None = None  # redis://... for the celery run launcher
    dagster_max_partitions_per_run: int = 25  # bindings per run of a refresh launched through the instance
    # an OPC UA reading whose StatusCode is Uncertain is a sample value (else missing, as a Bad one)
    opcua_accept_uncertain: bool = False
    # the live service writes verified advice to the bindings' advisory nodes (off: it only reads)
    opcua_write_advice: bool = False
    # security and credentials per OPC UA endpoint, from settings.yaml only (EndpointSecurity)
    opcua_endpoints: tuple[EndpointSecurity, ...] = ()

    def opcua_security(self, url: str) -> EndpointSecurity:
        """The security of the endpoint `url` (a binding's opcua.endpoint) names: its entry in opcua.endpoints
        (the same host, port and path however spelt: opc.tcp://Plant/ is opc.tcp://plant:4840), else none and
        an anonymous session."""
        identity = endpoint_identity(url)
        return next((e for e in self.opcua_endpoints if endpoint_identity(e.url) == identity), EndpointSecurity(url))


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
            if (step and not (step.isdigit() and int(step) > 0)) or \
                    (nth and not (nth.isdigit() and 1 <= int(nth) <= 5)):
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
    "live.predict_missing": ("live_predict_missing", number_rule(int, Interval(0, 1000))),
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


ENDPOINTS_KEY = "opcua.endpoints"  # read from settings.yaml only: a mapping has no one-line environment form
_ENDPOINT_KEYS = ("security_policy", "mode", "certificate", "private_key", "server_certificate", "username",
                  "password_env")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _opcua_endpoints(raw: Any, source: str, home: Path) -> tuple[EndpointSecurity, ...]:
    """opcua.endpoints: endpoint URL -> its security settings, each URL an opc.tcp one without credentials
    and naming an endpoint no other key names."""
    if not isinstance(raw, Mapping):
        refuse(source, "a mapping of endpoint URL to its security settings", raw, name=ENDPOINTS_KEY,
               error=SettingsError)
    endpoints: list[EndpointSecurity] = []
    for url, body in raw.items():
        if isinstance(url, str) and "@" in url.partition("://")[2].partition("/")[0]:
            raise SettingsError(f"{source}: {ENDPOINTS_KEY} key {redact_url(url)!r}: a user name or password does "
                                "not belong in the URL (use username and password_env)")
        check_opc_endpoint(url, f"{source}: {ENDPOINTS_KEY} key", error=SettingsError)
        same = [e.url for e in endpoints if endpoint_identity(e.url) == endpoint_identity(url)]
        if same:
            raise SettingsError(f"{source}: {ENDPOINTS_KEY}[{url!r}] names the same endpoint as {same[0]!r}")
        endpoints.append(_endpoint_security(url, body, source, home))
    return tuple(endpoints)


def _endpoint_security(url: str, body: Any, source: str, home: Path) -> EndpointSecurity:
    """One endpoint's settings: a policy other than None needs mode, certificate and private_key, and
    only such a policy takes them and server_certificate; password_env needs username."""
    path = f"{ENDPOINTS_KEY}[{url!r}]"
    if not isinstance(body, Mapping):
        refuse(source, "a mapping of its security settings", body, name=path, error=SettingsError)
    if "password" in body:  # said without the value: it is the password
        raise SettingsError(f"{source}: {path}.password: a password does not belong in settings.yaml; name the "
                            "environment variable holding it in password_env")
    check_keys(body, _ENDPOINT_KEYS, f"{source}: {path}", error=SettingsError)
    given = {key: value for key, value in body.items() if value is not None}
    policy = check_rule(given.get("security_policy", "None"), choice_rule(SECURITY_POLICIES), source,
                        f"{path}.security_policy", error=SettingsError)
    secured = ("mode", "certificate", "private_key")
    for key in (*secured, "server_certificate"):
        if policy == "None" and key in given:
            raise SettingsError(f"{source}: {path}.{key} needs a security_policy other than 'None'")
        if policy != "None" and key in secured and key not in given:
            raise SettingsError(f"{source}: {path}.{key} is required with security_policy {policy!r}")
    mode = None if policy == "None" else check_rule(given["mode"], choice_rule(SECURITY_MODES), source,
                                                    f"{path}.mode", error=SettingsError)
    files = {key: _readable_file(given[key], source, f"{path}.{key}", home)
             for key in ("certificate", "private_key", "server_certificate") if key in given}
    username, password_env = given.get("username"), given.get("password_env")
    if username is not None and not (isinstance(username, str) and username.strip()):
        refuse(source, "a user name", username, name=f"{path}.username", error=SettingsError)
    if password_env is not None and username is None:
        raise SettingsError(f"{source}: {path}.password_env needs {path}.username (the user it is the password of)")
    if password_env is not None and not (isinstance(password_env, str) and _ENV_VAR.fullmatch(password_env)):
        raise SettingsError(f"{source}: {path}.password_env must be the name of an environment variable (letters, "
                            "digits and _, not starting with a digit); its value is not shown: it may be a password")
    return EndpointSecurity(url, policy, mode, **files, username=username, password_env=password_env)


def _readable_file(raw: Any, source: str, name: str, home: Path) -> Path:
    """A file path (relative: to the home folder) that can be opened for reading now, as an absolute path."""
    if not (isinstance(raw, str) and raw.strip()):
        refuse(source, "a file path", raw, name=name, error=SettingsError)
    path = (Path(home) / Path(raw).expanduser()).absolute()  # not resolved: a symlink swapped on renewal is followed
    try:
        path.open("rb").close()
    except OSError as exc:
        raise SettingsError(f"{source}: {name} cannot be read: {str(path)!r} ({exc.strerror})") from None
    return path


def _flatten(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in doc.items():
        if not isinstance(body, Mapping):
            refuse(source, "a mapping of settings", body, name=f"section {section!r}", error=SettingsError)
        for name, value in body.items():
            key = f"{section}.{name}"
            check_choice(key, sorted([*_SPEC, ENDPOINTS_KEY]), source, what="setting", error=SettingsError)
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
            if key == ENDPOINTS_KEY:
                values["opcua_endpoints"] = _opcua_endpoints(raw, str(path), Path(home))
            else:
                values[_SPEC[key][0]] = _parse(key, raw, str(path))
    if env_name(ENDPOINTS_KEY) in environ:  # refused rather than ignored: it would leave the file's in force
        raise SettingsError(f"environment variable {env_name(ENDPOINTS_KEY)}: {ENDPOINTS_KEY} is read from "
                            f"{path} only")
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
