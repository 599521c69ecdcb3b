"""UQ evidence vocabulary: block scores of held-out runs and the block-conformal calibration of an
artifact (docs/ARCHITECTURE.md, "UQ evidence rules"); the rules that compute them live in optimizer_pipeline.uq.

Units: scores and qhat in the artifact's normalised units.
"""

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from optimizer_pipeline.contracts.canonical import canonical_json

# The fewest blocks the evidence is computed from (uq.decide), also what identification keeps the held
# disturbance's window short enough for (model.window.supported_window): val blocks for the empirical
# qhat, test runs holding a block and the test blocks' steps.
MIN_EMPIRICAL_VAL_BLOCKS = 2
MIN_TEST_RUNS = 2
MIN_UNIQUE_TEST_STEPS = 120


@dataclass(frozen=True, eq=False)
class BlockScores:
    """Scores of non-overlapping h-step blocks (normalised units).

    run_ids (n_blocks,) str and starts (n_blocks,) int: the run and the local row k of the block's
    initial (measured) state; the block covers y[k+1 .. k+h]. scores (n_blocks, n_cv), by `score`
    (optimizer_pipeline.uq.SCORE_RULES): "max_residual", the max over the block of |measured -
    predicted|, or "settled_residual", |measured - predicted| at the block's end, the prediction
    holding the disturbance bias of the rows before the block (both; and their "_local" forms).
    n_runs counts the plant's runs with at least one block (RunSeries.plant_run: the pieces of a run
    split at a gap count once). run_rows: every run scored, with or without a block, and its rows;
    rows_before: the rows a run holds before its first block (the model's state and the rows its held
    disturbance is fitted over): what a reason for too few blocks names.
    """

    cv_tags: tuple[str, ...]
    h: int
    run_ids: np.ndarray
    starts: np.ndarray
    scores: np.ndarray
    n_unique_steps: int
    n_runs: int
    score: str = "max_residual"
    run_rows: Mapping[str, int] = field(default_factory=dict)
    rows_before: int | None = None

    @property
    def n_blocks(self) -> int:
        return int(self.scores.shape[0])


@dataclass(frozen=True)
class UQEvidence:
    """Block-conformal calibration of one artifact (canonical-JSON-able).

    method: "split_conformal" | "empirical_max" | None (no evidence, see `reasons`).
    score / score_rule: what a block score measures (optimizer_pipeline.uq.SCORE_RULES), so what the
    band claims: the largest residual over the first `block_length` steps of a move plan, or the
    settled response of a steady target.
    qhat (n_cv,) normalised units; coverage = min over CVs of the covered fraction of test blocks.
    """

    method: str | None
    alpha: float
    block_length: int
    cv_tags: tuple[str, ...]
    qhat: tuple[float, ...] | None
    rank_k: int | None  # split_conformal: k = ceil((n + 1)(1 - alpha))
    safety_factor: float | None  # empirical_max: qhat = max(val) * factor
    n_val_blocks: int
    n_val_runs: int
    n_test_blocks: int
    n_test_runs: int
    n_unique_test_steps: int
    coverage: float | None
    coverage_per_cv: tuple[float, ...] | None
    coverage_threshold: float | None
    coverage_lower_95: float | None  # one-sided Clopper-Pearson lower bound of the worst CV's coverage
    exchangeability_p: float | None
    exchangeability_test: str
    reasons: tuple[str, ...]
    calibrated_at: str | None = None
    score: str | None = None  # None in evidence calibrated before scores were named (max_residual)
    score_rule: str | None = None

    @property
    def has_evidence(self) -> bool:
        return self.method is not None

    def to_dict(self) -> dict[str, Any]:
        return json.loads(canonical_json(self))

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> "UQEvidence":
        values = {f.name: doc.get(f.name) for f in fields(UQEvidence)}
        for name in ("cv_tags", "qhat", "coverage_per_cv", "reasons"):
            if values[name] is not None:
                values[name] = tuple(values[name])
        return UQEvidence(**values)


@dataclass(frozen=True)
class Scores:
    """Block scores of one artifact on its val runs (which set qhat) and its test runs (which measure coverage)."""

    val: BlockScores
    test: BlockScores


@dataclass(frozen=True)
class Calibration:
    """UQ evidence of one artifact as calibrated at `calibrated_at` (stored as `calibration_id`)."""

    calibration_id: str
    artifact_hash: str
    evidence: UQEvidence
