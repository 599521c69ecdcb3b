"""Bad input corpus (issue 9): every case is a clear one-line error, exit 2, no traceback, and the
ledger is byte-for-byte unchanged. Runs the CLI's own entry point in process (same code path as
the console script, without paying an interpreter start per case)."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import yaml

from optimizer_pipeline.cli import main
from optimizer_pipeline.contracts import ContractError, ProblemIR, StateSpace
from optimizer_pipeline.data.ingest import MAX_HISTORY_BYTES
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.problem import problem_from_dict, validate_problem
from optimizer_pipeline.settings import ledger_path
from optimizer_pipeline.solver import codec, errors
from optimizer_pipeline.solver.errors import SolverError
from optimizer_pipeline.solver.pool import SolverPool

PLANT = get_plant("heater")
GOOD = PLANT.binding_doc()


def _history() -> pd.DataFrame:
    return PLANT.history(1).frame


def _csv(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False)


def _set(doc, path, value):
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()

# case: (path in the binding document, bad value, the field the message must name, what it must say)
BINDING_CASES = {
    "id uppercase": (("id",), "Heater", "id", "'Heater' does not match"),
    "id with slash escapes home": (("id",), "../../etc", "id", "'../../etc' does not match"),
    "id with quote (SQL)": (("id",), "x'; DROP TABLE bindings; --", "id", "does not match"),
    "id too long": (("id",), "a" * 64, "id", "does not match [a-z0-9][a-z0-9_-]{0,62}"),
    "id missing": (("id",), _DELETE, "id", "required field is missing"),
    "period zero": (("sample_period_s",), 0, "sample_period_s", "must be > 0, got 0"),
    "period text": (("sample_period_s",), "ten", "sample_period_s", "expected a number > 0, got 'ten'"),
    "mvs empty": (("mvs",), [], "mvs", "at least one MV is required"),
    "mvs not a list": (("mvs",), "q", "mvs", "expected a list, got 'q'"),
    "mv lo >= hi": (("mvs", 0, "lo"), 1e9, "mvs[0]", "lo (1e+09) must be < hi (220)"),
    "mv max_move zero": (("mvs", 0, "max_move"), 0, "mvs[0].max_move", "must be > 0, got 0"),
    "mv max_move negative": (("mvs", 0, "max_move"), -1, "mvs[0].max_move", "must be > 0, got -1"),
    "mv tag empty": (("mvs", 0, "tag"), "", "mvs[0].tag", "expected a non-empty tag name"),
    "mv tag reserved": (("mvs", 0, "tag"), "timestamp", "mvs[0].tag", "other than 'run_id' and 'timestamp'"),
    "cv target above hi": (("cvs", 0, "target"), 1e6, "cvs[0].target", "must be from 20 to 75, got 1000000.0"),
    "cv weight negative": (("cvs", 0, "weight"), -1, "cvs[0].weight", "must be >= 0, got -1"),
    "cv lo missing": (("cvs", 0, "lo"), _DELETE, "cvs[0].lo", "required field is missing"),
    "cv hi is bool": (("cvs", 0, "hi"), True, "cvs[0].hi", "expected a number, got True"),
    "cv transform inside the limits": (("cvs", 0, "transform"), {"kind": "logit", "lo": 30, "hi": 80},
                                       "cvs[0].transform", "expected limits outside the CV's own [20, 75]"),
    "cv transform kind": (("cvs", 0, "transform"), {"kind": "log", "lo": 0, "hi": 100}, "cvs[0].transform.kind",
                          "unknown transform kind 'log'"),
    "cvs missing": (("cvs",), _DELETE, "cvs", "required field is missing"),
    "dv duplicate of cv": (("dvs", 0, "tag"), "t_out", "dvs[0].tag", "'t_out' is already used by cvs[0]"),
    "dv not a mapping": (("dvs", 0), "t_in", "dvs[0]", "expected a mapping like {tag: ...}, got 't_in'"),
    "unknown template": (("profile", "template"), "nonlinear@2", "profile.template", "unknown template 'nonlinear@2'"),
    "profile horizon zero": (("profile", "horizon"), 0, "profile.horizon", "must be >= 1, got 0"),
    "profile id bad": (("profile", "id"), "Bad Id", "profile.id", "'Bad Id' does not match"),
    "profile version zero": (("profile", "version"), 0, "profile.version", "must be >= 1, got 0"),
    "move_weight negative": (("profile", "move_weight"), -0.1, "profile.move_weight", "must be >= 0, got -0.1"),
    "valid_for_s zero": (("profile", "valid_for_s"), 0, "profile.valid_for_s", "must be > 0, got 0"),
    "model horizon zero": (("model", "horizon"), 0, "model.horizon", "must be >= 1, got 0"),
    "model delay zero": (("model", "delay"), 0, "model.delay", "must be >= 1, got 0"),
    "model na float": (("model", "na"), 1.5, "model.na", "expected an integer >= 1, got 1.5"),
    "profile missing": (("profile",), _DELETE, "profile", "required field is missing"),
    "model not mapping": (("model",), [1, 2], "model", "expected a mapping, got [1, 2]"),
}


def _renamed(doc, path, old, new):
    """The document with the key `old` of the mapping at `path` renamed to `new` (a misspelt key)."""
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path:
        target = target[key]
    target[new] = target.pop(old)
    return doc


# case: (where the mapping is, the key as meant, the key as misspelt, the line after "error: <file>.")
# Every level of the binding file refuses a key it does not know (a dropped optional key leaves its
# default in force: a misspelt CV target gave a verified plan that ignored the target).
MISSPELT_KEYS = {
    "top level optional": ((), "dvs", "dv", "dv: unknown key; did you mean 'dvs'?"),
    "top level required": ((), "sample_period_s", "sample_period", "sample_period: unknown key; did you mean "
                                                                   "'sample_period_s' (required, missing)?"),
    "top level in another case": ((), "id", "ID", "ID: unknown key; did you mean 'id' (required, missing)?"),
    "mv optional": (("mvs", 0), "max_move", "maxmove", "mvs[0].maxmove: unknown key; did you mean 'max_move' "
                                                       "(required, missing)?"),
    "cv target": (("cvs", 0), "target", "targte", "cvs[0].targte: unknown key; did you mean 'target'?"),
    "cv limit": (("cvs", 0), "hi", "hii", "cvs[0].hii: unknown key; did you mean 'hi' (required, missing)?"),
    "dv tag": (("dvs", 0), "tag", "tga", "dvs[0].tga: unknown key; did you mean 'tag' (required, missing)?"),
    "model horizon": (("model",), "horizon", "horizn", "model.horizn: unknown key; did you mean 'horizon'?"),
    "profile move weight": (("profile",), "move_weight", "move_wieght", "profile.move_wieght: unknown key; did you "
                                                                        "mean 'move_weight'?"),
    "key close to nothing": (("profile",), "valid_for_s", "expiry", "profile.expiry: unknown key (known: id, version, "
                                                                     "template, horizon, move_weight, valid_for_s)"),
}


WIRED = _set(GOOD, ("opcua",), {"endpoint": "opc.tcp://127.0.0.1:4840/heater",
                                 "nodes": {"q_heat": "ns=2;s=Heater.q", "t_out": "ns=2;s=Heater.t_out",
                                           "t_in": "ns=2;s=Heater.t_in"},
                                 "advisory": {"nodes": {"q_heat": "ns=2;s=Heater.q.advice"}}})
# case: (the wired binding with one defect in its `opcua` section, the line after "error: <file>.")
OPCUA_CASES = {
    "opcua key misspelt": (_renamed(WIRED, ("opcua",), "endpoint", "end_point"),
                           "opcua.end_point: unknown key; did you mean 'endpoint' (required, missing)?"),
    "advisory key misspelt": (_renamed(WIRED, ("opcua", "advisory"), "nodes", "nodse"),
                              "opcua.advisory.nodse: unknown key; did you mean 'nodes' (required, missing)?"),
    "node of an unknown tag": (_renamed(WIRED, ("opcua", "nodes"), "t_out", "t_outt"),
                               "opcua.nodes.t_outt: unknown tag; did you mean 't_out'?"),
    "advice to a measurement": (_set(WIRED, ("opcua", "advisory", "nodes", "q_heat"), "ns=2;s=Heater.t_out"),
                                "opcua.advisory.nodes.q_heat: 'ns=2;s=Heater.t_out' is the node opcua.nodes.t_out "
                                "reads (advice is never written to a measurement node)"),
    "endpoint with a password": (_set(WIRED, ("opcua", "endpoint"), "opc.tcp://op:pw@127.0.0.1:4840"),
                                 "opcua.endpoint: a user name or password does not belong here (credentials go in "
                                 "the host's settings)"),
}


def _history_cases():
    base = _history()
    cases = {}
    cases["missing tag column"] = _csv(base.drop(columns=["t_out"]))
    cases["tag column in capitals"] = _csv(base.rename(columns={"t_out": "T_OUT"}))
    cases["tag column misspelt"] = _csv(base.rename(columns={"t_out": "t_outt"}))
    cases["missing run_id"] = _csv(base.drop(columns=["run_id"]))
    cases["missing timestamp"] = _csv(base.drop(columns=["timestamp"]))
    bad = base.astype({"t_out": object})
    bad.loc[5, "t_out"] = "hot"
    cases["text in numbers"] = _csv(bad)
    cases["all NaN tag"] = _csv(base.assign(t_in=np.nan))
    dup = base.copy()
    dup.loc[3, "timestamp"] = dup.loc[2, "timestamp"]
    cases["duplicate timestamp"] = _csv(dup)
    dec = base.copy()
    dec.loc[7, "timestamp"] = dec.loc[5, "timestamp"] - 1
    cases["decreasing timestamp"] = _csv(dec)
    bad_ts = base.astype({"timestamp": object})
    bad_ts.loc[4, "timestamp"] = "yesterday"
    cases["unparseable timestamp"] = _csv(bad_ts)
    cases["empty file"] = ""
    cases["header only"] = ",".join(base.columns) + "\n"
    cases["semicolon delimited"] = base.to_csv(index=False, sep=";")
    cases["tab delimited"] = base.to_csv(index=False, sep="\t")
    cases["duplicate columns"] = _csv(base).replace("t_in", "t_out", 1)
    cases["empty run id"] = _csv(base.assign(run_id=base["run_id"].where(base.index != 9, "")))
    cases["wrong encoding"] = "run_id,timestamp,q_heat,t_in,t_out\n" + "r\xe9,1,2,3,4\n"
    return cases


HISTORY_CASES = _history_cases()
# case: the message after "error: <file>: ", naming the column, the run and the row where they apply
HISTORY_MESSAGES = {
    "missing tag column": "missing required column(s) 't_out'",
    "tag column in capitals": "missing required column(s) 't_out' (the file has 'T_OUT': column names are "
                              "case-sensitive)",
    "tag column misspelt": "missing required column(s) 't_out' (did you mean 't_outt'?)",
    "missing run_id": "missing required column(s) 'run_id'",
    "missing timestamp": "missing required column(s) 'timestamp'",
    "text in numbers": "column 't_out': non-numeric value 'hot' in run 'heater-run-00' at row 6 (line 7)",
    "all NaN tag": "column 't_in' has no values (all empty / NaN)",
    "duplicate timestamp": "run 'heater-run-00': timestamp at row 4 (line 5) is not after the previous sample of the "
                           "run (timestamps must be strictly increasing inside a run)",
    "decreasing timestamp": "run 'heater-run-00': timestamp at row 8 (line 9) is not after the previous sample of the "
                            "run (timestamps must be strictly increasing inside a run)",
    "unparseable timestamp": "run 'heater-run-00': timestamp 'yesterday' at row 5 (line 6) is not ISO 8601 text or "
                             "seconds since the epoch",
    "empty file": "empty file (no header and no data rows)",
    "header only": "empty file (no data rows; at least one run is needed)",
    "semicolon delimited": "the header looks like ';'-delimited (1 column(s) when split on ','); use ','",
    "tab delimited": "the header looks like tab-delimited (1 column(s) when split on ','); use ','",
    "duplicate columns": "duplicate column(s) 't_out' in the header",
    "empty run id": "column 'run_id' is empty at row 10 (line 11)",
    "wrong encoding": "cannot read history file (not UTF-8 text)",
}


def _dump(home) -> dict:
    if not ledger_path(home).exists():
        return {}
    ledger = Ledger(ledger_path(home))
    tables = list(ledger.counts())
    with ledger.transaction() as conn:  # row count and an order-independent hash of every row of every table
        return {t: conn.execute(f"SELECT count(*), coalesce(sum(hash(r)), 0)::VARCHAR FROM {t} r").fetchall()
                for t in tables}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A home holding the good binding and history, so every case must leave existing rows untouched."""
    home = tmp_path_factory.mktemp("home")
    folder = tmp_path_factory.mktemp("files")
    (folder / "good.yaml").write_text(yaml.safe_dump(GOOD))
    _history().to_csv(folder / "good.csv", index=False)
    assert main(["--home", str(home), "ingest", str(folder / "good.yaml"), str(folder / "good.csv")]) == 0
    return home, folder


