"""The whole benchmark suite on one device: what ``python -m mpcourse bench`` runs.

Steps, each skipped with a stated reason where the device cannot run it meaningfully:

1. :func:`~mpcourse.bench.device_info`: the device and its datasheet peaks.
2. :func:`~mpcourse.bench.max_matmul_tflops` for every precision: achieved against peak.
3. :func:`~mpcourse.bench.memory_bandwidth`: a large copy.
4. :func:`~mpcourse.bench.alignment_effect`: sizes on and off the tensor-core multiple.
5. :func:`~mpcourse.bench.compare_precisions`: a transformer block in every precision.
6. :func:`~mpcourse.bench.crosscheck.compare_with_do_bench`: :func:`~mpcourse.bench.benchmark`
   against Triton's ``do_bench`` (CUDA with Triton only).

``budget_s`` bounds the whole suite: a step that would start after the budget is spent is
skipped with that reason (a GPU's time is not predictable from a CPU's, and GPU time is scarce).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from mpcourse.bench.crosscheck import CrosscheckRow, compare_with_do_bench, crosscheck_support
from mpcourse.bench.precisions import PrecisionComparison, compare_precisions
from mpcourse.bench.probes import (AlignmentRow, BandwidthResult, MaxMatmulResult,
                                   alignment_effect, max_matmul_tflops, memory_bandwidth)
from mpcourse.bench.specs import (PRECISION_LABELS, PRECISIONS, DeviceInfo, as_device,
                                  device_info, precision_support)

# Sizes and budgets per (device type, quick). The CPU versions finish in well under a minute
# on two cores; "quick" is a smoke test (seconds), not a measurement to quote.
CONFIGS = {
    ("cuda", False): dict(sizes=(1024, 2048, 4096, 8192), budget_ms=100.0, copy_mb=None,
                          alignment=None, block={}, block_budget_ms=200.0),
    ("cuda", True): dict(sizes=(1024, 4096), budget_ms=40.0, copy_mb=None,
                         alignment=(4095, 4096, 4097), block={}, block_budget_ms=80.0),
    ("cpu", False): dict(sizes=(128, 256, 512), budget_ms=100.0, copy_mb=128,
                         alignment=None, block={}, block_budget_ms=200.0),
    ("cpu", True): dict(sizes=(64, 128, 256), budget_ms=15.0, copy_mb=32,
                        alignment=(127, 128, 129), block=dict(dim=64, heads=4, batch=4, seq_len=32),
                        block_budget_ms=30.0),
}


@dataclass(frozen=True)
class SuiteResults:
    """Everything :func:`run_suite` measured. A step that could not run holds its reason (str).

    Attributes:
        info: the device (:class:`~mpcourse.bench.DeviceInfo`).
        matmul: per precision, a :class:`~mpcourse.bench.MaxMatmulResult` or a skip reason.
        bandwidth: a :class:`~mpcourse.bench.BandwidthResult`, or a skip reason.
        alignment: :class:`~mpcourse.bench.AlignmentRow` list, or a skip reason.
        precisions: a :class:`~mpcourse.bench.PrecisionComparison`, or a skip reason.
        quick: whether the smoke-test sizes were used.
        seconds: the suite's wall time.
        torch_version: ``torch.__version__``.
        crosscheck: :class:`~mpcourse.bench.crosscheck.CrosscheckRow` list, or a skip reason.
        budget_s: the time budget the suite ran under (None: unbounded).
    """
    info: DeviceInfo
    matmul: dict[str, MaxMatmulResult | str]
    bandwidth: BandwidthResult | str
    alignment: list[AlignmentRow] | str
    precisions: PrecisionComparison | str
    quick: bool
    seconds: float
    torch_version: str
    crosscheck: list[CrosscheckRow] | str = "not run"
    budget_s: float | None = None


def run_suite(device=None, *, quick: bool = False, threads: int | None = None,
              progress: bool = True, budget_s: float | None = None) -> SuiteResults:
    """Run every benchmark of the suite on ``device`` (default CUDA if available, else the CPU).

    Args:
        quick: smaller sizes and budgets (a smoke test).
        threads: torch's CPU threads during the run (restored after). Default: 1 on a CPU, so
            the figures are per core and stay stable on a shared machine (several threads
            waiting for each other on a busy machine can be many times slower than one);
            unchanged on a GPU. Recorded in ``info.threads``.
        progress: a tqdm bar over the steps.
        budget_s: the whole suite's time budget in seconds; steps that would start after it
            is spent are skipped with that reason (None: no limit).
    """
    start = time.perf_counter()
    device = as_device(device)
    if threads is None and device.type == "cpu":
        threads = 1
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not budget_s > 0):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    saved_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        return _run(device, bool(quick), progress, start, budget_s)
    finally:
        torch.set_num_threads(saved_threads)


def _run(device, quick, progress, start, budget_s) -> SuiteResults:
    info = device_info(device)
    config = CONFIGS[("cuda" if device.type == "cuda" else "cpu", quick)]
    options = dict(budget_ms=config["budget_ms"], warmup_ms=config["budget_ms"] / 4)

    def matmul_step(precision):
        supported, reason = precision_support(precision, device)
        return max_matmul_tflops(precision, device, config["sizes"], **options) if supported \
            else reason

    steps = [(f"matmul {PRECISION_LABELS[p]}", functools.partial(matmul_step, p))
             for p in PRECISIONS]
    steps += [
        ("memory bandwidth", lambda: memory_bandwidth(device, config["copy_mb"], **options)),
        ("alignment", lambda: alignment_effect(config["alignment"], device=device, **options)),
        ("transformer block", lambda: compare_precisions(
            device, budget_ms=config["block_budget_ms"], **config["block"])),
        ("do_bench crosscheck", lambda: compare_with_do_bench(device, budget_ms=config["budget_ms"])
         if crosscheck_support(device)[0] else crosscheck_support(device)[1]),
    ]
    done = {}
    with tqdm(total=len(steps), desc="benchmarks", disable=not progress) as bar:
        for label, step in steps:
            bar.set_postfix_str(label)
            spent = time.perf_counter() - start
            if budget_s is not None and spent >= budget_s:
                done[label] = f"the {budget_s:g} s budget was spent after {spent:.1f} s"
            else:
                done[label] = step()
            bar.update()
    matmul = {p: done[f"matmul {PRECISION_LABELS[p]}"] for p in PRECISIONS}
    return SuiteResults(info, matmul, done["memory bandwidth"], done["alignment"],
                        done["transformer block"], quick, time.perf_counter() - start,
                        torch.__version__, done["do_bench crosscheck"], budget_s)
