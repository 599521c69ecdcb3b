"""The ledger's rows of the resident live service (a mixin of Ledger): its heartbeat, the samples it
polls for, and its publications, several per transaction, each under a unique publication key
(docs/ARCHITECTURE.md, "The live service")."""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, NamedTuple, Sequence

import orjson
import pandas as pd

from optimizer_pipeline.contracts import Recommendation, SolveCandidate, iso_from_seconds, iso_utc
from optimizer_pipeline.ledger.base import LedgerBase
from optimizer_pipeline.ledger.records import NewRun, RecommendationRecord, naive, naive_now
from optimizer_pipeline.ledger.writes import retried

SERVICE_STATES = ("starting", "serving", "stopping", "stopped")


@dataclass(frozen=True)
class Publication:
    """One re-solve by the live service, ready to write: its key (binding, revision, calibration, the
    newest sample solved from) and what `Ledger.record_solve` writes of it."""

    binding_id: str
    binding_revision: int
    calibration_id: str
    live_t: float  # s since epoch
    run: NewRun
    candidates: Sequence[SolveCandidate]
    model_id: str
    recommendation: Recommendation
    run_status: str
    independent_cost: float | None
    diagnostics: Mapping[str, Any]
    evidence_source: str
    # the recommendation this one may be summarised against (LiveRows.publish_live): the binding's
    # latest, when the service judged it current (same status, revision and calibration, young enough)
    follows: str | None = None


class Written(NamedTuple):
    """What publish_live wrote of a publication: the run it is (whole) or follows (summarised)."""

    run_id: str
    whole: bool


@dataclass(frozen=True)
class LivePublication:
    """A live_publications row: the publication's key, the run it is or follows, who published it
    when, and what it said (status, reasons, advice: MV -> the value to set now; cost)."""

    binding_id: str
    binding_revision: int
    calibration_id: str
    live_t: float
    run_id: str
    service_id: str
    published_at: datetime
    whole: bool
    status: str | None
    reasons: tuple[str, ...]
    advice: Mapping[str, float]
    cost: float | None


@dataclass(frozen=True)
class Fingerprint:
    """What a binding's model inputs are now: its revision and, of that revision, the newest artifact,
    calibration and split, and how many outcomes have a verdict. A change means: read them again."""

    revision: int
    artifact_hash: str | None
    calibration_id: str | None
    split_id: str | None
    verdicts: int


@dataclass(frozen=True)
class LiveService:
    """A live service's row: who it is, what it serves (None: every binding), its state and heartbeat."""

    id: str
    host: str
    pid: int
    bindings: tuple[str, ...] | None
    state: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None

    def serves(self, binding_id: str) -> bool:
        return self.bindings is None or binding_id in self.bindings


