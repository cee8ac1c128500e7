"""Timing done right: warm up, synchronise, repeat, and report the distribution, not one number.

Three mistakes spoil most hand-written benchmarks, published tutorials' included:

1. **CUDA is asynchronous.** A CUDA call returns as soon as its kernel is queued; ``time.time()``
   around it measures the launch, not the work. Either synchronise before reading a CPU clock or,
   better, time with *CUDA events*: markers the GPU itself stamps when its stream reaches them,
   so the figure is GPU time between the two stamps, with no CPU clock involved.
2. **The first calls are not typical.** They pay one-off costs: creating the CUDA context and
   the cuBLAS handle, choosing kernels, growing the caching allocator, lazy initialisation.
   Warm up first and never time them.
3. **One number hides the spread.** Other processes, clock boosts and caches make every run a
   little different. Time many runs and report the median with low and high quantiles (here
   the 20th and 80th percentiles; ``triton.testing.do_bench`` returns the *mean* by default,
   and these quantiles only when asked, ``quantiles=[0.5, 0.2, 0.8]``).

Two more effects are choices, not mistakes, and :func:`benchmark` makes them options:

- **Warm caches.** Run after run, the inputs stay in the GPU's L2 cache (50 MB on an H100), and
  a memory-bound kernel looks faster than it will be inside a network, where other layers have
  evicted its data. ``flush_l2=True`` overwrites a buffer larger than L2 before every run,
  outside the timed region.
- **Launch overhead.** Launching a kernel costs the CPU a few microseconds. For small kernels
  that is more than the work, and the GPU waits for the CPU ("launch-bound"). A CUDA graph
  records the whole sequence of kernels once and replays it with a single launch:
  ``cuda_graph=True`` times the replay.

How many runs: like ``triton.testing.do_bench``, :func:`benchmark` times a few calls to estimate
the cost of one, then chooses the counts that fill the time budgets::

    warmup  = min(ceil(warmup_ms / estimate_ms), 10 · max_repeats)
    repeats = clamp(ceil(budget_ms / estimate_ms), min_repeats, max_repeats)

Each timed call is one sample, and the statistics are those of the samples. That is not what
``torch.utils.benchmark.Timer.blocked_autorange`` reports: it times blocks of many calls and
gives the median of the block *means*. On a quiet machine the two agree; on a busy one every
block mean carries its share of the moments the process was preempted, while the median of
single calls ignores them (on a loaded two-core machine the block figure came out twice the
single-call median). For the same statistic, compare with ``Timer.timeit(number=1)`` samples.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

ESTIMATE_CALLS = 5             # calls timed together to estimate the cost of one (triton's choice)
FLUSH_BYTES = 256 * 2**20      # at least this much is overwritten by flush_l2 (triton's choice)
QUANTILES = (0.2, 0.5, 0.8)    # reported as p20_ms, median_ms, p80_ms


@dataclass(frozen=True)
class BenchmarkResult:
    """The timings of one :func:`benchmark` call, in milliseconds per call of ``fn``.

    Every statistic is computed from ``samples_ms`` (quantiles interpolate linearly between the
    sorted samples, NumPy's default), so they always agree with the raw data. ``p20_ms`` and
    ``p80_ms`` are the low and high quantiles (``triton.testing.do_bench`` reports them when
    called with ``quantiles=[0.5, 0.2, 0.8]``; by default it returns the mean).

    Attributes:
        samples_ms: the time of each timed call, in the order they ran.
        warmup: how many untimed calls ran before them (besides the first call and the
            estimate).
        estimate_ms: the cost of one call estimated from a few calls, which set the counts.
        device: where the work ran (``"cpu"``, ``"cuda:0"``).
        method: how it was timed: ``"perf_counter"`` (CPU clock; or the ``timer`` passed),
            ``"cuda events"`` or ``"cuda graph + cuda events"``.
        flush_l2: whether a buffer larger than the L2 cache was overwritten before each call.
    """
    samples_ms: tuple[float, ...]
    warmup: int
    estimate_ms: float
    device: str
    method: str
    flush_l2: bool

    @property
    def repeats(self) -> int:
        """The number of timed calls."""
        return len(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        """The q-quantile of the samples (q = 0.5: the median)."""
        return float(np.quantile(self.samples_ms, q))

    @property
    def median_ms(self) -> float:
        return self.quantile_ms(0.5)

    @property
    def p20_ms(self) -> float:
        """20th percentile: a fifth of the calls were faster."""
        return self.quantile_ms(0.2)

    @property
    def p80_ms(self) -> float:
        """80th percentile: a fifth of the calls were slower."""
        return self.quantile_ms(0.8)

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.samples_ms))

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    def __str__(self) -> str:
        return (f"{self.median_ms:.4g} ms (p20 {self.p20_ms:.4g}, p80 {self.p80_ms:.4g}; "
                f"{self.repeats} runs, {self.method}, {self.device})")


def benchmark(fn: Callable, *args, warmup_ms: float = 25.0, budget_ms: float = 100.0,
              repeats: int | None = None, min_repeats: int = 5, max_repeats: int = 1000,
              flush_l2: bool = False, cuda_graph: bool = False, device=None,
              timer: Callable[[], float] | None = None) -> BenchmarkResult:
    """Time ``fn(*args)``: warm up, repeat to fill a time budget, and return every sample.

    Every keyword of ``benchmark`` is an option of the measurement; ``args`` go to ``fn``. To
    pass keyword arguments to ``fn``, bind them first::

        benchmark(torch.matmul, a, b)                                    # times a @ b
        benchmark(functools.partial(F.softmax, dim=-1), x, budget_ms=50)  # fn's own kwargs

    On a CPU each call is timed with ``time.perf_counter``. On CUDA the device is synchronised
    first, each call is bracketed by two CUDA events, and the stamps are read once at the end.
    The counts follow the module docstring's formulas: the first call is never timed, then
    ``ESTIMATE_CALLS`` calls (one if the first call alone took longer than ``budget_ms``) give
    ``estimate_ms``.

    Args:
        fn, args: the work. It must do the same work every call.
        warmup_ms: time to spend on untimed calls after the estimate.
        budget_ms: time to spend on timed calls; sets ``repeats`` through the estimate.
        repeats: time exactly this many calls instead (the budget is then ignored).
        min_repeats, max_repeats: bounds on the number of timed calls; ``min_repeats`` wins over
            the budget, so a call slower than the budget still gets ``min_repeats`` runs.
        flush_l2: overwrite a buffer of max(256 MiB, 2 x L2) before each timed call, outside the
            timed region (cold-cache timings). On CUDA the flush kernel also gives the CPU a
            head start on queueing fn's kernels, which hides up to its duration of launch
            overhead: time launch-bound work without it (or with ``cuda_graph=True``).
        cuda_graph: CUDA only: capture one call of ``fn`` in a CUDA graph (after warming up on a
            side stream, as PyTorch requires) and time its replays (the counts still come from
            the estimate of eager calls). ``fn`` must be capturable: fixed shapes and addresses,
            no synchronisation (``.item()``, printing a tensor).
        device: where fn's work runs. Default: the device of the first tensor in ``args``; with
            no tensor there, CUDA if available, else the CPU (pass ``device="cpu"`` to time CPU
            work that takes no tensors on a machine with a GPU).
        timer: CPU only: the clock, in seconds (default ``time.perf_counter``), as in
            ``torch.utils.benchmark.Timer``.

    Returns:
        A :class:`BenchmarkResult`: ``median_ms``, ``p20_ms``, ``p80_ms``, ``samples_ms``, ...

    Raises:
        TypeError: fn is not callable.
        ValueError: a budget or count that is not positive; ``cuda_graph`` or ``timer`` where
            they do not apply.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    for name, value in (("warmup_ms", warmup_ms), ("budget_ms", budget_ms)):
        if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number >= 0 (milliseconds), got {value!r}")
    for name, value in (("min_repeats", min_repeats), ("max_repeats", max_repeats),
                        ("repeats", 1 if repeats is None else repeats)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if min_repeats > max_repeats:
        raise ValueError(f"min_repeats ({min_repeats}) is larger than max_repeats ({max_repeats})")
    device = _resolve_device(device, args)
    if device.type == "cuda":
        if timer is not None:
            raise ValueError("CUDA work is timed with CUDA events; timer= applies to CPU work only")
        clock = _CudaClock(device)
    else:
        if cuda_graph:
            raise ValueError(f"cuda_graph=True needs CUDA work, but the device is {device}")
        clock = _CpuClock(timer or time.perf_counter)

    call = lambda: fn(*args)  # noqa: E731
    first_ms = clock.total_ms(call, 1)  # one-off costs: never part of the statistics
    estimate_calls = 1 if first_ms > budget_ms else ESTIMATE_CALLS
    estimate_ms = max(clock.total_ms(call, estimate_calls) / estimate_calls, 1e-6)
    warmup = min(math.ceil(warmup_ms / estimate_ms), 10 * max_repeats)
    if repeats is None:
        repeats = min(max(math.ceil(budget_ms / estimate_ms), min_repeats), max_repeats)

    if cuda_graph:
        call = _capture_graph(fn, args, device)
    for _ in range(warmup):
        call()
    flush = _flush_buffer(device) if flush_l2 else None
    samples = clock.samples_ms(call, repeats, flush)
    method = ("cuda graph + " if cuda_graph else "") + clock.method
    return BenchmarkResult(tuple(samples), warmup, estimate_ms, str(device), method, flush_l2)


class _CpuClock:
    """Wall-clock timing of CPU work."""

    def __init__(self, timer: Callable[[], float]):
        self.timer = timer
        self.method = "perf_counter" if timer is time.perf_counter else getattr(timer, "__name__",
                                                                                 "timer")

    def total_ms(self, call, n: int) -> float:
        start = self.timer()
        for _ in range(n):
            call()
        return (self.timer() - start) * 1e3

    def samples_ms(self, call, n: int, flush) -> list[float]:
        samples = []
        for _ in range(n):
            if flush is not None:
                flush.zero_()
            start = self.timer()
            call()
            samples.append((self.timer() - start) * 1e3)
        return samples


class _CudaClock:
    """GPU-side timing with CUDA events: the GPU stamps each event when its stream reaches it."""
    method = "cuda events"

    def __init__(self, device: torch.device):
        self.device = device

    def total_ms(self, call, n: int) -> float:
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()  # earlier work must not land inside the timed region
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(n):
                call()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)

    def samples_ms(self, call, n: int, flush) -> list[float]:
        with torch.cuda.device(self.device):
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            torch.cuda.synchronize()
            for start, end in zip(starts, ends):
                if flush is not None:
                    flush.zero_()
                start.record()
                call()
                end.record()
            torch.cuda.synchronize()  # once, at the end: no CPU stall between the runs
            return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def _resolve_device(device, args) -> torch.device:
    if device is not None:
        return torch.device(device)
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer larger than the L2 cache: max(FLUSH_BYTES, 2 x L2) bytes."""
    size = FLUSH_BYTES
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        size = max(size, 2 * l2)
    return torch.empty(size // 4, dtype=torch.int32, device=device)


def _capture_graph(fn, args, device: torch.device) -> Callable[[], None]:
    """Capture one call of fn(*args) in a CUDA graph; return the function that replays it."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, on a side stream (PyTorch's rule)
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*args)
    return graph.replay
