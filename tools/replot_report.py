"""Redraw a committed benchmark report's achieved-vs-peak, roofline and transformer-block figures
from its report.json.

    python tools/replot_report.py mpcourse/data/bench/<device>-<date>

A report's figures are drawn when it is recorded on a GPU. When the library's plotting changes
after that (a figure title, say), this redraws ``achieved_vs_peak.png``, ``roofline.png`` and
``precisions.png`` with the current ``mpcourse.bench.report`` functions from the numbers in
``report.json``, on a CPU: the data are the recorded ones, only the drawing is new. report.md and
report.json are left as they are. The alignment figure needs fields report.json does not keep
(the alignment rounds), so it stays as recorded.
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from matplotlib.figure import Figure

from mpcourse.bench.probes import MaxMatmulResult
from mpcourse.bench.report import plot_achieved_vs_peak, plot_precisions, plot_roofline


def suite_from_json(report: dict) -> SimpleNamespace:
    """The fields of a SuiteResults that plot_achieved_vs_peak, plot_roofline and plot_precisions read,
    from report.json."""
    matmul = {precision: MaxMatmulResult(
        precision=precision, device=report["device"]["device"],
        results=tuple(SimpleNamespace(arithmetic_intensity=s["arithmetic_intensity"], tflops=s["tflops"])
                      for s in m["shapes"]),
        skipped=(), peak_tflops=m["peak_tflops"]) for precision, m in report["matmul"].items()}
    rows = [SimpleNamespace(precision=r["precision"], forward_ms=r["forward_ms"], step_ms=r["step_ms"],
                            skipped=r["skipped"], step_speedup=r["step_speedup"])
            for r in report["transformer_block"]["rows"]]
    return SimpleNamespace(info=SimpleNamespace(name=report["device"]["name"],
                                                memory_bandwidth_gbs=report["datasheet"]["memory_bandwidth_gbs"]),
                           bandwidth=SimpleNamespace(gbs=report["bandwidth"]["gbs"]), matmul=matmul,
                           precisions=SimpleNamespace(rows=rows))


def replot(folder: Path) -> list[Path]:
    report = json.loads((folder / "report.json").read_text())
    suite = suite_from_json(report)
    written = []
    for name, plot, data in (("achieved_vs_peak.png", plot_achieved_vs_peak, suite), ("roofline.png", plot_roofline, suite),
                             ("precisions.png", plot_precisions, suite.precisions)):
        if name not in report["figures"]:
            continue
        figure = Figure(figsize=(6.4, 4.2), layout="constrained")  # as write_report draws them
        plot(data, figure.add_subplot())
        figure.savefig(folder / name, dpi=120)
        written.append(folder / name)
    return written


if __name__ == "__main__":
    for path in replot(Path(sys.argv[1])):
        print(path)
