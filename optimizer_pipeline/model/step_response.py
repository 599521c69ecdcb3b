"""The step-response matrix of an identified model, the view a process-control engineer judges a
model by: for every (CV, input) pair, inputs being the MVs then the DVs, the response to a unit step
of the input with its standard error, the gain, dead time and settling time; for the MV gain matrix
its condition number and relative gain array. `step_response_record` makes the JSON-able record the
model artifact stores (`ModelArtifact.step_response`); `step_response_table` shows it as Markdown
(the `model_artifact` metadata and the `model` command).

Definitions (engineering units: CV units per unit of the input; the input steps by one unit at
time 0 and is held, the others stay put; `response[k]` is the CV change at the end of step k, i.e.
k + 1 sample periods after the step, the statespace.rollout convention):

  gain          the settled change, statespace.steady_state of the model; for an integrating CV (a
                level, `integrating_cvs`) its settled rate, CV units per sample: the response ramps.
  dead time     the apparent dead time of the tangent method (process reaction curve), in samples:
                where the tangent at the steepest sample-to-sample move of the response (toward the
                side of its largest |response|) crosses zero. With response[k*] - response[k* - 1]
                that move (response[-1] = 0 at time 0): k* + 1 - response[k*] / (its size).
                0 for a first-order lag, D for a first-order lag behind a transport delay of D
                samples; a channel whose ARX delay is d (model/fit.py, Structure.delays) responds
                exactly 0 for d - 1 samples, so its dead time is at least d - 1. Fractional for
                higher-order lags (their apparent dead time). None when the response is 0 or
                overflows within the horizon (an unstable model; its overflowed steps are None too).
  settling time statespace.settling_steps of the pair alone: the response stays within 5 % of its
                gain from `response[settling_steps - 1]` on (seconds = steps x sample period);
                None when it does not within MAX_SETTLING_STEPS (slow, integrating or unstable).
  horizon       HORIZON_FACTOR x the model's settling horizon (every pair within 5 % of its
                output's largest gain), at most MAX_STEPS; MAX_STEPS when the model does not settle.
  uncertainty   the jackknife over the train runs (model/artifact.py: the chosen structure refitted
                without one train run at a time): per pair and step, and for the gain and the dead
                time, se = sqrt((K - 1) / K * sum_r (x_r - mean x)^2) over the K replicates' values.
                None with fewer than 2 train runs.
  gain spread   how far the plant's gain strays from the model's over the history's operating range:
                the root-mean-square deviation of the local gains (the model refitted around each
                held-out operating point, model/local.py) from its gain; None without held-out
                windows. The steady-gain uncertainty adds it to the jackknife's (model/artifact.py).
  condition     of the MV gain matrix in engineering units (the artifact's `steady_gain.condition`
                is the same in normalised units); None when singular.
  RGA           G .* inv(G)^T of the MV gain matrix G (Bristol); for a non-square or singular G
                the Moore-Penrose pseudo-inverse takes the place of inv, and `rga_method` says so.

A CV with a transform (contracts.transform) is modelled in its transformed units: its rows are in
those (equal to engineering units at the middle of the transform's limits, smaller steps of the CV
toward them), and `transformed_cvs` names them with their transform.
"""

from typing import Any, Mapping, Sequence

import numpy as np

from optimizer_pipeline.contracts import BindingSpec, Normalisation, StateSpace
from optimizer_pipeline.model.statespace import (SETTLE_FRACTION, integrating_outputs, rollout, settling_steps,
                                                 steady_state)

HORIZON_FACTOR = 2  # the response is shown as long again after the model settles: the flat tail is visible
# 300 samples: a model settling within 150 samples is shown whole; 2 x 300 floats per pair keep an
# artifact of 10 CVs x 10 inputs near 1 MB of JSON in the ledger (the demo plants: 5-23 kB)
MAX_STEPS = 300

JACKKNIFE = ("jackknife over the train runs: the chosen structure refitted by ridge least squares without "
             "one train run at a time; se = sqrt((K - 1) / K * sum_r (x_r - mean x)^2) over the K replicates")
INVERSE, PSEUDO_INVERSE = "G .* inv(G)^T", "G .* pinv(G)^T (pseudo-inverse: G is not square or is singular)"


def jackknife_deviations(replicates: Sequence[Any]) -> np.ndarray:
    """sqrt((K - 1) / K) * (x_r - mean x) of K replicates (K, ...): their products summed over r are the
    jackknife covariance, their squares summed the jackknife variance."""
    values = np.asarray(replicates, float)
    k = values.shape[0]
    return np.sqrt((k - 1) / k) * (values - values.mean(axis=0))


def unit_step_responses(ss: StateSpace, steps: int) -> np.ndarray:
    """(ny, nu + nd, steps): the response of every output to a unit step of every input (MVs, then
    DVs) held from step 0, in the model's (normalised) units; the model's affine part cancels."""
    _, B, E, _, _ = ss.arrays()
    nu, nx = B.shape[1], B.shape[0]
    n_in = nu + E.shape[1]
    held = np.repeat(np.vstack([np.eye(n_in), np.zeros((1, n_in))])[:, None, :], steps, axis=1)
    y = rollout(ss, np.zeros((n_in + 1, nx)), held[..., :nu], held[..., nu:])  # the last row: no step
    return (y[:n_in] - y[n_in]).transpose(2, 0, 1)


