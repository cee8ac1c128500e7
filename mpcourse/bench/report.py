"""The suite's report: ``report.md``, its figures and ``report.json``, written to one folder.

``report.json`` (:func:`~mpcourse.bench.report_json.report_json`) holds every figure of the report
as data, so reports of many GPUs can be compared and a chapter can generate its sentences from
them; :func:`~mpcourse.bench.report_json.check_report` checks one's internal consistency (each TFLOP/s is 2·m·n·k over its
median time, each percentage is achieved over peak, each speed-up is a ratio of two times in the
file, ...). The book's appendix *GPU reports* documents every field.

Each ``plot_`` function draws onto a Matplotlib ``ax`` it is given (or a new one) and returns
it, like the helpers of :mod:`mpcourse.plotting`, so a chapter can show the same figures inline.
:func:`write_report` draws them on figures that never touch pyplot's global state and saves them
as PNG with Matplotlib's Agg renderer.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mpcourse.bench.probes import AlignmentRow, MaxMatmulResult
from mpcourse.bench.report_json import check_report, report_json
from mpcourse.bench.specs import GPU_SPECS, PRECISION_LABELS, PRECISIONS, device_slug
from mpcourse.bench.suite import SuiteResults
from mpcourse.display import markdown_table
from mpcourse.plotting import FORMAT_COLORS

COLORS = {**{p: FORMAT_COLORS[p] for p in ("fp32", "tf32", "fp16", "bf16")},
          "fp8": FORMAT_COLORS["e4m3"]}
FIGURES = ("achieved_vs_peak.png", "roofline.png", "precisions.png", "alignment.png")


def _axes(ax, figsize=(6, 4)):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def _measured(results: SuiteResults) -> dict[str, MaxMatmulResult]:
    return {p: r for p, r in results.matmul.items() if isinstance(r, MaxMatmulResult)}


def plot_achieved_vs_peak(results: SuiteResults, ax=None):
    """Best achieved matmul TFLOP/s per precision (dots), next to the datasheet's dense peak
    (open markers) on a log axis.

    Dots, not bars: on a log axis a bar's length is not proportional to its value, so bars of
    achieved and peak side by side would misstate the ratio. Here the ratio is the vertical
    distance between the two markers, the same for the same ratio in every precision, and each
    dot is labelled with its percentage of the peak."""
    ax = _axes(ax)
    measured = _measured(results)
    x = np.arange(len(measured))
    achieved = [r.tflops for r in measured.values()]
    peaks = [r.peak_tflops for r in measured.values()]
    colors = [COLORS[p] for p in measured]
    peak_known = any(p is not None for p in peaks)
    for xi, value, peak, color in zip(x, achieved, peaks, colors):
        if peak:
            ax.plot([xi, xi], [value, peak], color=color, linewidth=1, zorder=1)
            ax.scatter([xi], [peak], s=60, facecolors="white", edgecolors=[color], linewidths=1.5,
                       zorder=2)
        ax.scatter([xi], [value], s=40, color=color, zorder=3)
        text = (f"{value:.0f}" if value >= 100 else f"{value:.3g}") + " TFLOP/s" + (
            f"\n{100 * value / peak:.0f}% of peak" if peak else "")
        ax.annotate(text, (xi, value), xytext=(6, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=7)
    ax.scatter([], [], s=40, color="0.3", label="achieved (best shape)")
    if peak_known:
        ax.scatter([], [], s=60, facecolors="white", edgecolors="0.3", linewidths=1.5,
                   label="datasheet peak (dense)")
    ax.set_xticks(x, [PRECISION_LABELS[p] for p in measured])
    ax.set_xlim(-0.5, len(measured) - 0.2)  # room for the last dot's label
    ax.set_yscale("log")
    ax.set_ylabel("matmul throughput (TFLOP/s, log scale)")
    ax.set_title(f"{results.info.name}: achieved" + (" vs datasheet peak" if peak_known else
                                                     " (no datasheet peak for this device)"),
                 fontsize=9)
    ax.legend(fontsize=7)
    return ax


def plot_roofline(results: SuiteResults, ax=None):
    """Roofline: attainable TFLOP/s = min(peak, intensity x bandwidth), with every matmul measured.

    The roofs are the datasheet's where the device is known, else the best measured matmul
    and the measured copy bandwidth (drawn dashed and labelled "measured").
    """
    ax = _axes(ax)
    measured = _measured(results)
    intensities = [r.arithmetic_intensity for m in measured.values() for r in m.results]
    span = np.logspace(np.log10(min(intensities + [1.0]) / 4), np.log10(max(intensities) * 4),
                       200)
    spec_bandwidth = results.info.memory_bandwidth_gbs
    bandwidth = spec_bandwidth or results.bandwidth.gbs
    source = "datasheet" if spec_bandwidth else "measured"
    memory_roof = span * bandwidth / 1e3  # GB/s x FLOP/byte = GFLOP/s; / 1e3: TFLOP/s
    top = max(m.peak_tflops or m.tflops for m in measured.values())
    ax.plot(span[memory_roof <= top], memory_roof[memory_roof <= top], color="0.4",
            linewidth=1, label=f"memory roof, {bandwidth:.4g} GB/s ({source})")
    for precision, best in measured.items():
        peak = best.peak_tflops or best.tflops
        ridge = span >= peak * 1e3 / bandwidth
        ax.plot(span[ridge], np.full(ridge.sum(), peak), color=COLORS[precision],
                linestyle="-" if best.peak_tflops else "--", linewidth=1)
        ax.scatter([r.arithmetic_intensity for r in best.results],
                   [r.tflops for r in best.results], color=COLORS[precision], s=18,
                   label=PRECISION_LABELS[precision])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("throughput (TFLOP/s)")
    roofs = sorted({"datasheet peaks (solid)" if m.peak_tflops else "best measured (dashed)"
                    for m in measured.values()})
    ax.set_title(f"Roofline: flat roofs at the {' or '.join(roofs)};"
                 "\ndots: matmuls of growing size", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def plot_precisions(results, ax=None):
    """The transformer block's forward and forward + backward time per precision (skipped: marked).

    ``results``: a :class:`SuiteResults`, or the :class:`PrecisionComparison` itself."""
    ax = _axes(ax)
    rows = getattr(results, "precisions", results).rows
    x = np.arange(len(rows))
    for offset, attribute, label, hatch in ((-0.2, "forward_ms", "forward (no grad)", None),
                                            (0.2, "step_ms", "forward + backward", "..")):
        values = [getattr(r, attribute) or 0 for r in rows]
        ax.bar(x + offset, values, 0.4, color=[COLORS[r.precision] for r in rows], hatch=hatch,
               edgecolor="white", label=label)
    for xi, row in zip(x, rows):
        if row.skipped:
            ax.annotate("skipped", (xi, 0), ha="center", va="bottom", rotation=90, fontsize=7)
        elif row.step_speedup is not None:
            ax.annotate(f"{row.step_speedup:.2f}x", (xi + 0.2, row.step_ms), ha="center",
                        va="bottom", fontsize=7)
    # the FP8 row is the course's own Fp8Linear (emulated scaling, unfused casts), not a fused FP8 kernel
    ax.set_xticks(x, [PRECISION_LABELS[r.precision] + ("\n(course Fp8Linear,\nunfused)" if r.precision == "fp8" else "")
                      for r in rows])
    ax.set_ylabel("median time (ms)")
    ax.set_title("Transformer block: time per precision\n(label: forward + backward speed-up "
                 "vs FP32, no optimizer step)", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def plot_alignment(rows: list[AlignmentRow], ax=None):
    """Matmul TFLOP/s at each size, aligned or not, and after padding to the multiple."""
    ax = _axes(ax)
    sizes = [r.size for r in rows]
    rounds = len(rows[0].results) or 1

    def spread(values, ranges):  # error bars from the median round to the lowest and highest
        return [[v - lo for v, (lo, _) in zip(values, ranges)], [hi - v for v, (_, hi) in zip(values, ranges)]]

    ax.plot(sizes, [r.tflops for r in rows], color="0.6", zorder=1)
    for aligned, marker, label in ((True, "o", "aligned"), (False, "x", "not aligned")):
        chosen = [r for r in rows if r.aligned == aligned]
        ax.errorbar([r.size for r in chosen], [r.tflops for r in chosen],
                    yerr=spread([r.tflops for r in chosen], [r.tflops_range for r in chosen]),
                    fmt=marker, color="tab:blue", capsize=3, label=f"n x n x n, {label}", zorder=2)
    unaligned = [r for r in rows if not r.aligned]
    ax.errorbar([r.size + 0.15 for r in unaligned], [r.padded_tflops for r in unaligned],
                yerr=spread([r.padded_tflops for r in unaligned], [r.padded_tflops_range for r in unaligned]),
                fmt="^", color="tab:green", capsize=3, label="padded to the multiple (useful FLOPs only)",
                zorder=2)
    if rounds > 1:
        ax.text(0.01, 0.01, f"median of {rounds} rounds, bars: lowest to highest", transform=ax.transAxes,
                fontsize=7, color="0.4")
    precision = PRECISION_LABELS[rows[0].result.precision]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("matrix size n")
    ax.set_ylabel("throughput (TFLOP/s)")
    ax.set_title(f"{precision} matmul: sizes on and off multiples of {rows[0].multiple}",
                 fontsize=9)
    ax.legend(fontsize=7)
    return ax


def default_report_dir(results: SuiteResults, root="bench-report") -> Path:
    """``bench-report/<device-slug>-<YYYY-MM-DD>``: :func:`~mpcourse.bench.specs.device_slug` of
    the device name. Committed reports keep the folder's name under ``mpcourse/data/bench/``."""
    return Path(root) / f"{device_slug(results.info.name)}-{datetime.date.today().isoformat()}"


