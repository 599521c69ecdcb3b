"""The other processes beside the live service (bench_live.py --others, issue "Sharing the ledger").

`optimizer-pipeline` CLI commands run one at a time as subprocesses of this one (`python -c`: the DuckDB
backend's logger `optimizer_pipeline.ledger.duckdb_backend` at DEBUG to stderr, then `cli.main(argv)`); each
is timed end to end (start of the interpreter to its exit) and its lock waits are parsed from stderr (the
backend logs every contended acquisition, `ledger <path>: waited <s> s for the lock`; an uncontended one logs
nothing). The commands, REPEAT rounds of them in this order:

  status                                   every binding's latest status
  recommendation SERVED                    a binding the live service serves
  ingest BINDING_FILE HISTORY_FILE         a binding the service does not serve, new each time (a copy of the
      --source simulation                  demo tank named OTHER-in-<round tag>, its 3600-sample history):
                                           the same work every round, its samples written
  materialize OTHER                        a Dagster run in process (job refresh) of the binding OTHER, set up
                                           beside the others and not served
"""

import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_LOGGER = "optimizer_pipeline.ledger.duckdb_backend"
WAITED = re.compile(r"waited ([0-9.]+) s for the lock")
COMMANDS = ("status", "recommendation", "ingest", "materialize")
ISSUE_BEFORE = ("status 1.4 -> 9.6 s, recommendation 1.5 -> 21.4 s, ingest of another binding 2.0 -> 25.2 s "
                "(20 bindings, a sample every 0.5 s); the idle service 0.14 of a core")
COMMAND_MAX_S = 900.0  # the longest one command may take (a hung one is killed and reported)
RUNNER = f"""
import logging, sys
handler = logging.StreamHandler(sys.stderr)
handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
log = logging.getLogger({LOCK_LOGGER!r})
log.addHandler(handler)
log.setLevel(logging.DEBUG)
log.propagate = False  # once, whatever the command configures on the root logger
from optimizer_pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Timed:
    """One command's run."""

    command: str
    seconds: float
    waits: list[float]  # its contended lock acquisitions, seconds each
    rc: int
    tail: str = ""  # the end of its stderr when it failed


@dataclass
class Others:
    """The commands of the module docstring for `home`, their files in `folder`."""

    home: Path
    served: str  # recommendation's binding (served by the live service)
    other: str  # materialize's binding (not served)
    folder: Path
    runs: dict[str, list[Timed]] = field(default_factory=dict)  # phase -> its commands' runs
    cut: str = ""  # why the busy rounds ended early (run_phase's `go`)

    def __post_init__(self):
        import yaml

        from optimizer_pipeline.data.export import write_history
        from optimizer_pipeline.plants import get_plant

        plant = get_plant("tanks")
        self.doc = plant.binding_doc()
        self.history = self.folder / "other-history.csv"
        write_history(plant.history(1).frame, self.history)
        self._yaml = yaml.safe_dump

    def argv(self, command: str, tag: str) -> list[str]:
        if command == "status":
            return ["status"]
        if command == "recommendation":
            return ["recommendation", self.served]
        if command == "materialize":
            return ["materialize", self.other]
        binding_id = f"{self.other}-in-{tag}"
        path = self.folder / f"{binding_id}.yaml"
        path.write_text(self._yaml({**self.doc, "id": binding_id}, sort_keys=False), encoding="utf-8")
        return ["ingest", str(path), str(self.history), "--source", "simulation"]

    def run_phase(self, phase: str, repeat: int, go=None) -> list[Timed]:
        """`repeat` rounds of the commands as `phase`; before each round after the first, `go(seconds the
        last round took)` may say no more (its reason: a str; None: go on)."""
        runs = self.runs.setdefault(phase, [])
        stamp = time.strftime("%H%M%S")
        for k in range(repeat):
            started = time.perf_counter()
            if k and go is not None and (reason := go(round_s)) is not None:
                print(f"others ({phase}): {k} of {repeat} rounds: {reason}", flush=True)
                self.cut = f"{k} of {repeat} rounds ({reason})"
                return runs
            for command in COMMANDS:
                runs.append(_run(self.home, command, self.argv(command, f"{phase}{k + 1}-{stamp}")))
                done = runs[-1]
                print(f"others ({phase}): {command} {done.seconds:.1f} s, {len(done.waits)} lock wait(s)"
                      f"{f', max {max(done.waits):.3f} s' if done.waits else ''}"
                      f"{'' if done.rc == 0 else f'; FAILED rc {done.rc}: {done.tail}'}", flush=True)
            round_s = time.perf_counter() - started
        return runs