def singular_values(gain: np.ndarray) -> np.ndarray:
    """The singular values of `gain`, largest first, those at most the largest times max(shape) x
    machine epsilon (numpy's matrix_rank tolerance) as 0: below it they are rounding noise, which
    differs between LAPACK builds and would change a recorded artifact's hash."""
    gain = np.asarray(gain, float)
    sv = np.linalg.svd(gain, compute_uv=False)
    if sv.size:
        sv[sv <= sv[0] * max(gain.shape) * np.finfo(float).eps] = 0.0
    return sv


def gain_condition(gain: np.ndarray) -> float | None:
    """Largest over smallest singular value of `gain`; None when singular (the smallest is 0 in
    `singular_values`) or empty."""
    sv = singular_values(gain)
    return None if not sv.size or sv[-1] == 0.0 else float(sv[0] / sv[-1])


def relative_gain_array(gain: np.ndarray) -> tuple[np.ndarray, str]:
    """The RGA of `gain` (ny, nu) and how it was computed (INVERSE or PSEUDO_INVERSE)."""
    gain = np.asarray(gain, float)
    if gain.shape[0] == gain.shape[1] and gain_condition(gain) is not None:
        return gain * np.linalg.inv(gain).T, INVERSE
    return gain * np.linalg.pinv(gain).T, PSEUDO_INVERSE


