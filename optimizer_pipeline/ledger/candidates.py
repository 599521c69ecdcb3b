"""Candidate rows as one Arrow table: plans as list<list<double>>, report columns as JSON text.

Candidate plans (`controls` steps x MVs, `predicted` steps x CVs, engineering units) are numeric
columns built straight into the Arrow table; the report columns are JSON written by
contracts.fast_json (orjson): the same values as canonical JSON (nothing hashes them), ~10x faster
to build for 10 000 candidates. A missing, non-numeric or non-finite number is refused with a
ContractError naming the candidate and column before anything is written.
"""

import math
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from optimizer_pipeline.contracts import ContractError, SolveCandidate, fast_json
from optimizer_pipeline.ledger.records import candidate_id, naive_now

# a candidate batch this large commits in bulk mode (the backend's `bulk`, e.g. skipping DuckDB's WAL)
BULK_CANDIDATE_ROWS = 1000


def finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


# a plan: steps x variables, engineering units (DOUBLE[][] in DuckDB). Cost measured on DuckDB 2.0.1:
# the WAL serialises each inner list (one per step) on its own, so a small commit of 3 candidates
# with 30-step plans takes ~0.6 ms longer than with JSON text (~1.3 vs ~0.6 ms); bulk batches skip
# the WAL (_checkpoint_on_commit). A flat DOUBLE[] or per-variable lists would cost ~0.2 ms.
PLAN_ARROW_TYPE = pa.list_(pa.list_(pa.float64()))

# optimizer_candidates, column for column (tests check it against the table)
CANDIDATE_ARROW_SCHEMA = pa.schema([
    ("id", pa.string()), ("run_id", pa.string()), ("seq", pa.int32()), ("kind", pa.string()),
    ("solver_status", pa.string()), ("controls", PLAN_ARROW_TYPE), ("predicted", PLAN_ARROW_TYPE),
    ("cost", pa.float64()), ("constraints_json", pa.string()), ("feasible", pa.bool_()), ("verified", pa.bool_()),
    ("independent_cost", pa.float64()), ("verify_report_json", pa.string()), ("model_id", pa.string()),
    ("created_at", pa.timestamp("us"))])


def candidate_table(run_id: str, candidates: Sequence[SolveCandidate], model_id: str) -> pa.Table:
    """The optimizer_candidates rows of one run as an Arrow table (costs: non-finite -> NULL)."""
    n = len(candidates)
    seqs = [c.seq for c in candidates]

    def where(column: str) -> Callable[[int], str]:
        return lambda i: f"candidate {seqs[i]} of run {run_id}, {column}"

    def texts(column: str, values: list[Any]) -> list[str]:
        return _json_texts(values, where(column))

    columns = [
        [candidate_id(run_id, seq) for seq in seqs], [run_id] * n, seqs, [c.kind.value for c in candidates],
        [c.solver_status for c in candidates], _plan_array([c.controls for c in candidates], where("controls")),
        _plan_array([c.predicted for c in candidates], where("predicted")),
        [finite_or_none(c.cost) for c in candidates],
        texts("constraints", [c.constraints for c in candidates]), [c.feasible for c in candidates],
        [c.verified for c in candidates], [finite_or_none(c.independent_cost) for c in candidates],
        texts("verify_report", [c.verify_report for c in candidates]), [model_id] * n, [naive_now()] * n]
    return pa.Table.from_arrays([values if isinstance(values, pa.Array) else pa.array(values, field.type)
                                 for values, field in zip(columns, CANDIDATE_ARROW_SCHEMA)],
                                schema=CANDIDATE_ARROW_SCHEMA)


def _plan_array(plans: list[Any], where: Callable[[int], str]) -> pa.ListArray:
    """The plans (each a sequence of rows of numbers) as one Arrow list<list<double>> array; a
    missing, non-numeric or non-finite number is refused with a ContractError naming the plan by
    `where(i)` (canonical_json's message and path for a non-finite one).

    pa.array converts the nested tuples in C (~25 ms for 10 000 plans of 30 x 2, about half of a
    flat numpy buffer + offsets built in Python); the finiteness check is one numpy pass over the
    flat values, which pa.array leaves as NaN / inf rather than nulls."""
    array = _checked_plans(plans)
    if array is not None:
        return array
    for i, plan in enumerate(plans):  # only for bad input: find and name the first bad plan
        if _checked_plans([plan]) is None:
            _fast_text(plan, where, i)  # raises for a non-finite number, naming its path
            raise ContractError(f"{where(i)}: a plan must be rows of numbers, got {plan!r:.80}")
    raise AssertionError("unreachable: the plans failed together but each passed alone")


def _checked_plans(plans: list[Any]) -> pa.ListArray | None:
    """list<list<double>> of the plans, or None when one holds a null, a non-number or a non-finite number."""
    try:
        array = pa.array(plans, PLAN_ARROW_TYPE)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    numbers = array.values.values
    if array.null_count or array.values.null_count or numbers.null_count \
            or not np.isfinite(numbers.to_numpy()).all():
        return None
    return array


def _json_texts(values: list[Any], where: Callable[[int], str]) -> list[str]:
    """Valid JSON of each document (contracts.fast_json: canonical JSON's values, ~10x faster),
    refusing non-finite numbers with a ContractError whose message starts with `where(i)`."""
    return [_fast_text(value, where, i) for i, value in enumerate(values)]


def _fast_text(value: Any, where: Callable[[int], str], i: int) -> str:
    try:
        return fast_json(value).decode()
    except ContractError as exc:
        raise ContractError(f"{where(i)}: {exc}") from None
