"""UQ evidence rules (docs/ARCHITECTURE.md, "UQ evidence rules"): block scores of val / test runs (the largest
residual of a P-step block, or the settled response at the end of a settling-horizon block), block-conformal
qhat and test coverage, the verified-coverage threshold, the Clopper-Pearson bound and the
exchangeability p-value (beyond the spec), the seed / strict gates, input distance and freshness.

Units: scores, qhat and input distances are in the artifact's normalised units; `band_engineering`
converts qhat to engineering units. The evidence vocabulary (BlockScores, UQEvidence) lives in
optimizer_pipeline.contracts.evidence.
"""

import hashlib
import logging
import math
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from optimizer_pipeline.contracts import (
    MIN_STD,
    BlockScores,
    Condition,
    ContractError,
    MIN_EMPIRICAL_VAL_BLOCKS,
    MIN_TEST_RUNS,
    MIN_UNIQUE_TEST_STEPS,
    ModelArtifact,
    RunSeries,
    UQEvidence,
    parse_iso_utc,
)
from optimizer_pipeline.model.artifact import stack_for
from optimizer_pipeline.model.window import held_window
from optimizer_pipeline.model.arx import (Orders, Stacked, held_errors, rollout_windows,
                                          window_rows)
from optimizer_pipeline.model.local import LocalFitter, local_paths
from optimizer_pipeline.validation import (
    AT_LEAST_ONE,
    OPEN_UNIT,
    check_choice,
    check_integer,
    expectation,
    refuse,
    refuse_bound,
)

log = logging.getLogger(__name__)

SPLIT_CONFORMAL = "split_conformal"
EMPIRICAL_MAX = "empirical_max"
MIN_SPLIT_VAL_BLOCKS = 9
MIN_SPLIT_VAL_RUNS = 2
EMPIRICAL_SAFETY_FACTOR = 1.25
MIN_TEST_BLOCKS = 1
# Strict gate (beyond the spec): the coverage must be credible, and val must look like test.
STRICT_MIN_COVERAGE_LOWER = 0.8
STRICT_MIN_EXCHANGEABILITY_P = 0.01
CP_CONFIDENCE = 0.95
GATES = ("seed", "strict")
EXCHANGEABILITY_TEST = (
    "per CV: X = number of test blocks whose score exceeds the k-th smallest of the n val scores "
    "(k = the conformal rank; k = n for empirical_max, i.e. the plain val max before the safety factor); "
    "under exchangeability of val and test blocks (continuous scores) X ~ BetaBinomial(m, n + 1 - k, k) "
    "with m test blocks; two-sided p = min(1, 2 min(P(X <= x), P(X >= x))); reported p = Bonferroni "
    "min over CVs = min(1, n_cv * min_j p_j)")


# the local refit (model.local), as the rules below state it
_REFIT = ("model.local: the artifact's structure and ridge on its train runs, train rows weighted by a Gaussian "
          "kernel over the MVs and CVs (not the DVs) of the row before them, in train std, of the width "
          "identification chose (selection.steady_model.bandwidth; 1 without it), the nearest weighing 1")
