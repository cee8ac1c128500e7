"""``report.json``: a benchmark report as data (schema :data:`SCHEMA`), and its consistency check.

Every number of ``report.md`` is in it, with the raw medians the derived figures come from, so
that :func:`check_report` can recompute each derived figure from the file alone: a report edited
by hand, truncated, or written by a buggy version fails with a sentence naming the field. The
book's appendix *GPU reports* (book/gpu_reports.md) documents every field; contributed reports of
other GPUs go to ``mpcourse/data/bench/<device-slug>-<date>/`` (:func:`~mpcourse.bench.report.
default_report_dir`'s folder name).

A skipped step is ``{"skipped": "<reason>"}`` in place of its data.
"""
from __future__ import annotations

import datetime
import math
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from mpcourse.bench.precisions import PrecisionComparison
from mpcourse.bench.probes import MaxMatmulResult
from mpcourse.bench.specs import PRECISIONS, device_slug

SCHEMA = 1  # raise it when a field changes meaning or goes away
REL = 1e-6  # relative tolerance of the recomputed figures (they are stored as full floats)


def report_json(results, figures=()) -> dict:
    """``results`` (a :class:`~mpcourse.bench.SuiteResults`) as JSON-able data; ``figures``: the
    figure files written beside it."""
    info = results.info
    return {
        "schema": SCHEMA,
        "date": datetime.date.today().isoformat(),
        "quick": results.quick,
        "seconds": results.seconds,
        "budget_s": results.budget_s,
        "device": {
            "name": info.name, "slug": device_slug(info.name), "kind": info.kind,
            "device": info.device, "vendor": info.vendor,
            "compute_capability": None if info.compute_capability is None else
            list(info.compute_capability),
            "memory_gb": info.memory_gb, "l2_cache_mb": info.l2_cache_mb,
            "cpu_threads": info.threads, "accelerates": dict(info.accelerates),
            "spec_note": info.spec_note,
        },
        "software": software(results.torch_version),
        "clocks": gpu_clocks() if info.kind == "cuda" else None,
        "datasheet": {"peak_tflops": dict(info.peak_tflops),
                      "memory_bandwidth_gbs": info.memory_bandwidth_gbs},
        "matmul": {p: _matmul(results.matmul[p]) for p in PRECISIONS},
        "bandwidth": _skipped(results.bandwidth) or {
            "bytes": results.bandwidth.bytes, "median_ms": results.bandwidth.timing.median_ms,
            "gbs": results.bandwidth.gbs, "peak_gbs": results.bandwidth.peak_gbs,
            "percent_of_peak": results.bandwidth.percent_of_peak},
        "alignment": _skipped(results.alignment) or {
            "precision": results.alignment[0].result.precision,
            "multiple": results.alignment[0].multiple,
            "rows": [{"size": r.size, "aligned": r.aligned,
                      "median_ms": r.result.timing.median_ms, "tflops": r.tflops,
                      "padded_size": r.padded_size,
                      "padded_median_ms": r.padded_result.timing.median_ms,
                      "padded_tflops": r.padded_tflops} for r in results.alignment]},
        "transformer_block": _block(results.precisions),
        "do_bench": _skipped(results.crosscheck) or {
            "rows": [{"size": r.size, "cuda_graph": r.cuda_graph, "flush_l2": r.flush_l2,
                      "ours_ms": r.ours_ms, "do_bench_ms": r.do_bench_ms, "ratio": r.ratio}
                     for r in results.crosscheck]},
        "figures": list(figures),
    }


