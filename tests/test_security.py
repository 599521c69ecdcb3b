"""Security (issue 9): parent secrets stay out of solver workers; binding ids and tag names cannot
inject SQL or reach outside the home folder; every ledger statement passes values as parameters;
the UI listens on loopback unless told otherwise. (Bad-input refusals: test_bad_input_corpus.py.)
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

from optimizer_pipeline import THREAD_VARS
from optimizer_pipeline import ledger as ledger_package
from optimizer_pipeline.cli import build_parser, main
from optimizer_pipeline.contracts import ContractError, binding_from_dict
from optimizer_pipeline.ledger import Ledger, NotFoundError
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path
from optimizer_pipeline.solver.pool import SolverPool
from optimizer_pipeline.solver.process import CACHE_ENTRIES_VAR, ENV_PASS_THROUGH, ENV_WHITELIST

from conftest import BINDING_DOC
from ledger_helpers import solve
from reliability_helpers import heater_case, pool_solve

PLANT = get_plant("heater")
# heater tag -> a name built to break string-built SQL, identifiers and shell / path handling
HOSTILE_TAGS = {"q_heat": "q'); DROP TABLE plant_samples; --",
                "t_out": 'y1"; DELETE FROM bindings WHERE \'1\'=\'1',
                "t_in": "../../t_in`) OR 1=1 /* ; \\ %s {0}"}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_worker_environment_holds_only_the_whitelist_whatever_secrets_the_parent_has(monkeypatch):
    secrets = {"AWS_SECRET_ACCESS_KEY": "a", "GITHUB_TOKEN": "b", "DATABASE_URL": "postgres://u:p@h/d",
               "DAGSTER_CLOUD_API_TOKEN": "c", "OPTIMIZER_SECRET": "d", "PYTHONSTARTUP": "/tmp/evil.py"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    with SolverPool(size=1) as pool:
        env = _environ(pool.stats()["pids"][0])
    allowed = set(ENV_WHITELIST) | set(ENV_PASS_THROUGH) | set(THREAD_VARS) | {CACHE_ENTRIES_VAR, "PYTHONHASHSEED"}
    assert set(env) <= allowed, set(env) - allowed
    assert not set(secrets.values()) & set(env.values())


# ---------------------------------------------------------------------------- hostile tags and ids


def _hostile_binding_and_history(folder: Path):
    doc = PLANT.binding_doc()
    for group in ("mvs", "cvs", "dvs"):
        for item in doc[group]:
            item["tag"] = HOSTILE_TAGS[item["tag"]]
    frame = PLANT.history(1).frame.rename(columns=HOSTILE_TAGS)
    (folder / "binding.yaml").write_text(yaml.safe_dump(doc))
    frame.to_csv(folder / "history.csv", index=False)
    return doc, frame


def _tables(ledger: Ledger) -> list[str]:
    return sorted(ledger.query("SELECT table_name FROM duckdb_tables()")["table_name"])


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A home where the heater binding was ingested through the CLI with hostile tag names."""
    root = tmp_path_factory.mktemp("root")
    home, files = root / "home", root / "files"
    files.mkdir()
    doc, frame = _hostile_binding_and_history(files)
    outside = _files(root)  # the home folder does not exist yet
    assert main(["--home", str(home), "ingest", str(files / "binding.yaml"), str(files / "history.csv"),
                 "--source", "simulation"]) == 0
    return root, home, doc, frame, outside


def test_hostile_tag_names_round_trip_through_ingest_and_history_with_every_table_intact(hostile, tmp_path):
    _, home, doc, frame, _ = hostile
    ledger = Ledger(ledger_path(home))
    assert _tables(ledger) == _tables(Ledger(tmp_path / "fresh.duckdb"))
    spec = ledger.get_binding(doc["id"]).spec
    assert list(spec.tags) == [HOSTILE_TAGS[t] for t in ("q_heat", "t_out", "t_in")]
    stored = ledger.history_frame(spec.id, spec.tags)
    assert list(stored.columns) == ["run_id", "timestamp", *spec.tags]
    expected = frame.sort_values(["run_id", "timestamp"], kind="stable").reset_index(drop=True)
    for column in spec.tags:
        assert stored[column].to_numpy() == pytest.approx(expected[column].to_numpy(), nan_ok=True)
    assert ledger.counts()["plant_samples"] == int(frame[list(spec.tags)].notna().sum().sum())


