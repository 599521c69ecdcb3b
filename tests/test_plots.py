"""Figures for the UI (optimizer_pipeline/plots.py) and the plot / evidence metadata the assets emit."""

import base64
import io
import re
from dataclasses import replace

import numpy as np
import pytest
from dagster import AssetKey, instance_for_test
from matplotlib.collections import PolyCollection
from matplotlib.image import imread

from optimizer_pipeline import plots
from optimizer_pipeline.model import ArxModel, Orders, artifact_from_model
from optimizer_pipeline.plants import demo_plants

from model_helpers import binding, normalisation, run_series, simulate_arx
from pipeline_fixtures import DemoHome, seed_home

DATA_URI_IMAGE = re.compile(r"!\[([^\]]*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plan(n_cv=2, n_mv=3, n_hist=30, n_plan=20, band=(0.1, 0.2), steady=False, band_steps=None) -> plots.PlanSeries:
    rng = np.random.default_rng(0)
    return plots.PlanSeries(
        title="b: verified", steady=steady, period_s=10.0, cv_tags=tuple(f"y{j}" for j in range(n_cv)),
        mv_tags=tuple(f"u{i}" for i in range(n_mv)), t_hist=10.0 * np.arange(-n_hist + 1, 1),
        y_hist=5 + rng.normal(0, 0.1, (n_hist, n_cv)), u_hist=np.full((n_hist, n_mv), 2.0),
        controls=2 + rng.uniform(0, 1, (n_plan, n_mv)), predicted=6 + rng.normal(0, 0.1, (n_plan, n_cv)),
        band=np.array(band, float), band_steps=n_plan if band_steps is None else band_steps,
        cv_lo=np.full(n_cv, 1.0), cv_hi=np.full(n_cv, 9.0),
        cv_target=np.full(n_cv, 6.0), mv_lo=np.zeros(n_mv), mv_hi=np.full(n_mv, 4.0))


def decode(png: bytes) -> np.ndarray:
    return imread(io.BytesIO(png), format="png")


def lines(ax, label: str):
    return [line for line in ax.get_lines() if line.get_label() == label]


def test_markdown_image_is_a_base64_png_data_uri_of_the_given_bytes():
    png = plots.recommendation_figure(plan())
    match = DATA_URI_IMAGE.fullmatch(plots.markdown_image(png, "plan [b]"))
    assert match is not None
    assert match.group(1) == "plan (b)"  # brackets would end the alt text early
    assert base64.b64decode(match.group(2)) == png and png.startswith(PNG_SIGNATURE)


def test_recommendation_png_decodes_at_the_figure_size_and_stays_small():
    figure = plots.draw_plan(plan())
    width, height = figure.get_size_inches() * plots.DPI
    png = plots.png_bytes(figure)
    assert decode(png).shape[:2] == (round(height), round(width))
    assert len(png) < 80_000


def test_recommendation_figure_has_one_panel_per_cv_then_per_mv():
    s = plan(n_cv=2, n_mv=3)
    axes = plots.draw_plan(s).axes
    assert [ax.get_ylabel() for ax in axes] == ["CV y0", "CV y1", "MV u0", "MV u1", "MV u2"]


def test_cv_panel_draws_history_prediction_and_the_band_around_it():
    s = plan()
    ax = plots.draw_plan(s).axes[1]
    np.testing.assert_array_equal(lines(ax, "measured")[0].get_ydata(), s.y_hist[:, 1])
    predicted = lines(ax, "predicted")[0]
    np.testing.assert_allclose(predicted.get_ydata(), np.concatenate([[s.y_hist[-1, 1]], s.predicted[:, 1]]))
    np.testing.assert_allclose(predicted.get_xdata(), 10.0 * np.arange(21))  # end of each step, from now
    band = next(c for c in ax.collections if isinstance(c, PolyCollection))
    vertices = band.get_paths()[0].vertices
    assert vertices[:, 1].min() == pytest.approx(s.predicted[:, 1].min() - 0.2)
    assert vertices[:, 1].max() == pytest.approx(s.predicted[:, 1].max() + 0.2)
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"] == [1.0, 9.0]


def test_band_is_shaded_only_over_the_calibrated_steps_and_outlined_beyond():
    s = plan(n_plan=20, band_steps=5)
    ax = plots.draw_plan(s).axes[1]
    band = next(c for c in ax.collections if isinstance(c, PolyCollection))
    assert band.get_label() == "UQ band ±0.2, steps 1-5"
    assert band.get_paths()[0].vertices[:, 0].max() == pytest.approx(50.0)  # the end of step 5
    upper, lower = sorted(lines(ax, "band not calibrated beyond P") + [
        line for line in ax.get_lines() if line.get_linestyle() == "-." and line.get_label().startswith("_")],
        key=lambda line: -line.get_ydata()[0])
    np.testing.assert_allclose(upper.get_xdata(), 10.0 * np.arange(5, 21))
    np.testing.assert_allclose(upper.get_ydata(), s.predicted[4:, 1] + 0.2)
    np.testing.assert_allclose(lower.get_ydata(), s.predicted[4:, 1] - 0.2)


def test_band_of_a_plan_without_calibrated_steps_is_not_drawn():
    ax = plots.draw_plan(plan(band_steps=0)).axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_mv_panel_steps_through_the_planned_moves_and_holds_the_last():
    s = plan()
    ax = plots.draw_plan(s).axes[2]
    moves = lines(ax, "planned moves")[0]
    np.testing.assert_allclose(moves.get_ydata(), np.concatenate([s.controls[:, 0], s.controls[-1:, 0]]))
    assert moves.get_drawstyle() == "steps-post"


def test_cv_without_uq_evidence_has_no_band():
    ax = plots.draw_plan(plan(band=(np.nan, 0.2))).axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_rejected_recommendation_shows_history_only():
    figure = plots.draw_plan(plan(n_plan=0))
    assert all(not lines(ax, "predicted") and not lines(ax, "planned moves") for ax in figure.axes)
    assert all(lines(ax, "measured") for ax in figure.axes)


def test_a_whatif_plan_is_drawn_with_the_open_recommendation_dashed_beside_it():
    from optimizer_pipeline.contracts import RunSeries

    spec = binding(n_mv=2, n_cv=2, na=1, nb=1, delay=1, horizon=4)
    spec = replace(spec, cvs=(replace(spec.cvs[0], target=None), spec.cvs[1]))  # y0 without a target
    live = RunSeries("live", 10.0 * np.arange(12.0), np.full((12, 2), 1.0), np.full((12, 2), 0.5), np.zeros((12, 0)))
    whatif = {"status": "unverified", "template": "linear_mpc_quadratic@1", "controls": [[1.5, 1.0]] * 6,
              "predicted": [[0.7, 0.6]] * 6, "band": [0.1, None], "band_steps": 4}
    compared = {"controls": [[2.0, 1.0]] * 8, "predicted": [[0.9, 0.8]] * 8}
    s = plots.whatif_series(spec, live, whatif, compared, 10)
    assert s.title.startswith(f"{spec.id}: what-if, unverified") and np.isnan(s.cv_target[0])
    figure = plots.draw_plan(s)
    for j, ax in enumerate(figure.axes[:2]):
        [other] = lines(ax, "open recommendation")
        assert other.get_linestyle() == "--"
        np.testing.assert_allclose(other.get_ydata(), [0.5] + [compared["predicted"][0][j]] * 8)
        assert other.get_xdata()[0] == 0.0 and np.all(np.diff(other.get_xdata()) > 0)  # now, then its 8 steps
    assert not lines(figure.axes[0], "target") and lines(figure.axes[1], "target")  # y0 has none
    [moves] = lines(figure.axes[2], "open recommendation")
    np.testing.assert_allclose(moves.get_ydata(), [2.0] * 9)
    assert plots.whatif_series(spec, live, whatif, None, 10).compared is None


def test_steady_plan_is_drawn_as_settled_values_after_now():
    s = plan(n_plan=1, steady=True)
    ax = plots.draw_plan(s).axes[0]
    predicted = lines(ax, "steady-state prediction\n(time not to scale)")[0]
    np.testing.assert_allclose(predicted.get_ydata()[1:], [s.predicted[0, 0]] * 2)
    assert predicted.get_xdata()[0] == 0 and np.all(predicted.get_xdata()[1:] > 0)


def test_calibration_figure_marks_exactly_the_test_blocks_above_qhat():
    rng = np.random.default_rng(3)
    val, test = rng.gamma(2.0, 0.05, (40, 2)), rng.gamma(2.0, 0.05, (30, 2))
    qhat = (0.2, 0.15)
    axes = plots.draw_calibration(("a", "b"), val, test, qhat, (0.9, 0.8), 0.8, "t").axes
    for j, ax in enumerate(axes):
        above = [line for line in ax.get_lines() if line.get_marker() == "x"][0]
        np.testing.assert_array_equal(np.sort(above.get_ydata()), np.sort(test[test[:, j] > qhat[j], j]))
        assert [line.get_ydata()[0] for line in lines(ax, f"qhat {qhat[j]:.3g}")] == [qhat[j]]


def test_calibration_figure_without_evidence_says_so():
    axes = plots.draw_calibration(("a",), np.ones((1, 1)), np.ones((3, 1)), None, None, None, "t").axes
    assert axes[0].get_title() == "a: no UQ evidence"


def test_model_fit_series_reproduces_a_noise_free_arx_run_in_engineering_units():
    rng = np.random.default_rng(5)
    spec = binding(n_mv=2, n_cv=2, na=2, nb=2, delay=1, horizon=6)
    model = ArxModel(Orders(2, 2, 1), A=0.3 * rng.normal(size=(2, 2, 2)), B=rng.normal(size=(2, 2, 2)),
                     D=np.zeros((2, 2, 0)), c=rng.normal(size=2))
    u = rng.normal(3.0, 2.0, size=(2, 80, 2))
    y = simulate_arx(model.A, model.B, model.D, model.c, 1, u, np.zeros((2, 80, 0)), np.zeros((2, 80, 2)))
    runs = run_series("r", u, y, np.zeros((2, 80, 0)))
    norm = normalisation(spec, runs)  # not unit: the series must come back in engineering units
    # the ARX recursion is in engineering units; express it in normalised units for the artifact
    artifact = artifact_from_model(_normalised(model, norm, spec), spec, 1, norm)
    series = plots.model_fit_series(artifact, runs[1], max_blocks=5)
    # na=2, nb=2, delay=1: the first measured state is at row 1 (y[0..1], u[0]); blocks predict 2..31
    covered = ~np.isnan(series.predicted[:, 0])
    assert series.predicted.shape == series.measured.shape == (32, 2)
    assert not covered[:2].any() and covered[2:].all()
    np.testing.assert_allclose(series.predicted[covered], series.measured[covered], atol=1e-8)
    np.testing.assert_allclose(series.t, np.arange(32.0))


def _normalised(model: ArxModel, norm, spec) -> ArxModel:
    """The same ARX in normalised units: y_n = (y - my) / sy, u_n = (u - mu) / su."""
    mu, su = norm.of(spec.mv_tags)
    my, sy = norm.of(spec.cv_tags)
    A = model.A * sy[None, None, :] / sy[None, :, None]
    B = model.B * su[None, None, :] / sy[None, :, None]
    c = (model.c + model.A.sum(axis=0) @ my + model.B.sum(axis=0) @ mu - my) / sy
    return ArxModel(model.orders, A, B, model.D, c)


def test_outcome_figure_marks_the_observations_outside_the_band():
    t = 10.0 * np.arange(8)
    predicted = np.ones((8, 2))
    observed = predicted + np.array([0, 0.05, 0.3, 0, -0.4, 0, 0, 0.11])[:, None] * [1, 1]
    axes = plots.draw_outcome(("a", "b"), t, predicted, observed, (0.1, None), "t", targets=(1.0, 1.2)).axes
    np.testing.assert_allclose(lines(axes[0], "outside band (3)")[0].get_ydata(), [1.3, 0.6, 1.11])
    assert not [line for line in axes[1].get_lines() if line.get_label().startswith("outside")]  # no band
    assert decode(plots.outcome_figure(("a", "b"), t, predicted, observed, (0.1, None), "t")).shape[1] == \
        round(plots.WIDTH_IN * plots.DPI)


def _step_response_record():
    from test_step_response import HAND_SPEC, hand_built

    from optimizer_pipeline.model.step_response import step_response_record

    ss, replicates, norm = hand_built()
    return step_response_record(ss, replicates, HAND_SPEC, norm)


def _fit() -> plots.FitSeries:
    t = 10.0 * np.arange(40)
    measured = np.stack([np.sin(t / 50), np.cos(t / 50)], axis=1)
    return plots.FitSeries("r", 6, ("a", "b"), t, measured, measured + 0.01)


FIGURES = {  # every kind of figure, with the most legend entries each can have
    "plan, band beyond P": lambda: plots.draw_plan(plan(band_steps=5)),
    "steady plan": lambda: plots.draw_plan(plan(n_plan=1, steady=True)),
    "what-if plan": lambda: plots.draw_plan(replace(plan(band_steps=5), compared=(
        np.full((25, 3), 2.5), np.full((25, 2), 6.5)))),
    "calibration": lambda: plots.draw_calibration(("a", "b"), np.full((20, 2), 0.1), np.linspace(0.01, 0.3, 40)
                                                  .reshape(20, 2), (0.2, 0.15), (0.9, 0.8), 0.8, "t"),
    "model fit": lambda: plots.draw_model_fit(_fit(), "t"),
    "step response": lambda: plots.draw_step_response(_step_response_record(), "t"),
    "outcome": lambda: plots.draw_outcome(("a", "b"), 10.0 * np.arange(8), np.ones((8, 2)),
                                          np.ones((8, 2)) + 0.3 * (np.arange(8) % 2)[:, None], (0.1, 0.2), "t",
                                          targets=(1.0, 1.2)),
}


@pytest.mark.parametrize("kind", FIGURES)
def test_every_legend_sits_beside_the_panels_clear_of_their_data_and_inside_the_figure(kind):
    figure = FIGURES[kind]()
    figure.draw_without_rendering()  # lays the legends out
    legends = [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    boxes = [legend.get_window_extent() for legend in legends]
    assert legends
    for box in boxes:
        assert not [ax for ax in figure.axes if box.overlaps(ax.get_window_extent())]
        assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1  # not cut off at the edge
        assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]


def test_a_figure_that_cannot_be_drawn_becomes_one_line_of_markdown():
    def broken() -> bytes:
        raise ValueError("no data")

    assert plots.figure_markdown(broken, "plan") == "*figure 'plan' could not be drawn: ValueError: no data*"


def _os_exit(*_args) -> bytes:
    import os

    os._exit(3)


def test_many_figures_are_drawn_in_a_background_process_exactly_as_inline():
    series = [plan(), plan(n_cv=1, n_mv=1), plan(steady=True), plan(band=(None, 0.3))]
    inline = [plots.markdown_image(plots.recommendation_figure(s), f"plan {i}") for i, s in enumerate(series)]
    with plots.FigureQueue(len(series)) as figures:
        assert figures.background  # this many go to the background process
        pending = [figures.add(f"plan {i}", plots.recommendation_figure, s) for i, s in enumerate(series)]
        assert [p() for p in pending] == inline
    with plots.FigureQueue(plots.BACKGROUND_MIN_FIGURES - 1) as figures:
        assert not figures.background and figures.add("plan 0", plots.recommendation_figure, series[0])() == inline[0]


def test_a_background_process_that_dies_gives_one_line_per_figure():
    with plots.FigureQueue(plots.BACKGROUND_MIN_FIGURES) as figures:
        dead = figures.add("plan", _os_exit)
        assert dead().startswith("*figure 'plan' could not be drawn: BrokenProcessPool")


# --------------------------------------------------------------------------- asset metadata


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    """One demo binding refreshed through real Dagster; the instance keeps its materializations."""
    home = tmp_path_factory.mktemp("home")
    plants = [p for p in demo_plants() if p.spec.id == "tanks-1"]
    ledger = seed_home(home, plants)
    with instance_for_test(temp_dir=str(tmp_path_factory.mktemp("dagster"))) as instance:
        instance.add_dynamic_partitions("bindings", ["tanks-1"])
        DemoHome(home, ledger, instance, {"tanks-1": plants[0]}, in_process_solver=True).run("tanks-1")
        yield instance


def metadata_of(instance, asset: str) -> dict:
    return instance.get_latest_materialization_event(AssetKey(asset)).asset_materialization.metadata


@pytest.mark.parametrize("asset, panels", [("recommendation", 4), ("uq_calibration", 2), ("model_artifact", 2)])
def test_asset_materialization_carries_its_plot_as_a_png_markdown_image(materialized, asset, panels):
    match = DATA_URI_IMAGE.fullmatch(metadata_of(materialized, asset)["plot"].value)
    assert match is not None
    image = decode(base64.b64decode(match.group(2)))
    top, bottom = 0.45, 0.5  # plots._figure margins (inches): the height grows with the panel count
    assert (image.shape[0] / plots.DPI - top - bottom) // plots.PANEL_HEIGHT_IN == panels


def test_recommendation_lists_every_condition_for_verified_and_all_hold(materialized):
    metadata = metadata_of(materialized, "recommendation")
    rows = [r.data for r in metadata["conditions"].value.records]
    names = [r["condition"] for r in rows]
    assert names[:4] == ["feasible candidate", "UQ evidence", "test coverage (worst CV)", "calibration fresh"]
    assert {"model gate G1", "model gate G4", "candidate verified independently"} <= set(names)
    assert metadata["status"].value == "verified" and all(r["holds"] for r in rows)
    assert len(metadata["training_data_hash"].value) == 64


def test_recommendation_metadata_shows_status_reasons_and_conditions_first(materialized):
    """Dagster lists the entries in the order the step gave them."""
    metadata = metadata_of(materialized, "recommendation")
    assert list(metadata)[:6] == ["status", "status_label", "reasons", "conditions", "plot", "plan"]
    assert list(metadata)[-3:] == ["cost", "independent_cost", "input_distance"]  # plain numbers: the Plots tab
    assert all(isinstance(metadata[k].value, float) for k in ("cost", "independent_cost", "input_distance"))


def test_recommendation_tables_show_4_significant_digits(materialized):
    metadata = metadata_of(materialized, "recommendation")
    plan_values = [v for r in metadata["plan"].value.records for k, v in r.data.items() if k != "step"]
    costs = [r.data[k] for r in metadata["candidates"].value.records for k in ("cost", "independent_cost")]
    assert plan_values and costs
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", v) and len(v.lstrip("-").replace(".", "").lstrip("0")) <= 4
               for v in plan_values + costs)


