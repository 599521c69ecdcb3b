"""Statistical validity of the block-conformal evidence on a simulated stable ARX plant.

Plant y[t] = 0.8 y[t-1] + 0.5 u[t-1] + e[t], e ~ N(0, 0.1^2) iid, and the artifact is the true model:
val and test blocks are identically distributed, and independent across runs (within a run, the held
disturbances of neighbouring blocks are fitted over overlapping rows), so the split-conformal test
coverage has expectation k / (n + 1) up to that dependence, which the tolerance below ignores. Each replication has 3 val
runs x 13 blocks (n = 39, k = 36: expectation 0.9) and 4 test runs x 10 blocks of h = 5 steps.
"""

import math

import numpy as np
from model_helpers import binding, run_series, simulate_arx, unit_normalisation

from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.model.arx import disturbance_window
from optimizer_pipeline.uq import BlockScores, block_scores, compute_block_uq, gate_passes

REPLICATIONS = 200
H = 5
VAL_RUNS, VAL_BLOCKS = 3, 13
TEST_RUNS, TEST_BLOCKS = 4, 10
NOISE = 0.1
MODEL = ArxModel(Orders(1, 1, 1), A=np.array([[[0.8]]]), B=np.array([[[0.5]]]), D=np.zeros((1, 1, 0)),
                 c=np.zeros(1))


def artifact():
    spec = binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=H)
    return artifact_from_model(MODEL, spec, 1, unit_normalisation(spec))


def replicated_scores(rng, runs_per_rep: int, blocks_per_run: int, noise: float, prefix: str) -> list[BlockScores]:
    """All replications simulated and scored at once, then cut into one BlockScores per replication."""
    # first state row 0, then the W rows the held disturbance is fitted over
    n_runs, n = REPLICATIONS * runs_per_rep, disturbance_window(artifact().state_space, H) + blocks_per_run * H + 1
    u = rng.normal(size=(n_runs, n, 1))
    d = np.zeros((n_runs, n, 0))
    y = simulate_arx(MODEL.A, MODEL.B, MODEL.D, MODEL.c, 1, u, d, noise * rng.normal(size=(n_runs, n, 1)))
    scores = block_scores(artifact(), run_series(prefix, u, y, d))
    per_rep = runs_per_rep * blocks_per_run
    assert scores.n_blocks == REPLICATIONS * per_rep
    return [BlockScores(scores.cv_tags, H, scores.run_ids[i * per_rep:(i + 1) * per_rep],
                        scores.starts[i * per_rep:(i + 1) * per_rep], scores.scores[i * per_rep:(i + 1) * per_rep],
                        per_rep * H, runs_per_rep) for i in range(REPLICATIONS)]


def evidences(test_noise: float, seed: int):
    rng = np.random.default_rng(seed)
    val = replicated_scores(rng, VAL_RUNS, VAL_BLOCKS, NOISE, "v")
    test = replicated_scores(rng, TEST_RUNS, TEST_BLOCKS, test_noise, "t")
    return [compute_block_uq(v, t, alpha=0.1) for v, t in zip(val, test)]


def coverage_tolerance() -> tuple[float, float]:
    """Expected coverage k / (n + 1) and 4 standard deviations of the mean over replications.

    Per replication, p = F(qhat) ~ Beta(k, n + 1 - k) and covered blocks | p ~ Binomial(m, p).
    """
    n, m = VAL_RUNS * VAL_BLOCKS, TEST_RUNS * TEST_BLOCKS
    k = math.ceil((n + 1) * 0.9)
    a, b = k, n + 1 - k
    mean = a / (a + b)
    var_p = a * b / ((a + b) ** 2 * (a + b + 1))
    var = var_p + (mean - (var_p + mean ** 2)) / m
    return mean, 4 * math.sqrt(var / REPLICATIONS)


def test_mean_test_coverage_is_within_binomial_tolerance_of_1_minus_alpha():
    results = evidences(test_noise=NOISE, seed=11)
    assert all(e.method == "split_conformal" for e in results)
    expected, tolerance = coverage_tolerance()
    assert expected == 0.9
    assert abs(np.mean([e.coverage for e in results]) - expected) <= tolerance


def test_exchangeable_runs_pass_the_seed_gate_in_most_replications():
    results = evidences(test_noise=NOISE, seed=12)
    assert np.mean([gate_passes(e, "seed") for e in results]) >= 0.8
    assert np.mean([e.exchangeability_p < 0.01 for e in results]) <= 0.05  # a valid test rarely rejects


def test_inflated_test_noise_fails_the_gate_in_most_replications():
    results = evidences(test_noise=1.5 * NOISE, seed=13)
    assert np.mean([gate_passes(e, "seed") for e in results]) <= 0.2
    assert np.mean([gate_passes(e, "strict") for e in results]) <= 0.1
