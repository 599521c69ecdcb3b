"""Block scores: non-overlapping h-step open-loop blocks from measured states, the disturbance fitted over the
rows before each block held, per run."""

import numpy as np
import pytest
from model_helpers import binding, run_series, simulate_arx

from optimizer_pipeline.contracts import ModelArtifact, Normalisation, RunSeries
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.model import arx
from optimizer_pipeline.model.arx import disturbance_window
from optimizer_pipeline.uq import MAX_RESIDUAL, SETTLED_RESIDUAL, UQInputError, block_scores

MODEL = ArxModel(Orders(2, 2, 2), A=np.array([[[0.6, 0.1], [0.0, 0.5]], [[0.2, 0.0], [0.05, -0.1]]]),
                 B=np.array([[[0.3, 0.1], [0.1, 0.2]], [[0.1, 0.0], [0.0, 0.1]]]),
                 D=np.array([[[0.2], [0.0]], [[0.0], [0.1]]]), c=np.array([0.05, -0.02]))
NORM = Normalisation(("u0", "u1", "y0", "y1", "d0"), (1.0, -2.0, 5.0, 3.0, 0.5), (2.0, 0.5, 1.5, 4.0, 3.0))


def artifact(horizon: int = 5):
    return artifact_from_model(MODEL, binding(n_dv=1, na=2, nb=2, delay=2, horizon=horizon), 1, NORM)


def random_runs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [RunSeries(f"run-{i}", np.arange(float(n)), rng.normal(size=(n, 2)), rng.normal(size=(n, 2)) * 3,
                      rng.normal(size=(n, 1))) for i, n in enumerate(lengths)]


def test_block_scores_hold_the_disturbance_fitted_to_the_rows_before_each_block():
    """max_residual scores what a move plan predicts: the open-loop rollout from the block's measured
    state with the disturbance fitted over the W rows before the block held, as the live solve holds it."""
    runs = random_runs([77, 92, 58])
    scores = block_scores(artifact(), runs)
    ids, starts, expected = naive_scores(runs, 5)
    assert set(ids) == {"run-0", "run-1", "run-2"} and len(expected) >= 10
    assert list(scores.run_ids) == ids and list(scores.starts) == starts
    np.testing.assert_allclose(scores.scores, np.array(expected), rtol=1e-9, atol=1e-11)


def test_blocks_tile_each_run_without_overlap_and_count_only_runs_with_a_block():
    window = disturbance_window(artifact().state_space, 5)
    # a run of window + 7 rows holds no 5-step block after its first state row (2) and the window
    scores = block_scores(artifact(), random_runs([window + 37, window + 7, window + 18]))
    # run-0 has blocks at k = 2 + W, 7 + W, .., 27 + W (k + 5 <= W + 36), run-2 at k = 2 + W, 7 + W, 12 + W
    assert scores.n_runs == 2 and scores.n_blocks == 6 + 3 and scores.starts[0] == 2 + window
    assert scores.n_unique_steps == scores.n_blocks * 5
    for run_id in ("run-0", "run-2"):
        assert np.all(np.diff(scores.starts[scores.run_ids == run_id]) == 5)


def test_the_pieces_of_one_run_count_as_one_run():
    """Pieces of a run split at a gap (RunSeries.source_run) are scored as series of their own but count
    once: the UQ rules' run counts are of the plant's runs (uq.MIN_TEST_RUNS, the split-conformal rule)."""
    a, b, c = random_runs([77, 70, 58])
    pieces = [RunSeries(f"run-0#{i}", r.t, r.u, r.y, r.d, source_run="run-0") for i, r in ((1, a), (2, b))]
    scores = block_scores(artifact(), pieces + [c])
    assert set(scores.run_ids) == {"run-0#1", "run-0#2", "run-2"} and scores.n_runs == 2
    assert block_scores(artifact(), pieces).n_runs == 1


def test_one_step_blocks_score_the_first_step():
    runs = random_runs([70, 65], seed=1)
    scores = block_scores(artifact(horizon=5), runs, h=1)
    ids, starts, expected = naive_scores(runs, 1)
    assert scores.h == 1 and scores.n_blocks == len(expected) == len(starts) > 40
    np.testing.assert_allclose(scores.scores, np.array(expected), rtol=1e-9, atol=1e-11)


def test_block_length_defaults_to_the_training_horizon():
    assert block_scores(artifact(horizon=7), random_runs([80])).h == 7