def test_the_conditions_table_shows_the_short_columns_first_and_the_reason_of_a_failing_condition():
    from optimizer_pipeline.assets.batch import conditions_table
    from optimizer_pipeline.contracts import Condition

    table = conditions_table((Condition("calibration fresh", "9 days", "<= 7 days", False, "calibration is not fresh"),
                              Condition("input distance", "1", "<= 4", True, "input distance 1 exceeds 4")))
    assert [c.name for c in table.schema.columns] == ["holds", "value", "limit", "condition", "reason"]
    assert [r.data["reason"] for r in table.records] == ["calibration is not fresh", ""]  # a holding one has none


def test_calibration_shows_coverage_against_threshold_per_cv(materialized):
    metadata = metadata_of(materialized, "uq_calibration")
    rows = [r.data for r in metadata["coverage_by_cv"].value.records]
    evidence = metadata["evidence"].value
    assert [r["cv"] for r in rows] == evidence["cv_tags"]
    assert [r["coverage"] for r in rows] == evidence["coverage_per_cv"]
    assert all(r["meets_threshold"] == (r["coverage"] >= evidence["coverage_threshold"]) for r in rows)
    assert metadata["status"].value == "passes the UQ gate"


def test_step_response_figure_has_a_panel_per_cv_and_input_with_its_two_se_band():
    from test_step_response import HAND_SPEC, hand_built

    from optimizer_pipeline.model.step_response import step_response_record

    ss, replicates, norm = hand_built()
    record = step_response_record(ss, replicates, HAND_SPEC, norm)
    axes = plots.draw_step_response(record, "t").axes
    assert [ax.get_title() for ax in axes] == [
        "y1 / u: K 1±0.12, θ 10, T95 60 s", "y1 / d (DV): K 4±0, θ 0, T95 140 s",
        "y2 / u: K 2±0.23, θ 10, T95 60 s", "y2 / d (DV): K 0±0, θ -, T95 10 s"]
    pair = record["pairs"][2]
    response = lines(axes[2], "step response")[0]
    np.testing.assert_allclose(response.get_xdata(), 10.0 * np.arange(23))  # 0 at the step, then each step's end
    np.testing.assert_allclose(response.get_ydata(), [0.0, *pair["response"]])
    band = next(c for c in axes[2].collections if isinstance(c, PolyCollection)).get_paths()[0].vertices
    upper = np.asarray(pair["response"]) + 2 * np.asarray(pair["response_se"])
    assert band[:, 1].max() == pytest.approx(upper.max())
    assert [line.get_ydata()[0] for line in lines(axes[2], "gain")] == [pytest.approx(2.0)]
    assert decode(plots.step_response_figure(record, "t")).shape[:2] == (round((0.95 + 2 * 1.7 + 0.5) * plots.DPI),
                                                                           round(plots.WIDTH_IN * plots.DPI))