MAX_RESIDUAL = "max_residual"
MAX_RESIDUAL_LOCAL = "max_residual_local"
SETTLED_RESIDUAL = "settled_residual"
SETTLED_LOCAL = "settled_residual_local"
SCORE_RULES = {
    MAX_RESIDUAL: "per CV: the largest |measured - predicted| over the h steps of an open-loop rollout from the "
                  "block's measured state, driven by the measured MVs / DVs and the disturbance bias held "
                  "(model.statespace), bias the held disturbance that best explains the open-loop prediction "
                  "error of the W rows before the block, least squares, W = max(P, 2 x the model's settling "
                  "horizon) (model.arx.fit_disturbance: the disturbance a move plan is predicted with)",
    SETTLED_RESIDUAL: "per CV: |measured - predicted| at the last of the h steps of an open-loop rollout "
                      "from the block's measured state, driven by the measured MVs / DVs and the disturbance "
                      "bias held (model.statespace), with h the model's settling horizon "
                      "(model.statespace.settling_steps) and bias the held disturbance that best explains "
                      "the open-loop prediction error of the W rows before the block, least squares, W = "
                      "max(P, 2 x the settling horizon) (model.arx.fit_disturbance: the disturbance a steady "
                      "target is predicted with)",
    SETTLED_LOCAL: "as settled_residual, but each block predicted by the model refitted around the block's "
                   f"operating point ({_REFIT}, centred midway between the block's MVs and measured CVs at its start "
                   "and its last MVs and the identified model's settled prediction), its held disturbance the mean "
                   "of that model's one-step residuals over the same W rows, each weighted by the refit's kernel at "
                   "the row it predicts from (model.local.local_disturbances); a refit with fewer than 10 effective "
                   "rows per parameter, or whose slowest mode has not decayed to 5 % within 2 h (unstable "
                   "included), is refused and the block predicted by the identified model: the procedure a steady "
                   "target of such an artifact is solved with",
    MAX_RESIDUAL_LOCAL: "as max_residual, but each block predicted by the model refitted around the block's "
                        f"operating point ({_REFIT}, centred midway between the block's MVs and measured CVs at its "
                        "start and its last MVs and the identified model's prediction at its end), its held "
                        "disturbance the mean of that model's one-step residuals over the same W rows, each "
                        "weighted by the refit's kernel at the row it predicts from "
                        "(model.local.local_disturbances); a refit with fewer than 10 effective rows per parameter, "
                        "or whose slowest mode has not decayed to 5 % within 2 settling horizons of the identified "
                        "model (unstable included), is refused and the block predicted by the identified model: the "
                        "procedure a move plan of such an artifact is solved with",
}
LOCAL_SCORES = (SETTLED_LOCAL, MAX_RESIDUAL_LOCAL)  # refit on the artifact's train runs (model.local)
_BASE_RULES = {SETTLED_LOCAL: SETTLED_RESIDUAL, MAX_RESIDUAL_LOCAL: MAX_RESIDUAL}  # "as <base>, but ..."


def rule_text(score: str) -> str:
    """The whole text of a score rule, as the evidence records it (`score_rule`): SCORE_RULES[score], and
    for a local rule, which says "as <base>, but ...", the base rule's text after it, so that an edit of
    either shows as a new rule."""
    base = _BASE_RULES.get(score)
    return SCORE_RULES[score] if base is None else f"{SCORE_RULES[score]} [{base}: {SCORE_RULES[base]}]"


def rule_digest(text: str | None) -> str:
    """A short fingerprint of a score rule's text (the conditions table shows it; "unrecorded" for None)."""
    return "unrecorded" if text is None else hashlib.sha256(text.encode()).hexdigest()[:8]


def rule_key(score: str) -> str:
    """What stored block scores name as their rule (the ledger keys them by it): the score's name and the
    digest of this version's text of it (`rule_text`), so scores of an older text of the same rule are
    never read as this one's."""
    return f"{score}:{rule_digest(rule_text(score))}"


class UQInputError(ContractError):
    """Bad input to the UQ rules (alpha, gate name, method, timestamps)."""


# --------------------------------------------------------------------------- block scores


def _max_over_steps(values: np.ndarray) -> np.ndarray:
    """values (m, h, ny) -> (m, ny) max over h, overwriting `values`.

    Pairwise maximums of halves (log2 h passes): numpy's own axis-1 reduction of this layout is
    about 3x slower and dominated the block-scoring benchmark. NaN propagates like max().
    """
    h = values.shape[1]
    while h > 1:
        half = h // 2
        np.maximum(values[:, :half], values[:, h - half:h], out=values[:, :half])
        h -= half
    return values[:, 0].copy()