def _run_bad(capsys, home, *args):
    capsys.readouterr()
    before = _dump(home)
    code = main(["--home", str(home), *args])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    assert _dump(home) == before
    return lines[0]


@pytest.mark.parametrize("case", sorted(BINDING_CASES))
def test_bad_binding_file_is_one_clear_line_and_changes_nothing(seeded, capsys, case, tmp_path):
    home, folder = seeded
    path, value, field, reason = BINDING_CASES[case]
    if case == "dv not a mapping" or case == "dv duplicate of cv":
        doc = _set(GOOD, ("dvs",), [{"tag": "x"}])
        doc = _set(doc, path, value)
    else:
        doc = _set(GOOD, path, value)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    line = _run_bad(capsys, home, "ingest", str(tmp_path / "bad.yaml"), str(folder / "good.csv"))
    assert line.startswith(f"error: {tmp_path / 'bad.yaml'}.{field}: "), line  # the file, then the field
    assert reason in line


@pytest.mark.parametrize("case", sorted(MISSPELT_KEYS))
def test_a_misspelt_key_at_any_level_is_refused_naming_its_path_and_the_closest_key(seeded, capsys, case, tmp_path):
    home, folder = seeded
    path, meant, misspelt, message = MISSPELT_KEYS[case]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(_renamed(GOOD, path, meant, misspelt)))
    line = _run_bad(capsys, home, "ingest", str(tmp_path / "bad.yaml"), str(folder / "good.csv"))
    assert line == f"error: {tmp_path / 'bad.yaml'}.{message}"


