"""Measure what the hardware delivers: matmul TFLOP/s, memory bandwidth, and the cost of odd shapes.

A matrix product C = A @ B with A (m, k) and B (k, n) does m·n·k multiply-adds, counted as

    FLOPs = 2 · m · n · k            achieved TFLOP/s = FLOPs / time / 10^12

and moves at least (m·k + k·n + m·n) elements through memory (A and B read once, C written
once). Their ratio, FLOPs per byte, is the product's *arithmetic intensity*. For square n × n
products it grows like n, which is why big matmuls can keep tensor cores busy while
element-wise operations (intensity below 1) wait for memory whatever the precision: the
roofline model, attainable TFLOP/s = min(peak TFLOP/s, intensity × bandwidth).

A copy of B bytes reads B and writes B, so the bandwidth it achieves is 2·B / time.
"""
from __future__ import annotations

import functools
import random
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpcourse.bench.specs import (PRECISION_DTYPES, PRECISION_LABELS, as_device, device_info,
                                  precision_name, precision_support)
from mpcourse.bench.timing import BenchmarkResult, benchmark
from mpcourse.fp8.matmul import native_scaled_mm


# --- TF32 ------------------------------------------------------------------------------------
@contextmanager
def tf32_mode(enabled: bool):
    """Inside the block, CUDA FP32 matmuls and cuDNN convolutions may use TF32 (True) or must
    not (False); the previous settings come back on exit, even after an error.

    Uses PyTorch's newer ``fp32_precision`` flags where they exist (2.9+), else the legacy
    ``allow_tf32`` ones: mixing the two APIs makes PyTorch raise when the legacy flags are read.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        conv = torch.backends.cudnn.conv
        saved = matmul.fp32_precision, conv.fp32_precision
        matmul.fp32_precision = conv.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = saved
    else:
        saved = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tf32_state() -> str:
    """The current TF32 settings for CUDA matmuls and cuDNN convolutions, as text."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return (f"cuda.matmul.fp32_precision={matmul.fp32_precision!r}, "
                f"cudnn.conv.fp32_precision={torch.backends.cudnn.conv.fp32_precision!r}")
    return (f"cuda.matmul.allow_tf32={matmul.allow_tf32}, "
            f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")


# --- matrix products -------------------------------------------------------------------------
# The result's element size: FP8 products (F.scaled_mm, as timed here) write a BF16 result.
OUTPUT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}


def matmul_bytes(m: int, n: int, k: int, precision="bf16") -> int:
    """The least memory traffic of an (m, k) @ (k, n) product, in bytes: A and B read once in
    the precision's storage type, C written once::

        bytes = (m·k + k·n) · b_in + m·n · b_out

    with b_in the operands' element size (4 for FP32/TF32, 2 for FP16/BF16, 1 for FP8) and
    b_out the result's (FP8: 2, a BF16 result, as :func:`matmul_tflops` asks of PyTorch's
    ``F.scaled_mm``; otherwise b_in). The roofline of chapter 7 and the benchmark report
    both use this one definition.
    """
    precision = precision_name(precision)
    size = PRECISION_DTYPES[precision].itemsize
    return (m * k + k * n) * size + m * n * OUTPUT_BYTES[precision]


def matmul_intensity(m: int, n: int, k: int, precision="bf16") -> float:
    """Arithmetic intensity of an (m, k) @ (k, n) product: 2·m·n·k FLOPs / :func:`matmul_bytes`."""
    return 2 * m * n * k / matmul_bytes(m, n, k, precision)


@dataclass(frozen=True)
class MatmulResult:
    """One timed (m, k) @ (k, n) product. ``tflops`` uses the median time."""
    m: int
    n: int
    k: int
    precision: str
    device: str
    timing: BenchmarkResult
    peak_tflops: float | None

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s: 2·m·n·k / median time / 10^12."""
        return self.flops / (self.timing.median_ms * 1e-3) / 1e12

    @property
    def percent_of_peak(self) -> float | None:
        """100 · achieved / datasheet peak; None where the peak is unknown."""
        return None if self.peak_tflops is None else 100 * self.tflops / self.peak_tflops

    @property
    def bytes_moved(self) -> int:
        """The least memory traffic: :func:`matmul_bytes` of this product."""
        return matmul_bytes(self.m, self.n, self.k, self.precision)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of memory traffic."""
        return self.flops / self.bytes_moved


