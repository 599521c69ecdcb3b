"""Sample flags: the measured samples of a history that are not data. Non-destructive: the samples stay
in the ledger as ingested; cleaning (data/clean.py) treats a flagged sample as missing (its gap rules then
interpolate or cut) and reports every flag as a span (tag, run, start, end, samples, rule).

Rules, per run and tag, on the samples as recorded (before grid alignment). MVs are exempt from the
first three: they are commanded values, and an MV held by an operator is not a fault.

* spike (CVs and DVs): a sample that both one-sided line extrapolations miss the same way, from the
  two samples before it (2 x[k-1] - x[k-2]) and from the two after it (2 x[k+1] - x[k+2]), each by more
  than SPIKE_SIGMAS robust standard deviations of the tag's second differences over the history (1.4826
  x their median absolute value; floored at the tag's resolution, its smallest step), within stretches
  without a time gap. A line follows a trend, so a
  spike on a moving CV is seen; a step moves one side only, so it is kept. The Hampel filter this rule
  replaced (a window median +- 3 MADs) missed half the glitches of +-20 noise sigmas on the quadruple
  tank: a 7-sample window across a move holds a MAD of 5-30 noise sigmas (docs/ARCHITECTURE.md,
  "Flagged samples"). Each side's miss has 6 sigma^2 of variance on white noise; both beyond 4 of their
  sigmas the same way: none in 10^6 samples of white noise (measured; at 3.5: 2e-6, at 3: 2.2e-5).
  A spike of two samples: each sample's other side runs through the other, so the pair is judged as
  one, by the line through the two samples before it and the line through the two after it: each
  line misses both samples the same way by more than the threshold; of such pairs up to 3 samples
  apart missed the same way, the one the lines miss most (a transient beside a spike would pass for
  one), missed opposite ways, none (a burst: the clean samples between two glitches look like a pair
  against them). A run's first and last samples are judged after the pairs, not beside one. A step
  moves one side only, as before; three samples or more, and bursts, are slices to exclude by hand.
* stuck (CVs and DVs): a stretch of one value repeated, every sample after its first flagged, when
  chance cannot explain it: the tag repeats its previous value with frequency p over the history
  (`repeat_frequency`), so a stretch of L equal samples turns up by chance about
  n p^(L-1) times in n samples; flagged when that is below STUCK_CHANCE and L >= STUCK_MIN_SAMPLES.
  A noisy transmitter (p ~ 0) that stops moving is flagged after STUCK_MIN_SAMPLES; a tag quantized
  or compressed by the historian repeats values more often and is flagged only on a longer stretch (p
  0.5: 20 samples in 5 000); a tag that repeats its value more often than not (p > STUCK_MAX_REPEAT: a
  noise-free DV, a coarse quantization) has no noise that says it should move and is never flagged, nor
  is a transmitter dead for most of the history (data/clean.py warns of such a CV; exclude a dead slice
  by hand).
* pinned (CVs and DVs with a transmitter `range` in the binding): a value within PIN_FRACTION of the
  range's span of either end, or beyond it: a transmitter at its end reads its end, not the process.
* excluded: the samples of an exclusion recorded by hand (`optimizer-pipeline exclude`, the ledger's
  exclusions not revoked): between its from (inclusive) and to (exclusive), of its tags (every tag
  when it names none).
"""

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from optimizer_pipeline.contracts import BindingSpec, Exclusion

SPIKE, STUCK, PINNED, EXCLUDED = "spike", "stuck", "pinned", "excluded"
RULES = (SPIKE, STUCK, PINNED, EXCLUDED)
JUMP = "jump"  # the live window's newest CV value off its trend (`jump_sigmas`): a spike or a step
SPIKE_SIGMAS = 4.0
MAD_TO_SIGMA = 1.4826  # sigma of a normal distribution per unit MAD
STUCK_MIN_SAMPLES = 10
STUCK_CHANCE = 0.01
STUCK_MAX_REPEAT = 0.5
PIN_FRACTION = 1e-3