def _run(home: Path, command: str, argv: list[str]) -> Timed:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", RUNNER, "--home", str(home), *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=COMMAND_MAX_S)
        stderr, rc = proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stderr, rc = (exc.stderr or b"").decode(errors="replace") + f"\n(killed after {COMMAND_MAX_S:.0f} s)", -9
    seconds = time.perf_counter() - t0
    waits = [float(w) for w in WAITED.findall(stderr)]
    lines = [line for line in stderr.splitlines() if not line.startswith(LOCK_LOGGER)]
    return Timed(command, seconds, waits, rc, " | ".join(lines[-3:]) if rc else "")


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _waits(runs: list[Timed]) -> str:
    waits = [w for r in runs for w in r.waits]
    if not waits:
        return "0 contended"
    return f"{len(waits)} contended, p50 {_p50(waits):.3f} s, max {max(waits):.3f} s"


def print_others(others: Others, duckdb: bool, offered: str) -> None:
    """The figures: per command idle median vs busy median / worst against the targets (+2 s; materialize
    1.5x), and the lock waits (DuckDB; PostgreSQL has none: n/a)."""
    idle, busy = others.runs.get("idle", []), others.runs.get("busy", [])
    rounds = [sum(r.command == "status" for r in runs) for runs in (idle, busy)]
    print(f"\nother processes, one at a time ({rounds[0]} rounds on the idle home, nothing running; {rounds[1]} "
          f"with live busy at {offered}){f'; busy rounds cut at {others.cut}' if others.cut else ''}")
    print(f"  {'command':<15} {'idle p50':>9} {'busy p50':>9} {'busy max':>9}  {'max vs idle':<12} {'target':<14} "
          f"lock waits, busy (idle)")
    for command in COMMANDS:
        a = [r.seconds for r in idle if r.command == command and r.rc == 0]
        b = [r.seconds for r in busy if r.command == command and r.rc == 0]
        failed = sum(r.rc != 0 for r in idle + busy if r.command == command)
        waits = (f"{_waits([r for r in busy if r.command == command])} "
                 f"({_waits([r for r in idle if r.command == command])})" if duckdb else "n/a")
        if not a or not b:
            print(f"  {command:<15} {f'{_p50(a):.1f} s' if a else '-':>9} {f'{_p50(b):.1f} s' if b else '-':>9}  "
                  f"no figure: {failed} failed")
            continue
        base, worst = _p50(a), max(b)
        if command == "materialize":
            versus, target, ok = f"{worst / base:.2f}x", "<= 1.5x", worst <= 1.5 * base
        else:
            versus, target, ok = f"{worst - base:+.1f} s", "<= +2 s", worst - base <= 2.0
        print(f"  {command:<15} {base:>7.1f} s {_p50(b):>7.1f} s {worst:>7.1f} s  {versus:<12} "
              f"{target + ('' if ok else ' MISSED'):<14} {waits}{f'  ({failed} failed)' if failed else ''}")
    print(f"  before the fix (issue)  : {ISSUE_BEFORE}")
    if not duckdb:
        print("  lock waits              : n/a (PostgreSQL: no ledger file lock)")
        return
    waits = [w for r in busy for w in r.waits]
    missed = "  MISSED" if waits and max(waits) > 1.0 else ""
    print(f"  lock waits, all busy    : {_waits(busy)} over {len(busy)} processes   (target max <= 1 s){missed}")
    print(f"  lock waits, all idle    : {_waits(idle)} over {len(idle)} processes")