def test_an_unknown_key_of_a_cv_transform_is_refused(seeded, capsys, tmp_path):
    home, folder = seeded
    doc = _set(GOOD, ("cvs", 0, "transform"), {"kind": "logit", "lo": 0, "hi": 100, "kindd": 3})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    line = _run_bad(capsys, home, "ingest", str(tmp_path / "bad.yaml"), str(folder / "good.csv"))
    assert line == f"error: {tmp_path / 'bad.yaml'}.cvs[0].transform.kindd: unknown key; did you mean 'kind'?"


@pytest.mark.parametrize("case", sorted(OPCUA_CASES))
def test_a_bad_opcua_section_is_refused_naming_its_path(seeded, capsys, case, tmp_path):
    home, folder = seeded
    doc, message = OPCUA_CASES[case]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    line = _run_bad(capsys, home, "ingest", str(tmp_path / "bad.yaml"), str(folder / "good.csv"))
    assert line == f"error: {tmp_path / 'bad.yaml'}.{message}"


@pytest.mark.parametrize("case", sorted(HISTORY_CASES))
def test_bad_history_file_is_one_clear_line_and_changes_nothing(seeded, capsys, case, tmp_path):
    home, folder = seeded
    path = tmp_path / "bad.csv"
    text = HISTORY_CASES[case]
    path.write_bytes(text.encode("latin-1") if case == "wrong encoding" else text.encode())
    line = _run_bad(capsys, home, "ingest", str(folder / "good.yaml"), str(path))
    assert line == f"error: {path}: {HISTORY_MESSAGES[case]}"