@dataclass(frozen=True)
class TagRules:
    """What the rules need of a binding beyond the samples: the tags they judge (measured: CVs and DVs),
    each tag's noise (`noise_sigma`, for `spikes`) and repeat frequency (`repeat_frequency`, for `stuck`)
    over the whole history, the transmitter ranges given, and the exclusions in force."""

    tags: tuple[str, ...]
    measured: np.ndarray  # (n_tags,) bool: a CV or DV
    noise: np.ndarray  # (n_tags,) the robust std of the second differences
    repeats: np.ndarray  # (n_tags,) p of the stuck rule; NaN: not measured
    samples: int  # n of the stuck rule: the history's samples per tag
    ranges: dict[str, tuple[float, float]]
    exclusions: tuple[Exclusion, ...] = ()


def tag_rules(binding: BindingSpec, columns: dict[str, np.ndarray], exclusions: Sequence[Exclusion] = ()) -> TagRules:
    """The rules' inputs for `binding` from its history's values per tag (`columns`, tag -> values in run
    order, every run's samples; NaN for missing)."""
    tags = binding.tags
    measured_tags = set(binding.cv_tags + binding.dv_tags)
    measured = np.array([tag in measured_tags for tag in tags])
    repeats = np.array([repeat_frequency(columns[tag]) if tag in measured_tags else np.nan for tag in tags])
    ranges = {spec.tag: spec.range for spec in (*binding.cvs, *binding.dvs) if spec.range is not None}
    samples = max((len(v) for v in columns.values()), default=0)
    noise = noise_sigma(np.column_stack([columns[tag] for tag in tags])) if samples else np.ones(len(tags))
    return TagRules(tags, measured, noise, repeats, samples, ranges, tuple(exclusions))


def repeat_frequency(values: np.ndarray) -> float:
    """How often the tag repeats its previous value: equal consecutive pairs over the pairs with both
    values present (0 without such pairs). Its own stuck stretches count too: a tag that repeats more often
    than not, whatever the reason, gives no evidence that a stretch is a fault (module docstring)."""
    values = np.asarray(values, float)
    both = ~np.isnan(values[1:]) & ~np.isnan(values[:-1])
    return float((values[1:] == values[:-1])[both].mean()) if both.any() else 0.0


def flag_run(t: np.ndarray, values: np.ndarray, rules: TagRules, period: float,
             open_end: bool = False) -> dict[str, np.ndarray]:
    """The samples of one run (t (n,) seconds, values (n, n_tags) in rules.tags order, NaN missing) each
    rule flags: rule -> (n, n_tags) bool, for the rules that flag any. Spikes and stuck values are judged
    per stretch of samples without a time gap (more than 1.5 `period` between two): a sample across a
    gap is no neighbour. `open_end`: the newest run (`spikes`)."""
    spike, still = np.zeros(values.shape, bool), np.zeros(values.shape, bool)
    bounds = [0, *(np.flatnonzero(np.diff(t) > 1.5 * period) + 1).tolist(), len(t)]
    for a, b in zip(bounds, bounds[1:]):
        spike[a:b] = spikes(values[a:b], rules.noise, open_end and b == len(t))
        still[a:b] = stuck(values[a:b], rules.repeats, rules.samples)
    flags = {SPIKE: spike & rules.measured, STUCK: still & rules.measured,
             PINNED: pinned(values, rules.tags, rules.ranges),
             EXCLUDED: excluded(t, rules.tags, rules.exclusions)}
    return {rule: mask for rule, mask in flags.items() if mask.any()}


def spikes(values: np.ndarray, noise: np.ndarray, open_end: bool = False) -> np.ndarray:
    """(n, n_tags) bool: the spike rule (module docstring), `noise` each tag's `noise_sigma`. Next to a
    run's edge the short side holds one neighbour: it extrapolates flat, allowed the other side's slope on
    top. A run's first and last samples
    have one side only and are judged by it (no sample will come to tell a spike from a step), except,
    with `open_end` (the newest run), the last: the samples that arrive next judge it (and the live
    window's rule, `jump_sigmas`, until then). A side with a missing neighbour is unknown."""
    values = np.asarray(values, float)
    n = len(values)
    if n < 4:
        return np.zeros(values.shape, bool)
    forward = np.full(values.shape, np.nan)
    backward = np.full(values.shape, np.nan)
    forward[2:] = values[2:] - (2 * values[1:-1] - values[:-2])
    backward[:-2] = values[:-2] - (2 * values[1:-1] - values[2:])
    forward[1], backward[-2] = values[1] - values[0], values[-2] - values[-1]
    limit = SPIKE_SIGMAS * np.asarray(noise, float)
    forward_limit, backward_limit = np.tile(limit, (n, 1)), np.tile(limit, (n, 1))
    forward_limit[1] += np.abs(values[3] - values[2])
    backward_limit[-2] += np.abs(values[-3] - values[-4])
    with np.errstate(invalid="ignore"):
        off_f, off_b = np.abs(forward) > forward_limit, np.abs(backward) > backward_limit
        flagged = off_f & off_b & (np.sign(forward) == np.sign(backward))
        flagged[0] = flagged[-1] = False  # the edges are judged last, below
        pairs = _pairs(values, limit, flagged)
        near = flagged | pairs
        # an edge's one side runs through its two neighbours: not judged when one of them is a spike itself
        flagged[0] = off_b[0] & ~near[1] & ~near[2]
        flagged[-1] = False if open_end else off_f[-1] & ~near[-2] & ~near[-3]
    return flagged | pairs


