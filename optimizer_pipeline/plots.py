"""Figures shown in the Dagster UI, as small PNGs (matplotlib, Agg canvas; no pyplot state).

Each `draw_*` builds a figure from plain arrays (engineering units unless stated) and the matching
`*_figure` returns it as PNG bytes. `markdown_image` wraps PNG bytes in a markdown image with a
base64 data URI: the Dagster UI shows a markdown metadata value (`MetadataValue.md`, wrapped by the
caller) longer than 1000 characters as a "[Show Markdown]" link that opens the rendered image in a
dialog on the asset page (its sanitizer allows data: image sources).
The `*_series` functions prepare those arrays from the pipeline's contracts (pure, no plotting).

Time axes are seconds relative to "now" (the live run's last row, t = 0): history at t <= 0, the
plan at t > 0 (u[k] is held during step k; the predicted CV of step k is at the end of that step).
"""

import base64
import io
import logging
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from optimizer_pipeline.contracts import BindingSpec, ModelArtifact, Recommendation, RunSeries, Template
from optimizer_pipeline.model import Orders, rollout_windows, stack_for
from optimizer_pipeline.model.arx import window_rows

log = logging.getLogger(__name__)

DPI = 80  # measured: ~20-60 kB per figure at this size, well under 0.3 s to render
WIDTH_IN = 9.5  # 760 px: panels 6.55 in wide, then the legend column
PANEL_HEIGHT_IN = 1.7
# the column right of the panels that holds their legends: inside a panel a legend covered its data
# (a CV at its target, its band); a label of ~30 characters at 7 pt fits
LEGEND_IN = 2.2
HISTORY_HORIZONS = 3  # the recommendation plot shows the last 3 * P samples of the live run
MODEL_FIT_BLOCKS = 12  # P-step blocks shown on the test run (longer runs are cut for readability)
PNG_DATA_URI_PREFIX = "data:image/png;base64,"
MARGINS_IN = (0.45, 0.5, 0.75, LEGEND_IN)  # top, bottom, left, right of every figure
# A step drawing at least this many figures draws them in background processes: measured ~0.35 s of
# matplotlib per binding (3 figures) against ~1 s to start a process. Two processes, because the
# step mostly waits for its figures at its end (its own work per binding is shorter than theirs),
# and one process would leave the second core idle then.
BACKGROUND_MIN_FIGURES = 4
BACKGROUND_PROCESSES = 2

PLAIN_NUMBER = FuncFormatter(lambda value, _: f"{value:g}")
MEASURED, PREDICTED, LIMIT, TARGET, VAL, TEST, MISS = ("#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#7f7f7f",
                                                       "#1f77b4", "#d62728")


# --------------------------------------------------------------------------- encoding


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """Render `fig` on an Agg canvas to PNG bytes. The figure is not kept anywhere: no pyplot
    registry holds it, so dropping the reference frees it (no `fig.clear()`: measured ~10 % of a
    figure's time for nothing the garbage collector does not do)."""
    buffer = io.BytesIO()
    FigureCanvasAgg(fig)  # attaches the Agg canvas explicitly, whatever pyplot's backend is
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def png_data_uri(png: bytes) -> str:
    return PNG_DATA_URI_PREFIX + base64.b64encode(png).decode("ascii")


def markdown_image(png: bytes, alt: str) -> str:
    """Markdown image with the PNG inline as a data URI (what Dagster's markdown metadata renders)."""
    clean = alt.replace("[", "(").replace("]", ")")
    return f"![{clean}]({png_data_uri(png)})"


def figure_markdown(render: Callable[[], bytes], alt: str) -> str:
    """`markdown_image(render(), alt)`, or one line saying why the figure could not be drawn (logged
    with its traceback): a figure is a view of results already recorded, so it must not fail them."""
    try:
        return markdown_image(render(), alt)
    except Exception as exc:  # any drawing failure: the caller's step has already done its work
        log.exception("figure %r could not be drawn", alt)
        return f"*figure {alt!r} could not be drawn: {type(exc).__name__}: {exc}*"