class LiveRows(LedgerBase):
    """Part of Ledger."""

    # ------------------------------------------------------------------ the service's row

    @retried
    def live_register(self, service_id: str, host: str, pid: int, bindings: Sequence[str] | None) -> None:
        now = naive_now()
        with self.backend.transaction() as tx:
            tx.execute("INSERT INTO live_services VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [service_id, host, pid, json.dumps(None if bindings is None else sorted(bindings)),
                        "starting", now, now, None])

    @retried
    def live_heartbeat(self, service_id: str, state: str) -> None:
        """The service is alive now, in `state` (stopped: with its stop time)."""
        if state not in SERVICE_STATES:
            raise ValueError(f"live service state must be one of {', '.join(SERVICE_STATES)}, got {state!r}")
        now = naive_now()
        with self.backend.transaction() as tx:
            tx.execute("UPDATE live_services SET state = ?, heartbeat_at = ?, stopped_at = ? WHERE id = ?",
                       [state, now, now if state == "stopped" else None, service_id])

    def live_services(self, alive_within_s: float | None = None, now: datetime | None = None) -> list[LiveService]:
        """Every live service's row, newest first; with `alive_within_s` only those not stopped whose
        heartbeat is at most that old."""
        sql, params = "SELECT * FROM live_services", []
        if alive_within_s is not None:
            sql += " WHERE state <> 'stopped' AND heartbeat_at >= ?"
            params.append(naive(now) - timedelta(seconds=alive_within_s) if now else
                          naive_now() - timedelta(seconds=alive_within_s))
        with self.backend.connection() as conn:
            columns, rows = self.backend.fetch(conn, sql + " ORDER BY started_at DESC, id", params)
        services = []
        for row in rows:
            doc = dict(zip(columns, row))
            bindings = json.loads(doc["bindings_json"])
            services.append(LiveService(doc["id"], doc["host"], int(doc["pid"]),
                                        None if bindings is None else tuple(bindings), doc["state"],
                                        doc["started_at"], doc["heartbeat_at"], doc["stopped_at"]))
        return services

    def fingerprints(self) -> dict[str, Fingerprint]:
        """Every binding's Fingerprint, in one query."""
        sql = """WITH rev AS (SELECT binding_id, max(revision) AS revision FROM binding_revisions GROUP BY binding_id)
            SELECT r.binding_id, r.revision,
                (SELECT artifact_hash FROM model_artifacts a WHERE a.binding_id = r.binding_id
                    AND a.binding_revision = r.revision ORDER BY created_at DESC LIMIT 1),
                (SELECT id FROM uq_calibrations c WHERE c.binding_id = r.binding_id
                    AND c.binding_revision = r.revision ORDER BY calibrated_at DESC, id DESC LIMIT 1),
                (SELECT id FROM history_splits s WHERE s.binding_id = r.binding_id
                    AND s.binding_revision = r.revision ORDER BY created_at DESC, id DESC LIMIT 1),
                (SELECT count(*) FROM optimizer_outcomes o WHERE o.binding_id = r.binding_id AND o.verdict IS NOT NULL)
            FROM rev r"""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, sql)
        return {row[0]: Fingerprint(int(row[1]), row[2], row[3], row[4], int(row[5])) for row in rows}

    # ------------------------------------------------------------------ leases

    def live_leases(self, now: datetime | None = None) -> dict[str, str]:
        """The bindings served now: binding -> the service whose lease on it has not expired."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT binding_id, service_id FROM live_leases WHERE expires_at > ?",
                                         [naive(now) if now else naive_now()])
        return {binding_id: service_id for binding_id, service_id in rows}

    @retried
    def live_lease(self, service_id: str, *, take: Sequence[str], keep: Sequence[str], release: Sequence[str],
                   ttl_s: float) -> set[str]:
        """In one transaction: renew this service's leases on `keep`, give up those on `release`, and
        take the leases of `take` that are free (none, or expired); returns the bindings it holds
        after it. A lease another service holds is never taken: two services racing for a free one,
        one gets it (PostgreSQL: the row lock and the primary key; DuckDB: the file lock)."""
        now = naive_now()
        until = now + timedelta(seconds=ttl_s)
        with self.backend.transaction() as tx:
            # a statement per kind, not per binding (the bindings one list parameter): renewing 100 leases
            # one UPDATE each held the embedded ledger ~0.5 s per heartbeat
            renew = "UPDATE live_leases SET expires_at = ? WHERE service_id = ? AND binding_id = ANY(CAST(? AS VARCHAR[]))"
            if keep:
                self.backend.changed(tx, renew, [until, service_id, list(keep)])
            if release:
                self.backend.changed(tx, renew, [now, service_id, list(release)])
            if take:
                self.backend.changed(tx, "UPDATE live_leases SET service_id = ?, expires_at = ? WHERE binding_id = "
                                         "ANY(CAST(? AS VARCHAR[])) AND (expires_at <= ? OR service_id = ?)",
                                     [service_id, until, list(take), now, service_id])
                self.backend.changed(tx, "INSERT INTO live_leases SELECT unnest(CAST(? AS VARCHAR[])), ?, ? "
                                         "ON CONFLICT DO NOTHING", [list(take), service_id, until])
            # what it renewed or took carries this call's expiry (its other leases, none of the lists', do not)
            _, rows = self.backend.fetch(tx, "SELECT binding_id FROM live_leases WHERE service_id = ? "
                                             "AND expires_at = ?", [service_id, until])
        wanted = set(keep) | set(take)
        return {row[0] for row in rows if row[0] in wanted}

    # ------------------------------------------------------------------ samples

    def samples_ingested_since(self, since: datetime | None) -> tuple[dict[str, float], datetime | None]:
        """The newest sample time (s) of each binding with samples ingested after `since` (every binding
        with samples when None), and the newest ingestion time seen (the next call's `since`)."""
        sql, params = "SELECT binding_id, max(ts), max(ingested_at) FROM plant_samples", []
        if since is not None:
            sql += " WHERE ingested_at > ?"
            params.append(naive(since))
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, sql + " GROUP BY binding_id", params)
        newest = max((row[2] for row in rows), default=since)
        return {binding_id: float(ts) for binding_id, ts, _ in rows}, newest

    def recent_samples(self, binding_id: str, tags: Sequence[str], after_ts: float | None = None,
                       run_id: str | None = None, rows: int | None = None) -> pd.DataFrame:
        """Stored samples as a wide frame (run_id, timestamp, tags; NaN where a tag has no sample), in
        time order: those after `after_ts` (s), of `run_id`, the newest `rows` timestamps of it."""
        sql, params = "SELECT run_id, ts, tag, value FROM plant_samples WHERE binding_id = ?", [binding_id]
        if after_ts is not None:
            sql += " AND ts > ?"
            params.append(float(after_ts))
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        if rows is not None:
            sql += (" AND ts >= (SELECT min(ts) FROM (SELECT DISTINCT ts FROM plant_samples WHERE binding_id = ? "
                    "AND run_id = ? ORDER BY ts DESC LIMIT ?) newest)")
            params += [binding_id, run_id, int(rows)]
        with self.backend.connection() as conn:
            long = self.backend.fetch_frame(conn, sql, params)
        if long.empty:
            return pd.DataFrame({"run_id": pd.Series(dtype=str), "timestamp": pd.Series(dtype=float),
                                 **{tag: pd.Series(dtype=float) for tag in tags}})
        wide = long.pivot(index=["run_id", "ts"], columns="tag", values="value")
        wide = wide.reindex(columns=list(tags)).reset_index().rename(columns={"ts": "timestamp"})
        wide.columns.name = None
        return wide.sort_values(["timestamp", "run_id"], kind="stable").reset_index(drop=True)

    def newest_run(self, binding_id: str) -> str | None:
        """The binding's live run: the run with the latest sample (ties: the larger run id)."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT run_id FROM plant_samples WHERE binding_id = ? "
                                               "ORDER BY ts DESC, run_id DESC LIMIT 1", [binding_id])
        return rows[0][0] if rows else None

    def live_runs(self) -> dict[str, tuple[str, float, str]]:
        """Every binding with samples: its live run (the run with the latest sample; ties: the larger run
        id), that sample's time and the samples' source ('real' when any is real, else 'simulation'), in
        one read (a sampling source starting on a thousand bindings)."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, """
                SELECT s.binding_id, max(s.run_id), max(s.ts), max(m.any_real)
                FROM plant_samples s JOIN (
                    SELECT binding_id, max(ts) AS ts, max(CASE WHEN source = 'real' THEN 1 ELSE 0 END) AS any_real
                    FROM plant_samples GROUP BY binding_id) m ON s.binding_id = m.binding_id AND s.ts = m.ts
                GROUP BY s.binding_id""")
        return {b: (run_id, float(ts), "real" if real else "simulation") for b, run_id, ts, real in rows}

    # ------------------------------------------------------------------ publications

    @retried
    def publish_live(self, service_id: str, publications: Sequence[Publication]) -> list[Written | None]:
        """Every publication in ONE transaction, each with its key, status, reasons and advice in
        `live_publications`. A publication whose key is already there (another service published those
        samples) is skipped: None in its place. One that `follows` a recommendation still open with
        the same status is summarised (its row only, naming that recommendation's run); any other is
        written whole (run + candidates + recommendation, as `record_solve` writes them). Keys written
        by a concurrent transaction make the primary key refuse this one, and the retry (PostgreSQL's
        unique violation is retried) then skips them."""
        def whole(p: Publication):
            return self._solve_write(p.run, p.candidates, p.model_id, p.recommendation, p.run_status,
                                     p.independent_cost, p.diagnostics, p.evidence_source, True)

        # prepared (and checked) before the transaction, but for those likely summarised
        writes = [whole(p) if p.follows is None else None for p in publications]
        now = naive_now()
        with self.backend.transaction() as tx:
            done: list[Written | None] = []
            for publication, write in zip(publications, writes):
                rec = publication.recommendation
                key = [publication.binding_id, publication.binding_revision, publication.calibration_id,
                       float(publication.live_t)]
                _, rows = self.backend.fetch(tx, "SELECT run_id FROM live_publications WHERE binding_id = ? AND "
                                                 "binding_revision = ? AND calibration_id = ? AND live_t = ?", key)
                if rows:
                    done.append(None)
                    continue
                followed = self._still_open(tx, publication)
                written = Written(followed, False) if followed is not None else \
                    Written((write or whole(publication))(tx), True)
                advice = dict(zip(rec.mv_tags, rec.controls[0])) if rec.controls else {}
                tx.execute("INSERT INTO live_publications VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           key + [written.run_id, service_id, now, written.whole, rec.status.value,
                                  orjson.dumps(list(rec.reasons)).decode(), orjson.dumps(advice).decode(), rec.cost])
                done.append(written)
            return done

    def _still_open(self, tx: Any, publication: Publication) -> str | None:
        """The run of the recommendation `publication` follows, when that one is still open (nothing
        expired or superseded it) with the same status and revision; else None."""
        if publication.follows is None:
            return None
        rec = publication.recommendation
        _, rows = self.backend.fetch(tx, "SELECT run_id FROM optimizer_recommendations WHERE id = ? AND binding_id = ? "
                                         "AND binding_revision = ? AND status = ? AND expired_at IS NULL",
                                     [publication.follows, rec.binding_id, rec.binding_revision, rec.status.value])
        return rows[0][0] if rows else None

    def live_published_up_to(self, binding_id: str, revision: int, calibration_id: str,
                             since: datetime) -> float | None:
        """The newest sample time (s) a live publication of the binding's revision and calibration,
        published at or after `since` (the binding's latest recommendation: what follows it), was solved
        from (whole or summarised); None when there is none. `since` keeps the read to the newest rows
        (DuckDB skips the older row groups by their min / max: the table grows by every publication)."""
        with self.backend.connection() as conn:
            _, rows = self.backend.fetch(conn, "SELECT max(live_t) FROM live_publications WHERE published_at >= ? "
                                               "AND binding_id = ? AND binding_revision = ? AND calibration_id = ?",
                                         [naive(since), binding_id, revision, calibration_id])
        return None if rows[0][0] is None else float(rows[0][0])

    def live_advice(self, rec: RecommendationRecord) -> dict[str, Any] | None:
        """The newest summarised advice following recommendation record `rec` (same run and status),
        as `recommendation --json` shows it; None when there is none."""
        live = self.latest_live_publication(rec.binding_id)
        if live is None or live.whole or live.run_id != rec.run_id or live.status != rec.status:
            return None
        return {"live_t": iso_from_seconds(live.live_t),
                "published_at": iso_utc(live.published_at.replace(tzinfo=timezone.utc)),
                "advice": dict(live.advice), "reasons": list(live.reasons), "cost": live.cost}

    def latest_live_publication(self, binding_id: str) -> LivePublication | None:
        """The binding's newest live publication (whole or summarised), None when it has none."""
        with self.backend.connection() as conn:
            columns, rows = self.backend.fetch(conn, "SELECT * FROM live_publications WHERE binding_id = ? "
                                                     "ORDER BY published_at DESC, live_t DESC LIMIT 1", [binding_id])
        if not rows:
            return None
        doc = dict(zip(columns, rows[0]))
        return LivePublication(doc["binding_id"], int(doc["binding_revision"]), doc["calibration_id"],
                               float(doc["live_t"]), doc["run_id"], doc["service_id"], doc["published_at"],
                               bool(doc["whole"]), doc["status"],
                               tuple(json.loads(doc["reasons_json"] or "[]")), json.loads(doc["advice_json"] or "{}"),
                               doc["cost"])

