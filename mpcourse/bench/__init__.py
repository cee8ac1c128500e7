"""Benchmarking mixed precision: time code correctly, know the hardware, measure what it delivers.

The chain, one module per step:

- :mod:`~mpcourse.bench.timing`: :func:`benchmark` (CUDA events or ``perf_counter``, warm-up,
  repeat counts from a time budget, optional L2 flush and CUDA graph) → :class:`BenchmarkResult`
  (``median_ms``, ``p20_ms``, ``p80_ms``, ``samples_ms``).
- :mod:`~mpcourse.bench.specs`: :data:`GPU_SPECS` (dense datasheet peaks per precision and
  memory bandwidth for T4, V100, A10, A10G, A100, L4, H100, H200), :func:`lookup_spec`,
  :func:`device_info`, :func:`precision_support`.
- :mod:`~mpcourse.bench.probes`: :func:`matmul_tflops` (2·m·n·k / time),
  :func:`max_matmul_tflops`, :func:`memory_bandwidth` (2 · bytes / time of a copy),
  :func:`pad_to_multiple`, :func:`alignment_multiple`, :func:`alignment_effect`,
  :func:`tf32_mode`.
- :mod:`~mpcourse.bench.precisions`: :func:`compare_precisions`, a transformer block in FP32
  (TF32 off), TF32, FP16 and BF16 autocast, and FP8.
- :mod:`~mpcourse.bench.crosscheck`: :func:`compare_with_do_bench`, the timer against Triton's.
- :mod:`~mpcourse.bench.suite`, :mod:`~mpcourse.bench.report` and
  :mod:`~mpcourse.bench.report_json`: :func:`run_suite`, :func:`write_report` (report.md, figures,
  report.json) and :func:`check_report`, behind ``python -m mpcourse bench [--out DIR] [--quick]
  [--budget-s S]``.

Example::

    import torch
    from mpcourse.bench import benchmark, device_info, matmul_tflops
    print(device_info().name, device_info().peak("bf16"))   # None for a CPU or an unknown GPU
    x = torch.randn(1024, 1024)
    print(benchmark(torch.matmul, x, x))                    # median, p20, p80, runs, method
    print(matmul_tflops(1024, 1024, 1024, "fp32").tflops)
"""
from mpcourse.bench.crosscheck import CrosscheckRow, compare_with_do_bench
from mpcourse.bench.precisions import PrecisionComparison, PrecisionRow, compare_precisions
from mpcourse.bench.probes import (AlignmentRow, BandwidthResult, MatmulResult, MaxMatmulResult,
                                   alignment_effect, alignment_multiple, matmul_tflops,
                                   max_matmul_tflops, memory_bandwidth, pad_to_multiple,
                                   tf32_mode, tf32_state)
from mpcourse.bench.report import (plot_achieved_vs_peak, plot_alignment, plot_precisions,
                                   plot_roofline, write_report)
from mpcourse.bench.report_json import check_report, report_json
from mpcourse.bench.specs import (GPU_SPECS, PRECISIONS, DeviceInfo, GpuSpec, device_info,
                                  device_slug, lookup_spec, precision_name, precision_support)
from mpcourse.bench.suite import SuiteResults, run_suite
from mpcourse.bench.timing import BenchmarkResult, benchmark

__all__ = [
    "AlignmentRow", "BandwidthResult", "BenchmarkResult", "CrosscheckRow", "DeviceInfo",
    "GPU_SPECS", "GpuSpec", "MatmulResult", "MaxMatmulResult", "PRECISIONS",
    "PrecisionComparison", "PrecisionRow", "SuiteResults", "alignment_effect",
    "alignment_multiple", "benchmark", "check_report", "compare_precisions",
    "compare_with_do_bench", "device_info", "device_slug", "lookup_spec", "matmul_tflops",
    "max_matmul_tflops", "memory_bandwidth", "pad_to_multiple", "plot_achieved_vs_peak",
    "plot_alignment", "plot_precisions", "plot_roofline", "precision_name", "precision_support",
    "report_json", "run_suite", "tf32_mode", "tf32_state", "write_report",
]