def test_no_runs_give_no_blocks():
    scores = block_scores(artifact(), [])
    assert scores.n_blocks == 0 and scores.n_runs == 0 and scores.scores.shape == (0, 2)


def test_block_length_below_one_is_rejected():
    with pytest.raises(UQInputError, match="h must be >= 1"):
        block_scores(artifact(), random_runs([40]), h=0)


def test_a_perfect_model_scores_zero():
    rng = np.random.default_rng(2)
    u, d = rng.normal(size=(2, 80, 2)), rng.normal(size=(2, 80, 1))
    # engineering-unit plant whose normalised form is MODEL: simulate in normalised units, then map back
    yn = simulate_arx(MODEL.A, MODEL.B, MODEL.D, MODEL.c, 2, (u - NORM.mean[:2]) / NORM.std[:2],
                      (d - NORM.mean[4:]) / NORM.std[4:], np.zeros((2, 80, 2)), y_init=rng.normal(size=(2, 3, 2)))
    y = np.asarray(NORM.mean[2:4]) + yn * np.asarray(NORM.std[2:4])
    scores = block_scores(artifact(), run_series("p", u, y, d))
    assert scores.n_blocks > 0
    np.testing.assert_allclose(scores.scores, 0.0, atol=1e-9)


def naive_scores(runs, h: int, settled: bool = False) -> tuple[list, list, list]:
    """Per block, |y - simulated| over the block's h steps (max_residual: the largest; settled: the last),
    the simulation adding bias to every step of the plain ARX recursion in normalised units (independent
    of the realisation); bias = the constant added to every step of the same recursion run over the W
    rows before the block (from the measured history there) that fits those rows' measured y best, by
    np.linalg.lstsq on the recursion's response to each unit bias."""
    window = disturbance_window(artifact().state_space, 5)
    mean, std = np.asarray(NORM.mean), np.asarray(NORM.std)
    ids, starts, scores = [], [], []

    def arx(t, y_at, u, d):  # y[t] from y values given by y_at(t - 1), y_at(t - 2) and the inputs
        return (MODEL.A[0] @ y_at(t - 1) + MODEL.A[1] @ y_at(t - 2) + MODEL.c
                + sum(MODEL.B[j] @ u[t - 2 - j] + MODEL.D[j] @ d[t - 2 - j] for j in range(2)))

    def simulate(y, u, d, start, steps, bias):  # y[start + 1 .. start + steps] from the measured history at start
        sim = {t: y[t] for t in range(start - 1, start + 1)}
        for t in range(start + 1, start + steps + 1):
            sim[t] = arx(t, sim.__getitem__, u, d) + bias
        return np.array([sim[t] for t in range(start + 1, start + steps + 1)])

    for run in runs:
        u = (run.u - mean[:2]) / std[:2]
        y = (run.y - mean[2:4]) / std[2:4]
        d = (run.d - mean[4:]) / std[4:]
        k = MODEL.orders.first_state_row + window
        while k + h <= len(run) - 1:
            free = simulate(y, u, d, k - window, window, np.zeros(2))
            response = np.stack([simulate(y, u, d, k - window, window, unit) - free for unit in np.eye(2)], axis=-1)
            bias = np.linalg.lstsq(response.reshape(-1, 2), (y[k - window + 1:k + 1] - free).ravel(), rcond=None)[0]
            errors = np.abs(y[k + 1:k + h + 1] - simulate(y, u, d, k, h, bias))
            scores.append(errors[-1] if settled else errors.max(axis=0))
            ids.append(run.run_id)
            starts.append(k)
            k += h
    return ids, starts, scores


def test_settled_scores_hold_the_disturbance_fitted_to_the_rows_before_each_block():
    runs = random_runs([80, 45, 61], seed=2)
    scored = artifact(horizon=6)
    window = disturbance_window(scored.state_space, 6)
    scores = block_scores(scored, runs, h=9, score=SETTLED_RESIDUAL)
    ids, starts, expected = naive_scores(runs, 9, settled=True)
    assert window > 6 and len(expected) >= 3  # the window is the model's, longer than P; blocks in 2+ runs
    assert scores.score == SETTLED_RESIDUAL and scores.h == 9
    assert list(scores.run_ids) == ids and list(scores.starts) == starts and starts[0] == 2 + window
    np.testing.assert_allclose(scores.scores, np.array(expected), rtol=1e-9, atol=1e-11)
    assert scores.n_unique_steps == len(expected) * 9


