"""model/fit.py: the ARX fit with its steady gains constrained (`RidgeProblem.fit(..., steady=K)`),
against known answers: the gains it is given, the unconstrained fit when given that fit's own gains, and
the true coefficients when given the true gains."""

import numpy as np
from model_helpers import binding, split_of
from test_model_arx import normalised_truth, plant_runs

from optimizer_pipeline.model.arx import stack_runs
from optimizer_pipeline.model.fit import RidgeProblem, Structure, layout
from optimizer_pipeline.model.statespace import steady_state


def problem_of(noise: float, seed: int = 4):
    spec = binding(n_dv=1, na=2, nb=2, delay=2)
    split = split_of(spec, plant_runs(seed=seed, runs=10, n=400, noise=noise), 6, 2, 2)
    train = stack_runs(split.train, split.normalisation, spec.mv_tags, spec.cv_tags, spec.dv_tags)
    return RidgeProblem(train, 2, 4), split, spec


def gains(model) -> np.ndarray:
    g, gd, _ = steady_state(model.realise())
    return np.hstack([g, gd])


STRUCTURES = {"mimo": Structure(2, 2, ((2, 2, 2), (2, 2, 2))),
              "miso, delays per channel": Structure(2, 2, ((2, 3, 2), (2, 2, 3)), own_ar=True)}


def test_the_constrained_fit_has_exactly_the_gains_it_is_given():
    problem, _, _ = problem_of(noise=0.05)
    wanted = np.array([[1.5, -0.4, 0.7], [0.2, 2.0, -0.3]])
    for structure in STRUCTURES.values():
        np.testing.assert_allclose(gains(problem.fit(structure, 1e-6, steady=wanted)), wanted, atol=1e-9)


def test_given_its_own_gains_the_constrained_fit_is_the_unconstrained_one():
    """The unconstrained optimum satisfies its own constraint, so the constrained optimum is the same point."""
    problem, _, _ = problem_of(noise=0.05)
    for structure in STRUCTURES.values():
        free = problem.fit(structure, 1e-4)
        np.testing.assert_allclose(problem.fit(structure, 1e-4, steady=gains(free)).theta(), free.theta(), atol=1e-8)


def test_given_the_true_gains_noise_free_data_give_the_true_coefficients():
    problem, split, spec = problem_of(noise=0.0)
    A, B, D, _ = normalised_truth(split.normalisation, spec)
    truth_gain = np.linalg.solve(np.eye(2) - A.sum(axis=0), np.hstack([B.sum(axis=0), D.sum(axis=0)]))
    model = problem.fit(STRUCTURES["mimo"], 1e-12, steady=truth_gain)
    free = problem.fit(STRUCTURES["mimo"], 1e-12)
    np.testing.assert_allclose(model.theta(), free.theta(), atol=1e-6)
    np.testing.assert_allclose(gains(model), truth_gain, atol=1e-9)


def test_the_constraint_costs_fit_only_as_far_as_the_gains_move():
    """The one-step error grows with the distance of the imposed gains from the data's own."""
    problem, _, _ = problem_of(noise=0.05)
    structure = STRUCTURES["mimo"]
    free = problem.fit(structure, 1e-6)
    gram = problem.run_gram.sum(axis=0) / problem.run_rows.sum()
    cross = problem.run_cross.sum(axis=0) / problem.run_rows.sum()

    def objective(model) -> float:  # the mean squared one-step error up to a constant, summed over the CVs
        return sum(float(t @ g @ t - 2 * t @ c) for t, g, c in _per_cv(problem, structure, model.theta(), gram, cross))

    costs = [objective(problem.fit(structure, 1e-6, steady=gains(free) * (1 + shift))) for shift in (0.0, 0.05, 0.2)]
    assert costs[0] < costs[1] < costs[2]


def _per_cv(problem, structure, theta, gram, cross):
    """Per CV: its coefficients, its block of the normal matrix and its cross products."""
    for i, (cols, rows) in enumerate(layout(structure, problem.dims, problem.na_full, problem.lag_full)):
        yield theta[rows, i], gram[np.ix_(cols, cols)], cross[cols, i]
