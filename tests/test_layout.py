"""The house rules of the layout, enforced: the domain library never imports dagster, private Dagster
imports live in one compatibility module, no module is oversized, and the install is self-contained."""

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from optimizer_pipeline.plants import demo_plants

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "optimizer_pipeline"
COMPOSITION = {"definitions.py", "automation.py", "cli.py"}  # the only package modules wired to Dagster
COMPAT = ROOT / "assets" / "compat.py"
MAX_LINES = 600


def _modules(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _domain_modules() -> list[Path]:
    return [p for p in _modules(PACKAGE) if not (p.parent == PACKAGE and p.name in COMPOSITION)]


def test_no_domain_module_imports_dagster_or_the_dagster_layers():
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p)
                                                 if n.split(".")[0] == "dagster" or n.startswith("dagster_")
                                                 or n.startswith(("optimizer_pipeline.assets", "optimizer_pipeline.resources")))
                 for p in _domain_modules()}
    assert len(offenders) > 40  # every module of the domain library was looked at
    assert {path: names for path, names in offenders.items() if names} == {}


def test_importing_the_domain_library_loads_no_dagster():
    domain = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in _domain_modules()]
    domain = [m.removesuffix(".__init__") for m in domain]
    code = ("import importlib, sys\n"
            f"for name in {domain!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_solver_worker_imports_only_what_a_solve_needs():
    """A pool starts its workers on every materialize and live service: none loads pandas, the model
    fitting code (scipy.optimize), matplotlib or dagster."""
    code = ("import sys, optimizer_pipeline.solver.worker\n"
            "print(sorted(m for m in ('pandas', 'scipy.optimize', 'scipy.stats', 'matplotlib', 'dagster', "
            "'optimizer_pipeline.model.fit') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("environment, threads", [({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, 2)])
def test_a_process_of_the_product_runs_blas_on_one_thread_unless_its_environment_names_more(environment, threads):
    """Importing the package sets the thread budget before numpy starts OpenBLAS's threads (counted in
    /proc: the process's tasks after numpy's import); a budget of the environment's own is kept."""
    code = ("import os, optimizer_pipeline, numpy\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")} | environment
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(threads), str(threads)]


def test_private_dagster_imports_live_only_in_the_compatibility_module_each_with_its_reason():
    private = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.startswith("dagster._"))
               for p in _modules(PACKAGE, ROOT / "assets", ROOT / "resources")}
    assert {path for path, names in private.items() if names} == {str(COMPAT.relative_to(ROOT))}
    lines = COMPAT.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("from dagster._"):
            assert lines[i - 1].startswith("#"), f"assets/compat.py:{i + 1}: a private import without its reason above"
    assert "Checked on dagster 1.13.27" in "\n".join(lines)


def test_no_module_of_the_product_is_over_600_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in _modules(PACKAGE, ROOT / "assets", ROOT / "resources")}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_no_asset_value_is_pickled_and_no_upath_io_manager_is_used():
    for path in _modules(PACKAGE, ROOT / "assets", ROOT / "resources"):
        text = path.read_text(encoding="utf-8")
        assert "UPathIOManager" not in text and "pickle.dump" not in text and "pickle.load" not in text, path


def test_the_repository_cites_no_document_outside_it():
    cited = []
    for path in [*_modules(PACKAGE, ROOT / "assets", ROOT / "resources", ROOT / "tests", ROOT / "bench"),
                 *ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), ROOT / "pyproject.toml"]:
        text = path.read_text(encoding="utf-8")
        for needle in ("DESIGN.md", "DAGSTER-NOTES", "../shared"):
            if needle in text and path != Path(__file__):
                cited.append(f"{path.relative_to(ROOT)}: {needle}")
    assert cited == []


def demo_statuses(stdout: str) -> dict[str, str]:
    """binding -> status of the table `demo` prints (recommendation_text.demo_table: a header line
    starting binding, template, status; a rule; a row per binding until a blank line)."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"binding +template +status\b", line))
    rows = lines[header + 2:lines.index("", header)]
    return {row.split()[0]: row.split()[2] for row in rows}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [built] = out.glob("optimizer_pipeline-*.whl")
    return built


@pytest.mark.timeout(400)  # the wheel's build (300 s), when this test is the first to use it
def test_the_wheel_installs_assets_and_resources_under_the_product_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"optimizer_pipeline"}
    assert "optimizer_pipeline/assets/bindings.py" in names and "optimizer_pipeline/resources/ledger.py" in names
    assert "optimizer_pipeline/plants/heater.yaml" in names


@pytest.mark.slow
@pytest.mark.timeout(1300)  # its waits: the wheel's build 300 s (first use), the install 300 s, two demos 300 s each
def test_a_non_editable_install_runs_the_demo_from_another_directory(wheel, tmp_path):
    """The wheel installed into its own target folder (first on the path, ahead of the checkout's
    editable install), then `demo` from a directory that is not the checkout."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    env["PYTHONPATH"] = str(target)
    code = ("import sys, optimizer_pipeline, optimizer_pipeline.assets.bindings as b; "
            "print(optimizer_pipeline.__file__); print(b.__file__); "
            "from optimizer_pipeline.cli import main; sys.exit(main(['--home', 'h', 'demo']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    first, second = proc.stdout.splitlines()[:2]
    assert first.startswith(str(target)) and second.startswith(str(target))
    assert demo_statuses(proc.stdout) == {plant.spec.id: "verified" for plant in demo_plants()}, proc.stdout
    assert (elsewhere / "h" / "optimizer.duckdb").exists()
