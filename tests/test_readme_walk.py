"""README.md's section "Your own binding" runs as written (issue 35): its commands, taken from the
README itself, on a home that holds the demo heater's history (made two hours old, as a history is by
the time a newcomer reads on), give `unverified` for the live state's age; the relaxation the section
gives for offline work then gives `verified`. The section's commands run as a user runs them, a process
each; the `materialize` after the relaxation, whose subject is the setting, runs the CLI's `main` in this
process (Dagster and the solver workers as in a CLI's process; tests/test_cli.py keeps that process)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.plants import get_plant
from optimizer_pipeline.settings import ledger_path

from test_cli import cli_main

ROOT = Path(__file__).resolve().parents[1]
HOURS_OLD = 2


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Your own binding", 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[list[str]]:
    """The `optimizer-pipeline` lines of the section's shell block, comments dropped."""
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [words for words in lines if words and words[0] == "optimizer-pipeline"]


def _run(cwd: Path, words: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OPTIMIZER_HOME", "DAGSTER_HOME")}
    argv = [sys.executable, "-m", "optimizer_pipeline.cli", *words[1:]]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.timeout(6 * 300 + 60)  # the section's five commands and one more, each waited for up to 300 s
def test_the_readme_walk_to_a_binding_of_ones_own(tmp_path, capsys, monkeypatch):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    heater = get_plant("heater")
    history = heater.history(1).frame
    history["timestamp"] -= HOURS_OLD * 3600.0
    Ledger(ledger_path(tmp_path / ".optimizer")).ingest(heater.spec, history, "simulation")  # what `make demo` left

    commands = _commands(_section())
    assert [words[1:3] for words in commands][:2] == [["export", "heater-1"], ["--home", "my-home"]]
    for words in commands:
        done = _run(tmp_path, words)
        assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr}"
    text = done.stdout
    assert "status: unverified" in text and "live.max_age_s allows 300 s" in text, text
    assert re.search(r"q_heat: [\d.]+ -> [\d.]+ -> [\d.]+  \[20, 200\]", text), text  # the example's own limits

    relax = re.search(r"`(echo [^`]+ > my-home/settings\.yaml)`", _section()).group(1)
    subprocess.run(relax, shell=True, cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)  # where the section's commands ran
    again = cli_main(capsys, "my-home", "materialize", "my-heater")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["status"] == "verified"