def block_scores(artifact: ModelArtifact, runs: Sequence[RunSeries], h: int | None = None,
                 score: str = MAX_RESIDUAL, train: Sequence[RunSeries] = ()) -> BlockScores:
    """Block scores of `runs` (docs/ARCHITECTURE.md, "UQ evidence rules": score) by the rule `score` of
    SCORE_RULES. h defaults to the artifact's P (the steady-state template passes its settling horizon
    with SETTLED_RESIDUAL or SETTLED_LOCAL); the LOCAL_SCORES refit on the `train` runs.

    Blocks start at the first row with a measured state and the W rows before it the held disturbance is
    fitted over (model.arx.disturbance_window), and tile each run without overlap; every block is predicted
    open-loop from its measured state with the measured MVs / DVs and that disturbance held, as the
    recommendation predicts, all blocks of all runs at once: by the identified model from the one-step
    residuals (model.arx.held_errors: a pass over the h steps of all blocks), each local refit
    by rolling out its block, its disturbance from its one-step residuals over the W rows
    (model.local.local_paths).
    """
    h = check_integer(artifact.horizon if h is None else int(h), "block scores", AT_LEAST_ONE, name="block length h",
                      error=UQInputError)
    check_choice(score, tuple(SCORE_RULES), "block scores", what="score", error=UQInputError)
    stacked = stack_for(artifact, runs)
    orders = Orders(artifact.na, artifact.nb, artifact.delay)
    settled = score in (SETTLED_RESIDUAL, SETTLED_LOCAL)
    ss = artifact.state_space
    window = held_window(artifact)
    before = rows_before_blocks(artifact)
    rows, which = window_rows(stacked, before, h, h)
    ny = len(artifact.cv_tags)
    if rows.size:
        with np.errstate(invalid="ignore", over="ignore"):
            if score in LOCAL_SCORES:
                if not train:
                    raise UQInputError(f"block scores: {score} refits on the train runs, and none were given")
                fitter = LocalFitter.for_artifact(artifact, stack_for(artifact, train))
                predicted, measured = rollout_windows(ss, stacked, orders, rows, h)
                errors = measured - local_paths(fitter, ss, stacked, orders, rows, predicted, window)[1]
            else:  # the disturbance `current_state` would hold at row k: fitted over the W rows before it
                errors = held_errors(ss, stacked, orders, rows, h, window)
            if any(artifact.normalisation.transforms_of(artifact.cv_tags)):
                errors = _engineering_errors(artifact, stacked, rows, errors)
            scores = np.abs(errors[:, -1]) if settled else _max_over_steps(np.abs(errors, out=errors))
    else:
        scores = np.empty((0, ny))
    run_ids = np.asarray(stacked.run_ids, dtype=object)[which]  # which is an int array, empty without blocks
    return BlockScores(cv_tags=tuple(artifact.cv_tags), h=h, run_ids=run_ids,
                       starts=rows - stacked.offsets[which], scores=scores,
                       n_unique_steps=int(rows.size * h), n_runs=len({stacked.plant_runs[i] for i in np.unique(which)}),
                       score=score, run_rows={run.run_id: len(run) for run in runs},
                       rows_before=before)


def rows_before_blocks(artifact: ModelArtifact) -> int:
    """The rows a run holds before its first block: the first with a measured state and the W rows before
    it the held disturbance is fitted over (model.window.held_window: two settling horizons, at least P,
    unless identification chose otherwise: fewer that the runs support, or for an integrating CV the
    plan and its hold; model.window.supported_window)."""
    return Orders(artifact.na, artifact.nb, artifact.delay).first_state_row + held_window(artifact)


def _engineering_errors(artifact: ModelArtifact, stacked: Stacked, rows: np.ndarray,
                        errors: np.ndarray) -> np.ndarray:
    """Errors (m, h, ny) of a model of transformed CVs (contracts.transform), normalised z of the measured
    y[k + 1 .. k + h] minus the prediction, as the difference of their engineering values over the train
    std: the band (qhat x std) then bounds what a user reads, the CV in engineering units."""
    norm, tags = artifact.normalisation, artifact.cv_tags
    steps = rows[:, None] + 1 + np.arange(errors.shape[1])
    measured = np.take(stacked.y, steps, axis=0)  # (m, h, ny), normalised transformed units
    _, std = norm.of(tags)
    return (norm.engineering(tags, measured) - norm.engineering(tags, measured - errors)) / std


# --------------------------------------------------------------------------- evidence


