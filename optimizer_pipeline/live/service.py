"""The resident live service (`optimizer-pipeline live`): re-solves each binding it serves whenever
new samples of it are stored, with the model and calibration it keeps warm, through the same
solve-and-decide as a Dagster solve, and publishes the recommendations in the ledger.

One loop with explicit states (STARTING -> SERVING -> STOPPING -> STOPPED), a heartbeat row in the
ledger (`live_services`: the sensors leave the bindings of a live service to it, the UI shows
whether it is alive), a clean stop, one INFO line per publication. Per tick of the loop:

1. every HEARTBEAT_S: the heartbeat; the leases (which bindings this service serves: its share of
   the bindings among the live services alive, renewed, rebalanced, expired ones of a dead service
   taken over); the bindings' model fingerprints (ledger.live_rows.Fingerprint): a changed one (new
   revision, artifact, calibration, split or verdict) is read again, without a restart;
2. the sources store what arrived (live/sources.py) and name the bindings with new samples; each
   reads them into its live window (live/served.py);
3. a binding with unsolved samples and no solve in flight is re-solved on one of the solver
   pool's threads (at most one solve in flight per binding: samples that arrive meanwhile are
   coalesced into its next solve);
4. the solves that finished are published together, at most every PUBLISH_S, in ONE ledger
   transaction (Ledger.publish_live:
   each under its publication key), then handed to the reporter (Dagster, in the CLI).

All ledger calls run on the loop's thread; the solve threads compute and call the pool only. A
stop (SIGTERM / SIGINT) takes no new work, waits for the solves in flight and publishes them (or,
past STOP_GRACE_S, abandons them: nothing of them is written), stops the pool and marks the row
stopped.
"""

import logging
import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Protocol, Sequence

from optimizer_pipeline import pipeline
from optimizer_pipeline.contracts import BindingSpec, HistorySplit, SolveResult, utc_now
from optimizer_pipeline.ledger import Ledger, LedgerError, NotFoundError, Publication, new_id
from optimizer_pipeline.ledger.live_rows import Fingerprint
from optimizer_pipeline.data.prepare import with_live_run
from optimizer_pipeline.live.served import Served, load, resolve
from optimizer_pipeline.live.sources import SampleSource
from optimizer_pipeline.settings import Settings

log = logging.getLogger(__name__)

# while the loop has work it keeps the ledger through pauses up to KEEP_S (a longer one ends its session),
# looking every TICK_S whether another process waits for it
KEEP_S = 0.25
TICK_S = 0.05
# finished solves are published together at most this often: one ledger transaction for all of them (at
# ~17 re-solves a second, one per solve cost the embedded ledger a commit each); a publication waits for
# the next batch at most this long
PUBLISH_S = 0.2
HOLD_S = 1.0  # the longest the loop keeps the ledger while it has work (LiveService._work)
HAND_OVER_MAX_S = 2.0  # the longest the loop lets waiting processes go first after a stretch of work
# how often the service touches its row, renews (and rebalances) its leases and compares the bindings'
# model fingerprints
HEARTBEAT_S = 5.0
LEASE_S = 3 * HEARTBEAT_S  # a lease not renewed for this long is free: another service (or the sensors) takes over
HEARTBEAT_STALE_S = 6 * HEARTBEAT_S  # the UI calls a service dead when its heartbeat is this old
STOP_GRACE_S = 30.0  # how long a stop waits for the solves in flight
MAX_BACKOFF_S = 10.0  # the longest pause between two tries of an unavailable ledger


class State(str, Enum):
    STARTING = "starting"
    SERVING = "serving"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Published:
    """One publication, as the reporter gets it: the service that published it, the binding as
    served, the solve, the split it was solved from, the run it was written as (whole) or follows
    (summarised; None: another service had published those samples), the latency from the samples'
    arrival to the commit (s), and whether its status differs from the binding's recommendation before
    it (a restart compares with the ledger's latest)."""

    service_id: str
    served: Served
    solved: pipeline.Solved
    split: HistorySplit
    run_id: str | None
    whole: bool
    latency_s: float
    status_changed: bool


