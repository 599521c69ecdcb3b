"""A full filesystem under the home (issue 14): `ingest` and `materialize` end with one `error:` line
naming the full filesystem, exit 2, no traceback, and the ledger keeps only whole transactions.
Needs a small tmpfs (root with mount rights); elsewhere skipped with the reason."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from optimizer_pipeline.plants import get_plant

from servers import unavailable

pytestmark = pytest.mark.timeout(660)  # each test: two commands of up to 300 s each (`cli`)


def _mount_tmpfs(path: Path, size_kb: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        unavailable(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'mount failed'}): the full-disk test "
                    f"needs root with mount rights")


@pytest.fixture
def small_fs(tmp_path):
    mounted = []

    def make(size_kb: int) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        _mount_tmpfs(where, size_kb)
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    return subprocess.run([sys.executable, "-m", "optimizer_pipeline.cli", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=300, env=env)


def assert_full_disk_line(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "full" in lines[0] and "Traceback" not in proc.stderr


@pytest.fixture
def files(tmp_path):
    plant = get_plant("heater")
    binding, history = tmp_path / "heater.yaml", tmp_path / "history.csv"
    binding.write_text(yaml.safe_dump(plant.binding_doc()))
    plant.history(1).frame.to_csv(history, index=False)
    return binding, history


def _used_kb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) // 1024


def test_ingest_into_a_full_filesystem_is_one_line_and_leaves_no_partial_ingest(small_fs, files, tmp_path):
    roomy = tmp_path / "roomy"
    assert cli(roomy, "ingest", *map(str, files)).returncode == 0
    home = small_fs(max(64, _used_kb(roomy) // 3)) / "home"  # a third of what the ingest needs
    proc = cli(home, "ingest", *map(str, files))
    assert_full_disk_line(proc)
    ledger_file = home / "optimizer.duckdb"
    if ledger_file.exists():  # whatever was committed is whole: a binding only with its samples
        conn = duckdb.connect(str(ledger_file), read_only=True)
        try:
            bindings = conn.execute("SELECT count(*) FROM bindings").fetchall()[0][0]
            samples = conn.execute("SELECT count(*) FROM plant_samples").fetchall()[0][0]
        finally:
            conn.close()
        assert (bindings == 0) == (samples == 0)


def test_materialize_on_a_full_filesystem_is_one_line_and_the_ledger_stays_whole(small_fs, files, tmp_path):
    roomy = tmp_path / "roomy"
    assert cli(roomy, "ingest", *map(str, files)).returncode == 0
    home = small_fs(_used_kb(roomy) + 256) / "home"  # the ledger fits; a Dagster instance and a run do not
    shutil.copytree(roomy, home)
    proc = cli(home, "materialize", "heater-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "full" in lines[0], proc.stderr[-2000:]
    conn = duckdb.connect(str(home / "optimizer.duckdb"), read_only=True)
    try:
        runs = conn.execute("SELECT id FROM optimizer_runs").fetchall()
        recs = conn.execute("SELECT run_id FROM optimizer_recommendations").fetchall()
        cands = conn.execute("SELECT DISTINCT run_id FROM optimizer_candidates").fetchall()
    finally:
        conn.close()
    assert sorted(r[0] for r in recs) == sorted(r[0] for r in runs)  # every run whole, or none at all
    assert {r[0] for r in cands} <= {r[0] for r in runs}
