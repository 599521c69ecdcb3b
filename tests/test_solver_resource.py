"""The Dagster solver resource owns a worker pool for one run and leaves no process behind."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import asset, materialize

from optimizer_pipeline.contracts import ProblemIR, StateSpace, Template
from optimizer_pipeline.deployment import WORKER_ENV
from optimizer_pipeline.resources.solver import SolverPoolResource

seen: dict[str, list] = {}  # what the assets saw, for the assertions after the run


def _worker_children() -> set[int]:
    """Live solver worker processes started by this process (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"optimizer_pipeline.solver.worker" in cmdline:
            found.add(int(entry.name))
    return found


def _problem() -> ProblemIR:
    """One MV, one CV, first-order plant, N = 5 (identity normalisation)."""
    return ProblemIR(template=Template.LINEAR_MPC, binding_id="res-test", binding_revision=1, profile_id="p",
                     profile_version=1, model_artifact_hash="0" * 64, horizon=5, mv_tags=("u",), cv_tags=("y",),
                     dv_tags=(), model=StateSpace(A=((0.8,),), B=((0.2,),), E=((),), f=(0.0,), C=((1.0,),)),
                     x0=(0.0,), u_prev=(0.0,), d=(), bias=(0.0,), u_lo=(-1.0,), u_hi=(1.0,), du_max=(0.5,),
                     y_lo=(-2.0,), y_hi=(2.0,), y_target=(0.5,), y_weight=(1.0,), move_weight=0.1, slack_weight=1000.0,
                     band=None, u_mean=(0.0,), u_std=(1.0,), y_mean=(0.0,), y_std=(1.0,))


@asset
def solved(solver: SolverPoolResource) -> None:
    seen["stats"] = solver.stats()
    seen["children"] = _worker_children()
    seen["result"] = solver.solve(_problem())


@asset
def failing(solver: SolverPoolResource) -> None:
    seen["stats"] = solver.stats()
    raise RuntimeError("the asset failed after the pool started")


@pytest.fixture(autouse=True)
def clean():
    seen.clear()
    before = _worker_children()
    yield
    assert _worker_children() <= before


def test_resource_starts_its_pool_for_the_run_and_stops_it_after():
    result = materialize([solved], resources={"solver": SolverPoolResource(pool_size=2, request_timeout_ms=5_000)})
    assert result.success
    assert seen["stats"]["ready"] == 2 and seen["result"]["ok"]
    assert set(seen["stats"]["pids"]) <= seen["children"]  # the /proc scan does see live workers
    assert not set(seen["stats"]["pids"]) & _worker_children()


def test_failing_asset_leaves_no_worker_behind():
    result = materialize([failing], resources={"solver": SolverPoolResource(pool_size=1)}, raise_on_error=False)
    assert not result.success
    assert seen["stats"]["ready"] == 1
    assert not set(seen["stats"]["pids"]) & _worker_children()


def test_failed_pool_start_fails_the_run_cleanly(tmp_path, monkeypatch):
    (tmp_path / "osqp.py").write_text("raise ImportError('osqp is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    result = materialize([solved], resources={"solver": SolverPoolResource(pool_size=1)}, raise_on_error=False)
    assert not result.success and "stats" not in seen
    assert "ENV_MISSING_DEP" in " ".join(str(e.event_specific_data) for e in result.all_events if e.is_failure)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def test_runs_inside_kept_alive_share_one_pool_that_stops_at_the_end(tmp_path):
    from optimizer_pipeline.solver.shared import kept_alive

    seen = []

    @asset
    def uses_pool(solver: SolverPoolResource):
        seen.append(tuple(solver.stats()["pids"]))

    with kept_alive():
        for _ in range(2):
            assert materialize([uses_pool], resources={"solver": SolverPoolResource(pool_size=1)}).success
        assert seen[0] == seen[1]
        assert all(_alive(pid) for pid in seen[0])
    assert not any(_alive(pid) for pid in seen[0])
    assert os.getpid() not in seen[0]


def test_a_run_that_never_solves_starts_no_worker():
    @asset
    def no_solve(solver: SolverPoolResource) -> None:
        seen["children"] = _worker_children()

    assert materialize([no_solve], resources={"solver": SolverPoolResource(pool_size=2)}).success
    assert seen["children"] == set()


def test_the_in_process_fake_answers_what_the_worker_pool_answers():
    from optimizer_pipeline.contracts import SolveResult
    from optimizer_pipeline.resources.solver import InProcessSolverResource

    fake = InProcessSolverResource().solve(_problem())
    assert materialize([solved], resources={"solver": SolverPoolResource(pool_size=1)}).success
    real = seen["result"]
    def plans(doc):  # everything but timings (diagnostics) and the reports that carry them
        return [(c.kind, c.controls, c.predicted, c.cost, c.feasible, c.verified, c.independent_cost)
                for c in SolveResult.from_dict(doc).candidates]

    assert fake["ok"] and real["ok"] and len(plans(fake)) == 2  # hold + nominal (no band, no robust)
    assert plans(fake) == plans(real)


def test_a_celery_worker_keeps_its_pool_across_runs_and_stops_it_at_exit(tmp_path):
    """In a process that `optimizer-pipeline worker` started (WORKER_ENV set), two runs share one pool,
    and its workers end when the process exits. A process of its own: the keep is for a process's life."""
    script = tmp_path / "two_runs.py"
    script.write_text(
        "import json\n"
        "from dagster import asset, materialize\n"
        "from optimizer_pipeline.resources.solver import SolverPoolResource\n"
        "seen = []\n"
        "@asset\n"
        "def uses_pool(solver: SolverPoolResource):\n"
        "    seen.append(solver.stats()['pids'])\n"
        "for _ in range(2):\n"
        "    assert materialize([uses_pool], resources={'solver': SolverPoolResource(pool_size=1)}).success\n"
        "print(json.dumps(seen))\n")
    env = {**os.environ, WORKER_ENV: "a"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == second  # the second run took the first run's pool
    deadline = time.monotonic() + 60  # a bound, not a pause: the workers see stdin close as their parent ends
    while any(_alive(pid) for pid in first) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in first)