def _markdown_job(render: Callable[..., bytes], args: tuple, alt: str) -> str:
    """`figure_markdown` of `render(*args)`: the unit of work of the background process (picklable)."""
    return figure_markdown(lambda: render(*args), alt)


class FigureQueue:
    """Figure markdown for a step that draws `expected` figures: drawn inline when they are few, else
    in spawned background processes while the step goes on with its own work.

        with FigureQueue(len(bindings)) as figures:
            pending = figures.add("plan", recommendation_figure, series)   # module-level render + args
            ...
            markdown = pending()                                          # waits for that figure

    A figure that cannot be drawn, also when the background process dies, becomes one line saying
    why (as in `figure_markdown`): a figure is a view of results already recorded.
    """

    def __init__(self, expected: int):
        self._executor = None
        if expected >= BACKGROUND_MIN_FIGURES:
            # spawn, not fork: the step process runs threads (Dagster, the solver pool's readers)
            self._executor = ProcessPoolExecutor(max_workers=BACKGROUND_PROCESSES,
                                                 mp_context=multiprocessing.get_context("spawn"))

    @property
    def background(self) -> bool:
        """True when the figures are drawn in the background process."""
        return self._executor is not None

    def __enter__(self) -> "FigureQueue":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def add(self, alt: str, render: Callable[..., bytes], *args: Any) -> Callable[[], str]:
        """Queue `render(*args)` (PNG bytes); the returned callable gives its markdown."""
        if self._executor is None:
            markdown = _markdown_job(render, args, alt)
            return lambda: markdown
        future = self._executor.submit(_markdown_job, render, args, alt)
        return lambda: self._result(future, alt)

    @staticmethod
    def _result(future: "Future[str]", alt: str) -> str:
        try:
            return future.result()
        except Exception as exc:  # the process died or the arguments could not be pickled
            log.error("figure %r could not be drawn in the background process: %s", alt, exc)
            return f"*figure {alt!r} could not be drawn: {type(exc).__name__}: {exc}*"


def _figure(n_panels: int, title: str, gap: float = 0.25) -> tuple[Figure, list]:
    """A column of panels with fixed margins (inches): measured, constrained layout doubled the
    render time, and these figures all have the same structure."""
    top, bottom, left, right = MARGINS_IN
    height = top + bottom + PANEL_HEIGHT_IN * n_panels + gap * (n_panels - 1)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    axes = fig.subplots(n_panels, 1, sharex=True, squeeze=False)[:, 0].tolist()
    fig.subplots_adjust(left=left / WIDTH_IN, right=1 - right / WIDTH_IN, bottom=bottom / height,
                        top=1 - top / height, hspace=gap / PANEL_HEIGHT_IN)
    fig.suptitle(title, fontsize=10)
    for ax in axes:
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
    return fig, axes


def _legend(ax) -> None:
    """The panel's legend in the legend column (LEGEND_IN) beside it, top-aligned, clear of its data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, framealpha=0.6)


def _time_unit(span_s: float) -> tuple[float, str]:
    return (60.0, "min") if span_s > 1200 else (1.0, "s")


def _band(band: Sequence[float | None] | None, n: int) -> np.ndarray:
    """Band per CV as floats; a missing band (no UQ evidence) is NaN and is not drawn."""
    if band is None:
        return np.full(n, np.nan)
    return np.array([np.nan if b is None else float(b) for b in band], float)


# --------------------------------------------------------------------------- recommendation


@dataclass(frozen=True)
class PlanSeries:
    """What the recommendation plot shows. t_hist (n,) s <= 0; y_hist (n, n_cv); u_hist (n, n_mv);
    controls (N, n_mv) and predicted (N, n_cv) (N = 0 without a plan); band (n_cv,) NaN = none;
    band_steps: the plan steps the band is calibrated for (Recommendation.band_steps; 0 = none);
    limits / targets per tag (engineering units). steady: the plan is a steady-state target
    (predicted = the settled CVs, reached after an unknown time), not a trajectory. compared: the
    plan another one is shown beside, (controls, predicted) of the same shape rules (a what-if's
    open recommendation), drawn dashed and grey; None: none."""

    title: str
    steady: bool
    period_s: float
    cv_tags: tuple[str, ...]
    mv_tags: tuple[str, ...]
    t_hist: np.ndarray
    y_hist: np.ndarray
    u_hist: np.ndarray
    controls: np.ndarray
    predicted: np.ndarray
    band: np.ndarray
    band_steps: int
    cv_lo: np.ndarray
    cv_hi: np.ndarray
    cv_target: np.ndarray
    mv_lo: np.ndarray
    mv_hi: np.ndarray
    compared: tuple[np.ndarray, np.ndarray] | None = None


def plan_series(spec: BindingSpec, live: RunSeries, rec: Recommendation, history_samples: int) -> PlanSeries:
    """The last `history_samples` rows of the live run and the recommendation's plan."""
    return _series(spec, live, history_samples, f"{spec.id}: {rec.status.value} ({rec.template.value})",
                   rec.template is Template.STEADY_RESPONSE, rec.controls, rec.predicted, rec.band, rec.band_steps)


