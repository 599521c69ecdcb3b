"""The `optimizer-pipeline` command line (docs/ARCHITECTURE.md, "Interfaces"): demo, ingest, export,
exclude, materialize, recommendation, status, model, whatif, outcome, ledger, live, simulate, daemon, worker, ui.
Bad input: one specific line on stderr, exit code 2, nothing partial written. Dagster is imported only
by the commands that run it.
"""

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

from optimizer_pipeline.contracts import ContractError, EvidenceSource, load_binding_file, parse_iso_utc
from optimizer_pipeline.launch import UserError, prepare_dagster_home, require_broker
from optimizer_pipeline.launch import solve_whatif as launch_whatif
from optimizer_pipeline.recommendation_text import demo_table, recommendation_text
from optimizer_pipeline.settings import dagster_home, disk_full, ledger_path, load_settings, resolve_home

if TYPE_CHECKING:  # the ledger pulls in pandas and duckdb (~0.5 s): imported by the commands that use it
    from optimizer_pipeline.ledger import Ledger

EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 1
DEMO_SEED = 1
JOBS = ("refresh", "recalibrate", "solve")


# ------------------------------------------------------------------ commands


def _existing_ledger(home: Path) -> "Ledger":
    """The home's ledger; a command that only reads refuses a home without one (a mistyped --home
    must not leave an empty ledger behind)."""
    from optimizer_pipeline.ledger import open_ledger

    if load_settings(home).ledger_url:
        return open_ledger(home)
    path = ledger_path(home)
    if not path.exists():
        raise UserError(f"no ledger at {path}: run `ingest` or `demo` with this --home first")
    return open_ledger(home)