def _alpha(alpha: Any) -> Fraction:
    """alpha as an exact fraction of its decimal text (0.1 -> 1/10, not the binary float)."""
    try:
        exact = Fraction(str(alpha))  # a Fraction round-trips through its text
    except (ValueError, ZeroDivisionError):
        refuse("uq", expectation("a number", OPEN_UNIT), alpha, name="alpha", error=UQInputError)
    if exact not in OPEN_UNIT:
        refuse_bound("uq", OPEN_UNIT, alpha, name="alpha", error=UQInputError)
    return exact


def conformal_rank(n: int, alpha: Any) -> int:
    """k = ceil((n + 1)(1 - alpha)) in exact arithmetic (may exceed n: the caller fails closed)."""
    return math.ceil((n + 1) * (1 - _alpha(alpha)))


def coverage_threshold(method: str, n_test_runs: int) -> float:
    """Verified-coverage threshold (docs/ARCHITECTURE.md, "UQ evidence rules"): empirical_max -> 1.0;
    split_conformal -> max(0.8, 0.9 - 3 sqrt(0.09 / nTestRuns))."""
    check_choice(method, (SPLIT_CONFORMAL, EMPIRICAL_MAX), "coverage threshold", what="method", error=UQInputError)
    if method == EMPIRICAL_MAX:
        return 1.0
    if n_test_runs not in AT_LEAST_ONE:
        refuse_bound("coverage threshold", AT_LEAST_ONE, n_test_runs, name="nTestRuns", error=UQInputError)
    return max(0.8, 0.9 - 3.0 * math.sqrt(0.09 / n_test_runs))


def clopper_pearson_lower(successes: int, trials: int, confidence: float = CP_CONFIDENCE) -> float:
    """One-sided lower confidence bound of a binomial proportion (exact, via the beta quantile)."""
    if successes <= 0:
        return 0.0
    from scipy import stats  # here, not at the top: ~0.6 s of import every Dagster process paid at load

    return float(stats.beta.ppf(1.0 - confidence, successes, trials - successes + 1))


def exchangeability_p(val: np.ndarray, test: np.ndarray, k: int) -> float:
    """Two-sided Beta-Binomial p-value (see EXCHANGEABILITY_TEST); val (n, n_cv), test (m, n_cv)."""
    n, m = val.shape[0], test.shape[0]
    reference = np.sort(val, axis=0)[k - 1]
    exceed = np.sum(test > reference, axis=0)
    from scipy import stats  # see clopper_pearson_lower

    law = stats.betabinom(m, n + 1 - k, k)
    p = 2.0 * np.minimum(law.cdf(exceed), law.sf(exceed - 1))  # capped at 1 once, after Bonferroni
    return float(min(1.0, val.shape[1] * np.min(p)))


def _too_short(scores: BlockScores, shown: int = 4) -> str:
    """What a segment's runs lack: their rows against what a block needs (`rows_before_blocks` + 1 + h for
    the first, h for each next), naming the runs (the longest first); "" when the scores do not record it."""
    if scores.rows_before is None or not scores.run_rows:
        return ""
    first = scores.rows_before + 1 + scores.h
    runs = sorted(scores.run_rows.items(), key=lambda item: -item[1])
    named = ", ".join(f"{run_id} ({rows})" for run_id, rows in runs[:shown]) + \
        (f" and {len(runs) - shown} more" if len(runs) > shown else "")
    return (f": a run needs {first} rows for its first block ({scores.rows_before} before its start row for the "
            f"model's state and the disturbance it holds, fitted over two settling horizons, then 1 + {scores.h}) "
            f"and {scores.h} more for each next; the runs have {named} rows: record longer runs, or a model that "
            f"settles sooner")