def whatif_series(spec: BindingSpec, live: RunSeries, whatif: Mapping[str, Any], compared: Mapping[str, Any] | None,
                  history_samples: int) -> PlanSeries:
    """A what-if's plan (`whatif`: its result document: status, template, controls, predicted, band,
    band_steps) under its own spec (the overridden limits and targets), with the open recommendation
    it was compared with (`compared`: its document, or None) drawn beside it."""
    series = _series(spec, live, history_samples,
                     f"{spec.id}: what-if, {whatif['status']} ({whatif['template']}); dashed: the open recommendation",
                     whatif["template"] == Template.STEADY_RESPONSE.value, whatif["controls"], whatif["predicted"],
                     whatif.get("band"), whatif.get("band_steps"))
    if compared is None or not compared.get("controls"):
        return series
    return replace(series, compared=(np.asarray(compared["controls"], float).reshape(-1, len(spec.mvs)),
                                     np.asarray(compared["predicted"], float).reshape(-1, len(spec.cvs))))


def _series(spec: BindingSpec, live: RunSeries, history_samples: int, title: str, steady: bool, controls: Any,
            predicted: Any, band: Any, band_steps: int | None) -> PlanSeries:
    """A plan (engineering units, as a recommendation document holds it) under `spec`'s limits and
    targets, after the last `history_samples` rows of the live run."""
    n = max(1, min(int(history_samples), len(live)))
    t = np.asarray(live.t[-n:], float)
    ny, nu = len(spec.cvs), len(spec.mvs)
    return PlanSeries(
        title=title, steady=steady, period_s=spec.sample_period_s,
        cv_tags=spec.cv_tags, mv_tags=spec.mv_tags, t_hist=t - t[-1],
        y_hist=np.asarray(live.y[-n:], float), u_hist=np.asarray(live.u[-n:], float),
        controls=np.asarray(controls, float).reshape(-1, nu),
        predicted=np.asarray(predicted, float).reshape(-1, ny), band=_band(band, ny),
        band_steps=int(band_steps or 0),
        cv_lo=np.array([c.lo for c in spec.cvs]), cv_hi=np.array([c.hi for c in spec.cvs]),
        cv_target=np.array([np.nan if c.target is None else c.target for c in spec.cvs]),  # NaN: no target
        mv_lo=np.array([m.lo for m in spec.mvs]), mv_hi=np.array([m.hi for m in spec.mvs]))