def write_report(results: SuiteResults, out_dir=None) -> Path:
    """Write ``report.md``, its PNG figures and ``report.json`` into ``out_dir``; return
    report.md's path.

    ``out_dir`` defaults to :func:`default_report_dir`; it is created if needed. A figure whose
    step was skipped (a time budget, say) is not drawn, and report.json lists the figures drawn.

    Raises:
        ValueError: the written report.json fails :func:`~mpcourse.bench.check_report` (a bug:
            the files stay, for inspection).
    """
    out_dir = Path(out_dir) if out_dir is not None else default_report_dir(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    measured = bool(_measured(results))
    bandwidth = results.info.memory_bandwidth_gbs or not isinstance(results.bandwidth, str)
    plots = [(plot_achieved_vs_peak, results, measured),
             (plot_roofline, results, measured and bandwidth),
             (plot_precisions, results, not isinstance(results.precisions, str)),
             (plot_alignment, results.alignment, not isinstance(results.alignment, str))]
    drawn = []
    for name, (plot, data, available) in zip(FIGURES, plots):
        if not available:
            continue
        figure = Figure(figsize=(6.4, 4.2), layout="constrained")
        plot(data, figure.add_subplot())
        figure.savefig(out_dir / name, dpi=120)
        drawn.append(name)
    report = report_json(results, drawn)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    path = out_dir / "report.md"
    path.write_text(report_markdown(results, drawn))
    check_report(report, out_dir / "report.json", out_dir)  # after writing: a run is never lost
    return path


def report_markdown(results: SuiteResults, figures=FIGURES) -> str:
    """The report's Markdown text (tables computed from ``results``, figures by file name).

    ``figures``: the figure files drawn; a skipped step's section gives its reason instead."""
    info, cpu = results.info, results.info.kind == "cpu"

    def figure(name, alt):
        return f"![{alt}]({name})" if name in figures else f"(No {alt} figure: step not run.)"

    budget = "" if results.budget_s is None else f" under a {results.budget_s:g} s budget"
    sections = [
        f"# Benchmark report: {info.name}",
        f"{datetime.date.today().isoformat()}, PyTorch {results.torch_version}, device "
        f"`{info.device}`, {info.threads} CPU thread(s), "
        f"{'quick (smoke-test sizes)' if results.quick else 'full'} run in "
        f"{results.seconds:.0f} s{budget}. Times are medians of many warmed-up runs, timed with "
        f"{_method(results)}. The same figures as data: `report.json`.",
        "## Device", _table(_device_rows(info), ["property", "value"]),
        "## Matrix multiplication: achieved vs datasheet peak",
        figure("achieved_vs_peak.png", "achieved vs peak"),
        _table(_matmul_rows(results), ["precision", "best TFLOP/s", "at (m, n, k)",
                                       "datasheet peak", "% of peak", "note"]),
        "Every shape measured (median, with the 20th-80th percentile range):",
        _table(_sweep_rows(results), ["precision", "(m, n, k)", "median ms", "p20-p80 ms",
                                      "TFLOP/s", "FLOP/byte"]),
        "## Memory bandwidth", _bandwidth_text(results),
        "## Roofline", figure("roofline.png", "roofline"),
        "A product left of the ridge (where the slanted and flat roofs meet) waits for memory; "
        "right of it, for arithmetic. Element-wise operations sit far left in every precision.",
        "## Alignment", figure("alignment.png", "alignment"),
    ]
    if isinstance(results.alignment, str):
        sections.append(f"Skipped: {results.alignment}.")
    else:
        sections.append(_table(_alignment_rows(results),
                               ["n", f"multiple of {results.alignment[0].multiple}",
                                "TFLOP/s, median round (lowest to highest)", "padded to",
                                "TFLOP/s padded (useful), median round (lowest to highest)"]))
    sections.append("## A transformer block in every precision")
    if isinstance(results.precisions, str):
        sections.append(f"Skipped: {results.precisions}.")
    else:
        sections += [
            f"{results.precisions.model}. TF32 settings found before the run (restored after): "
            f"{results.precisions.tf32_before}.",
            figure("precisions.png", "precisions"),
            _table(_precision_rows(results), ["precision", "forward ms", "fwd+bwd ms",
                                              "peak memory (MiB)", "speed-up fwd / fwd+bwd",
                                              "skipped or note"])]
    sections += ["## The timer checked against Triton's do_bench", _crosscheck_text(results)]
    if cpu:
        sections += ["## What a GPU would show", _gpu_text()]
    return "\n\n".join(sections) + "\n"


def _crosscheck_text(results: SuiteResults) -> str:
    if isinstance(results.crosscheck, str):
        return f"Not measured: {results.crosscheck}."
    rows = [(r.size, "on" if r.cuda_graph else "off", "yes" if r.flush_l2 else "no",
             f"{r.ours_ms:.4g}", f"{r.do_bench_ms:.4g}", f"{r.ratio:.3f}")
            for r in results.crosscheck]
    return ("A BF16 n x n x n product timed by `mpcourse.bench.benchmark` and by "
            "`triton.testing.do_bench` (`do_bench_cudagraph` with graphs), medians; "
            "ratio = ours / do_bench.\n\n" +
            _table(rows, ["n", "CUDA graph", "L2 flushed", "benchmark ms", "do_bench ms",
                          "ratio"]))


def _method(results: SuiteResults) -> str:
    measured = _measured(results)
    if measured:
        return next(iter(measured.values())).best.timing.method
    return "-" if isinstance(results.bandwidth, str) else results.bandwidth.timing.method


def _table(rows, headers) -> str:
    return markdown_table(rows, headers).data


def _fmt(value, digits=3, unknown="unknown") -> str:
    return unknown if value is None else f"{value:.{digits}g}"


def _device_rows(info):
    capability = "none (CPU)" if info.compute_capability is None else \
        ".".join(map(str, info.compute_capability))
    answers = {None: "unknown", True: "yes", False: "no"}
    accelerated = ", ".join(f"{PRECISION_LABELS[p]}: {answers[v]}"
                            for p, v in info.accelerates.items())
    rows = [("name", info.name), ("kind", info.kind), ("compute capability", capability),
            ("hardware support", accelerated),
            ("datasheet bandwidth (GB/s)", _fmt(info.memory_bandwidth_gbs, 4)),
            ("spec source", info.spec_note)]
    if info.memory_gb is not None:
        rows.append(("memory (GB)", f"{info.memory_gb:.1f}"))
    if info.l2_cache_mb is not None:
        rows.append(("L2 cache (MiB)", f"{info.l2_cache_mb:.0f}"))
    return rows


def _matmul_rows(results):
    rows = []
    for precision, result in results.matmul.items():
        label = PRECISION_LABELS[precision]
        if isinstance(result, str):
            rows.append((label, "-", "-", _fmt(results.info.peak(precision), 5), "-",
                         f"skipped: {result}"))
            continue
        best = result.best
        rows.append((label, f"{best.tflops:.3g}", str((best.m, best.n, best.k)),
                     _fmt(result.peak_tflops, 5), _fmt(result.percent_of_peak, 3, "-"),
                     "TF32 off" if precision == "fp32" else ""))
    return rows


def _sweep_rows(results):
    return [(PRECISION_LABELS[r.precision], str((r.m, r.n, r.k)), f"{r.timing.median_ms:.4g}",
             f"{r.timing.p20_ms:.3g}-{r.timing.p80_ms:.3g}", f"{r.tflops:.3g}",
             f"{r.arithmetic_intensity:.3g}")
            for m in _measured(results).values() for r in m.results]


def _bandwidth_text(results):
    b = results.bandwidth
    if isinstance(b, str):
        return f"Skipped: {b}."
    peak = ("no datasheet figure for this device" if b.peak_gbs is None else
            f"{b.percent_of_peak:.0f}% of the datasheet's {b.peak_gbs:.0f} GB/s")
    return (f"Copying {b.bytes / 2**20:.0f} MiB: **{b.gbs:.1f} GB/s** (2 x bytes / median time "
            f"{b.timing.median_ms:.3g} ms); {peak}.")


def _alignment_rows(results):
    return [(r.size, "yes" if r.aligned else "no", f"{r.tflops:.3g} ({r.tflops_range[0]:.3g} to "
             f"{r.tflops_range[1]:.3g})", r.padded_size, f"{r.padded_tflops:.3g} ({r.padded_tflops_range[0]:.3g} "
             f"to {r.padded_tflops_range[1]:.3g})") for r in results.alignment]


def _precision_rows(results):
    rows = []
    for r in results.precisions.rows:
        speedup = "-" if r.forward_speedup is None else \
            f"{r.forward_speedup:.2f}x / {r.step_speedup:.2f}x"
        memory = "-" if r.skipped else _fmt(r.peak_memory_mb, 4, "unknown (CPU)")
        rows.append((f"{PRECISION_LABELS[r.precision]}: {r.description}",
                     _fmt(r.forward_ms, 4, "-"), _fmt(r.step_ms, 4, "-"), memory, speedup,
                     f"skipped: {r.skipped}" if r.skipped else r.note))
    return rows


def _gpu_text() -> str:
    ratios = [max(v for v in s.peak_tflops.values() if v) / s.peak_tflops["fp32"]
              for s in GPU_SPECS]
    rows = [(s.name + (" (approx.)" if s.approximate else ""),
             *(_fmt(s.peak_tflops[p], 5, "-") for p in PRECISIONS),
             f"{s.memory_bandwidth_gbs:.0f}", f"{ratio:.3g}")
            for s, ratio in zip(GPU_SPECS, ratios)]
    table = _table(rows, ["GPU", *(f"{PRECISION_LABELS[p]} TFLOP/s" for p in PRECISIONS),
                          "GB/s", "fastest / FP32"])
    return ("This run used a CPU, whose matrix units (if any) give reduced precision a modest "
            "edge at best. On an NVIDIA GPU the tensor cores change the picture: the dense "
            "datasheet peaks below (mpcourse.bench.GPU_SPECS) put the fastest precision "
            f"{min(ratios):.0f} to {max(ratios):.0f} times above plain FP32, large BF16/FP16 "
            "matmuls commonly reach 70-90% of their peak, "
            "unaligned sizes lose a visible share, and a transformer block gains less than the "
            "matmul ratio because its element-wise work is bound by memory bandwidth. Run "
            "`python -m mpcourse bench` on a GPU to measure it.\n\n" + table)