def compute_block_uq(val: BlockScores, test: BlockScores, alpha: Any = 0.1,
                     calibrated_at: str | None = None) -> UQEvidence:
    """UQ evidence from val (sets qhat) and test (measures coverage) block scores, the rules of docs/ARCHITECTURE.md, "UQ evidence rules".

    No evidence (method None) lists every failed rule in `reasons`.
    """
    if val.cv_tags != test.cv_tags:
        raise UQInputError(f"block scores: val CVs {val.cv_tags} differ from test CVs {test.cv_tags}")
    if (val.score, val.h) != (test.score, test.h):
        raise UQInputError(f"block scores: val ({val.score}, h = {val.h}) and test ({test.score}, h = {test.h}) "
                           f"are not scored alike")
    exact_alpha = _alpha(alpha)
    n, m = val.n_blocks, test.n_blocks
    reasons: list[str] = []
    method: str | None
    k: int | None = None
    if n >= MIN_SPLIT_VAL_BLOCKS and val.n_runs >= MIN_SPLIT_VAL_RUNS:
        method = SPLIT_CONFORMAL
        k = conformal_rank(n, exact_alpha)
        if k > n:
            reasons.append(f"conformal rank k = ceil((n+1)(1-alpha)) = {k} exceeds the {n} val blocks "
                           f"(alpha {alpha} is too small for this many blocks); not capped at the max")
    elif n >= MIN_EMPIRICAL_VAL_BLOCKS:
        method = EMPIRICAL_MAX
    else:
        method = None
        reasons.append(f"{n} val block(s) of {val.h} steps; at least {MIN_EMPIRICAL_VAL_BLOCKS} are needed "
                       f"({MIN_SPLIT_VAL_BLOCKS} from >= {MIN_SPLIT_VAL_RUNS} runs for split conformal)"
                       + _too_short(val))
    bad = [tag for tag, ok in zip(val.cv_tags, np.all(np.isfinite(val.scores), axis=0)) if not ok]
    if bad:
        reasons.append(f"non-finite val score for CV {', '.join(bad)}")
    if test.n_unique_steps < MIN_UNIQUE_TEST_STEPS:
        reasons.append(f"{test.n_unique_steps} unique test steps; at least {MIN_UNIQUE_TEST_STEPS} are needed")
    if test.n_runs < MIN_TEST_RUNS:
        reasons.append(f"{test.n_runs} test run(s) with a block; at least {MIN_TEST_RUNS} are needed")
    if m < MIN_TEST_BLOCKS:
        reasons.append("no test block")

    common = dict(alpha=float(alpha), block_length=val.h, cv_tags=val.cv_tags, n_val_blocks=n, n_val_runs=val.n_runs,
                  n_test_blocks=m, n_test_runs=test.n_runs, n_unique_test_steps=test.n_unique_steps,
                  exchangeability_test=EXCHANGEABILITY_TEST, calibrated_at=calibrated_at, score=val.score,
                  score_rule=rule_text(val.score))
    if reasons:
        log.info("no UQ evidence: %s", "; ".join(reasons))
        return UQEvidence(method=None, qhat=None, rank_k=k, safety_factor=None, coverage=None, coverage_per_cv=None,
                          coverage_threshold=None, coverage_lower_95=None, exchangeability_p=None,
                          reasons=tuple(reasons), **common)

    ordered = np.sort(val.scores, axis=0)
    if method == SPLIT_CONFORMAL:
        qhat, factor, rank = ordered[k - 1], None, k
    else:
        qhat, factor, rank = ordered[-1] * EMPIRICAL_SAFETY_FACTOR, EMPIRICAL_SAFETY_FACTOR, n
    covered = np.sum(test.scores <= qhat, axis=0)  # a non-finite test score is not covered
    per_cv = covered / m
    worst = int(np.argmin(per_cv))
    return UQEvidence(
        method=method, qhat=tuple(float(q) for q in qhat), rank_k=k, safety_factor=factor,
        coverage=float(per_cv[worst]), coverage_per_cv=tuple(float(c) for c in per_cv),
        coverage_threshold=coverage_threshold(method, test.n_runs),
        coverage_lower_95=clopper_pearson_lower(int(covered[worst]), m),
        exchangeability_p=exchangeability_p(val.scores, test.scores, rank), reasons=(), **common)