@pytest.mark.parametrize("settled", [False, True])
def test_scores_with_the_disturbance_filtered_a_few_windows_at_a_time_are_the_same(monkeypatch, settled):
    """The held disturbance's filter gathers the residual windows of the blocks in chunks
    (model.arx.WINDOW_CHUNK_VALUES): chunks of two blocks, two of them with the end of one run and the
    start of the next, give the independent scores."""
    runs = random_runs([75, 55, 61], seed=3)
    h, window = 6, disturbance_window(artifact().state_space, 5)
    monkeypatch.setattr(arx, "WINDOW_CHUNK_VALUES", 3 * window * 2 - 1)  # two windows of W rows, 2 CVs
    scores = block_scores(artifact(), runs, h=h, score=SETTLED_RESIDUAL if settled else MAX_RESIDUAL)
    ids, starts, expected = naive_scores(runs, h, settled=settled)
    assert ids == ["run-0"] * 5 + ["run-1"] * 2 + ["run-2"] * 3  # blocks 4 | 5 and 6 | 7 share a chunk
    assert list(scores.run_ids) == ids and list(scores.starts) == starts
    np.testing.assert_allclose(scores.scores, np.array(expected), rtol=1e-9, atol=1e-11)


def test_unknown_score_rule_is_refused():
    with pytest.raises(UQInputError, match="score"):
        block_scores(artifact(), random_runs([40]), score="median")


SLOW = ArxModel(Orders(1, 1, 1), A=np.array([[[0.95]]]), B=np.array([[[0.05]]]), D=np.zeros((1, 1, 0)),
                c=np.array([0.0]))


@pytest.mark.parametrize("val_rows_over_shortest", [-1, 0, 9, 200])
def test_the_held_disturbance_window_is_shortened_to_what_the_evidence_runs_hold(val_rows_over_shortest):
    """Identification keeps the held disturbance's window W at the rule's (two settling horizons, at least P)
    where the val runs hold 2 blocks of P with it, else the longest W down to one settling horizon with which
    they do (model.window.supported_window): block scoring then finds its blocks; below that, the rule."""
    from dataclasses import replace

    from optimizer_pipeline.model.artifact import stack_for
    from optimizer_pipeline.model.window import held_window, supported_window
    from optimizer_pipeline.model.statespace import settling_steps

    h, first = 10, Orders(1, 1, 1).first_state_row
    slow = artifact_from_model(SLOW, binding(n_mv=1, n_cv=1, na=1, nb=1, delay=1, horizon=h), 1,
                               Normalisation(("u0", "y0"), (0.0, 0.0), (1.0, 1.0)))
    settling = settling_steps(slow.state_space)
    rule, shortest = disturbance_window(slow.state_space, h), max(h, settling)
    assert rule == 2 * settling > shortest  # a model slow against P: the window can be shortened
    val_rows = first + shortest + 1 + h + val_rows_over_shortest  # two val runs of a block each at W = ...
    runs = lambda lengths, seed: [RunSeries(f"{seed}-{i}", r.t, r.u[:, :1], r.y[:, :1], r.d[:, :0])  # noqa: E731
                                  for i, r in enumerate(random_runs(lengths, seed))]
    val, test = runs([val_rows, val_rows], 1), runs([first + rule + 1 + 6 * h] * 2, 2)
    window, record = supported_window(slow.state_space, Orders(1, 1, 1), h, stack_for(slow, val),
                                      stack_for(slow, test))
    expected = min(val_rows - 1 - first - h, rule)  # the longest W leaving each val run one block
    if expected < shortest:  # too short even at one settling horizon: the rule, and the evidence says why
        assert window is None and record["rows"] == rule
        return
    assert record["rows"] == expected and window == (None if expected == rule else expected)
    chosen = replace(slow, disturbance_rows=window)
    assert held_window(chosen) == expected
    assert block_scores(chosen, val).n_blocks >= 2 and block_scores(chosen, test).n_unique_steps >= 120
    # written and read back whole; an artifact on the rule's window keeps the JSON it had before the field
    assert ModelArtifact.from_dict(chosen.to_dict()).artifact_hash == chosen.artifact_hash
    assert ("disturbance_rows" in chosen.to_dict()) == (window is not None)
    if window is not None:  # a block in each val run, and one row more leaves them none
        assert block_scores(chosen, val).n_blocks == 2
        assert block_scores(replace(slow, disturbance_rows=window + 1), val).n_blocks == 0