def test_a_cv_value_beyond_its_transforms_limits_is_one_clear_line_and_changes_nothing(seeded, capsys, tmp_path):
    home, folder = seeded
    doc = _set(GOOD, ("cvs", 0, "transform"), {"kind": "logit", "lo": 0.0, "hi": 90.0})
    (tmp_path / "transformed.yaml").write_text(yaml.safe_dump(doc))
    frame = _history()
    frame.loc[11, "t_out"] = 90.0
    frame.to_csv(tmp_path / "bad.csv", index=False)
    line = _run_bad(capsys, home, "ingest", str(tmp_path / "transformed.yaml"), str(tmp_path / "bad.csv"))
    assert line == (f"error: {tmp_path / 'bad.csv'}: column 't_out': 90.0 in run 'heater-run-00' at row 12 (line 13) "
                    "is not inside the limits of the CV's transform (logit between 0 and 90)")


def test_every_history_case_has_its_expected_message():
    assert set(HISTORY_MESSAGES) == set(HISTORY_CASES)


def test_history_file_over_the_size_limit_is_one_line_naming_file_and_limit(seeded, capsys, tmp_path):
    home, folder = seeded
    path = tmp_path / "huge.csv"
    with path.open("wb") as handle:  # sparse: the real limit without writing 256 MiB
        handle.truncate(MAX_HISTORY_BYTES + 1)
    line = _run_bad(capsys, home, "ingest", str(folder / "good.yaml"), str(path))
    assert line == (f"error: {path}: history file is {MAX_HISTORY_BYTES + 1} bytes, over the limit of "
                    f"{MAX_HISTORY_BYTES} bytes (MAX_HISTORY_BYTES, 256 MiB); split it into several files and ingest each")