def dead_time_steps(response: np.ndarray) -> np.ndarray:
    """(..., steps) -> (...): the apparent dead time in samples (module docstring); NaN where the response is 0."""
    response = np.asarray(response, float)
    side = np.sign(np.take_along_axis(response, np.argmax(np.abs(response), axis=-1)[..., None], axis=-1))
    move = side * np.diff(response, axis=-1, prepend=0.0)  # per sample, toward the largest |response|
    k = np.argmax(move, axis=-1)[..., None]
    steepest = np.take_along_axis(move, k, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = k + 1 - side * np.take_along_axis(response, k, axis=-1) / steepest
    return np.where(steepest > 0, crossing, np.nan)[..., 0]


def _pair_settling(ss: StateSpace, cv: int, column: int) -> int | None:
    """The settling horizon of CV `cv` to input `column` (MVs, then DVs) alone."""
    A, B, E, f, C = ss.arrays()
    return settling_steps(StateSpace.of(A, np.hstack([B, E])[:, column], np.zeros((A.shape[0], 0)), f, C[cv]))


def _optional(value: float) -> float | None:
    """A number of the record; None where it is undefined (NaN) or overflowed (an unstable model)."""
    return float(value) if np.isfinite(value) else None


def step_response_record(ss: StateSpace, replicates: Sequence[StateSpace], binding: BindingSpec,
                         normalisation: Normalisation, local_gains: np.ndarray | None = None) -> dict[str, Any]:
    """The step-response matrix (module docstring) of the model `ss` (normalised units, the
    artifact's state space) and its K jackknife `replicates`, in engineering units; with the
    `local_gains` [G, Gd] over the held-out operating points (m, ny, nu + nd, normalised; model/local.py
    `local_gains`) each pair's `gain_spread`, their root-mean-square deviation from its gain."""
    _, cv_std = normalisation.of(binding.cv_tags)
    inputs = binding.mv_tags + binding.dv_tags
    scale = cv_std[:, None] / normalisation.of(inputs)[1][None, :]  # (ny, n_in): normalised -> engineering
    settle = settling_steps(ss)
    steps = MAX_STEPS if settle is None else min(MAX_STEPS, HORIZON_FACTOR * settle)

    def engineering(model: StateSpace) -> tuple[np.ndarray, np.ndarray]:
        G, Gd, _ = steady_state(model)
        return unit_step_responses(model, steps) * scale[..., None], np.hstack([G, Gd]) * scale

    with np.errstate(over="ignore", invalid="ignore"):  # an unstable model's responses overflow: None below
        response, gain = engineering(ss)
        spread = None if local_gains is None or not len(local_gains) else \
            np.sqrt(np.mean((np.asarray(local_gains, float) * scale - gain) ** 2, axis=0))
        dead = dead_time_steps(response)
        se = None
        if len(replicates) >= 2:
            responses, gains = (np.asarray(x) for x in zip(*map(engineering, replicates)))
            se = {name: np.sqrt(np.sum(jackknife_deviations(values) ** 2, axis=0)) for name, values in
                  (("response", responses), ("gain", gains), ("dead_time", dead_time_steps(responses)))}
    period = binding.sample_period_s
    kinds = ("mv",) * len(binding.mv_tags) + ("dv",) * len(binding.dv_tags)
    pairs = []
    for i, cv in enumerate(binding.cv_tags):
        for j, (tag, kind) in enumerate(zip(inputs, kinds)):
            settling = _pair_settling(ss, i, j)
            pairs.append({
                "cv": cv, "input": tag, "kind": kind,
                "gain": float(gain[i, j]), "gain_se": None if se is None else _optional(se["gain"][i, j]),
                "gain_spread": None if spread is None else _optional(spread[i, j]),
                "dead_time_steps": _optional(dead[i, j]), "dead_time_s": _optional(dead[i, j] * period),
                "dead_time_se_steps": None if se is None else _optional(se["dead_time"][i, j]),
                "settling_steps": settling, "settling_s": None if settling is None else float(settling * period),
                "response": [_optional(v) for v in response[i, j]],
                "response_se": None if se is None else [_optional(v) for v in se["response"][i, j]],
            })
    nu = len(binding.mv_tags)
    rga, rga_method = relative_gain_array(gain[:, :nu])
    transformed = {cv: t.describe() for cv, t in zip(binding.cv_tags, normalisation.transforms_of(binding.cv_tags))
                   if t is not None}
    ramps = [cv for cv, ramp in zip(binding.cv_tags, integrating_outputs(ss)) if ramp]
    return {**({"transformed_cvs": transformed} if transformed else {}),
        **({"integrating_cvs": ramps} if ramps else {}),
        "units": "engineering: CV units per unit of the input, a unit step held from time 0; response[k] is the "
                 "change at the end of step k",
        "cv_tags": list(binding.cv_tags), "input_tags": list(inputs), "input_kinds": list(kinds),
        "sample_period_s": float(period), "steps": steps, "model_settling_steps": settle,
        "horizon_rule": f"{HORIZON_FACTOR} x the model's settling horizon, at most {MAX_STEPS} steps",
        "settle_fraction": SETTLE_FRACTION,
        "dead_time_rule": "tangent method: where the tangent at the steepest sample-to-sample move crosses zero",
        "uncertainty": None if se is None else {"method": JACKKNIFE, "replicates": len(replicates)},
        "gain_spread_points": 0 if spread is None else len(local_gains),
        "pairs": pairs,
        "mv_gain": {"gain": gain[:, :nu].tolist(), "condition": gain_condition(gain[:, :nu]),
                    "rga": rga.tolist(), "rga_method": rga_method},
    }


def _num(value: float | None, se: float | None = None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if se is None else f"{value:.{digits}g} ± {se:.2g}"


def step_response_table(record: Mapping[str, Any]) -> str:
    """Markdown: per pair gain ± se, gain spread, dead time and settling time; the MV gain matrix's
    condition number and RGA."""
    lines = ["| CV | input | gain ± se | gain spread | dead time [samples] ± se | dead time [s] | settling [samples] "
             "| settling [s] |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    ramps = set(record.get("integrating_cvs", ()))
    for p in record["pairs"]:
        dead = _num(p["dead_time_steps"], p["dead_time_se_steps"], 3)
        gain = _num(p["gain"], p["gain_se"]) + (" per sample" if p["cv"] in ramps else "")
        lines.append(f"| {p['cv']} | {p['input']} ({p['kind'].upper()}) | {gain} | "
                     f"{_num(p.get('gain_spread'), digits=2)} | {dead} | "
                     f"{_num(p['dead_time_s'], digits=3)} | {_num(p['settling_steps'])} | {_num(p['settling_s'])} |")
    uncertainty = record["uncertainty"]
    se = (f"standard errors: {uncertainty['method']}, K = {uncertainty['replicates']}" if uncertainty
          else "no standard errors (fewer than 2 train runs)")
    points = record.get("gain_spread_points")
    se += ("; gain spread not recorded (identified before it was)" if points is None else
           f"; gain spread: root-mean-square deviation of the local gains at {points} held-out operating points "
           "from the gain" if points else "; no gain spread (no held-out operating points)")
    mv = record["mv_gain"]
    condition = "singular" if mv["condition"] is None else f"{mv['condition']:.4g}"
    mv_tags = [t for t, kind in zip(record["input_tags"], record["input_kinds"]) if kind == "mv"]
    lines += ["", f"Sample period {record['sample_period_s']:g} s; responses over {record['steps']} samples "
                  f"({record['horizon_rule']}); {se}.",
              "", f"Condition number of the MV gain matrix (engineering units): {condition}",
              "", f"Relative gain array, {mv['rga_method']}:", "",
              "| CV | " + " | ".join(mv_tags) + " |", "| --- |" + " --- |" * len(mv_tags)]
    lines += [f"| {cv} | " + " | ".join(f"{v:.4g}" for v in row) + " |"
              for cv, row in zip(record["cv_tags"], mv["rga"])]
    if ramps:
        lines += ["", "Integrating CVs, whose gain is a rate (CV units per sample per unit of the input: a step "
                      "makes them ramp) and whose settling time is their rate's: " + ", ".join(sorted(ramps))]
    transformed = record.get("transformed_cvs")
    if transformed:
        lines += ["", "Transformed CVs, whose rows are in transformed units (engineering units at the middle of "
                      "the limits, smaller steps of the CV toward them): "
                  + "; ".join(f"{cv}: {what}" for cv, what in transformed.items())]
    return "\n".join(lines)
