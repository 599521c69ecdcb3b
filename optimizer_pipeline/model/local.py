"""Local models for steady targets: the artifact's structure refitted around an operating point.

A linear model fitted to the whole history carries the history's average gain. On a plant whose gain
changes over the operating range (the blending tank: its concentration is a ratio of the flows), a
steady target computed with that gain from the live MVs misses by the difference between the average
and the secant from the live point to the answer, which no better global fit can remove
(bench/linear_floor.py). The secant is close to the plant's local gain at the midpoint of the move,
so the steady solve refits the model there (pipeline.solve_and_decide):

* the operating point of a move is the midpoint of its start (the MVs held there, the CVs measured
  there) and its predicted end (the MVs it holds, the CVs the global model predicts they settle to);
* the local model is the artifact's structure and ridge refitted by least squares with every train
  target row weighted by a Gaussian kernel of the distance between the MVs / CVs of the row before it
  and that point, in normalised units (train standard deviations), width LOCAL_BANDWIDTH;
* identification keeps the local procedure for a steady target only when it predicts the settled
  values of held-out data closer than the global model (model/artifact.py, `selection.steady_model`),
  and its evidence scores the same procedure on every val / test block (uq.SETTLED_LOCAL): each block
  predicted by the model refitted at its own operating point, so the band covers what the
  recommendation does.
"""

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from optimizer_pipeline.contracts import ModelArtifact, StateSpace
from optimizer_pipeline.model.arx import ArxModel, Orders, Stacked, rollout_windows
from optimizer_pipeline.model.fit import RidgeProblem, Structure

LOCAL_BANDWIDTH = 1.0  # kernel width in train standard deviations, over the MVs and CVs together
LOCAL = "local"
GLOBAL = "global"


@dataclass(frozen=True, eq=False)
class OperatingPoint:
    """Where a local model is centred: MVs (nu,) and CVs (ny,), normalised units."""

    u: np.ndarray
    y: np.ndarray

    @staticmethod
    def of_move(u_start: np.ndarray, y_start: np.ndarray, u_end: np.ndarray, y_end: np.ndarray) -> "OperatingPoint":
        """The midpoint of a move from (u_start, y_start) to its predicted end (u_end, y_end)."""
        return OperatingPoint((np.asarray(u_start, float) + u_end) / 2, (np.asarray(y_start, float) + y_end) / 2)

    def to_json_dict(self) -> dict[str, Any]:
        return {"u": np.asarray(self.u, float).tolist(), "y": np.asarray(self.y, float).tolist()}


def structure_of(artifact: ModelArtifact) -> tuple[Structure, float]:
    """The structure and ridge identification chose (artifact.selection); a model without that record
    (e.g. a benchmark's reference fit) is refitted with its plain orders and no ridge."""
    selection = artifact.selection or {}
    record, final = selection.get("structure"), selection.get("final") or {}
    if record:
        structure = Structure(int(record["na"]), int(record["nb"]), tuple(tuple(int(d) for d in row)
                                                                          for row in record["delays"]),
                              bool(record.get("own_ar", False)))
    else:
        structure = Structure.common(Orders(artifact.na, artifact.nb, artifact.delay), len(artifact.cv_tags),
                                     len(artifact.mv_tags) + len(artifact.dv_tags))
    return structure, float(final.get("ridge", 0.0))


def steady_procedure(artifact: ModelArtifact) -> str:
    """LOCAL when identification chose the local procedure for steady targets, else GLOBAL."""
    return ((artifact.selection or {}).get("steady_model") or {}).get("procedure", GLOBAL)


class LocalFitter:
    """The train regression of one structure, refitted around operating points (module docstring)."""

    def __init__(self, structure: Structure, ridge: float, train: Stacked, bandwidth: float = LOCAL_BANDWIDTH):
        self.structure, self.ridge, self.bandwidth = structure, float(ridge), float(bandwidth)
        self.problem = RidgeProblem(train, structure.na, structure.orders.max_lag)
        before = self.problem.rows - 1  # the row before each target row: same run (rows start after the lags)
        self._u, self._y = train.u[before], train.y[before]

    @staticmethod
    def for_artifact(artifact: ModelArtifact, train: Stacked) -> "LocalFitter":
        return LocalFitter(*structure_of(artifact), train)

    def weights(self, point: OperatingPoint) -> np.ndarray:
        """Kernel weight of every target row of the regression (rows of `problem.rows`)."""
        distance = np.sum((self._u - point.u) ** 2, axis=1) + np.sum((self._y - point.y) ** 2, axis=1)
        return np.exp(-0.5 * distance / self.bandwidth ** 2)

    def problem_at(self, point: OperatingPoint) -> RidgeProblem:
        return self.problem.weighted(self.weights(point))

    def model_at(self, point: OperatingPoint) -> ArxModel:
        return self.problem_at(point).fit(self.structure, self.ridge)

    def effective_rows(self, point: OperatingPoint) -> float:
        """Kish's effective sample size of the weighted fit: (sum w)^2 / sum w^2."""
        w = self.weights(point)
        return float(w.sum() ** 2 / max(float(np.sum(w ** 2)), 1e-300))


def settled_local(fitter: LocalFitter, stacked: Stacked, orders: Orders, rows: np.ndarray, h: int,
                  predicted_end: np.ndarray) -> tuple[list[StateSpace], np.ndarray]:
    """Per window k of `rows`: the local model at the window's operating point (its first MVs and its
    CVs at k, to the MVs of its last step and `predicted_end`, the global prediction there) and its
    h-step open-loop prediction of y[k + h] (n, ny), from the same measured start state and inputs as
    the global model's `rollout_windows`. The models are returned realised, for the held
    disturbance of each window (uq)."""
    models, ends = [], np.empty((rows.size, stacked.y.shape[1]))
    for i, k in enumerate(rows):
        point = OperatingPoint.of_move(stacked.u[k], stacked.y[k], stacked.u[k + h - 1], predicted_end[i])
        local = fitter.model_at(point).realise()
        models.append(local)
        ends[i] = rollout_windows(local, stacked, orders, np.array([k]), h)[0][0, -1]
    return models, ends


def steady_model_record(procedure: str, global_error: float, local_error: float,
                        bandwidth: float = LOCAL_BANDWIDTH) -> Mapping[str, Any]:
    """What identification records of the choice (artifact.selection["steady_model"])."""
    def finite(value: float) -> float | None:
        return float(value) if np.isfinite(value) else None

    return {"procedure": procedure, "bandwidth": bandwidth,
            "rule": "the local procedure when its held-out settled NRMSE is below the global model's",
            "settled_nrmse": {GLOBAL: finite(global_error), LOCAL: finite(local_error)}}