def software(torch_version: str) -> dict:
    """Python, torch, CUDA, cuDNN and Triton versions (None where absent)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"python": platform.python_version(), "torch": torch_version,
            "cuda": torch.version.cuda, "cudnn": cudnn, "triton": triton_version}


def gpu_clocks() -> dict | None:
    """The GPU's clocks (MHz), power limit (W) and driver as ``nvidia-smi`` reads them when the
    report is written, or None where nvidia-smi is missing or fails."""
    fields = {"sm_mhz": "clocks.sm", "max_sm_mhz": "clocks.max.sm", "memory_mhz": "clocks.mem",
              "max_memory_mhz": "clocks.max.mem", "power_limit_w": "power.limit",
              "temperature_c": "temperature.gpu", "driver": "driver_version"}
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields.values())}",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    if len(values) != len(fields):
        return None
    return {k: (v if k == "driver" else _number(v)) for k, v in zip(fields, values)}


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]"


def _skipped(value):
    return {"skipped": value} if isinstance(value, str) else None


def _matmul(result) -> dict:
    if not isinstance(result, MaxMatmulResult):
        return {"skipped": str(result)}
    best = result.best
    return {
        "best": {"m": best.m, "n": best.n, "k": best.k, "tflops": best.tflops},
        "peak_tflops": result.peak_tflops, "percent_of_peak": result.percent_of_peak,
        "shapes": [{"m": r.m, "n": r.n, "k": r.k, "median_ms": r.timing.median_ms,
                    "p20_ms": r.timing.p20_ms, "p80_ms": r.timing.p80_ms, "tflops": r.tflops,
                    "arithmetic_intensity": r.arithmetic_intensity, "method": r.timing.method}
                   for r in result.results],
        "skipped_shapes": [{"shape": list(shape), "reason": reason}
                           for shape, reason in result.skipped],
    }


def _block(comparison) -> dict:
    if not isinstance(comparison, PrecisionComparison):
        return {"skipped": str(comparison)}
    return {"model": comparison.model, "tf32_before": comparison.tf32_before,
            "rows": [{"precision": r.precision, "description": r.description,
                      "forward_ms": r.forward_ms, "step_ms": r.step_ms,
                      "peak_memory_mb": r.peak_memory_mb, "forward_speedup": r.forward_speedup,
                      "step_speedup": r.step_speedup, "skipped": r.skipped, "note": r.note}
                     for r in comparison.rows]}


# --- the consistency check ---------------------------------------------------------------------
def check_report(report: dict, where="report.json", folder=None) -> None:
    """Check a report's internal consistency; raise ValueError naming the first field that fails.

    Checked: the schema version; every key the appendix documents; each matmul's TFLOP/s against
    2·m·n·k / median; each best against the fastest shape; each % of peak against achieved / the
    datasheet's peak in the same file; bandwidth against 2·bytes / median; alignment flags and
    TFLOP/s; the block's speed-ups against FP32's time over each time; the do_bench ratios; and,
    given ``folder``, that every figure listed is there.
    """
    def fail(message):
        raise ValueError(f"{where}: {message}")

    def close(field, got, expected):
        if got is None or expected is None or not math.isclose(got, expected, rel_tol=REL):
            fail(f"{field} is {got!r}, but the file's own data give {expected!r}")

    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        fail(f"schema {report.get('schema') if isinstance(report, dict) else None!r}; "
             f"this library reads schema {SCHEMA}")
    missing = [k for k in ("date", "quick", "seconds", "device", "software", "clocks", "datasheet",
                           "matmul", "bandwidth", "alignment", "transformer_block", "do_bench",
                           "figures") if k not in report]
    if missing:
        fail(f"missing {missing}")
    datasheet = report["datasheet"]["peak_tflops"]
    if set(report["matmul"]) != set(PRECISIONS) or set(datasheet) != set(PRECISIONS):
        fail(f"matmul and datasheet.peak_tflops must name exactly {PRECISIONS}")
    if report["device"]["slug"] != device_slug(report["device"]["name"]):
        fail(f"device.slug {report['device']['slug']!r} is not the slug of its name")
    for precision, entry in report["matmul"].items():
        if "skipped" in entry:
            continue
        field = f"matmul.{precision}"
        for i, s in enumerate(entry["shapes"]):
            close(f"{field}.shapes[{i}].tflops", s["tflops"],
                  2 * s["m"] * s["n"] * s["k"] / (s["median_ms"] * 1e-3) / 1e12)
            if not s["p20_ms"] <= s["median_ms"] <= s["p80_ms"]:
                fail(f"{field}.shapes[{i}]: p20 <= median <= p80 does not hold")
        fastest = max(entry["shapes"], key=lambda s: s["tflops"])
        close(f"{field}.best.tflops", entry["best"]["tflops"], fastest["tflops"])
        if [entry["best"][k] for k in "mnk"] != [fastest[k] for k in "mnk"]:
            fail(f"{field}.best is not the fastest shape")
        if entry["peak_tflops"] != datasheet[precision]:
            fail(f"{field}.peak_tflops differs from datasheet.peak_tflops.{precision}")
        if entry["peak_tflops"] is None:
            if entry["percent_of_peak"] is not None:
                fail(f"{field}.percent_of_peak given without a peak")
        else:
            close(f"{field}.percent_of_peak", entry["percent_of_peak"],
                  100 * entry["best"]["tflops"] / entry["peak_tflops"])
    bandwidth = report["bandwidth"]
    if "skipped" not in bandwidth:
        close("bandwidth.gbs", bandwidth["gbs"],
              2 * bandwidth["bytes"] / (bandwidth["median_ms"] * 1e-3) / 1e9)
        if bandwidth["peak_gbs"] != report["datasheet"]["memory_bandwidth_gbs"]:
            fail("bandwidth.peak_gbs differs from datasheet.memory_bandwidth_gbs")
        if bandwidth["peak_gbs"] is not None:
            close("bandwidth.percent_of_peak", bandwidth["percent_of_peak"],
                  100 * bandwidth["gbs"] / bandwidth["peak_gbs"])
    alignment = report["alignment"]
    for i, r in enumerate(alignment.get("rows", [])):
        useful = 2 * r["size"] ** 3 / 1e12
        if r["aligned"] != (r["size"] % alignment["multiple"] == 0):
            fail(f"alignment.rows[{i}].aligned contradicts size {r['size']} and multiple "
                 f"{alignment['multiple']}")
        if r["padded_size"] % alignment["multiple"] or r["padded_size"] < r["size"]:
            fail(f"alignment.rows[{i}].padded_size is not the next multiple")
        close(f"alignment.rows[{i}].tflops", r["tflops"], useful / (r["median_ms"] * 1e-3))
        close(f"alignment.rows[{i}].padded_tflops", r["padded_tflops"],
              useful / (r["padded_median_ms"] * 1e-3))
    rows = report["transformer_block"].get("rows", [])
    base = next((r for r in rows if r["precision"] == "fp32" and not r["skipped"]), None)
    for r in rows:
        if r["skipped"]:
            continue
        for time, speedup in (("forward_ms", "forward_speedup"), ("step_ms", "step_speedup")):
            if base is not None:
                close(f"transformer_block.{r['precision']}.{speedup}", r[speedup],
                      base[time] / r[time])
    for i, r in enumerate(report["do_bench"].get("rows", [])):
        close(f"do_bench.rows[{i}].ratio", r["ratio"], r["ours_ms"] / r["do_bench_ms"])
    if folder is not None:
        absent = [name for name in report["figures"] if not (Path(folder) / name).is_file()]
        if absent:
            fail(f"figures {absent} are listed but not in {folder}")


def oldest_torch(reports) -> str | None:
    """The oldest torch version among ``reports`` (None for none): the version the suite has
    been seen to run on, for the bound in pyproject.toml."""
    versions = [r["software"]["torch"] for r in reports]
    key = lambda v: tuple(int(p) if p.isdigit() else 0 for p in v.split("+")[0].split("."))  # noqa: E731
    return min(versions, key=key) if versions else None
