"""The FP8 matrix product: multiply the stored values, accumulate wide, then undo the scales.

For ``a`` (M, K) and ``b`` (K, N) quantized with scales ``s_a`` and ``s_b`` (which multiplied the
originals), the product of what they stand for is::

    (a @ b)[m, n] = sum_k (a_data[m, k] / s_a[m, k]) * (b_data[k, n] / s_b[k, n])

Tensor cores never divide inside the sum. They multiply the FP8 values (each product of two
FP8 numbers is exact in FP32), add the products up over a stretch of K in which both scales are
constant, and only then divide that partial sum by ``s_a * s_b``::

    (a @ b)[m, n] = sum over stretches c of  (sum_{k in c} a_data[m, k] * b_data[k, n])
                                              / (s_a[m, c] * s_b[c, n])

Per tensor, or one scale per row of a and per column of b, there is a single stretch (all of K)
and the result is ``(a_data @ b_data) / (s_a * s_b)``. With blocks along K (DeepSeek-V3's 1×128
and 128×128, MX's 32, NVFP4's 16) a stretch is a block.

**The accumulator.** The sum inside a stretch is only as good as the register it runs in.
DeepSeek-V3 (section 3.3.2) reports that FP8 products on the H800's tensor cores keep only
about 14 bits of the sum, a maximum relative error of nearly 2 % in their test with K = 4096, and
fixes it by *promoting*: every 128 elements of K (4 WGMMA instructions) the partial sum is moved
to an FP32 register on the CUDA cores. ``accumulate=accumulator_format(13)`` emulates such a
narrow accumulator (the running sum rounded to 13 mantissa bits after every addition) and
``promote_every=128`` the fix.

**Backends.** PyTorch's FP8 product is, in torch 2.13, the public
``torch.nn.functional.scaled_mm``: float8 data, ``b`` column-major, *decoding* scales ``1 / scale``
(float32), and the kind of each scale (``F.ScalingType.TensorWise``, ``RowWise``, and the block
kinds ``BlockWise1x16``, ``BlockWise1x32``, ``BlockWise1x128``, ``BlockWise128x128`` on the GPUs
that have kernels for them). Older code calls the private ``torch._scaled_mm`` (per tensor or
row-wise), which :func:`native_scaled_mm` falls back to in a torch without the public one. On CUDA
it needs compute capability 8.9 or newer (Ada, Hopper, Blackwell) and M, K, N multiples of 16, and
its sum is not an IEEE FP32 sum: Hopper's FP8 tensor cores add the products in a narrower register
(DeepSeek-V3's 14 bits, above) before cuBLAS moves the sum to FP32, with or without
``use_fast_accum``. On a CPU, in torch 2.13, it is itself an emulation: it converts to float32,
multiplies by the scales and calls an FP32 matmul, or, on CPUs with AMX, goes through oneDNN, which
is slow (over a second for one 256³ product on the machine this was written on); torch 2.11's public
``scaled_mm`` has no CPU kernel at all (:func:`native_fp8_support` asks the installed torch). So
``backend="auto"`` uses it on FP8 GPUs only, and the exact emulation here everywhere else (and
where PyTorch's product refuses); the emulation also does blocks, FP6/FP4 elements and narrow
accumulators.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

from mpcourse.formats import FloatFormat, from_float8, get_format, round_to
from mpcourse.fp8.quantization import QuantizedTensor

BACKENDS = ("auto", "torch", "emulate")
_NATIVE_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def accumulator_format(mantissa_bits: int) -> FloatFormat:
    """A narrow accumulator: FP32's exponent range with ``mantissa_bits`` bits of mantissa.

    ``accumulator_format(13)`` keeps 14 significant bits (13 stored plus the implicit 1), a model
    of the ~14 bits DeepSeek-V3 measured on H800 FP8 tensor cores. A model, not the circuit:
    here the sum is rounded to nearest after each addition, where the hardware aligns the
    addends and, in Khattak and Mikaitis' H100 model, truncates them (disputed for older GPUs).
    """
    return FloatFormat(f"acc_m{mantissa_bits}", exponent_bits=8, mantissa_bits=mantissa_bits)


def native_scaled_mm(a_data: torch.Tensor, b_data: torch.Tensor, scale_a: torch.Tensor,
                     scale_b: torch.Tensor, out_dtype: torch.dtype = torch.float32,
                     use_fast_accum: bool = False) -> torch.Tensor:
    """PyTorch's FP8 product ``(a_data * scale_a) @ (b_data * scale_b)``, accumulated in FP32.

    ``a_data`` (M, K) row-major and ``b_data`` (K, N) column-major, both float8; the *decoding*
    scales are one-element tensors (per tensor) or (M, 1) and (1, N) (one per row of a and column
    of b), float32. ``use_fast_accum=True`` lets Hopper's tensor cores keep the narrow running sum
    (see the module docstring). Calls the public ``torch.nn.functional.scaled_mm`` (torch 2.13)
    with the matching ``ScalingType``, or, in an older torch without it, ``torch._scaled_mm``.
    Autocast is off inside: the product is FP8 x FP8 -> ``out_dtype``, whatever region encloses it.
    """
    per_tensor = scale_a.numel() == 1 and scale_b.numel() == 1
    # No autocast rule covers these ops, yet on a CPU they run ordinary matmuls inside, which an
    # enclosing autocast region would cast to 16 bits.
    with torch.autocast(a_data.device.type, enabled=False):
        functional = torch.nn.functional
        if hasattr(functional, "scaled_mm"):
            kind = functional.ScalingType.TensorWise if per_tensor else functional.ScalingType.RowWise
            if per_tensor:
                scale_a, scale_b = scale_a.reshape(()), scale_b.reshape(())
            return functional.scaled_mm(a_data, b_data, scale_a, kind, scale_b, kind,
                                        output_dtype=out_dtype, use_fast_accum=use_fast_accum)
        out = torch._scaled_mm(a_data, b_data, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                               use_fast_accum=use_fast_accum)
    return out[0] if isinstance(out, tuple) else out  # torch < 2.4 also returned an amax


def native_fp8_support(device) -> tuple[bool, str]:
    """Whether PyTorch's FP8 product can run on ``device``, and a sentence saying why (not)."""
    device = torch.device(device)
    if device.type == "cpu":
        problem = _cpu_kernel_problem()
        if problem:
            return False, problem
        return True, "on CPU, PyTorch's FP8 product runs (as an FP32 emulation inside PyTorch)"
    if device.type != "cuda":
        return False, f"this library uses PyTorch's FP8 product on CPU and CUDA only, not {device.type}"
    name = torch.cuda.get_device_name(device)
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        return False, (f"{name} (compute capability {capability[0]}.{capability[1]}) has no FP8 "
                       "tensor cores; they start at 8.9 (Ada, Hopper, Blackwell)")
    return True, f"{name} (compute capability {capability[0]}.{capability[1]}) has FP8 tensor cores"