def _pairs(values: np.ndarray, limit: np.ndarray, single: np.ndarray) -> np.ndarray:
    """(n, n_tags) bool: two neighbouring samples that the lines through the two samples before them and
    through the two after them both miss the same way, each by more than `limit`, none of the six a
    spike alone (`single`: a line through one is no line; module docstring: a spike of two samples)."""
    n = len(values)
    pairs = np.zeros(values.shape, bool)
    if n < 6:
        return pairs
    v = [values[i:n - 5 + i] for i in range(6)]  # x[k-2] .. x[k+3] for k = 2 .. n-4: the pair is k, k+1
    misses = (v[2] - (2 * v[1] - v[0]), v[3] - (3 * v[1] - 2 * v[0]),  # the line before, at k and k+1
              v[3] - (2 * v[4] - v[5]), v[2] - (3 * v[4] - 2 * v[5]))  # the line after, at k+1 and k
    with np.errstate(invalid="ignore"):
        up = np.logical_and.reduce([miss > limit for miss in misses])
        down = np.logical_and.reduce([miss < -limit for miss in misses])
    found = (up | down) & ~np.logical_or.reduce([single[i:n - 5 + i] for i in range(6)])
    # a pair's lines run through the samples of a pair up to 3 samples away: of such neighbours missed the
    # same way, the one the lines miss most is the spike (a transient next to a spike would pass for one);
    # missed opposite ways, none is told from the others (the clean samples between two glitches look like
    # a pair against them): a burst, left to an exclusion by hand
    strength = np.where(found, np.min(np.abs(misses), axis=0), 0.0)
    sign = np.where(found, np.where(up, 1.0, -1.0), 0.0)
    m = len(strength)
    padded_strength, padded_sign = np.pad(strength, ((3, 3), (0, 0))), np.pad(sign, ((3, 3), (0, 0)))
    for o in (-3, -2, -1, 1, 2, 3):
        found &= (strength >= padded_strength[3 + o:3 + o + m]) & (sign * padded_sign[3 + o:3 + o + m] >= 0)
    pairs[2:n - 3] |= found
    pairs[3:n - 2] |= found
    return pairs


