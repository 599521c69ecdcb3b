"""The ledger's versioned schema, one history for both backends; migrations are applied in order,
idempotently, on open.

Timestamps are UTC (`TIMESTAMP` without zone); JSON documents are stored as JSON text: canonical
JSON, except the candidates' report columns (plain valid JSON of the same values, written fast by
orjson; nothing hashes them). The candidates' plans (`controls` steps x MVs, `predicted` steps x
CVs, engineering units) are numeric DOUBLE[][] columns since version 2.

Statements are written in DuckDB's SQL; for PostgreSQL the column types are translated
(`postgres_sql`), and a statement whose syntax differs is given per dialect ({"duckdb": ...,
"postgres": ...}).
"""

import re
from typing import Any, Union

from optimizer_pipeline.contracts import utc_now

DUCKDB, POSTGRES = "duckdb", "postgres"
Statement = Union[str, dict[str, str]]

# (version, description, statements). Append new versions; never edit an applied one.
MIGRATIONS: list[tuple[int, str, list[Statement]]] = [
    (1, "initial ledger", [
        """CREATE TABLE bindings (
            id VARCHAR PRIMARY KEY,
            created_at TIMESTAMP NOT NULL
        )""",
        """CREATE TABLE binding_revisions (
            binding_id VARCHAR NOT NULL,
            revision INTEGER NOT NULL,
            spec_hash VARCHAR NOT NULL,
            spec_json VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            PRIMARY KEY (binding_id, revision)
        )""",
        """CREATE TABLE plant_samples (
            binding_id VARCHAR NOT NULL,
            run_id VARCHAR NOT NULL,
            ts DOUBLE NOT NULL,            -- seconds since epoch, UTC
            tag VARCHAR NOT NULL,
            value DOUBLE,
            source VARCHAR NOT NULL,       -- simulation | real
            ingest_id VARCHAR NOT NULL,
            ingested_at TIMESTAMP NOT NULL,
            PRIMARY KEY (binding_id, run_id, ts, tag)
        )""",
        """CREATE TABLE model_artifacts (
            artifact_hash VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            gates_passed BOOLEAN NOT NULL,
            artifact_json VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL
        )""",
        """CREATE TABLE uq_block_scores (
            artifact_hash VARCHAR NOT NULL,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            segment VARCHAR NOT NULL,      -- val | test
            run_id VARCHAR NOT NULL,
            block_start INTEGER NOT NULL,  -- row index inside the run
            cv_tag VARCHAR NOT NULL,
            score DOUBLE,                  -- normalised units
            created_at TIMESTAMP NOT NULL,
            PRIMARY KEY (artifact_hash, segment, run_id, block_start, cv_tag)
        )""",
        """CREATE TABLE uq_calibrations (
            id VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            artifact_hash VARCHAR NOT NULL,
            calibrated_at TIMESTAMP NOT NULL,
            has_evidence BOOLEAN NOT NULL,
            method VARCHAR,
            coverage DOUBLE,
            threshold DOUBLE,
            evidence_json VARCHAR NOT NULL,
            reasons_json VARCHAR NOT NULL
        )""",
        """CREATE TABLE optimizer_runs (
            id VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            profile_id VARCHAR NOT NULL,
            profile_version INTEGER NOT NULL,
            problem_ir_hash VARCHAR,
            context_json VARCHAR NOT NULL,
            problem_json VARCHAR,
            diagnostics_json VARCHAR,
            status VARCHAR NOT NULL,       -- running | succeeded | failed
            independent_cost DOUBLE,
            started_at TIMESTAMP NOT NULL,
            finished_at TIMESTAMP
        )""",
        """CREATE TABLE optimizer_candidates (
            id VARCHAR PRIMARY KEY,
            run_id VARCHAR NOT NULL,
            seq INTEGER NOT NULL,
            kind VARCHAR NOT NULL,
            solver_status VARCHAR NOT NULL,
            controls_json VARCHAR NOT NULL,
            predicted_json VARCHAR NOT NULL,
            cost DOUBLE,
            constraints_json VARCHAR NOT NULL,
            feasible BOOLEAN NOT NULL,
            verified BOOLEAN NOT NULL,
            independent_cost DOUBLE,
            verify_report_json VARCHAR NOT NULL,
            model_id VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL
        )""",
        """CREATE TABLE optimizer_recommendations (
            id VARCHAR PRIMARY KEY,
            run_id VARCHAR NOT NULL,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            candidate_id VARCHAR,
            template VARCHAR NOT NULL,
            problem_ir_hash VARCHAR NOT NULL,
            model_artifact_hash VARCHAR NOT NULL,
            evidence_source VARCHAR NOT NULL,
            uq_evidence_json VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            status_label VARCHAR NOT NULL,
            reasons_json VARCHAR NOT NULL,
            payload_json VARCHAR NOT NULL,  -- the recommendation JSON as created
            created_at TIMESTAMP NOT NULL,
            valid_until TIMESTAMP NOT NULL,
            expired_at TIMESTAMP,
            expired_reason VARCHAR
        )""",
        """CREATE TABLE optimizer_outcomes (
            id VARCHAR PRIMARY KEY,
            recommendation_id VARCHAR NOT NULL,
            binding_id VARCHAR NOT NULL,
            applied_at TIMESTAMP NOT NULL,
            observed_json VARCHAR NOT NULL,
            delta_json VARCHAR NOT NULL,
            verdict VARCHAR,
            details_json VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL
        )""",
    ]),
    # Plans as numbers, not JSON text (issue 8): 10 000 candidates carried ~22 MB of distinct JSON
    # text that DuckDB's checkpoint compressed on every close. DuckDB 2.0 alters the column type of
    # this keyed table in place (column order kept, which the positional Arrow insert relies on);
    # its VARCHAR -> DOUBLE cast reads the stored JSON numbers back exactly (tests compare them).
    # PostgreSQL reads a JSON array of arrays as an array literal once its brackets are braces.
    (2, "candidate plans as DOUBLE[][] columns controls / predicted", [
        {DUCKDB: "ALTER TABLE optimizer_candidates ALTER controls_json SET DATA TYPE DOUBLE[][] "
                 "USING CAST(controls_json AS DOUBLE[][])",
         POSTGRES: "ALTER TABLE optimizer_candidates ALTER controls_json SET DATA TYPE double precision[][] "
                   "USING translate(controls_json, '[]', '{}')::double precision[][]"},
        "ALTER TABLE optimizer_candidates RENAME COLUMN controls_json TO controls",
        {DUCKDB: "ALTER TABLE optimizer_candidates ALTER predicted_json SET DATA TYPE DOUBLE[][] "
                 "USING CAST(predicted_json AS DOUBLE[][])",
         POSTGRES: "ALTER TABLE optimizer_candidates ALTER predicted_json SET DATA TYPE double precision[][] "
                   "USING translate(predicted_json, '[]', '{}')::double precision[][]"},
        "ALTER TABLE optimizer_candidates RENAME COLUMN predicted_json TO predicted",
    ]),
    # The ledger as the one store of the binding assets: plant_history records how it split the
    # stored samples (so a later step rebuilds the same split), and a batch records each binding
    # stage that failed (queryable per binding; the other bindings of the batch go on).
    (3, "history splits and binding failures", [
        """CREATE TABLE history_splits (
            id VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            samples_through TIMESTAMP NOT NULL,  -- the newest ingested_at of the samples it split
            seed INTEGER NOT NULL,
            data_hash VARCHAR NOT NULL,          -- content hash of the cleaned train / val / test / live runs
            train_runs_json VARCHAR NOT NULL,
            val_runs_json VARCHAR NOT NULL,
            test_runs_json VARCHAR NOT NULL,
            live_run VARCHAR,
            report_json VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL
        )""",
        """CREATE TABLE binding_failures (
            id VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER,
            stage VARCHAR NOT NULL,              -- plant_history | model_artifact | ... | recommendation
            error VARCHAR NOT NULL,              -- the error's kind (class name)
            message VARCHAR NOT NULL,
            dagster_run_id VARCHAR,
            created_at TIMESTAMP NOT NULL
        )""",
    ]),
    # "At most one open recommendation per binding", held by the database itself, not only by the
    # code path: PostgreSQL with a partial unique index on the recommendations; DuckDB has no
    # partial index, so a table of the open recommendation of each binding, keyed by binding,
    # written in the same transaction as the recommendations (it is current state, not history:
    # its row of a binding is replaced or removed when the recommendation it names stops being open).
    (4, "at most one open recommendation per binding, in the database", [
        {DUCKDB: """CREATE TABLE open_recommendations (
            binding_id VARCHAR PRIMARY KEY,
            recommendation_id VARCHAR NOT NULL
        )""",
         POSTGRES: "CREATE UNIQUE INDEX one_open_recommendation_per_binding ON optimizer_recommendations "
                   "(binding_id) WHERE status IN ('verified', 'unverified', 'rejected')"},
        {DUCKDB: """INSERT INTO open_recommendations SELECT binding_id, max(id) FROM optimizer_recommendations
                    WHERE status IN ('verified', 'unverified', 'rejected') GROUP BY binding_id""",
         POSTGRES: "SELECT 1"},
    ]),
    # What-if solves (issue 17): a solve of a binding with overridden limits / targets / costs. Its
    # run and candidates are ordinary optimizer_runs / optimizer_candidates rows; this table says the
    # run was a what-if, with the overrides, the overridden spec it solved (never a binding revision)
    # and what was decided. It has no row in optimizer_recommendations, so it never supersedes,
    # expires or becomes the binding's latest recommendation. A new table: older ledgers gain it on
    # open and keep every row.
    (5, "what-if solves", [
        """CREATE TABLE whatif_runs (
            run_id VARCHAR PRIMARY KEY,          -- its optimizer_runs row (candidates by run_id)
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,   -- the stored revision the overrides were applied to
            overrides_json VARCHAR NOT NULL,     -- [{path, value}] in the order given
            spec_json VARCHAR NOT NULL,          -- the overridden binding spec that was solved
            compared_recommendation_id VARCHAR,  -- the binding's latest recommendation when solved (shown beside it)
            result_json VARCHAR NOT NULL,        -- status, reasons, plan, predicted CVs, band, economic value
            requested_by VARCHAR NOT NULL,       -- cli | dagster
            dagster_run_id VARCHAR,
            created_at TIMESTAMP NOT NULL
        )""",
    ]),
    # Block scores keyed by the rule that scored them (issue 15). An artifact's hash is its content, so
    # a recalibration after an upgrade that changed a score rule (move plans now hold the disturbance)
    # scores the same artifact again; keyed without the rule, its rows at block starts the old rule
    # also had were skipped as stored, and the calibration read old and new scores together. Rows
    # stored before name no rule ('unrecorded') and are kept; pipeline.load_scores reads only the
    # current rule's (uq.rule_key). Rebuilt, not altered: DuckDB does not change a primary key in place.
    (6, "block scores keyed by their score rule", [
        """CREATE TABLE uq_block_scores_by_rule (
            artifact_hash VARCHAR NOT NULL,
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            segment VARCHAR NOT NULL,      -- val | test
            run_id VARCHAR NOT NULL,
            block_start INTEGER NOT NULL,  -- row index inside the run
            cv_tag VARCHAR NOT NULL,
            score DOUBLE,                  -- normalised units
            created_at TIMESTAMP NOT NULL,
            score_rule VARCHAR NOT NULL,   -- uq.rule_key: the rule's name and a digest of its text
            PRIMARY KEY (artifact_hash, score_rule, segment, run_id, block_start, cv_tag)
        )""",
        "INSERT INTO uq_block_scores_by_rule SELECT *, 'unrecorded' FROM uq_block_scores",
        "DROP TABLE uq_block_scores",
        "ALTER TABLE uq_block_scores_by_rule RENAME TO uq_block_scores",
    ]),
    # The resident live service (optimizer_pipeline/live/). live_services and live_leases are current
    # state, like open_recommendations: one row per service process, its heartbeat updated in place
    # (a row is kept after the service stops, with stopped_at), and one lease per binding served, so
    # the sensors and the UI can tell whether a binding is served. live_publications holds the key of every publication by a live service, one
    # re-solve per (binding, revision, calibration, newest sample time): a second publication of the
    # same samples (two services, a retried batch) is refused by the primary key.
    (7, "live service heartbeats, leases and publication keys", [
        """CREATE TABLE live_services (
            id VARCHAR PRIMARY KEY,
            host VARCHAR NOT NULL,
            pid INTEGER NOT NULL,
            bindings_json VARCHAR NOT NULL,   -- the bindings it serves: a list, or null for every binding
            state VARCHAR NOT NULL,           -- starting | serving | stopping | stopped
            started_at TIMESTAMP NOT NULL,
            heartbeat_at TIMESTAMP NOT NULL,
            stopped_at TIMESTAMP
        )""",
        """CREATE TABLE live_publications (
            binding_id VARCHAR NOT NULL,
            binding_revision INTEGER NOT NULL,
            calibration_id VARCHAR NOT NULL,
            live_t DOUBLE NOT NULL,           -- the newest sample solved from, s since epoch
            run_id VARCHAR NOT NULL,
            service_id VARCHAR NOT NULL,
            published_at TIMESTAMP NOT NULL,
            PRIMARY KEY (binding_id, binding_revision, calibration_id, live_t)
        )""",
        # which service serves a binding: a lease it renews with its heartbeat (current state, updated
        # in place); an expired lease is free for any service to take
        """CREATE TABLE live_leases (
            binding_id VARCHAR PRIMARY KEY,
            service_id VARCHAR NOT NULL,
            expires_at TIMESTAMP NOT NULL
        )""",
        # the service polls for samples ingested since its last look; DuckDB's row-group min / max
        # already skip the old samples (an ART index would slow every insert)
        {DUCKDB: "SELECT 1", POSTGRES: "CREATE INDEX plant_samples_ingested_at ON plant_samples (ingested_at)"},
    ]),
    # Summarised live publications (docs/ARCHITECTURE.md, "What the ledger keeps of a live
    # publication"): every publication's status, reasons and advice (the MVs' values to set now, exact)
    # in its live_publications row; only a status change, a new revision or calibration, and one
    # publication per `live.whole_every_s` write the whole run, candidates and recommendation (`whole`);
    # the others name the whole publication they follow (run_id). Rows before this version were whole.
    (8, "live publications: whole or summarised, with status, reasons and advice", [
        "ALTER TABLE live_publications ADD COLUMN whole BOOLEAN DEFAULT TRUE",
        "ALTER TABLE live_publications ADD COLUMN status VARCHAR",
        "ALTER TABLE live_publications ADD COLUMN reasons_json VARCHAR",
        "ALTER TABLE live_publications ADD COLUMN advice_json VARCHAR",
        "ALTER TABLE live_publications ADD COLUMN cost DOUBLE",
    ]),
    # A binding's OPC UA wiring (issue 36: its `opcua` section, contracts.wiring.OpcUaWiring): wiring,
    # not model, so it is no part of a revision (a changed endpoint or node keeps the revision and its
    # recommendations). Append-only beside the revisions: a row whenever a stored binding's wiring
    # differs from its latest row, null when the binding is stored without one; reads carry the latest.
    (9, "binding wiring", [
        """CREATE TABLE binding_wiring (
            binding_id VARCHAR NOT NULL,
            seq INTEGER NOT NULL,              -- 1, 2, ... per binding: the latest is the highest
            wiring_json VARCHAR,               -- OpcUaWiring.canonical_json; null: the binding has no wiring
            created_at TIMESTAMP NOT NULL,
            PRIMARY KEY (binding_id, seq)
        )""",
    ]),
    # Slices of a binding's history excluded by hand (`optimizer-pipeline exclude`, issue 38): append-only;
    # a later row with `revokes` set withdraws an earlier one. The next recalibration's cleaning counts the
    # samples of the exclusions in force as missing (data/flags.py).
    (10, "history exclusions", [
        """CREATE TABLE exclusions (
            exclusion_id VARCHAR PRIMARY KEY,
            binding_id VARCHAR NOT NULL,
            start_ts DOUBLE,                   -- seconds since epoch, UTC, inclusive; null on a revocation
            end_ts DOUBLE,                     -- exclusive
            tags_json VARCHAR,                 -- the tags excluded, [] for every tag
            reason VARCHAR NOT NULL,
            revokes VARCHAR,                   -- the exclusion this row withdraws; null: an exclusion
            created_at TIMESTAMP NOT NULL
        )""",
    ]),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]


_POSTGRES_TYPES = [(r"\bDOUBLE\[\]\[\]", "double precision[][]"), (r"\bDOUBLE\b", "double precision")]


def statement_for(statement: Statement, dialect: str) -> str:
    """The SQL of one migration statement in `dialect` (duckdb | postgres)."""
    if isinstance(statement, dict):
        return statement[dialect]
    if dialect == POSTGRES:
        for pattern, replacement in _POSTGRES_TYPES:
            statement = re.sub(pattern, replacement, statement)
    return statement


def apply_schema(conn: Any, up_to: int = SCHEMA_VERSION, dialect: str = DUCKDB) -> list[int]:
    """Apply the missing migrations up to version `up_to` (an older one builds a ledger as an earlier
    release left it, for migration tests) inside the caller's transaction; returns the versions
    applied. `conn` is a DuckDB connection or the PostgreSQL backend's transaction (both take `?`)."""
    conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)""")
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    for version, description, statements in MIGRATIONS:
        if version in done or version > up_to:
            continue
        for statement in statements:
            conn.execute(statement_for(statement, dialect))
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                     [version, description, utc_now().replace(tzinfo=None)])
        applied.append(version)
    return applied
