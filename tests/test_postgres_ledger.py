"""The PostgreSQL ledger as a user configures it (`ledger.url`): the CLI and Dagster runs on it, no
DuckDB file anywhere, the password never shown, a bad URL refused with one line (issue 14)."""

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

from optimizer_pipeline.ledger.postgres_backend import PostgresBackend
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import redact_url

from servers import free_port

SECRET = "s3cret-pw"


def _with_password(url: str) -> str:
    """The server trusts loopback, so any password is accepted: the test only checks where it shows."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


def cli(home, *args, env_extra=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_redact_url_hides_only_the_password():
    assert redact_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.timeout(1560)  # five commands of up to 300 s each
def test_ingest_materialize_and_ledger_run_on_postgres_with_no_duckdb_file(postgres, tmp_path):
    url = _with_password(postgres.new_database())
    home = tmp_path / "home"
    plant = get_plant("heater")
    binding, history = tmp_path / "heater.yaml", tmp_path / "history.csv"
    binding.write_text(yaml.safe_dump(plant.binding_doc()))
    plant.history(1).frame.to_csv(history, index=False)
    env = {"OPTIMIZER_LEDGER_URL": url}

    outputs = []
    for args in (("ingest", str(binding), str(history)), ("materialize", "heater-1"),
                 ("recommendation", "heater-1", "--json"), ("ledger", "--binding", "heater-1"),
                 ("ledger", "--json")):
        proc = cli(home, *args, env_extra=env)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        outputs.append(proc.stdout + proc.stderr)
    assert json.loads(outputs[2])["status"] == "verified"
    assert all(SECRET not in text for text in outputs)
    assert "postgresql://postgres:***@" in outputs[3]  # the ledger command names where the ledger is
    assert not list(tmp_path.rglob("*.duckdb")) and not list(tmp_path.rglob("*.duckdb.wal"))
    ledger = PostgresBackend(url)
    try:
        with ledger.connection() as conn:
            _, rows = ledger.fetch(conn, "SELECT count(*) FROM optimizer_recommendations WHERE binding_id = ?",
                                   ["heater-1"])
        assert rows[0][0] == 1
    finally:
        ledger.close()


def test_an_unreachable_ledger_url_is_one_error_line_without_the_password(tmp_path):
    home = tmp_path / "home"
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/nowhere"
    proc = cli(home, "ledger", env_extra={"OPTIMIZER_LEDGER_URL": url}, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ledger postgresql://postgres:***@127.0.0.1:")
    assert "cannot be reached" in lines[0] and SECRET not in proc.stderr and "Traceback" not in proc.stderr
    assert not home.exists() or not list(home.rglob("*.duckdb"))


def test_a_malformed_ledger_url_is_refused_naming_the_setting_without_the_password(tmp_path):
    proc = cli(tmp_path / "home", "ledger", env_extra={"OPTIMIZER_LEDGER_URL": f"mysql://root:{SECRET}@db/x"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "OPTIMIZER_LEDGER_URL" in lines[0] and "ledger.url must be" in lines[0]
    assert SECRET not in proc.stderr and "mysql://root:***@db/x" in lines[0]


def test_an_unreachable_broker_is_one_error_line_and_nothing_is_submitted(postgres, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    (home / "settings.yaml").write_text(yaml.safe_dump({
        "ledger": {"url": postgres.new_database()},
        "dagster": {"postgres_url": postgres.new_database(), "run_launcher": "celery",
                    "broker": f"redis://:{SECRET}@127.0.0.1:{port}/0"}}))
    for args in (("worker", "--name", "w"), ("materialize", "--all")):
        proc = cli(home, *args, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: broker redis://:***@127.0.0.1:{port}/0 cannot be "
                                                      f"reached"), proc.stderr
        assert SECRET not in proc.stderr
    assert not (home / "dagster").exists() or not list((home / "dagster").rglob("*.db"))



def test_a_pool_with_every_connection_in_use_says_so_not_that_the_server_is_down(postgres):
    """The pool's timeout has two causes a user must tell apart: here the server is up and the one
    connection is held, so the refusal names the pool, not reachability (the server down: the
    restart tests in tests/test_postgres_restart.py)."""
    from optimizer_pipeline.ledger import LedgerBusyError

    backend = PostgresBackend(postgres.new_database(), pool_max=1, connect_timeout_s=1.0)
    try:
        with backend.session():
            outcome = []
            worker = threading.Thread(target=lambda: outcome.append(_take_or_error(backend)))
            worker.start()
            worker.join(30)
        with pytest.raises(LedgerBusyError, match=r": all 1 connections in use for 1 s$"):
            raise outcome[0]
    finally:
        backend.close()


def _take_or_error(backend: PostgresBackend) -> BaseException:
    try:
        with backend.session():
            return AssertionError("a second connection was handed out from a pool of one")
    except BaseException as exc:  # noqa: BLE001 - handed back to the test's thread
        return exc