def cmd_ingest(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.inbox import ingest_history  # the same code as the historian inbox
    from optimizer_pipeline.ledger import open_ledger

    spec = load_binding_file(args.binding_file)
    settings = load_settings(home)  # a broken settings file is refused before anything is read or written
    summary = ingest_history(lambda: open_ledger(home, settings), spec, args.history_file, args.source)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_export(args: argparse.Namespace, home: Path) -> int:
    """Write a binding's stored samples as a history file that `ingest` reads back unchanged."""
    from optimizer_pipeline.data.export import export_history

    ledger = _existing_ledger(home)
    stored = ledger.get_binding(args.binding_id)
    since, until = (_iso_option(name, getattr(args, name)) for name in ("since", "until"))
    if since and until and since > until:
        raise UserError(f"export: --since {args.since} is after --until {args.until}")
    summary = export_history(ledger.history_frame(stored.spec.id, stored.spec.tags), args.file, since, until,
                             f"export: binding {stored.spec.id!r}")
    print(json.dumps({"binding_id": stored.spec.id, "binding_revision": stored.revision, "file": str(args.file),
                      **summary, "tags": list(stored.spec.tags)}, indent=2))
    return 0


def _iso_option(name: str, text: str | None) -> datetime | None:
    """An ISO 8601 command-line option (naive = UTC), or a one-line error naming it."""
    try:
        return None if text is None else parse_iso_utc(text)
    except ValueError:
        raise UserError(f"--{name}: {text!r} is not an ISO 8601 timestamp (e.g. 2026-12-01T06:00:00)") from None


def cmd_exclude(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline import exclusions

    ledger = _existing_ledger(home)
    stored = ledger.get_binding(args.binding_id)
    if args.revoke:
        if args.start or args.end or args.tags:
            raise UserError("exclude --revoke ID takes only --reason (the exclusion it revokes names its slice)")
        print(json.dumps(exclusions.revoke(ledger, stored, args.revoke, args.reason), indent=2))
        return 0
    if not (args.start and args.end):
        raise UserError(f"exclude {args.binding_id}: --from and --to are required (or --revoke ID)")
    start, end = (_iso_option(name, text) for name, text in (("from", args.start), ("to", args.end)))
    print(json.dumps(exclusions.exclude(ledger, stored, start, end, args.tags or (), args.reason), indent=2))
    return 0


def cmd_materialize(args: argparse.Namespace, home: Path) -> int:
    ledger = _existing_ledger(home)
    if args.all == bool(args.binding_ids):
        raise UserError("materialize: give binding ids or --all, not both and not neither")
    binding_ids = [b.spec.id for b in ledger.list_bindings()] if args.all else list(dict.fromkeys(args.binding_ids))
    for binding_id in binding_ids:
        ledger.get_binding(binding_id)  # NotFoundError -> one line, before any run
    from optimizer_pipeline import automation  # Dagster: imported by the commands that run it

    results = automation.run_partitions(home, binding_ids, args.job, wait=not args.no_wait)
    if args.no_wait:
        print(json.dumps([{"binding_id": r.binding_id, "job": args.job, "dagster_run_id": r.dagster_run_id,
                           "submitted": True} for r in results], indent=2))
        return 0
    docs = []
    for run in results:
        rec = ledger.latest_recommendation(run.binding_id) if run.ok else None
        docs.append({"binding_id": run.binding_id, "job": args.job, "dagster_run_id": run.dagster_run_id,
                     "ok": run.ok, "error": run.detail or None,
                     "recommendation_id": rec and rec.id, "status": rec and rec.status.value})
    print(json.dumps(docs[0] if len(docs) == 1 and not args.all else docs, indent=2))
    failed = [f"{run.binding_id} ({run.detail})" for run in results if not run.ok]
    if failed:
        raise UserError(f"materialize: {len(failed)} of {len(results)} binding(s) failed: {'; '.join(failed)}")
    return 0


def cmd_recommendation(args: argparse.Namespace, home: Path) -> int:
    ledger = _existing_ledger(home)
    ledger.get_binding(args.binding_id)
    ledger.expire_past_valid_until()
    row = ledger.latest_recommendation(args.binding_id)
    if row is None:
        raise UserError(f"binding {args.binding_id!r} has no recommendation yet; run "
                        f"`optimizer-pipeline materialize {args.binding_id}`")
    doc = row.document()
    advice = ledger.live_advice(row)  # the live service's newer summarised publications: their advice is newer
    if advice is not None:
        doc["live_advice"] = advice
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(recommendation_text(doc, ledger.get_binding(args.binding_id, revision=doc["binding_revision"]).spec))
    return 0


def cmd_status(args: argparse.Namespace, home: Path) -> int:
    """Every binding's latest status, its age and first reason, worst first."""
    import shutil

    from optimizer_pipeline.contracts import utc_now
    from optimizer_pipeline.overview import overview_lines, overview_text

    ledger = _existing_ledger(home)
    ledger.expire_past_valid_until()
    lines = overview_lines(ledger.site_overview(), utc_now())
    print(json.dumps([line.to_json_dict() for line in lines], indent=2) if args.json
          else overview_text(lines, shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
    return 0


def cmd_model(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.model.step_response import step_response_table

    ledger = _existing_ledger(home)
    stored = ledger.get_binding(args.binding_id)
    artifact = ledger.latest_artifact(args.binding_id, stored.revision)
    if artifact is None:
        raise UserError(f"binding {args.binding_id!r} revision {stored.revision} has no model yet; run "
                        f"`optimizer-pipeline materialize {args.binding_id}`")
    if artifact.step_response is None:
        raise UserError(f"binding {args.binding_id!r}: model artifact {artifact.artifact_hash[:12]} was identified "
                        f"before step-response matrices were recorded; run "
                        f"`optimizer-pipeline materialize {args.binding_id} --job recalibrate`")
    doc = {"binding_id": artifact.binding_id, "binding_revision": artifact.binding_revision,
           "artifact_hash": artifact.artifact_hash, "step_response": dict(artifact.step_response)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"binding {artifact.binding_id}@r{artifact.binding_revision}  model artifact "
              f"{artifact.artifact_hash[:12]}: step-response matrix (unit steps, engineering units)\n")
        print(step_response_table(artifact.step_response))
    return 0


def cmd_whatif(args: argparse.Namespace, home: Path) -> int:
    """Solve the binding with overridden limits / targets / costs (in memory; the binding keeps its
    revision), record it as a what-if run and show it beside the binding's latest recommendation."""
    from optimizer_pipeline import whatif
    from optimizer_pipeline.contracts import utc_now
    from optimizer_pipeline.solver.errors import SolverError

    ledger = _existing_ledger(home)
    stored = ledger.get_binding(args.binding_id)
    overrides, _ = whatif.whatif_spec(stored.spec, args.set)  # refused here, before anything is read or started
    try:
        solved = launch_whatif(ledger, stored, overrides, load_settings(home), utc_now(), requested_by="cli")
    except SolverError as exc:  # the pool did not start (a failed solve is recorded, rejected)
        raise UserError(f"whatif: the solver pool did not start ({exc.code}: {exc.message})") from None
    except ValueError as exc:  # e.g. no live run in the stored history: nothing to start from
        raise UserError(f"whatif: {exc}") from None
    doc = whatif.comparison(ledger, solved.record)
    print(json.dumps(doc, indent=2) if args.json else whatif.side_by_side_text(doc))
    return 0


def cmd_outcome(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.outcomes import record_outcome, summary

    outcome = record_outcome(_existing_ledger(home), args.recommendation_id, args.observed_file, args.applied_at)
    print(json.dumps(summary(outcome), indent=2))
    return 0


def cmd_ledger(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.ledger_listing import listing_json, listing_text

    ledger = _existing_ledger(home)
    if args.binding:
        ledger.get_binding(args.binding)
    print(listing_json(ledger, args.binding) if args.json else listing_text(ledger, args.binding))
    return 0


def cmd_demo(args: argparse.Namespace, home: Path) -> int:
    from dataclasses import replace

    from optimizer_pipeline.ledger import open_ledger
    from optimizer_pipeline.plants import demo_plants

    ledger = open_ledger(home)
    plants = demo_plants()
    print(f"home {home}: seeding {len(plants)} demo plants (simulated history)")
    seeded = ledger.newest_samples()
    wirings = {b.spec.id: b.spec.opcua for b in ledger.list_bindings()}  # a demo spec has none: keep a user's
    for plant in plants:
        spec = replace(plant.spec, opcua=wirings[plant.spec.id]) if plant.spec.id in wirings else plant.spec
        if plant.spec.id in seeded:  # a second copy under later timestamps would count its data twice
            upsert = ledger.upsert_binding(spec)
            age = time.time() - seeded[plant.spec.id]
            print(f"  {plant.spec.id:<13} revision {upsert.revision}, already seeded (history ends {age / 60:.0f} min "
                  "ago: a fresh --home seeds a current live state)")
            continue
        upsert, rows = ledger.ingest(spec, plant.history(DEMO_SEED).frame, EvidenceSource.SIMULATION.value)
        print(f"  {plant.spec.id:<13} revision {upsert.revision}, {rows} new samples")
    print("materializing every asset of every binding through Dagster (job refresh) ...")
    from optimizer_pipeline import automation

    results = automation.run_partitions(home, [p.spec.id for p in plants])
    failed = [f"{run.binding_id} ({run.detail})" for run in results if not run.ok]
    latest = [ledger.latest_recommendation(run.binding_id) for run in results if run.ok]
    print(f"\n{demo_table([rec.document() for rec in latest if rec is not None], plants)}\n")
    exe = _command_name()
    print(f"Open the Dagster UI on this home:  {exe} --home {home} ui   (then http://127.0.0.1:3000)")
    print(f"One recommendation as JSON:         {exe} --home {home} recommendation {plants[0].spec.id} --json")
    if failed:
        print(f"error: {len(failed)} of {len(results)} binding(s) failed: " + "; ".join(failed), file=sys.stderr)
        return EXIT_RUN_FAILED
    return 0


def cmd_ui(args: argparse.Namespace, home: Path) -> int:
    """The Dagster webserver and daemon for the home, as `dagster dev` starts them (Dagster 1.13 marks
    it superseded by `dg dev`, for projects in its `dg` layout); the instance's storage is made first
    (the two would race to make it)."""
    from dagster import DagsterInstance

    from optimizer_pipeline.deployment import daemon_command, webserver_command
    from optimizer_pipeline.supervise import run_supervised

    prepare_dagster_home(home)
    DagsterInstance.get().dispose()
    print(f"Dagster UI for home {home} at http://{args.host}:{args.port}  (Ctrl-C stops it)", flush=True)
    return run_supervised([webserver_command(args.host, args.port), daemon_command()], os.environ)


def cmd_simulate(args: argparse.Namespace, home: Path) -> int:
    """A demo plant served over OPC UA until SIGTERM / SIGINT, its history and binding written first."""
    from optimizer_pipeline.plants import get_plant
    from optimizer_pipeline.plants.simulator import Simulation, run
    from optimizer_pipeline.validation import check_opc_endpoint

    if not args.speed > 0:
        raise UserError(f"simulate: --speed must be > 0, got {args.speed:g}")
    sim = Simulation(get_plant(args.plant), check_opc_endpoint(args.opcua, "--opcua"), args.speed, args.apply_advice)
    for line in sim.write_files(args.history, args.binding):
        print(line, flush=True)
    run(sim, on_ready=lambda: print(sim.describe(), flush=True))
    return 0


def cmd_daemon(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.deployment import daemon_command
    from optimizer_pipeline.supervise import run_supervised

    prepare_dagster_home(home)
    print(f"dagster-daemon for home {home} (queued runs, schedules, sensors, run monitoring)", flush=True)
    return run_supervised([daemon_command()], os.environ)


def cmd_live(args: argparse.Namespace, home: Path) -> int:
    import logging

    from dagster import DagsterInstance

    from optimizer_pipeline.assets.live_report import DagsterReporter
    from optimizer_pipeline.live.run import serve

    ledger, settings = _existing_ledger(home), load_settings(home)
    prepare_dagster_home(home)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("optimizer_pipeline.live").setLevel(logging.INFO)  # one line per publication
    logging.getLogger("asyncua").setLevel(logging.ERROR)  # live/opcua.py says what a user needs, once
    reporter = DagsterReporter(DagsterInstance.get(), settings.live_report_interval_s)
    ready = lambda service: print(f"live service {service.id} for home {home}: {len(service.served)} binding(s) "  # noqa: E731
                                  f"served (SIGTERM / Ctrl-C stops it)", flush=True)
    try:
        serve(home, ledger, settings, args.binding or None, reporter, on_ready=ready)
    finally:
        reporter.close()
    return 0


def cmd_worker(args: argparse.Namespace, home: Path) -> int:
    from optimizer_pipeline.deployment import WORKER_ENV, write_celery_config
    from optimizer_pipeline.supervise import run_supervised

    settings = load_settings(home)
    if settings.dagster_run_launcher != "celery":
        raise UserError(f"worker: home {home} has dagster.run_launcher {settings.dagster_run_launcher!r}; set "
                        f"dagster.run_launcher: celery, dagster.broker and dagster.postgres_url first")
    require_broker(settings)
    prepare_dagster_home(home)
    config_dir = write_celery_config(dagster_home(home), settings)
    name = args.name or f"optimizer-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(config_dir), os.environ.get("PYTHONPATH")])),
               **{WORKER_ENV: name})
    print(f"Celery worker {name} for home {home}, queue {args.queue}", flush=True)
    # -P solo: prefork children are daemonic and may not start the solver pool or the figure processes
    return run_supervised([[sys.executable, "-m", "celery", "-A", "dagster_celery.app", "worker", "-P", "solo",
                           "-Q", args.queue, "-n", f"{name}@%h", "--loglevel", "INFO"]], env,
                          on_death=lambda code: _fail_runs_of_dead_worker(settings, name, code))


def _fail_runs_of_dead_worker(settings: Any, name: str, code: int) -> None:
    from optimizer_pipeline.automation import fail_runs_of_dead_worker

    for run_id in fail_runs_of_dead_worker(settings.dagster_broker, name, code):
        print(f"run {run_id} reported failed: its worker {name} died", file=sys.stderr)


# ------------------------------------------------------------------ the command itself


def _command_name() -> str:
    """How the user can call this CLI again: the bare name when it is on PATH, else its path."""
    import shutil

    if shutil.which("optimizer-pipeline"):
        return "optimizer-pipeline"
    script = Path(sys.argv[0])
    return str(script) if script.name == "optimizer-pipeline" else f"{sys.executable} -m optimizer_pipeline.cli"


# ------------------------------------------------------------------ entry point


DESCRIPTION = ("Process-optimisation recommendations from plant history: each binding (a model linked to a "
               "plant's MVs, CVs and DVs) gets an identified model, calibrated evidence, a solved and "
               "independently verified plan, and a recommendation whose status (verified, unverified, rejected, "
               "expired) says how far it can be trusted. Everything is kept in the ledger of the home folder. "
               "Start with 'demo', then 'recommendation BINDING_ID'; README.md walks the rest.")


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's rule for a usage mistake: one `error: ...` line on stderr, exit code 2
    (argparse's own form is the usage text plus the message, three lines or more). Subcommand parsers
    are of this class too (add_subparsers makes them of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {text}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="optimizer-pipeline", description=DESCRIPTION)
    parser.add_argument("--home", help="home directory (default: $OPTIMIZER_HOME or ./.optimizer)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", help="seed the demo plants and materialize everything").set_defaults(func=cmd_demo)

    p = sub.add_parser("ingest", help="store a binding and append its history")
    p.add_argument("binding_file")
    p.add_argument("history_file")
    p.add_argument("--source", choices=(EvidenceSource.REAL.value, EvidenceSource.SIMULATION.value),
                   default=EvidenceSource.REAL.value,
                   help="where the history comes from (default: real plant data)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("export", help="write a binding's stored samples as a history file (CSV or Parquet by the "
                                      "file's extension) that ingest reads back unchanged")
    p.add_argument("binding_id")
    p.add_argument("file")
    p.add_argument("--since", metavar="ISO", help="only samples at or after this time (ISO 8601, naive = UTC)")
    p.add_argument("--until", metavar="ISO", help="only samples at or before this time (ISO 8601, naive = UTC)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("exclude", help="mark a slice of a binding's history bad (append-only; applied by the next "
                                       "recalibration), or --revoke an earlier exclusion")
    p.add_argument("binding_id")
    p.add_argument("--from", dest="start", metavar="ISO", help="first excluded time (ISO 8601, naive = UTC)")
    p.add_argument("--to", dest="end", metavar="ISO", help="end of the slice, not included (ISO 8601)")
    p.add_argument("--tags", nargs="+", metavar="TAG", help="only these tags (default: every tag of the binding)")
    p.add_argument("--revoke", metavar="EXCLUSION_ID", help="withdraw an exclusion instead")
    p.add_argument("--reason", required=True, help="why (kept with the record)")
    p.set_defaults(func=cmd_exclude)

    p = sub.add_parser("materialize", help="materialize the assets of binding partitions in process (one Dagster run "
                                           "for all of them); prints one JSON object, or a list for several / --all")
    p.add_argument("binding_ids", nargs="*", metavar="binding_id")
    p.add_argument("--all", action="store_true", help="every binding in the ledger")
    p.add_argument("--job", choices=JOBS, default="refresh")
    p.add_argument("--no-wait", action="store_true",
                   help="with dagster.run_launcher celery: return once the runs are submitted")
    p.set_defaults(func=cmd_materialize)

    p = sub.add_parser("recommendation", help="the latest recommendation of a binding")
    p.add_argument("binding_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_recommendation)

    p = sub.add_parser("status", help="every binding's latest status, how long ago it was last confirmed and its "
                                      "first reason, the bindings that need a look first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("model", help="the step-response matrix of a binding's latest model: gain, dead time and "
                                     "settling time per CV and input, condition number and RGA")
    p.add_argument("binding_id")
    p.add_argument("--json", action="store_true", help="the JSON record, responses and their standard errors included")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("outcome", help="record what the plant did after applying a recommendation; prints the verdict",
                       description="Record that a recommendation was applied and what the plant did; prints the "
                                   "verdict (confirmed / deviated / inconclusive) as JSON. OBSERVED_FILE has the "
                                   "history format (run_id, timestamp, every tag of the binding).")
    p.add_argument("recommendation_id")
    p.add_argument("observed_file")
    p.add_argument("--applied-at", metavar="ISO",
                   help="when the first move was made (ISO 8601, naive = UTC; default: the file's first timestamp)")
    p.set_defaults(func=cmd_outcome)

    p = sub.add_parser("whatif", help="solve a binding with overridden limits / targets / costs, beside its "
                                      "recommendation (recorded as a what-if run; the binding is not changed)",
                       description="Solve BINDING_ID with its model, calibration and live state and the overrides "
                                   "applied in memory only (no new revision; the open recommendation stays open and "
                                   "latest); recorded as a what-if run and shown beside the recommendation.")
    p.add_argument("binding_id")
    p.add_argument("--set", action="append", required=True, metavar="PATH=VALUE",
                   help="an override: mvs.<tag>.{lo,hi,max_move,cost,cost_quadratic}, "
                        "cvs.<tag>.{lo,hi,target,weight,cost,cost_quadratic} (target=none: no target) or "
                        "profile.{horizon,move_weight}; repeat for several")
    p.add_argument("--json", action="store_true", help="both sides as JSON")
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("ledger", help="runs, what-ifs, candidates, recommendations, outcomes")
    p.add_argument("--binding")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger)

    p = sub.add_parser("live", help="the resident re-solve service: re-solves each binding within milliseconds of its "
                                    "new samples (inbox, ingest), publishes in the ledger and reports to Dagster")
    p.add_argument("--binding", action="append", help="serve only this binding (repeatable; default: every binding)")
    p.set_defaults(func=cmd_live)

    p = sub.add_parser("simulate", help="serve a demo plant over OPC UA in real time (its MVs, CVs, DVs, advisory "
                                        "and status nodes), for trying the live service")
    p.add_argument("plant", help="tanks, heater, blend or blend-econ")
    p.add_argument("--opcua", required=True, metavar="ENDPOINT", help="opc.tcp://host:port/path to serve at")
    p.add_argument("--speed", type=float, default=1.0, help="times real time (default 1)")
    p.add_argument("--apply-advice", action="store_true", help="the MVs follow a verified advice (closes the loop)")
    p.add_argument("--history", metavar="FILE", help="first write a history to identify from (.csv / .parquet)")
    p.add_argument("--binding", metavar="FILE", help="first write the plant's binding, wired to this server (YAML)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("daemon", help="several hosts: dagster-daemon for this home (runs stay queued without it)")
    p.set_defaults(func=cmd_daemon)

    p = sub.add_parser("worker", help="several hosts: a Celery worker (-P solo) running this home's runs")
    p.add_argument("--name", help="the worker's node name (default optimizer-<pid>)")
    p.add_argument("--queue", default="dagster", help="the Celery queue of run tasks (default dagster)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("ui", help="start the Dagster UI (webserver and daemon) for this home")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    home = resolve_home(args.home)
    from optimizer_pipeline.ledger import LedgerError

    try:
        return args.func(args, home)
    except (ContractError, LedgerError, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:  # the home cannot be created or written (a file, no permission, full disk)
        if disk_full(exc, home):
            print(f"error: the filesystem under {home} is full (no space left on device); free space and run "
                  f"the command again", file=sys.stderr)
            return EXIT_USER_ERROR
        print(f"error: home {home}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # noqa: BLE001 - a full filesystem surfaces as the library's own error
        if not disk_full(exc, home):
            raise
        print(f"error: the filesystem under {home} is full (no space left on device); free space and run "
              f"the command again (the ledger keeps only whole transactions)", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
