"""Shared figure helpers: they draw what their docstrings promise."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mpcourse.plotting import legend_in_view, plot_magnitude_histogram  # noqa: E402


def bars(ax):
    (patch,) = [c for c in ax.patches if hasattr(c, "get_data")]
    heights, edges, _ = patch.get_data()  # StepPatch data: values, edges, baseline
    return heights, edges


def test_magnitude_histogram_puts_each_value_in_its_binade_and_reports_zeros_and_nonfinite():
    values = torch.tensor([0.0, 0.0, 1.0, -1.5, 2.0, 3.0, 0.25, float("inf"), float("nan"), 2.0**-30])
    ax = plot_magnitude_histogram(values, label="grads")
    heights, edges = bars(ax)
    assert list(edges) == [2.0**k for k in range(-30, 3)]
    expected = {-30: 1, -2: 1, 0: 2, 1: 2}  # binade k holds [2**k, 2**(k+1))
    for k, height in zip(range(-30, 2), heights):
        assert height == pytest.approx(100 * expected.get(k, 0) / len(values))
    legend = ax.get_legend_handles_labels()[1]
    assert legend == ["grads, 20.0% exactly zero, 20.0% inf or NaN"]
    plt.close(ax.figure)


def test_magnitude_histogram_accepts_arrays_and_draws_the_format_limits_once():
    fig, ax = plt.subplots()
    plot_magnitude_histogram(np.array([1e-6, 1e-3]), ax)
    lines = len(ax.lines)
    assert lines > 0  # the FP16 limits
    plot_magnitude_histogram(np.array([1e-2]), ax, limits=False)
    assert len(ax.lines) == lines
    plt.close(fig)


def test_magnitude_histogram_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one value"):
        plot_magnitude_histogram(torch.tensor([]))


def test_legend_in_view_drops_lines_off_the_axis_and_lists_the_shaded_ranges():
    _, ax = plt.subplots()
    ax.plot([1, 10], [0, 1], label="_data")
    ax.axvline(5, label="inside")
    ax.axvline(1e6, label="off the axis")
    ax.set_xlim(0.5, 20)
    legend_in_view(ax, shaded=[("FP16 range", "tab:blue", 0.1)])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["inside", "FP16 range"]
    plt.close("all")


def test_legend_in_view_refuses_an_empty_legend():
    _, ax = plt.subplots()
    ax.axvline(1e6, label="off the axis")
    ax.set_xlim(0, 1)
    with pytest.raises(ValueError, match="nothing to put in the legend"):
        legend_in_view(ax)
    plt.close("all")