@functools.lru_cache(maxsize=None)
def _cpu_kernel_problem() -> str | None:
    """Why this torch cannot run its FP8 product on a CPU, or None if a 16x16 product runs."""
    data, one = torch.zeros(16, 16, dtype=torch.float8_e4m3fn), torch.ones(())
    try:
        native_scaled_mm(data, data.t(), one, one)
    except (RuntimeError, NotImplementedError) as error:
        first_line = str(error).splitlines()[0].split(". ")[0] if str(error) else type(error).__name__
        return f"torch {torch.__version__}'s scaled_mm has no CPU kernel ({first_line[:160]})"
    return None


def scaled_matmul(a: QuantizedTensor, b: QuantizedTensor, *, out_dtype: torch.dtype = torch.float32,
                  accumulate="fp32", promote_every: int | None = None,
                  backend: str = "auto") -> torch.Tensor:
    """The product ``a @ b`` of two quantized matrices, a (M, K) and b (K, N).

    Args:
        a, b: :class:`~mpcourse.fp8.QuantizedTensor` matrices of any granularity. The scales are
            applied per stretch of K over which both are constant (see the module docstring):
            to multiply by a weight W of shape (N, K) quantized along K, pass ``w_q.t()``.
        out_dtype: the result's dtype (the sum itself is FP32, or float64 for ``"fp64"``).
        accumulate: what the partial sums run in. ``"fp32"``: float32 (torch's matmul; the
            order of the additions is the BLAS library's). ``"fp64"``: float64, the exact
            reference: products of FP8 values are exact and, unless the exponents spread over
            more than 53 bits, so are their sums. A :class:`~mpcourse.formats.FloatFormat`
            (e.g. :func:`accumulator_format`): the running sum is rounded to it after every
            addition, k = 0, 1, 2, ... in order (slow: one pass per k).
        promote_every: move the partial sum into an FP32 accumulator (after applying the scales)
            every this many elements of K, as DeepSeek-V3 does every 128. None: only where the
            scales change. (Partial sums are promoted every gcd(a's group, b's group,
            promote_every) elements along K: for powers of two, the smallest of the three.)
        backend: ``"emulate"``: the exact emulation, any device. ``"torch"``: PyTorch's FP8
            product, :func:`native_scaled_mm` (CPU or GPU), ValueError where it cannot compute
            this product (non-float8 data, blocks, an emulated accumulator, an old GPU). ``"auto"``:
            PyTorch's product on a GPU with FP8 tensor cores where it can compute the product, else the emulation (on
            CPU always; a one-time warning on a GPU without FP8 tensor cores, or where PyTorch's
            product raises).

    Returns:
        A tensor of shape (M, N) and dtype ``out_dtype`` on a's device.
    """
    _check_operands(a, b)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    accumulate = _accumulator(accumulate)
    if promote_every is not None and (not isinstance(promote_every, int) or promote_every < 1):
        raise ValueError(f"promote_every is a positive int (e.g. 128) or None, got {promote_every!r}")

    problem = _native_problem(a, b, out_dtype, accumulate, promote_every)
    if backend == "torch" and problem:
        raise ValueError(f"backend='torch' cannot compute this product: {problem}; "
                         "backend='emulate' can")
    device = a.data.device
    if backend == "torch":
        return _torch_scaled_mm(a, b, out_dtype)
    if backend == "auto" and not problem and device.type == "cuda":
        try:
            return _torch_scaled_mm(a, b, out_dtype)
        except RuntimeError as error:  # e.g. a cuBLAS without this kernel: emulate instead
            warnings.warn(f"{error}; scaled_matmul emulates FP8 instead, exactly but slowly", stacklevel=2)
    if backend == "auto" and device.type == "cuda":
        supported, reason = native_fp8_support(device)
        if not supported:  # Python shows a warning once per calling line; other reasons to
            warnings.warn(  # emulate (blocks, narrow accumulators) are the caller's own choice
                f"{reason}: scaled_matmul emulates FP8 there, exactly but slowly", stacklevel=2)
    return _emulate(a, b, accumulate, promote_every).to(out_dtype)