@pytest.mark.parametrize("args, message", [
    (["ingest", "nope.yaml", "nope.csv"], "error: nope.yaml: binding file not found"),
    (["recommendation", "x'; DROP TABLE bindings; --"],
     """error: binding "x'; DROP TABLE bindings; --" is not in the ledger {ledger} (1 binding; closest: heater-1)"""),
    (["materialize", "../../etc"], "error: binding '../../etc' is not in the ledger {ledger} (1 binding; closest: heater-1)"),
    (["ledger", "--binding", "nope"], "error: binding 'nope' is not in the ledger {ledger} (1 binding; closest: heater-1)"),
    (["outcome", "rec-nope", "nope.csv"], "error: recommendation rec-nope is not in the ledger"),
])
def test_bad_command_arguments_name_the_file_binding_or_recommendation(seeded, capsys, args, message):
    home, _ = seeded
    assert _run_bad(capsys, home, *args) == message.format(ledger=ledger_path(home))


def _problem_doc() -> dict:
    from test_contracts import _problem

    return _problem().to_dict()


@pytest.mark.parametrize("mutate, start", [
    (lambda d: d.update(template="nonlinear@2"), "problem.template: malformed ('nonlinear@2'"),
    (lambda d: d.update(x0=[float("nan"), 0.0]), "problem.x0[0]: expected a finite number, got nan"),
    (lambda d: d.update(x0=[0.0]), "problem.x0: expected length 2, got 1"),
    # A shrunk to 1 x 1 makes the state size 1, so the first matrix that disagrees is B
    (lambda d: d["model"].update(A=[[1.0]]), "problem.model.B: expected 1 rows, got 2"),
    (lambda d: d.update(u_lo=[1.0], u_hi=[0.0]), "problem: u_lo[0] (1) must be <= u_hi[0] (0)"),
    (lambda d: d.update(horizon=0), "problem.horizon: must be >= 1, got 0"),
    (lambda d: d.pop("bias"), "problem.bias: required field is missing"),
    (lambda d: d.update(y_target=["a"]), "problem.y_target: malformed"),
])
def test_malformed_problem_documents_are_refused_with_the_field(mutate, start):
    doc = _problem_doc()
    mutate(doc)
    with pytest.raises(ContractError) as err:
        problem_from_dict(doc)
    assert str(err.value).startswith(start), str(err.value)