def gate_checks(evidence: UQEvidence, gate: str = "seed") -> list[Condition]:
    """The UQ gate as conditions. seed: evidence exists and coverage >= threshold; strict
    additionally: Clopper-Pearson lower bound >= 0.8 and exchangeability p >= 0.01."""
    check_choice(gate, GATES, "uq gate", what="setting", error=UQInputError)
    if not evidence.has_evidence:
        why = "; ".join(evidence.reasons)
        return [Condition("UQ evidence", "none: " + why, f"{SPLIT_CONFORMAL} or {EMPIRICAL_MAX}", False,
                          "no UQ evidence: " + why)]
    checks = [Condition("UQ evidence", evidence.method, f"{SPLIT_CONFORMAL} or {EMPIRICAL_MAX}", True),
              Condition("test coverage (worst CV)", f"{evidence.coverage:.4g}", f">= {evidence.coverage_threshold:.4g}",
                        evidence.coverage >= evidence.coverage_threshold,
                        f"test coverage {evidence.coverage:.3f} < threshold {evidence.coverage_threshold:.3f}")]
    if gate == "strict":
        checks += [
            Condition("coverage 95% lower bound", f"{evidence.coverage_lower_95:.4g}", f">= {STRICT_MIN_COVERAGE_LOWER:g}",
                      evidence.coverage_lower_95 >= STRICT_MIN_COVERAGE_LOWER,
                      f"coverage 95% lower bound {evidence.coverage_lower_95:.3f} < {STRICT_MIN_COVERAGE_LOWER}"),
            Condition("val/test exchangeability p", f"{evidence.exchangeability_p:.4g}",
                      f">= {STRICT_MIN_EXCHANGEABILITY_P:g}", evidence.exchangeability_p >= STRICT_MIN_EXCHANGEABILITY_P,
                      f"val/test exchangeability p = {evidence.exchangeability_p:.4g} < {STRICT_MIN_EXCHANGEABILITY_P}")]
    return checks


def gate_failures(evidence: UQEvidence, gate: str = "seed") -> list[str]:
    """Failed conditions of the UQ gate ([] = passes), as text."""
    return [c.reason for c in gate_checks(evidence, gate) if not c.holds]


def gate_passes(evidence: UQEvidence, gate: str = "seed") -> bool:
    return not gate_failures(evidence, gate)


def band_engineering(evidence: UQEvidence, artifact: ModelArtifact) -> tuple[float | None, ...]:
    """UQ half-width per CV in engineering units (qhat * train std); None per CV without evidence."""
    if evidence.qhat is None:
        return tuple(None for _ in artifact.cv_tags)
    _, std = artifact.normalisation.of(artifact.cv_tags)
    return tuple(float(q * s) for q, s in zip(evidence.qhat, std))


# --------------------------------------------------------------------------- input distance, freshness


def input_distance(artifact: ModelArtifact, u_now: Sequence[float], y_now: Sequence[float]) -> float | None:
    """max |z| over the current MVs and CVs against the train normalisation (engineering inputs).

    A tag whose train std is below 1e-9 gives inf; a length mismatch or a non-finite value gives
    None (never invented).
    """
    try:
        u, y = np.asarray(u_now, float), np.asarray(y_now, float)
    except (TypeError, ValueError):  # ragged or non-numeric: not a measurement we can use
        return None
    if u.shape != (len(artifact.mv_tags),) or y.shape != (len(artifact.cv_tags),):
        return None
    x = np.concatenate([u, y])
    if not np.all(np.isfinite(x)):
        return None
    tags = artifact.mv_tags + artifact.cv_tags
    if np.any(artifact.normalisation.of(tags)[1] < MIN_STD):
        return math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        z = artifact.normalisation.normalise(tags, x)  # a CV at or beyond its transform's limits: inf / NaN
    return float(np.max(np.abs(z))) if np.all(np.isfinite(z)) else math.inf


def _instant(value: datetime | str, what: str) -> datetime:
    if isinstance(value, str):
        try:
            value = parse_iso_utc(value)
        except ValueError:
            refuse(what, "an ISO 8601 timestamp", value, error=UQInputError)
    if not isinstance(value, datetime):
        refuse(what, "a datetime or ISO 8601 text", value, error=UQInputError)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)  # naive = UTC


def is_fresh(calibrated_at: datetime | str | None, now: datetime | str, fresh_days: float = 7) -> bool:
    """Fresh when now - calibrated_at <= fresh_days (naive timestamps are UTC); never calibrated -> False."""
    if calibrated_at is None:
        return False
    return _instant(now, "now") - _instant(calibrated_at, "calibrated_at") <= timedelta(days=fresh_days)