def test_model_artifact_materialization_shows_the_step_response_matrix_and_its_table(materialized):
    metadata = metadata_of(materialized, "model_artifact")
    match = DATA_URI_IMAGE.fullmatch(metadata["step_response_plot"].value)
    assert match is not None and match.group(1) == "step-response matrix"
    assert decode(base64.b64decode(match.group(2))).shape[:2] == (round((0.95 + 2 * 1.7 + 0.5) * plots.DPI),
                                                                  round(plots.WIDTH_IN * plots.DPI))  # 2 CVs x 2 MVs
    table = metadata["step_response"].value
    for cv in ("y1", "y2"):
        for mv in ("v1", "v2"):
            assert f"| {cv} | {mv} (MV) | " in table
    assert "Condition number of the MV gain matrix (engineering units): " in table
    assert "Relative gain array, G .* inv(G)^T:" in table


def test_step_response_figure_of_an_unstable_model_draws_what_did_not_overflow():
    from test_step_response import HAND_DOC

    from optimizer_pipeline.contracts import Normalisation, StateSpace, binding_from_dict
    from optimizer_pipeline.model.step_response import step_response_record

    spec = binding_from_dict({**HAND_DOC, "dvs": [], "cvs": HAND_DOC["cvs"][:1]})
    ss = StateSpace.of([[20.0]], [[1.0]], np.zeros((1, 0)), [0.0], [[1.0]])
    record = step_response_record(ss, [], spec, Normalisation(("u", "y1"), (0.0, 0.0), (1.0, 1.0)))
    (ax,) = plots.draw_step_response(record, "t").axes
    assert ax.get_title() == "y1 / u: K -0.0526, θ -, T95 - min"  # no dead time of a response that overflowed
    assert lines(ax, "step response")[0].get_ydata()[:3].tolist() == [0.0, 1.0, 21.0]
    assert plots.step_response_figure(record, "t").startswith(PNG_SIGNATURE)
