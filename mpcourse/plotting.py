"""Figure helpers the chapters share: formats drawn from their FloatFormat, never from typed numbers.

Each ``plot_``/``draw_`` helper draws onto a Matplotlib ``ax`` it is given (or a new one) and
returns that ``ax``, so a chapter can combine several helpers in one figure, add its own title, and
call ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.transforms as mtransforms
import numpy as np
import torch
from matplotlib.patches import Patch

from mpcourse.formats import FloatFormat, get_format

# One colour per format, the same in every chapter, so that "orange" always means BF16.
FORMAT_COLORS = {
    "fp32": "#4c4c4c", "tf32": "#8c564b", "fp16": "#1f77b4", "bf16": "#ff7f0e",
    "e4m3": "#2ca02c", "e5m2": "#d62728", "e3m2": "#9467bd", "e2m3": "#e377c2",
    "e2m1": "#17becf", "e8m0": "#bcbd22",
}
# The three fields of a format, in bit order.
FIELD_COLORS = {"sign": "#d62728", "exponent": "#1f77b4", "mantissa": "#2ca02c"}


def _axes(ax, figsize):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_bit_layouts(formats, ax=None):
    """Draw each format as a row of boxes, one per bit: sign, then exponent, then mantissa.

    The rows share one bit width and start at the same edge, so the picture answers at a glance
    how a budget of bits is split: BF16 keeps FP32's 8 exponent bits and drops mantissa, FP16
    keeps more mantissa and gives up exponent.
    """
    formats = [get_format(f) for f in formats]
    ax = _axes(ax, (9, 0.55 * len(formats) + 0.6))
    for row, fmt in enumerate(formats):
        y = -row
        fields = [("sign", int(fmt.signed)), ("exponent", fmt.exponent_bits),
                  ("mantissa", fmt.mantissa_bits)]
        x = 0
        for field, width in fields:
            for bit in range(width):
                ax.add_patch(plt.Rectangle((x + bit, y - 0.35), 1, 0.7, facecolor=FIELD_COLORS[field],
                                           edgecolor="white", linewidth=0.8, alpha=0.85))
            if width:
                ax.text(x + width / 2, y, str(width), ha="center", va="center", color="white",
                        fontsize=8, fontweight="bold")
            x += width
        ax.text(-0.8, y, fmt.name.upper(), ha="right", va="center", fontsize=10)
        ax.text(x + 0.6, y, f"{fmt.bits} bits", ha="left", va="center", fontsize=9, color="0.3")
    widest = max(f.bits for f in formats)
    ax.set_xlim(-6, widest + 6)
    ax.set_ylim(-len(formats) + 0.4, 0.8)
    ax.legend(handles=[Patch(color=color, label=field) for field, color in FIELD_COLORS.items()],
              loc="lower right", ncol=3, frameon=False, fontsize=9)
    ax.axis("off")
    return ax


def plot_number_line(fmt, ax=None, *, log=False, color=None):
    """Mark every finite value of ``fmt`` with a tick; subnormals get a lighter tick.

    On a linear axis (both signs) you see the values crowd towards zero. On a log axis
    (``log=True``, positive values only) you see the same fact from the other side: each binade
    ``[2**e, 2**(e+1))`` holds the same number of values, ``2**mantissa_bits`` (one fewer where
    NaN takes the top code, as in E4M3).
    """
    fmt = get_format(fmt)
    ax = _axes(ax, (8, 1.4))
    color = color or FORMAT_COLORS.get(fmt.name, "k")
    values = fmt.values().astype(np.float64)
    if log:
        values = values[values > 0]
    subnormal = (np.abs(values) < fmt.min_normal) & (values != 0)  # none without subnormals
    ax.vlines(values[~subnormal], -1, 1, color=color, linewidth=1)
    ax.vlines(values[subnormal], -0.6, 0.6, color=color, linewidth=1, alpha=0.45)
    ax.axhline(0, color="0.6", linewidth=0.6, zorder=0)
    if log:
        ax.set_xscale("log", base=2)
    ax.set_ylim(-1.6, 1.6)
    ax.set_yticks([])
    ax.set_ylabel(fmt.name.upper(), rotation=0, ha="right", va="center")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    return ax


def spacing(fmt: FloatFormat):
    """Every positive finite value of ``fmt`` (except the largest) and the gap up to the next one.

    The gap is the value's *ulp* (unit in the last place): what one step of the last mantissa bit
    is worth there. Only for formats ``FloatFormat.values()`` can list (16 bits or fewer).
    """
    values = get_format(fmt).values().astype(np.float64)
    values = values[values > 0]
    return values[:-1], np.diff(values)


def plot_spacing(fmt, ax=None, *, color=None):
    """Plot the gap between neighbouring values against magnitude on log-log axes.

    In the normal range the gap doubles every binade (a staircase along a line of slope 1: the
    *relative* gap stays near ``fmt.epsilon``); in the subnormal range it stays flat at
    ``fmt.min_subnormal``.
    """
    fmt = get_format(fmt)
    ax = _axes(ax, (8, 3.5))
    values, gaps = spacing(fmt)
    ax.step(values, gaps, where="post", color=color or FORMAT_COLORS.get(fmt.name),
            label=fmt.name.upper())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("magnitude |x|")
    ax.set_ylabel("gap to next value (ulp)")
    return ax


def draw_limits(ax, fmt, *, color=None, fontsize=7):
    """Draw ``fmt``'s smallest subnormal, smallest normal and largest value as labelled lines.

    For plots whose x axis is a magnitude: vertical lines, told apart by their style (dotted,
    dashed, solid), each labelled at the top of the axes.
    """
    fmt = get_format(fmt)
    color = color or FORMAT_COLORS.get(fmt.name, "0.3")
    limits = {fmt.min_subnormal: ("min subnormal", ":"), fmt.min_normal: ("min normal", "--"),
              fmt.max_value: ("max", "-")}  # a dict: E8M0's two equal minimums draw once
    top_of_axes = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for value, (name, style) in limits.items():
        ax.axvline(value, color=color, linestyle=style, linewidth=1)
        ax.text(value, 0.98, f" {fmt.name.upper()} {name}", transform=top_of_axes, rotation=90,
                ha="right", va="top", fontsize=fontsize, color=color, clip_on=True)
    return ax


def plot_magnitude_histogram(values, ax=None, *, fmt="fp16", label=None, color=None, limits=True):
    """Histogram of the magnitudes of ``values``, one bar per binade ``[2**k, 2**(k+1))``, with
    ``fmt``'s limits drawn as reference lines (:func:`draw_limits`).

    The x axis is the magnitude on a log2 scale, the y axis the share of *all* values (in %) in
    each binade. Exact zeros, and inf or NaN, have no binade: they are left out of the bars and
    their share is written into the legend label instead. Values may be a tensor (any dtype,
    any device) or an array. To overlay several histograms, pass the same ``ax``, and
    ``limits=False`` after the first so that the limits are drawn once.

    This is the picture behind loss scaling: multiplying by ``S = 2**k`` slides the whole
    histogram ``k`` binades to the right, out of ``fmt``'s subnormal range and below.
    """
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    magnitudes = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    if magnitudes.size == 0:
        raise ValueError("plot_magnitude_histogram needs at least one value")
    finite = np.isfinite(magnitudes)
    positive = magnitudes[finite & (magnitudes > 0)]
    ax = _axes(ax, (8, 3.5))
    shares = {"exactly zero": np.mean(magnitudes == 0), "inf or NaN": np.mean(~finite)}
    notes = [f"{share:.1%} {what}" for what, share in shares.items() if share]
    label = ", ".join(filter(None, [label, *notes])) or None
    if positive.size:
        binade = np.frexp(positive)[1] - 1  # |x| in [2**binade, 2**(binade + 1)), exactly
        counts = np.bincount(binade - binade.min())
        edges = np.exp2(np.arange(binade.min(), binade.max() + 2, dtype=np.float64))
        ax.stairs(100 * counts / magnitudes.size, edges, fill=True, alpha=0.6,
                  color=color or "0.5", label=label)
    elif label:
        ax.plot([], [], color=color, label=label)  # nothing to draw, but keep the legend entry
    ax.set_xscale("log", base=2)
    ax.set_xlabel("magnitude |x| (log scale)")
    ax.set_ylabel("share of all values (%)")
    if limits:
        draw_limits(ax, fmt)
    return ax


def legend_in_view(ax, shaded=(), **legend_options):
    """Rebuild ``ax``'s legend from what the reader can see: the labelled lines that lie inside the
    x-range shown (a vertical line drawn off the axis is left out), plus one patch per shaded range.

    ``shaded`` holds ``(label, color, alpha)`` for ranges drawn with ``axvspan``, which carry no
    legend entry of their own. Returns ``ax``.
    """
    low, high = sorted(ax.get_xlim())
    handles = []
    for line in ax.get_lines():
        label = line.get_label()
        if label.startswith("_"):
            continue  # matplotlib's name for an artist kept out of the legend
        xs = np.asarray(line.get_xdata(), dtype=float)
        if xs.size and ((xs >= low) & (xs <= high)).any():
            handles.append(line)
    handles += [Patch(color=color, alpha=alpha, label=label) for label, color, alpha in shaded]
    if not handles:
        raise ValueError("nothing to put in the legend: no labelled line lies in view and no "
                         "shaded range was given")
    ax.legend(handles=handles, **legend_options)
    return ax