def _problem_over_the_size_limit() -> ProblemIR:
    """A valid problem (every dimension consistent) whose JSON is just over codec.MAX_PROBLEM_BYTES:
    a stable 640-state model of 2 MVs and 2 CVs (~9.3 MB of JSON)."""
    from test_pool import _problem

    nx = 640
    rng = np.random.default_rng(0)
    c = np.zeros((2, nx))
    c[0, 0] = c[1, 1] = 1.0
    model = StateSpace.of(0.9 * np.eye(nx) + rng.uniform(-1e-4, 1e-4, (nx, nx)), rng.uniform(-0.1, 0.1, (nx, 2)),
                          np.zeros((nx, 0)), np.zeros(nx), c)
    return replace(_problem(), model=model, x0=(0.0,) * nx)


def test_oversized_problem_document_is_refused_by_the_pool_before_sending_naming_the_limit(tmp_path):
    from reliability_helpers import counting_worker_cmd, received

    problem = _problem_over_the_size_limit()
    assert validate_problem(problem) is problem  # nothing is wrong with it but its size
    size = len(codec.encode(problem))
    assert codec.MAX_PROBLEM_BYTES < size < 2 * codec.MAX_PROBLEM_BYTES
    at_limit = {"template": "nonlinear@2", "pad": ""}
    at_limit["pad"] = " " * (codec.MAX_PROBLEM_BYTES - len(codec.encode(at_limit)))
    assert len(codec.encode(at_limit)) == codec.MAX_PROBLEM_BYTES
    log = tmp_path / "received.log"
    with SolverPool(size=1, worker_cmd=counting_worker_cmd(log)) as pool:
        with pytest.raises(codec.ProblemTooLarge) as refused:
            pool.solve(problem)
        assert str(refused.value) == (f"problem of binding 'pool-test': problem document is {size} bytes, over the "
                                      f"limit of {codec.MAX_PROBLEM_BYTES} bytes (MAX_PROBLEM_BYTES, 8 MiB); not sent "
                                      f"to a solver worker")
        # exactly the limit is sent: the worker refuses it for its content, not for its size
        with pytest.raises(SolverError) as sent:
            pool.solve(at_limit)
        assert sent.value.code == errors.BAD_REQUEST and sent.value.message.startswith("payload.problemIr:")
        with pytest.raises(codec.ProblemTooLarge, match=f"is {codec.MAX_PROBLEM_BYTES + 1} bytes, over the limit"):
            pool.solve({**at_limit, "pad": at_limit["pad"] + " "})
        assert pool.ping()["busy"] is False
    assert [op for _, _, op in received(log)] == ["solve", "ping"]  # only the document at the limit was sent