def test_hostile_tag_names_flow_through_a_recommendation_and_write_only_inside_home(hostile, tmp_path):
    root, home, doc, _, outside = hostile
    case = heater_case(Ledger(ledger_path(home)), doc=doc, ingest=False)
    with SolverPool(size=1) as pool:
        record = case.recommend(pool_solve(pool))
    row = case.ledger.latest_recommendation(doc["id"])
    assert row.id == record.recommendation.id and row.status == "verified", row.reasons
    assert (tuple(row.payload["mv_tags"]), tuple(row.payload["cv_tags"])) == (
        (HOSTILE_TAGS["q_heat"],), (HOSTILE_TAGS["t_out"],))
    assert _tables(case.ledger) == _tables(Ledger(tmp_path / "fresh.duckdb"))
    assert case.ledger.counts()["bindings"] == 1
    assert _files(root) - _files(home) == outside  # nothing written beside the home folder


@pytest.mark.parametrize("binding_id", ["..", "../outside", "a/b", "a\\b", "/etc", "~root", ".hidden", "a\0b",
                                        "a b", "héater", "a;drop", "a'b", "A", "-a", ""])
def test_path_like_or_sql_like_binding_ids_are_refused(binding_id):
    with pytest.raises(ContractError, match="does not match"):
        binding_from_dict({**PLANT.binding_doc(), "id": binding_id})


def test_ledger_lookups_with_sql_in_the_value_match_nothing(tmp_path):
    ledger = Ledger(tmp_path / "optimizer.duckdb")
    solve(ledger, binding_id="tanks-1")
    for value in ("x' OR '1'='1", "tanks-1' --", "%", "tanks-1'; DELETE FROM optimizer_runs; --"):
        assert ledger.latest_recommendation(value) is None and ledger.list_runs(value) == []
        assert ledger.expire(binding_id=value, reason="injection attempt") == 0
        with pytest.raises(NotFoundError):
            ledger.get_binding(value)
    assert [r.status for r in ledger.list_recommendations("tanks-1")] == ["verified"]
    assert ledger.counts()["optimizer_runs"] == 1


# ---------------------------------------------------------------------------- SQL built only from constants

# Calls that take SQL text, and the position of that text among their arguments: DuckDB's own
# execute, Ledger.query, and the backend / repository helpers every statement goes through.
SQL_ARG = {"execute": 0, "executemany": 0, "query": 0, "fetch": 1, "fetch_frame": 1, "changed": 1, "_read": 1,
           "_one": 1}
# Functions that pass their caller's SQL text on unchanged (parameter `sql`); every call of them is checked too.
PASS_THROUGH = {"query", "fetch", "fetch_frame", "changed", "_read", "_one", "execute"}
# Functions that rewrite SQL text without letting a value in: static in, static out.
TRANSLATORS = {
    "_pg": "postgres_backend: the repository's ? placeholders as psycopg's %s (and % escaped)",
    "statement_for": "schema: a migration statement (a module constant) in the backend's dialect",
}
# Names an f-string may splice into SQL, each an identifier or a fragment built from literals (the
# call sites are checked by test_identifiers_spliced_into_sql_come_from_literals_at_every_call_site):
IDENTIFIERS = {
    "table": "_select / insert_table: every call site passes a string literal",
    "order": "_select: every call site passes a string literal",
    "t": "counts(): iterates a literal list of table names",
    "where": "_expire: every call site passes a literal or ' AND '.join of literal-column clauses",
    "placeholders": "_expire: ', '.join of a literal '?' per open status (a module constant)",
    "column": "list_candidates / expire: loop over a literal tuple of (column, value) pairs",
    "alias": "duckdb_backend: 'ledger_' + a hex digest of the ledger file's path (test_the_attached_ledger_...)",
    "path": "duckdb_backend: the ledger file's own path as an SQL string literal, quotes doubled (ATTACH takes "
            "no parameters; test_the_attached_ledger_...)",
}
LEDGER_SOURCES = sorted(Path(ledger_package.__file__).parent.glob("*.py"))
REPOSITORY = Path(ledger_package.__file__).parent / "repository.py"