def matmul_tflops(m: int, n: int, k: int, precision="bf16", device=None,
                  **options) -> MatmulResult:
    """Time one (m, k) @ (k, n) matrix product and report its achieved TFLOP/s.

    Args:
        m, n, k: the sizes (positive ints).
        precision: ``"fp32"`` (TF32 off: strict FP32), ``"tf32"`` (FP32 tensors, TF32 allowed),
            ``"fp16"``, ``"bf16"``, ``"fp8"`` (E4M3 x E4M3 through PyTorch's FP8 product,
            :func:`~mpcourse.fp8.native_scaled_mm`, with unit scales and a BF16 result; m, n, k
            multiples of 16), or a torch dtype.
        device: default CUDA if available, else the CPU.
        options: passed to :func:`~mpcourse.bench.benchmark` (``budget_ms``, ``flush_l2``, ...);
            ``flush_l2`` defaults to True on CUDA (cold L2, as ``triton.testing.do_bench``).

    Returns:
        A :class:`MatmulResult` (``tflops``, ``percent_of_peak``, ``timing``, ...).

    Raises:
        ValueError: a size that is not a positive int; a precision this device cannot measure
            (:func:`~mpcourse.bench.precision_support` says why); operands too large for the
            free GPU memory.
    """
    precision, device = precision_name(precision), as_device(device)
    for name, size in (("m", m), ("n", n), ("k", k)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    supported, reason = precision_support(precision, device)
    if not supported:
        raise ValueError(f"cannot time an {PRECISION_LABELS[precision]} matmul here: {reason}")
    if precision == "fp8" and any(size % 16 for size in (m, n, k)):
        raise ValueError(f"FP8 matmuls (F.scaled_mm) need m, n, k multiples of 16, "
                         f"got {m}, {n}, {k}; pad them (pad_to_multiple)")
    _check_fits(m, n, k, precision, device)
    fn, a, b = _operands(m, n, k, precision, device)
    options.setdefault("flush_l2", device.type == "cuda")
    with tf32_mode(precision == "tf32"):
        timing = benchmark(fn, a, b, device=device, **options)
    return MatmulResult(m, n, k, precision, str(device), timing,
                        device_info(device).peak(precision))


def _operands(m, n, k, precision, device):
    """The product to time and its operands: random normal values in the precision's dtype."""
    generator = torch.Generator(device=device).manual_seed(0)
    if precision != "fp8":
        dtype = PRECISION_DTYPES[precision]
        a = torch.randn(m, k, dtype=dtype, device=device, generator=generator)
        b = torch.randn(k, n, dtype=dtype, device=device, generator=generator)
        return torch.matmul, a, b
    e4m3 = torch.float8_e4m3fn  # values of a standard normal fit E4M3's range as they are
    a = torch.randn(m, k, device=device, generator=generator).to(e4m3)
    b = torch.randn(n, k, device=device, generator=generator).to(e4m3).t()  # column-major
    one = torch.ones((), device=device)
    return functools.partial(native_scaled_mm, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), a, b


def _check_fits(m, n, k, precision, device) -> None:
    if device.type != "cuda":
        return
    size = PRECISION_DTYPES[precision].itemsize
    needed = (m * k + k * n + m * n) * max(size, 2) + 2**28  # operands, result, flush buffer
    free, _ = torch.cuda.mem_get_info(device)
    if needed > 0.8 * free:
        raise ValueError(f"a {m}x{k} @ {k}x{n} {PRECISION_LABELS[precision]} matmul needs about "
                         f"{needed / 1e9:.1f} GB; {free / 1e9:.1f} GB of GPU memory is free")


@dataclass(frozen=True)
class MaxMatmulResult:
    """The fastest of several matmul shapes: ``best``, and every measurement in ``results``."""
    precision: str
    device: str
    results: tuple[MatmulResult, ...]
    skipped: tuple[tuple[tuple[int, int, int], str], ...]  # ((m, n, k), reason) not measured
    peak_tflops: float | None

    @property
    def best(self) -> MatmulResult:
        return max(self.results, key=lambda r: r.tflops)

    @property
    def tflops(self) -> float:
        return self.best.tflops

    @property
    def percent_of_peak(self) -> float | None:
        return self.best.percent_of_peak


DEFAULT_MATMUL_SIZES = {"cuda": (1024, 2048, 4096, 8192), "cpu": (128, 256, 512)}


def max_matmul_tflops(precision="bf16", device=None, sizes=None, **options) -> MaxMatmulResult:
    """The highest TFLOP/s a matrix product reaches, over a sweep of shapes.

    Small products cannot fill the GPU (too few tiles for its multiprocessors) and pay a fixed
    launch cost, so achieved TFLOP/s rise with the size and level off near, not at, the
    datasheet peak: 70 to 90 % is typical for BF16 on recent GPUs.

    Args:
        precision: as for :func:`matmul_tflops`.
        device: default CUDA if available, else the CPU.
        sizes: ints n (square n x n x n products) or (m, n, k) triples. Default
            ``DEFAULT_MATMUL_SIZES`` for the device type.
        options: passed to :func:`~mpcourse.bench.benchmark`.

    Returns:
        A :class:`MaxMatmulResult`: ``best`` (a :class:`MatmulResult`), ``tflops``,
        ``percent_of_peak`` (None where the peak is unknown), every result, and the shapes
        skipped (too large for the free memory) with the reason.

    Raises:
        ValueError: the precision cannot be measured on this device, or no shape could be.
    """
    precision, device = precision_name(precision), as_device(device)
    supported, reason = precision_support(precision, device)
    if not supported:
        raise ValueError(f"cannot time an {PRECISION_LABELS[precision]} matmul here: {reason}")
    sizes = DEFAULT_MATMUL_SIZES["cuda" if device.type == "cuda" else "cpu"] if sizes is None \
        else sizes
    results, skipped = [], []
    for size in sizes:
        shape = (size,) * 3 if isinstance(size, int) else tuple(size)
        try:
            results.append(matmul_tflops(*shape, precision=precision, device=device, **options))
        except ValueError as error:
            if "GPU memory is free" not in str(error):
                raise
            skipped.append((shape, str(error)))
    if not results:
        raise ValueError(f"no shape could be measured: {skipped}")
    return MaxMatmulResult(precision, str(device), tuple(results), tuple(skipped),
                           results[0].peak_tflops)


# --- memory bandwidth ------------------------------------------------------------------------
@dataclass(frozen=True)
class BandwidthResult:
    """One timed copy of ``bytes`` bytes; ``gbs`` uses the median time."""
    bytes: int
    device: str
    timing: BenchmarkResult
    peak_gbs: float | None

    @property
    def gbs(self) -> float:
        """Achieved GB/s: 2 · bytes (read + write) / median time / 10^9."""
        return 2 * self.bytes / (self.timing.median_ms * 1e-3) / 1e9

    @property
    def percent_of_peak(self) -> float | None:
        return None if self.peak_gbs is None else 100 * self.gbs / self.peak_gbs


def memory_bandwidth(device=None, size_mb: float | None = None, **options) -> BandwidthResult:
    """Copy a buffer of ``size_mb`` MiB into another and report the achieved GB/s.

    The buffer must be much larger than the caches, or the copy measures the cache instead of
    the memory. Default size: 256 MiB on a GPU (five times an H100's 50 MB L2), 128 MiB on a
    CPU. A copy typically reaches 80 to 90 % of a GPU's datasheet bandwidth. ``options`` go to
    :func:`~mpcourse.bench.benchmark`.
    """
    device = as_device(device)
    if size_mb is None:
        size_mb = 256 if device.type == "cuda" else 128
    if not isinstance(size_mb, (int, float)) or not size_mb > 0:
        raise ValueError(f"size_mb must be a positive number of MiB, got {size_mb!r}")
    count = max(int(size_mb * 2**20) // 4, 1)
    source = torch.ones(count, device=device)
    target = torch.empty_like(source)
    timing = benchmark(target.copy_, source, device=device, **options)
    return BandwidthResult(count * 4, str(device), timing,
                           device_info(device).memory_bandwidth_gbs)


# --- alignment -------------------------------------------------------------------------------
def alignment_multiple(precision) -> int:
    """The size multiple tensor cores like best: 16 bytes' worth of elements, 16 / itemsize.

    TF32: 4 (also returned for FP32, whose strict products run on CUDA cores with no tile rule),
    FP16/BF16: 8, FP8: 16 (NVIDIA's matrix-multiplication performance guide; on
    A100, multiples of 64 FP16 elements, 128 bytes, are better still).
    """
    return 16 // PRECISION_DTYPES[precision_name(precision)].itemsize


def pad_to_multiple(x, multiple: int, dims=(-2, -1)):
    """Round a size up to a multiple, or zero-pad a tensor's ``dims`` up to multiples.

    ``pad_to_multiple(4095, 8) == 4096``. For a tensor, zeros are appended at the end of each
    dimension in ``dims`` (default the last two: a matrix); the original is the leading block,
    ``padded[..., :rows, :cols]``. Zero padding leaves a matrix product's original block exact:
    padding K adds products 0 · 0, padding M or N adds rows or columns to slice off. A tensor
    already aligned is returned as it is, not copied.
    """
    if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple!r}")
    if isinstance(x, int) and not isinstance(x, bool):
        if x < 0:
            raise ValueError(f"a size cannot be negative, got {x}")
        return -(-x // multiple) * multiple
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pad_to_multiple takes an int size or a torch tensor, "
                        f"not {type(x).__name__}")
    if isinstance(dims, int):
        dims = (dims,)
    try:
        dims = sorted({range(x.dim())[d] for d in dims})
    except (IndexError, TypeError):
        raise ValueError(f"dims {dims!r} do not fit a tensor of shape {tuple(x.shape)}") from None
    padding = [0] * (2 * (x.dim() - dims[0]))  # F.pad lists (before, after) from the last dim
    for d in dims:
        padding[2 * (x.dim() - 1 - d) + 1] = pad_to_multiple(x.shape[d], multiple) - x.shape[d]
    return x if not any(padding) else F.pad(x, padding)


@dataclass(frozen=True)
class AlignmentRow:
    """One square size n: its own matmul, and the same product padded to ``padded_size``.

    Each product is timed once per round (:func:`alignment_effect`): ``results`` and
    ``padded_results`` hold the rounds, and ``result`` / ``padded_result`` the round with the
    median throughput (the upper one of two middle rounds). ``padded_tflops`` counts only the
    useful work, 2·n³, over the padded product's time: the speed the caller sees when padding is
    the fix. ``tflops_range`` and ``padded_tflops_range`` give the lowest and highest round.
    """
    size: int
    multiple: int
    result: MatmulResult
    padded_size: int
    padded_result: MatmulResult
    results: tuple = ()
    padded_results: tuple = ()

    @property
    def aligned(self) -> bool:
        return self.size % self.multiple == 0

    @property
    def tflops(self) -> float:
        return self.result.tflops

    @property
    def padded_tflops(self) -> float:
        return self.useful_tflops(self.padded_result)

    def useful_tflops(self, padded: MatmulResult) -> float:
        """2·n³ over the time of one timing of the padded product."""
        return self.result.flops / (padded.timing.median_ms * 1e-3) / 1e12

    @property
    def tflops_range(self) -> tuple[float, float]:
        rounds = [r.tflops for r in self.results or (self.result,)]
        return min(rounds), max(rounds)

    @property
    def padded_tflops_range(self) -> tuple[float, float]:
        rounds = [self.useful_tflops(r) for r in self.padded_results or (self.padded_result,)]
        return min(rounds), max(rounds)


def _median_round(results: list) -> MatmulResult:
    """The round whose throughput is the median (the upper middle one for an even count)."""
    return sorted(results, key=lambda r: r.tflops)[len(results) // 2]


DEFAULT_ALIGNMENT_SIZES = {"cuda": (4088, 4092, 4095, 4096, 4097, 4100, 4104),
                           "cpu": (252, 255, 256, 257, 260, 264)}


def alignment_effect(sizes=None, precision=None, device=None, multiple: int | None = None,
                     rounds: int = 5, seed: int = 0, **options) -> list[AlignmentRow]:
    """Matmul speed at sizes that are and are not multiples of ``multiple``, and after padding.

    For each n of ``sizes``: the n x n x n product, and the product padded to the next multiple
    (:func:`pad_to_multiple`). On GPUs a size off the multiple can cost a large share of the
    speed (cuBLAS falls back to slower kernels); padding wins it back for a few percent more
    work. On CPUs the effect is usually small.

    Every distinct size (the sizes and their padded sizes) is timed once per round, ``rounds``
    times, in a new random order each round (from ``seed``): a machine that drifts (clocks,
    other processes, a warming cache) then spreads over all sizes instead of favouring the ones
    timed first, and the rounds give each size a spread. A size and its padded product share
    their rounds, so the two can be compared round by round (a paired design).

    Args:
        sizes: square sizes; default ``DEFAULT_ALIGNMENT_SIZES`` for the device type.
        precision: default BF16 where the device accelerates it, else FP16 on a GPU and FP32
            on a CPU.
        device: default CUDA if available, else the CPU.
        multiple: default :func:`alignment_multiple` of the precision.
        rounds: how many times each size is timed (a positive int).
        seed: seeds the order of the sizes in each round.
        options: passed to :func:`~mpcourse.bench.benchmark`.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    device = as_device(device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    if precision is None:
        precision = "bf16" if device_info(device).accelerates["bf16"] else \
            ("fp16" if kind == "cuda" else "fp32")
    precision = precision_name(precision)
    multiple = alignment_multiple(precision) if multiple is None else multiple
    sizes = list(DEFAULT_ALIGNMENT_SIZES[kind] if sizes is None else sizes)
    padded = {n: pad_to_multiple(n, multiple) for n in sizes}
    timed = sorted(set(sizes) | set(padded.values()))
    order = random.Random(seed)
    times = {n: [] for n in timed}
    for _ in range(rounds):
        for n in order.sample(timed, len(timed)):  # this round's order
            times[n].append(matmul_tflops(n, n, n, precision, device, **options))
    return [AlignmentRow(n, multiple, _median_round(times[n]), padded[n], _median_round(times[padded[n]]),
                         tuple(times[n]), tuple(times[padded[n]])) for n in sizes]