def _check_operands(a, b) -> None:
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, QuantizedTensor):
            raise TypeError(f"{name} must be a QuantizedTensor (from mpcourse.fp8.quantize), "
                            f"not {type(q).__name__}")
        if q.data.dim() != 2:
            raise ValueError(f"{name} must be a matrix, got shape {tuple(q.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    if a.data.device != b.data.device:
        raise ValueError(f"a is on {a.data.device}, b on {b.data.device}")


def _accumulator(accumulate):
    if accumulate in ("fp32", "fp64"):
        return accumulate
    if isinstance(accumulate, (str, FloatFormat)):
        return get_format(accumulate)
    raise TypeError(f"accumulate is 'fp32', 'fp64' or a FloatFormat, not {accumulate!r}")


def _constant_along_k(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """True where a has one scale per row (or tensor) and b one per column: no blocks along K."""
    K = a.shape[1]
    return a.group_shape[1] == K and b.group_shape[0] == K


def _native_problem(a, b, out_dtype, accumulate, promote_every) -> str | None:
    """Why PyTorch's FP8 product cannot compute this product here, or None if it can."""
    if a.data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or \
            b.data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return f"it takes E4M3/E5M2 data, not {a.fmt.name} x {b.fmt.name}"
    if accumulate != "fp32" or promote_every is not None:
        return "it accumulates in FP32 its own way; accumulate= and promote_every= are emulated"
    if out_dtype not in _NATIVE_OUT_DTYPES:
        return f"it returns float32, bfloat16 or float16, not {out_dtype}"
    if not _constant_along_k(a, b):
        return (f"it takes scales per tensor or per row of a and column of b, not "
                f"{a.granularity} groups {a.group_shape} x {b.granularity} groups {b.group_shape}")
    supported, reason = native_fp8_support(a.data.device)
    if not supported:
        return reason
    if a.data.device.type == "cuda":
        if a.granularity != "tensor" or b.granularity != "tensor":
            return ("on CUDA its row-wise kernels depend on the GPU and cuBLAS version; "
                    "this library uses only its per-tensor one there")
        if any(n % 16 for n in (*a.shape, b.shape[1])):
            return f"on CUDA it needs M, K, N multiples of 16, got {tuple(a.shape)} x {tuple(b.shape)}"
        if a.fmt == b.fmt and a.data.dtype == torch.float8_e5m2:
            return "cuBLAS multiplies E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3, not E5M2 x E5M2"
    return None


def _torch_scaled_mm(a: QuantizedTensor, b: QuantizedTensor, out_dtype) -> torch.Tensor:
    """PyTorch's FP8 product with its layout: a row-major, b column-major, scales as 1 / scale."""
    a_data = a.data.contiguous()
    b_data = b.data.t().contiguous().t()
    if a.granularity == "tensor" and b.granularity == "tensor":
        scale_a, scale_b = 1.0 / a.scale, 1.0 / b.scale
    else:  # row-wise: one scale per row of a, (M, 1), and per column of b, (1, N)
        scale_a = 1.0 / a.scale_per_element().expand(a.shape)[:, :1].contiguous()
        scale_b = 1.0 / b.scale_per_element().expand(b.shape)[:1, :].contiguous()
    try:
        return native_scaled_mm(a_data, b_data, scale_a.float(), scale_b.float(), out_dtype)
    except RuntimeError as error:
        raise RuntimeError(f"PyTorch's scaled_mm refused this product on {a.data.device} ({error}); "
                           "backend='emulate' computes it on any device") from error


def _emulate(a: QuantizedTensor, b: QuantizedTensor, accumulate, promote_every) -> torch.Tensor:
    """The product stretch by stretch: partial sums in ``accumulate``, then scaled and added up."""
    (M, K), N = a.shape, b.shape[1]
    # A stretch of K over which both scales are constant and no promotion falls due (for the
    # usual powers of two: the smallest of a's group, b's group and promote_every along K).
    stretch = math.gcd(a.group_shape[1], b.group_shape[0], promote_every or K)
    count = K // stretch
    wide = torch.float64 if accumulate == "fp64" else torch.float32
    exact = torch.float64 if isinstance(accumulate, FloatFormat) else wide
    a_stretches = from_float8(a.data, exact).reshape(M, count, stretch).transpose(0, 1)  # (count, M, s)
    b_stretches = from_float8(b.data, exact).reshape(count, stretch, N)                  # (count, s, N)
    # Autocast would run bmm in FP16/BF16 and round the sums: the accumulator is ours to choose.
    with torch.autocast(a.data.device.type, enabled=False):
        partials = _partial_sums(a_stretches, b_stretches, accumulate).to(wide)  # (count, M, N)

    # Each stretch's scales: a's (M, count), b's (count, N); then promote, in order, into `out`.
    a_scale = a.scale_per_element().expand(M, K)[:, ::stretch].to(wide)
    b_scale = b.scale_per_element().expand(K, N)[::stretch, :].to(wide)
    divisors = a_scale.t()[:, :, None] * b_scale[:, None, :]  # (count, M, N)
    out = torch.zeros(M, N, dtype=wide, device=a.data.device)
    for partial, divisor in zip(partials, divisors):  # in order: the order is part of the result
        out.addcdiv_(partial, divisor)  # out + partial / divisor, each rounded, in one pass
    return out


def _partial_sums(a: torch.Tensor, b: torch.Tensor, accumulate) -> torch.Tensor:
    """Batched a @ b in the accumulator: a plain matmul, or one rounded addition per k."""
    if not isinstance(accumulate, FloatFormat):
        return torch.bmm(a, b)
    total = torch.zeros(a.shape[0], a.shape[1], b.shape[2], dtype=torch.float64, device=a.device)
    for k in range(a.shape[2]):  # products and the sum are exact in float64; round the sum
        total = round_to(total + a[:, :, k:k + 1] * b[:, k:k + 1, :], accumulate).double()
    return total