PACKAGE = Path(ledger_package.__file__).parents[1]
# Sources whose `.query(` calls reach Ledger.query (a pass-through of its `sql` parameter).
QUERY_CALLERS = sorted({*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "assets").glob("*.py"),
                        *(PACKAGE.parent / "resources").glob("*.py")})


def _loop_iters(scope: ast.AST, name: str) -> list[ast.AST]:
    """The iterables of the `for` loops in `scope` that bind `name` (alone or in a tuple target)."""
    out = []
    for loop in (n for n in ast.walk(scope) if isinstance(n, ast.For)):
        targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            out.append(loop.iter)
    return out


def _from_constant(node: ast.AST, scope: ast.AST) -> bool:
    """An iterable rooted at a module constant (e.g. the schema's MIGRATIONS and their statements)."""
    if not isinstance(node, ast.Name):
        return False
    if node.id.isupper():
        return True
    iters = _loop_iters(scope, node.id)
    return bool(iters) and all(_from_constant(i, scope) for i in iters)


def _assigned(scope: ast.AST, name: str) -> list[ast.AST]:
    """The values assigned to `name` in `scope` (`x = ...`, `x += ...`, `x, y = a, b`)."""
    out = []
    for node in ast.walk(scope):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            out.append(node.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    out.append(node.value)
                elif isinstance(target, ast.Tuple):
                    for i, element in enumerate(target.elts):
                        if isinstance(element, ast.Name) and element.id == name:
                            paired = isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(target.elts)
                            out.append(node.value.elts[i] if paired else node.value)  # unpaired: not static
    return out


def _static(node: ast.AST, scope: ast.FunctionDef) -> bool:
    """SQL text whose every piece is a literal, an allowed identifier, or a local built from those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):  # an allowed identifier, or a local built from literals only
        return all(isinstance(v, ast.Constant) or (isinstance(v.value, ast.Name) and (
            v.value.id in IDENTIFIERS or _static(v.value, scope))) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _static(node.left, scope) and _static(node.right, scope)
    if isinstance(node, ast.IfExp):
        return _static(node.body, scope) and _static(node.orelse, scope)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TRANSLATORS and node.args:
        return _static(node.args[0], scope)
    if isinstance(node, ast.Name):
        if scope.name in PASS_THROUGH and node.id == "sql":
            return True  # passes its caller's text on; every call of it is checked too
        sources = _assigned(scope, node.id)
        iters = _loop_iters(scope, node.id)
        return bool(sources or iters) and all(_static(s, scope) for s in sources) \
            and all(_from_constant(i, scope) for i in iters)
    return False


def _sql_calls():
    for path in sorted(set(LEDGER_SOURCES) | set(QUERY_CALLERS)):
        methods = SQL_ARG if path in LEDGER_SOURCES else {"query": 0}
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for call in ast.walk(function):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and call.func.attr in methods and len(call.args) > methods[call.func.attr]:
                    yield path, function, call, call.args[methods[call.func.attr]]


def test_every_ledger_statement_passes_values_as_parameters():
    calls = list(_sql_calls())
    assert len(calls) > 40  # the walk found the ledger's statements
    loose = [f"{path.name}:{call.lineno} in {function.name}" for path, function, call, sql in calls
             if not _static(sql, function)]
    assert loose == [], f"SQL text built from values (pass them as ? parameters): {loose}"


def _literal_pairs_loop(function: ast.FunctionDef) -> None:
    """Every `for column, value in ((literal, ...), ...)` loop of `function` names literal columns."""
    loops = [n for n in ast.walk(function) if isinstance(n, ast.For) and isinstance(n.target, ast.Tuple)
             and isinstance(n.target.elts[0], ast.Name) and n.target.elts[0].id == "column"]
    assert loops, f"{function.name}: no (column, value) loop found"
    for loop in loops:
        assert isinstance(loop.iter, ast.Tuple), f"repository.py:{loop.lineno}: {ast.unparse(loop.iter)}"
        assert all(isinstance(pair, ast.Tuple) and isinstance(pair.elts[0], ast.Constant)
                   and isinstance(pair.elts[0].value, str) for pair in loop.iter.elts), ast.unparse(loop.iter)


def test_identifiers_spliced_into_sql_come_from_literals_at_every_call_site():
    tree = ast.parse(REPOSITORY.read_text())
    # positions of the spliced arguments: _select(kind, table, binding_id, order), _expire(tx, where, ...),
    # backend.insert_table(tx, table, rows)
    spliced = {"_select": (1, 3), "_expire": (1,), "insert_table": (1,)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in spliced]
    assert {c.func.attr for c in calls} == set(spliced)
    for call in calls:
        for piece in (call.args[i] for i in spliced[call.func.attr]):
            literal = isinstance(piece, ast.Constant) and isinstance(piece.value, str)
            # expire(): " AND ".join(clauses) of f"{column} = ?" over a literal tuple of column names
            joined = (call.func.attr == "_expire" and isinstance(piece, ast.Call)
                      and isinstance(piece.func, ast.Attribute) and piece.func.attr == "join"
                      and isinstance(piece.func.value, ast.Constant))
            assert literal or joined, f"repository.py:{call.lineno}: {ast.unparse(piece)}"
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for name in ("expire", "list_candidates"):
        _literal_pairs_loop(functions[name])
    # _expire's placeholders: ", ".join("?" for _ in <MODULE CONSTANT>)
    (placeholders,) = _assigned(functions["_expire"], "placeholders")
    assert isinstance(placeholders, ast.Call) and isinstance(placeholders.func.value, ast.Constant), \
        ast.unparse(placeholders)
    (generator,) = placeholders.args
    assert isinstance(generator, ast.GeneratorExp) and isinstance(generator.elt, ast.Constant) \
        and generator.elt.value == "?" and _from_constant(generator.generators[0].iter, functions["_expire"]), \
        ast.unparse(placeholders)


def test_the_attached_ledger_file_is_named_by_a_digest_and_its_path_quoted(tmp_path):
    """The two names duckdb_backend splices into its ATTACH / USE / DETACH statements: an identifier of
    hex digits, and the path as a literal that a quote in it cannot end."""
    from optimizer_pipeline.ledger.duckdb_backend import DuckDBBackend

    folder = tmp_path / "it's; DROP TABLE bindings; --"
    ledger = Ledger(folder / "ledger.duckdb")
    ledger.upsert_binding(binding_from_dict(BINDING_DOC))
    assert [b.spec.id for b in Ledger(folder / "ledger.duckdb").list_bindings()] == [BINDING_DOC["id"]]
    backend = ledger.backend
    assert isinstance(backend, DuckDBBackend) and re.fullmatch(r"ledger_[0-9a-f]{16}", backend._alias)
    assert backend._path_literal == "'" + str((folder / "ledger.duckdb").resolve()).replace("'", "''") + "'"


# ---------------------------------------------------------------------------- UI


def test_ui_listens_on_loopback_by_default():
    args = build_parser().parse_args(["ui"])
    assert (args.host, args.port) == ("127.0.0.1", 3000)