def _compared_lines(s: PlanSeries, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(t of the CVs, CVs, t of the moves, MVs) of the compared plan, drawn like the plan itself."""
    controls, predicted = s.compared
    if s.steady:
        plan_s = max(s.period_s, -float(s.t_hist[0]) / 3)
        return (np.array([0.5, 1.0]) * plan_s / scale, np.repeat(predicted[-1:], 2, axis=0),
                np.array([0.0, plan_s]) / scale, controls[-1:])
    n = controls.shape[0]
    return (s.period_s * np.arange(1, n + 1) / scale, predicted, s.period_s * np.arange(n + 1) / scale, controls)


def draw_plan(s: PlanSeries) -> Figure:
    """One panel per CV (history, predicted trajectory +- UQ band, limits, target), then one per MV
    (history and planned moves as a step plot, bounds).

    A steady-state plan is drawn over a display span of a third of the history (its settling time
    is not predicted): the MVs step to their targets at t = 0 and the settled CVs, with their band,
    fill the second half of that span. A move plan's band is shaded over the steps it is calibrated
    for (band_steps, the first P) and only outlined (dash-dotted, "not calibrated") beyond them.
    """
    n_plan = s.controls.shape[0]
    history_s = -float(s.t_hist[0])
    n_shown = max(n_plan, 0 if s.compared is None else s.compared[0].shape[0])
    plan_s = max(s.period_s, history_s / 3) if s.steady else s.period_s * n_shown
    scale, unit = _time_unit(history_s + plan_s)
    fig, axes = _figure(len(s.cv_tags) + len(s.mv_tags), s.title)
    if s.steady:
        t_pred = np.array([0.5, 1.0]) * plan_s / scale
        t_steps = np.array([0.0, plan_s]) / scale
        predicted = np.repeat(s.predicted[-1:], 2, axis=0)
        controls = s.controls[-1:]
    else:
        t_pred = s.period_s * np.arange(1, n_plan + 1) / scale  # predicted CV at the end of each step
        t_steps = s.period_s * np.arange(n_plan + 1) / scale
        predicted, controls = s.predicted, s.controls
    label = "steady-state prediction\n(time not to scale)" if s.steady else "predicted"
    other = None if s.compared is None else _compared_lines(s, scale)
    for j, (ax, tag) in enumerate(zip(axes, s.cv_tags)):
        ax.plot(s.t_hist / scale, s.y_hist[:, j], color=MEASURED, lw=1.2, label="measured")
        if n_plan:
            ax.plot(np.concatenate([[0.0], t_pred]), np.concatenate([[s.y_hist[-1, j]], predicted[:, j]]),
                    color=PREDICTED, lw=1.5, label=label)
            if np.isfinite(s.band[j]) and s.band_steps:
                shaded = len(t_pred) if s.steady else min(s.band_steps, n_plan)
                lo, hi = predicted[:, j] - s.band[j], predicted[:, j] + s.band[j]
                ax.fill_between(t_pred[:shaded], lo[:shaded], hi[:shaded], color=PREDICTED, alpha=0.35, lw=0,
                                label=f"UQ band ±{s.band[j]:.3g}" + ("" if s.steady else f", steps 1-{shaded}"))
                if shaded < n_plan:
                    for edge, text in ((lo, "band not calibrated beyond P"), (hi, None)):
                        ax.plot(t_pred[shaded - 1:], edge[shaded - 1:], color=PREDICTED, lw=0.8, ls="-.",
                                alpha=0.6, label=text)
        if other is not None:
            ax.plot(np.concatenate([[0.0], other[0]]), np.concatenate([[s.y_hist[-1, j]], other[1][:, j]]),
                    color=VAL, lw=1.2, ls="--", label="open recommendation")
        _limits(ax, s.cv_lo[j], s.cv_hi[j], "limits")
        targeted = bool(np.isfinite(s.cv_target[j]))
        if targeted:
            ax.axhline(s.cv_target[j], color=TARGET, ls=":", lw=1.2, label="target")
        shown = [s.y_hist[:, j], predicted[:, j] - np.nan_to_num(s.band[j]), predicted[:, j] + np.nan_to_num(s.band[j]),
                 s.cv_target[j:j + 1] if targeted else [], [] if other is None else other[1][:, j]]
        ax.set_ylim(*_zoom(np.concatenate(shown), (s.cv_lo[j], s.cv_hi[j])))
        ax.set_ylabel(f"CV {tag}", fontsize=8)
    for i, (ax, tag) in enumerate(zip(axes[len(s.cv_tags):], s.mv_tags)):
        ax.step(s.t_hist / scale, s.u_hist[:, i], where="post", color=MEASURED, lw=1.2, label="measured")
        if n_plan:
            values = np.concatenate([controls[:, i], controls[-1:, i]])  # the last move holds to the end
            ax.step(t_steps, values, where="post", color=PREDICTED, lw=1.5,
                    label="steady-state target" if s.steady else "planned moves")
        if other is not None:
            ax.step(other[2], np.concatenate([other[3][:, i], other[3][-1:, i]]), where="post", color=VAL, lw=1.2,
                    ls="--", label="open recommendation")
        _limits(ax, s.mv_lo[i], s.mv_hi[i], "bounds")
        ax.set_ylabel(f"MV {tag}", fontsize=8)
    for ax in axes:
        ax.axvline(0.0, color="black", lw=0.8, alpha=0.6)
        _legend(ax)
    axes[-1].set_xlabel(f"time from now [{unit}]", fontsize=8)
    return fig


def recommendation_figure(s: PlanSeries) -> bytes:
    """PNG bytes of `draw_plan`."""
    return png_bytes(draw_plan(s))


def _limits(ax, lo: float, hi: float, label: str) -> None:
    ax.axhline(lo, color=LIMIT, ls="--", lw=1, label=f"{label} [{lo:g}, {hi:g}]")
    ax.axhline(hi, color=LIMIT, ls="--", lw=1)


def _zoom(values: np.ndarray, limits: Sequence[float]) -> tuple[float, float]:
    """y range of a CV panel: the data (history, plan +- band, target) with a margin, widened to a
    limit only when it is near; wide limits would squeeze a narrow UQ band to a line. The limit
    values stay in the legend."""
    finite = values[np.isfinite(values)]
    lo, hi = float(finite.min()), float(finite.max())
    pad = 0.15 * (hi - lo) or 0.05 * abs(hi) or 1.0
    lo, hi = lo - pad, hi + pad
    for limit in limits:
        if lo - 3 * pad <= limit < lo:
            lo = limit - pad
        elif hi < limit <= hi + 3 * pad:
            hi = limit + pad
    return lo, hi


# --------------------------------------------------------------------------- calibration


def draw_calibration(cv_tags: Sequence[str], val_scores: np.ndarray, test_scores: np.ndarray,
                       qhat: Sequence[float] | None, coverage_per_cv: Sequence[float] | None,
                       coverage_threshold: float | None, title: str) -> Figure:
    """One panel per CV: val block scores, then test block scores (normalised units) against qhat;
    test blocks above qhat are drawn red (the uncovered ones). val (n, n_cv), test (m, n_cv)."""
    val, test = np.asarray(val_scores, float), np.asarray(test_scores, float)
    n = val.shape[0]
    fig, axes = _figure(len(cv_tags), title, gap=0.45)  # room for the per-CV coverage titles
    for j, (ax, tag) in enumerate(zip(axes, cv_tags)):
        ax.plot(np.arange(n), val[:, j], ".", color=VAL, ms=4, label=f"val ({n} blocks)")
        x_test = n + np.arange(test.shape[0])
        if qhat is None:
            ax.plot(x_test, test[:, j], ".", color=TEST, ms=4, label=f"test ({test.shape[0]} blocks)")
            ax.set_title(f"{tag}: no UQ evidence", fontsize=9)
        else:
            missed = ~(test[:, j] <= qhat[j])
            ax.plot(x_test[~missed], test[~missed, j], ".", color=TEST, ms=4, label="test, covered")
            ax.plot(x_test[missed], test[missed, j], "x", color=MISS, ms=5, label=f"test, above qhat ({missed.sum()})")
            ax.axhline(qhat[j], color="black", lw=1.2, label=f"qhat {qhat[j]:.3g}")
            cover = "" if coverage_per_cv is None else f"test coverage {coverage_per_cv[j]:.3f}"
            need = "" if coverage_threshold is None else f" vs threshold {coverage_threshold:.3f}"
            ax.set_title(f"{tag}: {cover}{need}", fontsize=9)
        ax.axvline(n - 0.5, color="black", lw=0.6, alpha=0.5)
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())  # measured: log minor ticks cost ~0.1 s per panel
        ax.yaxis.set_major_formatter(PLAIN_NUMBER)  # "0.01", not mathtext "10^-2": ~10 % of this figure
        ax.set_ylabel("block score", fontsize=8)
        _legend(ax)
    axes[-1].set_xlabel("block (val, then test)", fontsize=8)
    return fig


def calibration_figure(cv_tags: Sequence[str], val_scores: np.ndarray, test_scores: np.ndarray,
                       qhat: Sequence[float] | None, coverage_per_cv: Sequence[float] | None,
                       coverage_threshold: float | None, title: str) -> bytes:
    """PNG bytes of `draw_calibration`."""
    return png_bytes(draw_calibration(cv_tags, val_scores, test_scores, qhat, coverage_per_cv, coverage_threshold,
                                      title))


# --------------------------------------------------------------------------- model fit


@dataclass(frozen=True)
class FitSeries:
    """Measured CVs of one run and P-step open-loop rollouts restarted from the measured state every
    P samples (NaN where no block covers a row). t (n,) s from the run start; measured and
    predicted (n, n_cv) engineering units."""

    run_id: str
    horizon: int
    cv_tags: tuple[str, ...]
    t: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray


def model_fit_series(artifact: ModelArtifact, run: RunSeries, max_blocks: int = MODEL_FIT_BLOCKS) -> FitSeries:
    """Rollouts of the artifact's state space over `run` in P-step blocks (the UQ block tiling)."""
    h = artifact.horizon
    stacked = stack_for(artifact, [run])
    orders = Orders(artifact.na, artifact.nb, artifact.delay)
    rows, _ = window_rows(stacked, orders.first_state_row, h, h)
    rows = rows[:max_blocks]
    end = int(rows[-1]) + h + 1 if rows.size else len(run)
    predicted = np.full((end, len(artifact.cv_tags)), np.nan)
    if rows.size:
        with np.errstate(over="ignore", invalid="ignore"):
            rolled, _ = rollout_windows(artifact.state_space, stacked, orders, rows, h)
        steps = (rows[:, None] + 1 + np.arange(h)).ravel()
        predicted[steps] = artifact.normalisation.engineering(artifact.cv_tags, rolled.reshape(-1, rolled.shape[-1]))
    t = np.asarray(run.t[:end], float)
    return FitSeries(run.run_id, h, tuple(artifact.cv_tags), t - t[0], np.asarray(run.y[:end], float), predicted)


def draw_model_fit(s: FitSeries, title: str) -> Figure:
    """One panel per CV: measured vs the P-step open-loop rollouts (each block starts on the
    measured state, drawn as its own segment)."""
    scale, unit = _time_unit(float(s.t[-1]) if s.t.size else 0.0)
    fig, axes = _figure(len(s.cv_tags), title)
    for j, (ax, tag) in enumerate(zip(axes, s.cv_tags)):
        ax.plot(s.t / scale, s.measured[:, j], color=MEASURED, lw=1.2, label="measured")
        ax.plot(s.t / scale, s.predicted[:, j], color=PREDICTED, lw=1.4,
                label=f"{s.horizon}-step open-loop rollout")
        ax.set_ylabel(f"CV {tag}", fontsize=8)
        _legend(ax)
    axes[-1].set_xlabel(f"time in test run {s.run_id} [{unit}]", fontsize=8)
    return fig


def model_fit_figure(s: FitSeries, title: str) -> bytes:
    """PNG bytes of `draw_model_fit`."""
    return png_bytes(draw_model_fit(s, title))


# --------------------------------------------------------------------------- flagged samples

FLAG_COLOURS = {"spike": "#d62728", "stuck": "#9467bd", "pinned": "#8c564b", "excluded": "#7f7f7f"}
MAX_FLAG_PANELS = 4


@dataclass(frozen=True)
class FlagSeries:
    """Per flagged tag (at most MAX_FLAG_PANELS, the most flagged first), the cleaned values of the run it
    has the most flagged samples in (t s from the run start, NaN between its pieces) and that run's flag
    spans of the tag as (start s, end s, rule)."""
    panels: tuple[tuple[str, str, np.ndarray, np.ndarray, tuple[tuple[float, float, str], ...]], ...]


def flag_series(spec: BindingSpec, runs: Sequence[RunSeries], spans: Sequence[Mapping[str, Any]]) -> FlagSeries:
    """The FlagSeries of a split's runs (every piece, the live one too) and its cleaning report's flag spans."""
    per_tag: dict[str, dict[str, int]] = {}
    for span in spans:
        counts = per_tag.setdefault(span["tag"], {})
        counts[span["run_id"]] = counts.get(span["run_id"], 0) + span["samples"]
    panels = []
    for tag, counts in sorted(per_tag.items(), key=lambda item: -sum(item[1].values()))[:MAX_FLAG_PANELS]:
        run_id = max(counts, key=counts.get)
        pieces = sorted((r for r in runs if (r.source_run or r.run_id) == run_id), key=lambda r: float(r.t[0]))
        # a run dropped in cleaning has no pieces: its spans only
        t0 = float(pieces[0].t[0]) if pieces else min(s["start_s"] for s in spans if s["run_id"] == run_id)
        t = np.concatenate([np.r_[r.t, np.nan] for r in pieces] or [np.zeros(0)]) - t0
        column = spec.tags.index(tag)  # u, y, d in binding order
        values = np.concatenate([np.r_[np.hstack([r.u, r.y, r.d])[:, column], np.nan] for r in pieces] or [np.zeros(0)])
        marked = tuple((s["start_s"] - t0, s["end_s"] - t0, s["rule"]) for s in spans
                       if s["tag"] == tag and s["run_id"] == run_id)
        panels.append((tag, run_id, t, values, marked))
    return FlagSeries(tuple(panels))


def draw_flags(s: FlagSeries, title: str) -> Figure:
    """One panel per flagged tag: the cleaned values of its most flagged run (flagged samples count as
    missing: interpolated across short gaps, else the run is cut there) and each flagged span shaded in
    its rule's colour."""
    span_s = max((float(np.nanmax(t)) for _, _, t, _, _ in s.panels if t.size), default=0.0)
    scale, unit = _time_unit(span_s)
    fig, axes = _figure(len(s.panels), title)
    for ax, (tag, run_id, t, values, marked) in zip(axes, s.panels):
        ax.plot(t / scale, values, color=MEASURED, lw=1.0, label=f"{run_id}, cleaned")
        shown = set()
        for start, end, rule in marked:
            ax.axvspan(start / scale, max(end, start + 0.5) / scale, color=FLAG_COLOURS.get(rule, "#000000"),
                       alpha=0.35, lw=0, label=None if rule in shown else f"flagged: {rule}")
            shown.add(rule)
        ax.set_ylabel(tag, fontsize=8)
        _legend(ax)
    axes[-1].set_xlabel(f"time in the run [{unit}]", fontsize=8)
    return fig


def flags_figure(s: FlagSeries, title: str) -> bytes:
    """PNG bytes of `draw_flags`."""
    return png_bytes(draw_flags(s, title))


# --------------------------------------------------------------------------- step-response matrix


def draw_step_response(record: Mapping[str, Any], title: str) -> Figure:
    """The step-response matrix (model/step_response.py record, engineering units): one panel per
    (CV, input), rows the CVs, columns the MVs then the DVs; each the unit step response from time 0
    with its ±2 standard-error band shaded (when the record has one) and the gain dotted; gain ± se,
    dead time and settling time in the panel title."""
    cvs, inputs = record["cv_tags"], record["input_tags"]
    period, steps = record["sample_period_s"], record["steps"]
    scale, unit = _time_unit(period * steps)
    t = period * np.arange(steps + 1) / scale  # response[k] at the end of step k; 0 at the step
    (top, bottom, left, right), gap = MARGINS_IN, 0.5
    width_in = max(WIDTH_IN, left + right + 2.2 * len(inputs))  # at least 2.2 in per input
    height = top + bottom + PANEL_HEIGHT_IN * len(cvs) + gap * (len(cvs) - 1)
    fig = Figure(figsize=(width_in, height), dpi=DPI)
    grid = fig.subplots(len(cvs), len(inputs), sharex=True, squeeze=False)
    fig.subplots_adjust(left=left / width_in, right=1 - right / width_in, bottom=bottom / height,
                        top=1 - top / height, hspace=gap / PANEL_HEIGHT_IN, wspace=0.35)
    fig.suptitle(title, fontsize=10)
    for pair, ax in zip(record["pairs"], grid.ravel()):
        response = np.concatenate([[0.0], np.asarray(pair["response"], float)])  # None (overflow): not drawn
        ax.plot(t, response, color=PREDICTED, lw=1.4, label="step response")
        if pair["response_se"] is not None:
            se = np.concatenate([[0.0], np.asarray(pair["response_se"], float)])
            ax.fill_between(t, response - 2 * se, response + 2 * se, color=PREDICTED, alpha=0.25, lw=0,
                            label="±2 standard errors")
        ax.axhline(pair["gain"], color="black", ls=":", lw=1, label="gain")
        gain = f"K {pair['gain']:.3g}" + ("" if pair["gain_se"] is None else f"±{pair['gain_se']:.2g}")
        dead = "-" if pair["dead_time_s"] is None else f"{pair['dead_time_s'] / scale:.3g}"
        settle = "-" if pair["settling_s"] is None else f"{pair['settling_s'] / scale:.3g}"
        source = pair["input"] + (" (DV)" if pair["kind"] == "dv" else "")
        ax.set_title(f"{pair['cv']} / {source}: {gain}, θ {dead}, T95 {settle} {unit}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for i, cv in enumerate(cvs):
        grid[i, 0].set_ylabel(f"CV {cv}", fontsize=8)
    for ax in grid[-1]:
        ax.set_xlabel(f"time after the step [{unit}]", fontsize=8)
    _legend(grid[0, -1])
    return fig


def step_response_figure(record: Mapping[str, Any], title: str) -> bytes:
    """PNG bytes of `draw_step_response`."""
    return png_bytes(draw_step_response(record, title))


# --------------------------------------------------------------------------- outcomes


def draw_outcome(cv_tags: Sequence[str], t_s: np.ndarray, predicted: np.ndarray, observed: np.ndarray,
                   band: Sequence[float | None] | None, title: str,
                   targets: Sequence[float] | None = None) -> Figure:
    """Predicted vs observed CVs after a recommendation was applied, one panel per CV.

    t_s (n,) seconds since the plan was applied; predicted and observed (n, n_cv) engineering
    units (NaN = not observed); band (n_cv,) UQ half-width (None entries or None = no band);
    targets (n_cv,) optional. Observations outside predicted +- band are marked red.
    """
    t = np.asarray(t_s, float)
    pred, obs = np.asarray(predicted, float), np.asarray(observed, float)
    widths = _band(band, len(cv_tags))
    scale, unit = _time_unit(float(t[-1] - t[0]) if t.size else 0.0)
    fig, axes = _figure(len(cv_tags), title)
    for j, (ax, tag) in enumerate(zip(axes, cv_tags)):
        ax.plot(t / scale, pred[:, j], color=PREDICTED, lw=1.5, label="predicted")
        if np.isfinite(widths[j]):
            ax.fill_between(t / scale, pred[:, j] - widths[j], pred[:, j] + widths[j], color=PREDICTED,
                            alpha=0.25, lw=0, label=f"UQ band ±{widths[j]:.3g}")
            outside = np.abs(obs[:, j] - pred[:, j]) > widths[j]
        else:
            outside = np.zeros(t.size, bool)
        ax.plot(t / scale, obs[:, j], ".-", color=MEASURED, lw=1, ms=3, label="observed")
        if outside.any():
            ax.plot(t[outside] / scale, obs[outside, j], "x", color=MISS, ms=6, label=f"outside band ({outside.sum()})")
        if targets is not None:
            ax.axhline(targets[j], color=TARGET, ls=":", lw=1.2, label="target")
        ax.set_ylabel(f"CV {tag}", fontsize=8)
        _legend(ax)
    axes[-1].set_xlabel(f"time since applied [{unit}]", fontsize=8)
    return fig


def outcome_figure(cv_tags: Sequence[str], t_s: np.ndarray, predicted: np.ndarray, observed: np.ndarray,
                   band: Sequence[float | None] | None, title: str,
                   targets: Sequence[float] | None = None) -> bytes:
    """PNG bytes of `draw_outcome`."""
    return png_bytes(draw_outcome(cv_tags, t_s, predicted, observed, band, title, targets))
