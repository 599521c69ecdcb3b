"""Shared test fixtures: a valid binding document built in code."""

import copy

import pytest

import optimizer_pipeline  # noqa: F401  (before any test module loads numpy: the package's thread budget)


# The files whose tests take longest (servers, daemons, workers, CLI subprocesses; measured with
# `pytest --durations=0`), longest first. `make test` spreads files over two processes (pytest-xdist,
# `-n 2 --dist loadfile`), each file whole on one of them, in collection order
# (`--no-loadscope-reorder`); a long file that started last would run on alone at the end.
LONG_FILES_FIRST = ("test_several_hosts.py", "test_live_service.py", "test_postgres_restart.py", "test_layout.py",
                    "test_ui_browser.py", "test_opcua_live.py", "test_automation.py", "test_readme_walk.py",
                    "test_postgres_ledger.py", "test_definitions.py", "test_whatif_ledger.py", "test_whatif.py",
                    "test_reliability_scaling.py", "test_process_hygiene.py")


def pytest_collection_modifyitems(items):
    """The long files first, the others after them in their usual order (the sort is stable)."""
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


BINDING_DOC = {
    "id": "tanks-1",
    "unit": "quadruple tank, line 1",
    "sample_period_s": 5,
    "mvs": [{"tag": "v1", "lo": 0.0, "hi": 6.0, "max_move": 0.5},
            {"tag": "v2", "lo": 0.0, "hi": 6.0, "max_move": 0.5}],
    "cvs": [{"tag": "y1", "lo": 2.0, "hi": 10.0, "target": 7.0, "weight": 1.0},
            {"tag": "y2", "lo": 2.0, "hi": 10.0, "target": 7.5, "weight": 1.0}],
    "dvs": [],
    "model": {"na": 2, "nb": 2, "delay": 1, "horizon": 10},
    "profile": {"id": "tanks-track", "version": 1, "template": "linear_mpc_quadratic@1",
                "horizon": 40, "move_weight": 0.1, "valid_for_s": 3600},
}


@pytest.fixture(autouse=True)
def no_dagster_instance_current_from_another_test():
    """Each test starts with no "current" Dagster instance and cannot leave one to the next.

    Entering a DagsterInstance puts its definitions-state storage into a process-wide context
    variable, read whenever a repository is built (`Definitions.get_repository_def`); the storage
    holds the instance only by a weak reference. Should a test's instance context be closed out of
    order (a generator context manager finalised by the garbage collector during a later test), a
    later test would build its repository against a dead instance ("Attempted to resolve undefined
    DagsterInstance weakref": seen once in CI, and once in a two-process run here). A finaliser that
    runs during a later test is past this fixture's reach, so a test closes every Dagster context it
    opens: the one source found, unclosed `build_schedule_context` contexts in test_automation.py,
    is closed now. The product's own commands run in a process each and build their jobs inside the
    instance's scope (automation.run_partitions)."""
    from dagster._core.storage.defs_state.base import set_defs_state_storage  # checked on dagster 1.13.27

    with set_defs_state_storage(None):
        yield


@pytest.fixture
def binding_doc():
    """A fresh, valid binding document (the quadruple tank's, docs/binding-file.md) that a test may modify."""
    return copy.deepcopy(BINDING_DOC)


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL cluster for the session (tests/servers.py); each test takes its own
    database from it (`postgres.new_database()`)."""
    from servers import postgres_server

    with postgres_server() as server:
        yield server


BACKENDS = ("duckdb", "postgres")


@pytest.fixture(params=BACKENDS)
def any_ledger(request, tmp_path):
    """The same ledger test on both backends: the DuckDB file, and a fresh PostgreSQL database."""
    from optimizer_pipeline.ledger import Ledger

    if request.param == "duckdb":
        yield Ledger(tmp_path / "optimizer.duckdb")
        return
    from optimizer_pipeline.ledger.postgres_backend import PostgresBackend

    backend = PostgresBackend(request.getfixturevalue("postgres").new_database())
    try:
        yield Ledger(backend)
    finally:
        backend.close()


@pytest.fixture(params=BACKENDS)
def ledger_location(request, tmp_path) -> str:
    """Where a ledger shared by several processes lives: a DuckDB file path or a PostgreSQL URL."""
    if request.param == "duckdb":
        return str(tmp_path / "shared.duckdb")
    return request.getfixturevalue("postgres").new_database()