def jump_sigmas(values: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """(n_tags,) how far the newest sample lies off its trend, in robust standard deviations of the second
    differences (NaN where unknown): the nearer of the line through the two samples before it and the
    sample before it (a sample after a step holds the new level). Beyond SPIKE_SIGMAS a spike or a step,
    which only the samples after it tell apart (the live window's rule, pipeline.live_run); `noise` each
    tag's `noise_sigma`."""
    values = np.asarray(values, float)
    if len(values) < 3:
        return np.full(values.shape[1], np.nan)
    line, flat = values[-1] - (2 * values[-2] - values[-3]), values[-1] - values[-2]
    return np.fmin(np.abs(line), np.abs(flat)) / np.asarray(noise, float)


def noise_sigma(values: np.ndarray) -> np.ndarray:
    """(n_tags,) the robust std of the second differences (those not 0: a stuck stretch would pull the
    median down), floored at the tag's resolution (its smallest step between samples) and at 1e-9 of its
    spread (noise-free data); 1 for a tag with fewer than 3 samples (nothing to judge)."""
    if len(values) < 3:
        return np.ones(np.shape(values)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a tag without values gives NaN
        curvature = np.abs(np.diff(values, 2, axis=0))
        sigma = MAD_TO_SIGMA * _column_nanmedian(np.where(curvature > 0, curvature, np.nan))
        steps = np.abs(np.diff(values, axis=0))
        resolution = np.nanmin(np.where(steps > 0, steps, np.nan), axis=0)
        spread = np.nanmax(values, axis=0) - np.nanmin(values, axis=0)
    floor = np.fmax(1e-9 * np.nan_to_num(spread), np.finfo(float).tiny)
    return np.fmax(np.fmax(np.nan_to_num(sigma), np.nan_to_num(resolution)), floor)


def _column_nanmedian(values: np.ndarray) -> np.ndarray:
    """Each column's median ignoring NaN (NaN for a column without values): np.nanmedian's answer, ~10x
    faster on a window of the live service (it sorts per column instead of a Python loop over them)."""
    ordered = np.sort(values, axis=0)  # NaN sort last
    count = np.count_nonzero(~np.isnan(values), axis=0)
    lo = np.take_along_axis(ordered, np.maximum(count - 1, 0)[None] // 2, axis=0)[0]
    hi = np.take_along_axis(ordered, np.minimum(count // 2, len(values) - 1)[None], axis=0)[0]
    return np.where(count > 0, (lo + hi) / 2, np.nan)


def stuck(values: np.ndarray, repeats: np.ndarray, samples: int) -> np.ndarray:
    """(n, n_tags) bool: the stuck rule (module docstring) with each tag's repeat frequency and the
    history's samples per tag."""
    values = np.asarray(values, float)
    flagged = np.zeros(values.shape, bool)
    for j in range(values.shape[1]):
        p = repeats[j]
        if np.isnan(p) or p > STUCK_MAX_REPEAT:
            continue
        same = values[1:, j] == values[:-1, j]
        for start, end in zip(*true_spans(same)):
            length = end - start + 1  # equal pairs start..end-1 join samples start..end
            if length >= STUCK_MIN_SAMPLES and max(samples, 1) * p ** (length - 1) < STUCK_CHANCE:
                flagged[start + 1:end + 1, j] = True
    return flagged


def pinned(values: np.ndarray, tags: Sequence[str], ranges: dict[str, tuple[float, float]]) -> np.ndarray:
    """(n, n_tags) bool: the pinned rule (module docstring) for the tags with a range."""
    flagged = np.zeros(np.shape(values), bool)
    for j, tag in enumerate(tags):
        if tag in ranges:
            lo, hi = ranges[tag]
            margin = PIN_FRACTION * (hi - lo)
            with np.errstate(invalid="ignore"):
                flagged[:, j] = (values[:, j] <= lo + margin) | (values[:, j] >= hi - margin)
    return flagged


def excluded(t: np.ndarray, tags: Sequence[str], exclusions: Iterable[Exclusion]) -> np.ndarray:
    """(n, n_tags) bool: the samples inside an exclusion, of its tags (every tag when it names none)."""
    flagged = np.zeros((len(t), len(tags)), bool)
    for ex in exclusions:
        inside = (t >= ex.start_s) & (t < ex.end_s)
        if inside.any():
            columns = [j for j, tag in enumerate(tags) if not ex.tags or tag in ex.tags]
            flagged[np.ix_(inside, columns)] = True
    return flagged


def flag_spans(run_id: str, t: np.ndarray, flags: dict[str, np.ndarray], tags: Sequence[str]) -> list[dict[str, Any]]:
    """Every flagged stretch of one run as a record: {tag, run_id, rule, start_s, end_s, samples}, in
    time order (a stretch: consecutive samples of one tag that one rule flags)."""
    spans = []
    for rule, mask in flags.items():
        for j, tag in enumerate(tags):
            for start, end in zip(*true_spans(mask[:, j])):
                spans.append({"tag": tag, "run_id": run_id, "rule": rule, "start_s": float(t[start]),
                              "end_s": float(t[end - 1]), "samples": int(end - start)})
    return sorted(spans, key=lambda s: (s["start_s"], s["tag"], s["rule"]))


def true_spans(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and (exclusive) ends of the stretches where mask is True."""
    edges = np.diff(np.concatenate(([0], np.asarray(mask, np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
