"""Builders of ledger rows for tests (recommendations, candidates) from plain values."""

from dataclasses import replace
from datetime import timedelta

from optimizer_pipeline.contracts import (
    CandidateKind,
    Recommendation,
    RecommendationStatus,
    SolveCandidate,
    Template,
    iso_utc,
    utc_now,
)
from optimizer_pipeline.ledger import NewRun, candidate_id, new_id


def run_row(binding_id="tanks-1", revision=1, problem_hash="p" * 64):
    return NewRun(binding_id, revision, "tanks-track", 1, problem_hash, {"why": "test"},
                  {"template": "linear_mpc_quadratic@1"})


def candidates():
    plan = ((1.0, 2.0), (1.5, 2.0))
    pred = ((7.0, 7.5), (7.1, 7.4))
    return [SolveCandidate(seq=s, kind=k, solver_status="solved", controls=plan, predicted=pred, cost=1.0 + s,
                           constraints={"slack": 0.0}, feasible=True, verified=True, independent_cost=1.0 + s,
                           verify_report={"ok": True})
            for s, k in enumerate((CandidateKind.HOLD, CandidateKind.NOMINAL))]


def recommendation(run_id, binding_id="tanks-1", revision=1, status=RecommendationStatus.VERIFIED,
                   problem_hash="p" * 64, valid_for_s=3600.0):
    now = utc_now()
    return Recommendation(
        id=new_id("rec"), binding_id=binding_id, binding_revision=revision, run_id=run_id,
        candidate_id=candidate_id(run_id, 1), template=Template.LINEAR_MPC, status=status, reasons=(),
        created_at=iso_utc(now), valid_until=iso_utc(now + timedelta(seconds=valid_for_s)),
        mv_tags=("v1", "v2"), cv_tags=("y1", "y2"), controls=((1.0, 2.0),), predicted=((7.0, 7.5),),
        band=(0.1, None), cost=2.0, independent_cost=2.0, problem_ir_hash=problem_hash,
        model_artifact_hash="m" * 64, evidence={"source": "simulation", "uq": None})


def solve(ledger, binding_id="tanks-1", revision=1, problem_hash="p" * 64, status=RecommendationStatus.VERIFIED,
          valid_for_s=3600.0):
    """Write one run with its candidates and recommendation; returns (run_id, rec_id)."""
    run = replace(run_row(binding_id, revision, problem_hash), id=new_id("or"))
    rec = recommendation(run.id, binding_id, revision, status, problem_hash, valid_for_s)
    ledger.record_solve(run, candidates(), "m" * 64, rec, run_status="succeeded", independent_cost=2.0,
                        diagnostics={"iterations": 12}, evidence_source="simulation")
    return run.id, rec.id


def ledger_at(where: str):
    """The ledger at `where`: a PostgreSQL URL or a DuckDB file path (for writer processes)."""
    from optimizer_pipeline.ledger import Ledger

    if where.startswith("postgresql://"):
        from optimizer_pipeline.ledger.postgres_backend import PostgresBackend

        return Ledger(PostgresBackend(where))
    return Ledger(where)