@dataclass(frozen=True)
class _Latest:
    """A binding's latest recommendation as the service knows it: the status a publication is compared
    with and, when this service wrote it, what a publication may be summarised against
    (LiveService._follows)."""

    rec_id: str
    status: str
    revision: int
    calibration_id: str | None
    created: float  # s since epoch
    ours: bool  # written whole by this service (a service's first publication of a binding is whole)


class Reporter(Protocol):
    """Where publications go besides the ledger (the Dagster instance, in the CLI)."""

    def report(self, published: Sequence[Published]) -> None:
        ...


class _NeedsFullSplit(Exception):
    """Cleaning the live window left no piece of the run: prepare the whole history (loop thread)."""


class LiveService:
    """The loop of the module docstring, over `ledger` for `bindings` (None: every binding stored)."""

    def __init__(self, ledger: Ledger, settings: Settings, solve: Callable, sources: Sequence[SampleSource], *,
                 bindings: Sequence[str] | None = None, reporter: Reporter | None = None, threads: int = 2):
        self.ledger, self.settings, self.solve = ledger, settings, solve
        self.sources, self.reporter = list(sources), reporter
        self.wanted = None if bindings is None else set(bindings)
        self.id = new_id("live")
        self.state = State.STARTING
        self.served: dict[str, Served] = {}
        self.unservable: dict[str, str] = {}  # binding -> why it cannot be served (logged once)
        # binding -> the fingerprint its inputs were missing at (tried again when it changes)
        self._missing_at: dict[str, Fingerprint] = {}
        # served bindings whose window or last solve changed since the loop last found them solved: only
        # they can want a solve (the loop asks on every wake-up; asking all of 100 bindings cost ~1 ms)
        self._unsolved: set[str] = set()
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="live-solve")
        self._in_flight: dict[str, tuple[Future, float]] = {}  # binding -> (solve, arrival time)
        self._arrived: dict[str, float] = {}  # binding -> monotonic time its unsolved samples were noticed
        self._dirty: set[str] = set()  # bindings with stored samples to read from the ledger into their window
        self._pending: dict[str, list] = {}  # binding -> frames a source stored, not yet in its window (solving)
        # solved, not yet written (the ledger failed): (served, publication, solve, split, arrival time)
        self._unpublished: list[tuple[Served, Publication, pipeline.Solved, HistorySplit, float]] = []
        self._next_heartbeat = 0.0
        self._next_publish = 0.0  # monotonic: when finished solves may be published next (PUBLISH_S)
        self.held: set[str] = set()  # the bindings whose lease this service holds
        self._latest: dict[str, _Latest] = {}  # binding -> its latest recommendation (ledger, then published)
        self._fingerprint_cache: dict[str, Fingerprint] = {}
        self._models: str | None = None  # the models stamp the cache was read at (None: not read)
        self.published = 0

    def ingests(self, binding_id: str) -> bool:
        """Whether this service takes the inbox files of a binding in its home: any binding when it was
        given none (the samples go to the ledger, where the service holding the lease finds them; an
        unknown binding's file is refused, moved aside with its reason), else the ones it was given."""
        return self.wanted is None or binding_id in self.wanted

    def spec_of(self, binding_id: str) -> BindingSpec | None:
        """The binding's spec: the one served, else the ledger's (None: not in the ledger)."""
        served = self.served.get(binding_id)
        if served is not None:
            return served.stored.spec
        try:
            return self.ledger.get_binding(binding_id).spec
        except NotFoundError:
            return None

    def request_stop(self) -> None:
        """Stop taking work (safe from a signal handler)."""
        self._stop.set()

    # ------------------------------------------------------------------ the loop

    def run(self, until: Callable[[], bool] | None = None,
            on_serving: Callable[["LiveService"], None] | None = None) -> None:
        """Serve until a stop is requested (or `until()` holds), then stop cleanly; `on_serving` is
        called once the bindings are loaded. Between two stretches of work the loop sleeps until its
        next event (a solve finishing, a source's next poll, the next publication or heartbeat)."""
        self.ledger.live_register(self.id, socket.gethostname(), os.getpid(),
                                  None if self.wanted is None else sorted(self.wanted))
        try:
            with self.ledger.session():  # the bindings' first load: one connection (DuckDB: one lock)
                self._heartbeat()
            self._set_state(State.SERVING)
            log.info("live %s: serving %d binding(s): %s", self.id, len(self.served), ", ".join(sorted(self.served)))
            if on_serving is not None:
                on_serving(self)
            backoff = 0.0
            while not self._stop.is_set() and not (until is not None and until()):
                try:
                    self._work()
                    backoff = 0.0
                except LedgerError as exc:  # unreachable or busy: retried; nothing solved is dropped
                    backoff = min(MAX_BACKOFF_S, max(TICK_S, 2 * backoff))
                    log.warning("live %s: the ledger failed (%s); retrying in %.1f s", self.id,
                                str(exc).splitlines()[0], backoff)
                    self._stop.wait(backoff)
                    continue
                self._sleep(self._next_event() - time.monotonic())
        finally:
            self._shutdown()

    def _work(self) -> None:
        """The ticks that have work now, in ONE ledger session (DuckDB: one connection and its lock,
        instead of an open, a checkpoint and a close per tick) for up to HOLD_S, through pauses of up
        to KEEP_S while solves are in flight (slept in pieces of at most TICK_S). The session lets the
        ledger go after any call when another process waits for it (ledger/duckdb_backend.py), and the
        stretch ends then; that process gets the ledger before the next stretch (Ledger.hand_over): no
        process waits longer than one ledger call of this loop plus its own poll (RELIABILITY.md)."""
        if self._next_event() > time.monotonic():
            return
        end = time.monotonic() + HOLD_S
        with self.ledger.session():
            while not self._stop.is_set() and time.monotonic() < end and not self.ledger.others_waiting():
                pause = self._next_event() - time.monotonic()
                if pause <= 0:
                    self.tick()
                elif pause > KEEP_S or not (self._in_flight or self._unpublished):
                    break  # (nothing in flight: no work comes before the next event, slept outside)
                else:
                    self._sleep(min(pause, TICK_S))
        self.ledger.hand_over(HAND_OVER_MAX_S)

    def _next_event(self) -> float:
        """When the loop has work next (monotonic s): now while a binding not in flight has samples to
        read or a solve to start; else the first of the sources' next polls, the heartbeat and, when a
        solve finished (or a publication waits for the ledger), the next publication. A binding whose
        solve is in flight waits, parked, for its solve: its samples go into its next one."""
        now_m = time.monotonic()
        if (self._dirty | set(self._pending)) - set(self._in_flight) or self._wanting():
            return now_m
        events = [self._next_heartbeat, *(source.due_at() for source in self.sources)]
        if self._unpublished or any(future.done() for future, _ in self._in_flight.values()):
            events.append(self._next_publish)
        return min(events)

    def _sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, woken early by a stop or by a solve finishing."""
        if seconds <= 0:
            return
        running = [future for future, _ in self._in_flight.values() if not future.done()]
        if running:
            wait(running, timeout=seconds, return_when=FIRST_COMPLETED)
        else:
            self._stop.wait(seconds)

    def tick(self) -> bool:
        """One pass of the loop; True when it opened the ledger (there was something to read or write:
        a source's poll, samples of a binding not in flight, a solve to start or publish, the heartbeat).
        The ledger is opened (for DuckDB: its lock taken) only then."""
        now_m = time.monotonic()
        due = [source for source in self.sources if source.ready(now_m)]
        done = now_m >= self._next_publish and (any(future.done() for future, _ in self._in_flight.values())
                                                or bool(self._unpublished))
        actionable = (self._dirty | set(self._pending)) - set(self._in_flight)
        if not (due or done or actionable or self._wanting() or now_m >= self._next_heartbeat):
            return False
        with self.ledger.session():
            if now_m >= self._next_heartbeat:
                self._heartbeat()
            for source in due:
                for binding_id, arrived in source.poll(self.ledger).items():
                    served = self.served.get(binding_id)
                    if served is None:
                        continue
                    if isinstance(arrived, list):  # stored by the source: straight into the window
                        self._pending.setdefault(binding_id, []).extend(arrived)
                    elif served.newest_t is None or arrived > served.newest_t:
                        self._dirty.add(binding_id)
            for binding_id in sorted((self._dirty | set(self._pending)) - set(self._in_flight)):
                served = self.served.get(binding_id)
                frames = self._pending.pop(binding_id, [])
                if served is None:  # no longer served (its lease went to another service)
                    self._dirty.discard(binding_id)
                    continue
                added = served.add(frames) if frames else 0
                if binding_id in self._dirty:
                    self._dirty.discard(binding_id)
                    added += served.extend(self.ledger)
                if added:
                    self._arrived.setdefault(binding_id, now_m)
                    self._unsolved.add(binding_id)
            for binding_id in self._wanting():
                self._submit(self.served[binding_id], None)
            if done:
                self._next_publish = now_m + PUBLISH_S
                self._publish_done()
        return True

    def _wanting(self) -> list[str]:
        """The served bindings not in flight with samples newer than their last solve (Served.wants_solve);
        the others leave `_unsolved`."""
        wanting = []
        for binding_id in sorted(self._unsolved):
            served = self.served.get(binding_id)
            if served is None or not served.wants_solve():
                self._unsolved.discard(binding_id)
            elif binding_id not in self._in_flight:
                wanting.append(binding_id)
        return wanting

    def _submit(self, served: Served, split: HistorySplit | None) -> None:
        arrived = self._arrived.pop(served.binding_id, time.monotonic())
        served.solved_t = served.newest_t  # what this solve covers: later samples make the next one
        future = self._executor.submit(self._resolve, served, split, utc_now())
        self._in_flight[served.binding_id] = (future, arrived)

    def _resolve(self, served: Served, split: HistorySplit | None, now) -> tuple[Publication, pipeline.Solved,
                                                                                    HistorySplit]:
        """On a solve thread: the live split (cleaned from the window) and the re-solve."""
        if split is None:
            split = with_live_run(served.split, served.window, served.stored.spec)
            if split is None:
                raise _NeedsFullSplit()
        solve = lambda problem: SolveResult.from_dict(self.solve(problem))  # noqa: E731
        publication, solved = resolve(served, split, solve, self.settings, now)
        return publication, solved, split

    def _publish_done(self, wait_s: float = 0.0) -> bool:
        """Publish every finished solve in one transaction (after waiting up to `wait_s` for those in
        flight); True when there was one."""
        if wait_s > 0 and self._in_flight:
            wait([f for f, _ in self._in_flight.values()], timeout=wait_s)
        done = [(b, f, t) for b, (f, t) in self._in_flight.items() if f.done()]
        if not done and not self._unpublished:
            return False
        ready, self._unpublished = self._unpublished, []
        for binding_id, future, arrived in done:
            del self._in_flight[binding_id]
            served = self.served.get(binding_id)
            try:
                publication, solved, split = future.result()
            except _NeedsFullSplit:
                if served is not None:
                    try:
                        split = pipeline.current_split(self.ledger, served.stored)
                    except Exception as exc:  # noqa: BLE001 - as a failed solve of this binding
                        self._record_failure(binding_id, served, exc)
                        continue
                    self._arrived[binding_id] = arrived
                    self._submit(served, split)
                continue
            except Exception as exc:  # noqa: BLE001 - recorded for the binding, the others go on
                self._record_failure(binding_id, served, exc)
                continue
            if served is not None:
                ready.append((served, publication, solved, split, arrived))
        if ready:
            now = time.time()
            try:
                written = self.ledger.publish_live(
                    self.id, [replace(p, follows=self._follows(s, p, now)) for s, p, _, _, _ in ready])
            except LedgerError:
                self._unpublished = ready  # written with the next batch, once the ledger is back
                raise
            end = time.monotonic()
            published = []
            for (served, publication, solved, split, arrived), done in zip(ready, written):
                rec = solved.decision.recommendation
                latest = self._latest.get(served.binding_id)
                changed = latest is None or latest.status != rec.status.value
                if done is not None and done.whole:
                    self._latest[served.binding_id] = _Latest(rec.id, rec.status.value, rec.binding_revision,
                                                              publication.calibration_id, now, True)
                published.append(Published(self.id, served, solved, split, None if done is None else done.run_id,
                                           done is not None and done.whole, end - arrived, changed))
            for item in published:
                self._log(item)
            if self.reporter is not None:
                self.reporter.report([p for p in published if p.run_id is not None])
        return True

    def _follows(self, served: Served, publication: Publication, now: float) -> str | None:
        """The recommendation `publication` may be summarised against: the binding's latest, when this
        service wrote it whole with the same status, revision and calibration, younger than
        `live.whole_every_s` and 0.9 x the binding's valid_for_s (so a served binding's open
        recommendation never lapses); the ledger still checks that it is open (LiveRows.publish_live)."""
        latest = self._latest.get(served.binding_id)
        rec = publication.recommendation
        if latest is None or not latest.ours or (latest.status, latest.revision, latest.calibration_id) != \
                (rec.status.value, rec.binding_revision, publication.calibration_id):
            return None
        whole_every_s = min(self.settings.live_whole_every_s, 0.9 * served.stored.spec.profile.valid_for_s)
        return latest.rec_id if now - latest.created < whole_every_s else None

    def _log(self, item: Published) -> None:
        rec = item.solved.decision.recommendation
        if item.run_id is None:
            log.info("binding %s: samples up to t=%.3f already published by another service", item.served.binding_id,
                     item.served.solved_t)
            return
        self.published += 1
        log.info("binding %s: %s %s%s, latency %.0f ms%s", item.served.binding_id, rec.id, rec.status.value,
                 "" if item.whole else f" (summarised, follows run {item.run_id})", item.latency_s * 1000,
                 "" if not rec.reasons else f" ({rec.reasons[0]})")

    def _record_failure(self, binding_id: str, served: Served | None, exc: Exception) -> None:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("binding %s: re-solve failed: %s", binding_id, message)
        try:
            self.ledger.record_failure(binding_id, None if served is None else served.stored.revision,
                                       "recommendation", type(exc).__name__, f"live {self.id}: {message}")
        except LedgerError as ledger_exc:
            log.warning("binding %s: the failure could not be recorded: %s", binding_id, ledger_exc)

    # ------------------------------------------------------------------ bindings and their models

    def _heartbeat(self) -> None:
        """The heartbeat, the leases, and the bindings whose model fingerprint changed read again."""
        self._next_heartbeat = time.monotonic() + HEARTBEAT_S
        self.ledger.live_heartbeat(self.id, self.state.value)
        fingerprints = self._fingerprints()
        self._lease([b for b in sorted(fingerprints) if self.wanted is None or b in self.wanted])
        for binding_id in sorted(self.held):
            if binding_id in self._in_flight:
                continue
            fingerprint, current = fingerprints[binding_id], self.served.get(binding_id)
            if (current is not None and current.fingerprint == fingerprint) or \
                    self._missing_at.get(binding_id) == fingerprint:
                continue
            try:
                with self.ledger.session():
                    served = load(self.ledger, binding_id, fingerprint, self.settings, utc_now())
            except (pipeline.MissingInputError, LedgerError) as exc:
                if isinstance(exc, pipeline.MissingInputError):  # a new fingerprint may bring them
                    self._missing_at[binding_id] = fingerprint
                reason = str(exc).splitlines()[0]
                if self.unservable.get(binding_id) != reason:
                    log.warning("binding %s: not served yet: %s", binding_id, reason)
                self.unservable[binding_id] = reason
                self.served.pop(binding_id, None)
                continue
            self.unservable.pop(binding_id, None)
            self._missing_at.pop(binding_id, None)
            self._unsolved.add(binding_id)
            if current is not None:
                served.solved_t = current.solved_t
                if fingerprint.calibration_id != current.fingerprint.calibration_id or \
                        fingerprint.revision != current.fingerprint.revision:
                    served.solved_t = None  # a recalibration (or a new revision) ends with a re-solve
                log.info("binding %s: model inputs read again (revision %d, calibration %s)", binding_id,
                         fingerprint.revision, fingerprint.calibration_id)
            else:
                served.solved_t = self._solved_from(binding_id, fingerprint)
            self.served[binding_id] = served
        for binding_id in [b for b in self.served if b not in self.held and b not in self._in_flight]:
            del self.served[binding_id]
        if self.wanted is not None:
            for binding_id in sorted(self.wanted - set(fingerprints)):
                if binding_id not in self.unservable:
                    log.warning("binding %s: not in the ledger; served once it is ingested", binding_id)
                    self.unservable[binding_id] = "not in the ledger"

    def _fingerprints(self) -> dict[str, Fingerprint]:
        """Every binding's fingerprint: read again only when the ledger's models stamp changed (read
        before the query: a write after it changes the stamp again); ~70 ms for 100 bindings."""
        stamp = self.ledger.models_stamp()
        if stamp is None or self._models != stamp:
            self._fingerprint_cache, self._models = self.ledger.fingerprints(), stamp
        return self._fingerprint_cache

    def _lease(self, candidates: list[str]) -> None:
        """Renew this service's leases and hold its share of `candidates`: all of them when it was
        given a list (--binding), else ceil(len / the live services alive), taking free leases (none,
        or expired: a dead service's) and giving up the ones over its share (not while solving)."""
        leases = self.ledger.live_leases()
        mine = sorted(b for b, owner in leases.items() if owner == self.id and b in candidates)
        alive = max(1, len(self.ledger.live_services(alive_within_s=LEASE_S)))
        share = len(candidates) if self.wanted is not None else -(-len(candidates) // alive)
        over = [b for b in reversed(mine) if b not in self._in_flight][:max(0, len(mine) - share)]
        free = [b for b in candidates if b not in leases][:max(0, share - len(mine))]
        held = self.ledger.live_lease(self.id, take=free, keep=[b for b in mine if b not in over], release=over,
                                      ttl_s=LEASE_S)
        gained, lost = held - self.held, self.held - held
        if gained or lost:
            log.info("live %s: serving %d binding(s)%s%s", self.id, len(held),
                     f", took {', '.join(sorted(gained))}" if gained else "",
                     f", gave up {', '.join(sorted(lost))}" if lost else "")
        self.held = held

    def _solved_from(self, binding_id: str, fingerprint: Fingerprint) -> float | None:
        """The newest sample the binding's current revision and calibration were solved from, by a
        live publication (whole or summarised) or the latest recommendation (a restart does not solve
        the same samples again); the latest recommendation is remembered (_latest)."""
        rec = self.ledger.latest_recommendation(binding_id)
        if rec is None:
            return None
        context = self.ledger.get_run(rec.run_id).context
        created = rec.created_at
        self._latest[binding_id] = _Latest(rec.id, rec.status.value, rec.binding_revision,
                                           context.get("calibration_id"), created.timestamp(), False)
        solved = [self.ledger.live_published_up_to(binding_id, fingerprint.revision, fingerprint.calibration_id,
                                                   created)]
        if rec.binding_revision == fingerprint.revision and context.get("calibration_id") == fingerprint.calibration_id:
            solved.append(context.get("live_t"))
        return max((float(t) for t in solved if t is not None), default=None)

    # ------------------------------------------------------------------ states

    def _set_state(self, state: State) -> None:
        self.state = state
        self.ledger.live_heartbeat(self.id, state.value)

    def _shutdown(self) -> None:
        """Publish what is in flight (up to STOP_GRACE_S), give the leases up, mark the row stopped; with
        the ledger unavailable, what could not be written is abandoned (nothing of it is written) and
        the leases expire by themselves."""
        try:
            self._set_state(State.STOPPING)
            if self._in_flight or self._unpublished:
                self._publish_done(wait_s=STOP_GRACE_S)
        except LedgerError as exc:
            log.warning("live %s: the ledger failed while stopping (%s)", self.id, str(exc).splitlines()[0])
        abandoned = len(self._in_flight) + len(self._unpublished)
        if abandoned:
            log.warning("live %s: %d solve(s) abandoned at stop (nothing of them written)", self.id, abandoned)
        self._executor.shutdown(wait=False, cancel_futures=True)
        try:
            self.ledger.live_lease(self.id, take=[], keep=[], release=sorted(self.held), ttl_s=LEASE_S)
            self.held = set()
            self._set_state(State.STOPPED)
        except LedgerError as exc:
            log.warning("live %s: could not mark itself stopped (%s)", self.id, str(exc).splitlines()[0])
        log.info("live %s: stopped after %d publication(s)", self.id, self.published)
