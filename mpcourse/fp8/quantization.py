"""Scaled quantization: a tensor becomes low-precision values plus the scales that place them.

An 8-bit float has a narrow window of magnitudes (E4M3: 2**-9 to 448), so a tensor is first
multiplied by a scale that moves its values into that window, then rounded. The convention here
is Transformer Engine's and torchao's: **the scale multiplies x before rounding**::

    data         = round_to(x * scale, fmt, saturate=True)    # what is stored
    dequantize() = data / scale                               # what it stands for

and, unless told otherwise, each scale maps the largest magnitude of its group onto the format's
largest value, ``scale = fmt.max_value / amax``, so the group uses the whole range and nothing
overflows. Values pushed beyond ``fmt.max_value`` (possible with a scale from the past, see
:mod:`mpcourse.fp8.scaling`) saturate to it instead of becoming NaN or infinity.

*Granularity* says which elements share one scale (a *group*); ``group_shape`` records it:

============  ====================================  =============================  ===========
granularity   one scale per                         ``scale.shape`` for (M, K)     group_shape
============  ====================================  =============================  ===========
``tensor``    the whole tensor                      ``()``                         (M, K)
``channel``   index along ``axis`` (0: each row)    (M, 1) for axis 0              (1, K)
``block``     1×128 run along ``axis`` (DeepSeek)   (M, K // 128)                  (1, 128)
``block``     128×128 tile (DeepSeek-V3 weights)    (M // 128, K // 128)           (128, 128)
``mx``        32 elements along ``axis``, 2**k      (M, K // 32)                   (1, 32)
``nvfp4``     16 elements along ``axis``            (M, K // 16)                   (1, 16)
``nvfp4``     16×16 tile (NVFP4 training weights)   (M // 16, K // 16)             (16, 16)
============  ====================================  =============================  ===========

Finer groups cost more scales but protect small values from one large neighbour: a group's
scale is set by its own maximum only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from mpcourse.formats import (E2M1, E4M3, E5M2, FP32, FloatFormat, exact_pow2, from_float8, get_format,
                              round_to)
from mpcourse.fp8.microscaling import (E8M0_BIAS, MX_ELEMENT_FORMATS, mx_shared_exponent,
                                       nvfp4_scales)

GRANULARITIES = ("tensor", "channel", "block", "mx", "nvfp4")
TORCH_DTYPES = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
DEFAULT_BLOCK_SIZES = {"mx": 32, "nvfp4": 16}


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor stored as low-precision values and one float32 scale per group.

    Attributes:
        data: the rounded values ``round_to(x * scale, fmt, saturate=True)``, same shape as x:
            a ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` tensor for E4M3 / E5M2 (the dtypes
            torch has), else float32 holding values exactly representable in ``fmt``.
        scale: float32, one per group, the factor x was *multiplied* by: shape ``()`` per
            tensor, otherwise x's shape with each dimension divided by ``group_shape``.
        fmt: the element format (a :class:`~mpcourse.formats.FloatFormat`).
        granularity: ``"tensor"``, ``"channel"``, ``"block"``, ``"mx"`` or ``"nvfp4"``.
        group_shape: the shape of one group of elements sharing a scale.
        amax: float32, the largest magnitude of each group of x (same shape as ``scale``): what
            delayed scaling records.
        scale_e8m0: MX only: the scales as the hardware stores them, E8M0 codes (``torch.uint8``,
            ``code = E + 127`` for the decoding scale ``2**E = 1 / scale``;
            ``.view(torch.float8_e8m0fnu)`` gives torch's dtype).
        scale_e4m3: NVFP4 only: the decoding block scales, ``torch.float8_e4m3fn``.
        tensor_scale: NVFP4 only: the decoding FP32 tensor scale (shape ``()``), so that
            ``x ≈ data × scale_e4m3 × tensor_scale`` and ``scale = 1 / (scale_e4m3 × tensor_scale)``
            rounded to float32.
    """

    data: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    granularity: str
    group_shape: tuple[int, ...]
    amax: torch.Tensor
    scale_e8m0: torch.Tensor | None = None
    scale_e4m3: torch.Tensor | None = None
    tensor_scale: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def scale_per_element(self) -> torch.Tensor:
        """Each element's scale, as a tensor that broadcasts against ``data``."""
        return _broadcast_scale(self.scale, self.shape, self.group_shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the quantized tensor stands for: ``data / scale``, computed in float32."""
        return (from_float8(self.data) / self.scale_per_element()).to(dtype)

    def t(self) -> QuantizedTensor:
        """The transpose of a 2-D quantized tensor (data, scales and groups all transposed).

        A weight of shape (out, in) quantized along ``in`` becomes the (in, out) operand of
        ``x @ W.T`` with its groups still running along the summed dimension.
        """
        if self.data.dim() != 2:
            raise ValueError(f"t() transposes 2-D tensors; this one has shape {tuple(self.shape)}")

        def flip(t):
            return t if t is None or t.dim() < 2 else t.t()

        return replace(self, data=self.data.t(), scale=flip(self.scale), amax=flip(self.amax),
                       group_shape=self.group_shape[::-1], scale_e8m0=flip(self.scale_e8m0),
                       scale_e4m3=flip(self.scale_e4m3))

    def __repr__(self) -> str:
        return (f"QuantizedTensor({self.fmt.name}, granularity={self.granularity!r}, "
                f"shape={tuple(self.shape)}, group_shape={self.group_shape}, "
                f"scale.shape={tuple(self.scale.shape)}, device={self.data.device})")


def amax_to_scale(amax, fmt, margin: int = 0) -> torch.Tensor:
    """The scale that maps ``amax`` onto the format's largest value, ``margin`` binades below::

        scale = (fmt.max_value / amax) / 2**margin

    computed in float32. An amax of 0 (an all-zero group) gives 1.0, and an amax so small that
    the scale would overflow float32 gives float32's largest value: the scale is always finite.
    """
    fmt = get_format(fmt)
    if not isinstance(margin, int) or isinstance(margin, bool):
        raise TypeError(f"margin is a whole number of binades (an int), not {margin!r}")
    amax = torch.as_tensor(amax, dtype=torch.float32)
    if not bool(((amax >= 0) & torch.isfinite(amax)).all()):
        raise ValueError("amax must be finite and non-negative")
    # (a Python number over a tensor would be computed as number * (1 / amax): two roundings)
    scale = (torch.full_like(amax, fmt.max_value) / amax) / 2.0**margin
    return torch.where(amax > 0, scale.clamp(max=FP32.max_value), 1.0)


def quantize(x: torch.Tensor, fmt=None, *, granularity: str = "tensor", axis: int = -1,
             block_size=None, scale=None, scale_rounding: str | None = None,
             rounding: str = "nearest_even", generator=None) -> QuantizedTensor:
    """Quantize ``x`` to ``fmt`` with one scale per group: ``data = round_to(x * scale, fmt)``.

    Args:
        x: a floating-point tensor (any device; float64 is first rounded to float32, the
            precision the scaling is done in). Not differentiable: :class:`~mpcourse.fp8.Fp8Linear`
            supplies the gradients of a quantized layer.
        fmt: a :class:`~mpcourse.formats.FloatFormat` or a name (``"e4m3"``, ``"e5m2"``,
            ``"e2m1"``, ...). Default E4M3; E2M1 for ``"nvfp4"``.
        granularity: which elements share a scale (see the module docstring):
            ``"tensor"``: one scale, ``fmt.max_value / amax(x)``.
            ``"channel"``: one scale per index along ``axis``; the amax is taken over all other
            dimensions. For a weight W of shape (out, in), ``axis=0`` gives one scale per output
            channel (row); for activations (tokens, features), ``axis=0`` gives one per token.
            ``"block"``: ``block_size`` an int: runs of that many elements along ``axis``
            (1×128 for DeepSeek-V3 activations); a pair: 2-D tiles over the last two
            dimensions ((128, 128) for DeepSeek-V3 weights). ``"nvfp4"`` takes a pair too
            ((16, 16) tiles for weights, so that the transpose quantizes identically).
            ``"mx"``: OCP Microscaling v1.0: 32 elements along ``axis`` share a power-of-two
            scale stored as E8M0; elements E4M3/E5M2 (MXFP8), E3M2/E2M3 (MXFP6), E2M1 (MXFP4).
            ``"nvfp4"``: E2M1 elements, 16 along ``axis`` share an E4M3 scale, times one FP32
            scale for the tensor. See :mod:`mpcourse.fp8.microscaling` for both rules.
        axis: for ``"channel"`` the dimension that keeps one scale per index; for ``"block"``
            (int block_size), ``"mx"`` and ``"nvfp4"`` the dimension the blocks run along.
            Use the dimension a matrix product sums over (K).
        block_size: for ``"block"`` (required), ``"mx"`` (default 32), ``"nvfp4"`` (default 16).
            Every blocked dimension must be a multiple of it: x is never padded (pad it
            yourself with zeros, which change no amax), a size that does not divide is a
            ValueError.
        scale: ``"tensor"`` only: use this scale (a positive float or one-element tensor, e.g.
            from :class:`~mpcourse.fp8.DelayedScaling`) instead of ``fmt.max_value / amax``.
            Values it pushes beyond ``fmt.max_value`` saturate.
        scale_rounding: ``"mx"``: ``"floor"`` (the default, the OCP spec) or ``"rceil"``
            (round the scale up: never saturates; torchao's RCEIL, not its CEIL), see :func:`~mpcourse.fp8.microscaling.mx_shared_exponent`.
            ``"block"``: ``"power_of_two"`` rounds each scale ``fmt.max_value / amax`` down to a
            power of two (DeepSeek-V3's option: scaling is then exact; nothing saturates).
        rounding, generator: how the scaled values are rounded, as in
            :func:`~mpcourse.formats.round_to` (``"nearest_even"``, ``"toward_zero"``,
            ``"stochastic"``).

    Returns:
        A :class:`QuantizedTensor`. An all-zero group gets the scale 1.0 (MX: E8M0 code 127;
        NVFP4: block scale 1.0): finite, and it stores zeros exactly.

    Raises:
        TypeError: x is not a floating-point tensor (integer, bool, complex, NumPy).
        ValueError: x is empty or holds NaN or infinity (no finite amax to scale by: fix the
            value upstream); an unknown ``fmt``/``granularity``; a block size that does not
            divide x; a keyword that does not apply to the granularity.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; "
                         f"choose one of {', '.join(GRANULARITIES)}")
    x = _checked_input(x)
    fmt = _element_format(fmt, granularity)
    _check_keywords(granularity, block_size, scale, scale_rounding)
    group_shape = _group_shape(x.shape, granularity, axis, block_size)
    amax = _group_amax(x, group_shape)

    extra = {}
    if granularity == "mx":
        shared = mx_shared_exponent(amax, fmt, scale_rounding or "floor")
        scale = exact_pow2(-shared).float()
        extra["scale_e8m0"] = (shared + E8M0_BIAS).to(torch.uint8)
    elif granularity == "nvfp4":
        block_scale, tensor_scale = nvfp4_scales(amax, amax.amax())
        scale = 1.0 / (block_scale * tensor_scale)
        extra.update(scale_e4m3=block_scale.to(torch.float8_e4m3fn), tensor_scale=tensor_scale)
    elif scale is None:
        scale = amax_to_scale(amax, fmt)
        if scale_rounding == "power_of_two":  # round down: 2**floor(log2(scale)), never saturates
            scale = exact_pow2(torch.frexp(scale).exponent - 1).float()
    else:
        scale = _checked_scale(scale, x.device)
    if granularity == "tensor":
        scale, amax = scale.reshape(()), amax.reshape(())

    # each group times its own scale, without copying the scale out to every element
    group_scale = scale.reshape([n for c in _group_counts(x.shape, group_shape) for n in (c, 1)])
    scaled = (_grouped(x, group_shape) * group_scale).reshape(x.shape)
    # round_to takes torch's own cast itself where it is proven identical (and rounds float64 once)
    data = round_to(scaled, fmt, rounding=rounding, saturate=True, generator=generator)
    if fmt in TORCH_DTYPES:
        data = data.to(TORCH_DTYPES[fmt])  # exact: data holds E4M3/E5M2 values already
    return QuantizedTensor(data, scale, fmt, granularity, group_shape, amax, **extra)


# --- groups ----------------------------------------------------------------------------------
def _group_counts(shape, group_shape) -> tuple[int, ...]:
    return tuple(n // g for n, g in zip(shape, group_shape))


def _group_amax(x: torch.Tensor, group_shape) -> torch.Tensor:
    """The largest magnitude in each group: shape (n0 // g0, n1 // g1, ...)."""
    if x.dim() == 0:
        return x.abs()
    return _grouped(x.abs(), group_shape).amax(dim=tuple(range(1, 2 * x.dim(), 2)))


def _grouped(x: torch.Tensor, group_shape) -> torch.Tensor:
    """x as (n0 // g0, g0, n1 // g1, g1, ...): (count, size) per dimension, a group's elements
    on the odd dimensions."""
    counts = _group_counts(x.shape, group_shape)
    return x.reshape([n for pair in zip(counts, group_shape) for n in pair])


def _broadcast_scale(scale: torch.Tensor, shape, group_shape) -> torch.Tensor:
    """Repeat each group's scale over its group, leaving size-1 dimensions to broadcasting."""
    s = scale.reshape(_group_counts(shape, group_shape))
    for dim, size in enumerate(group_shape):
        if size > 1 and s.shape[dim] > 1:
            s = s.repeat_interleave(size, dim)
    return s


def _group_shape(shape, granularity: str, axis: int, block_size) -> tuple[int, ...]:
    ndim = len(shape)
    if granularity == "tensor":
        return tuple(shape)
    if isinstance(block_size, (tuple, list)):  # 2-D tiles over the last two dimensions
        if ndim < 2:
            raise ValueError(f"2-D tiles need a tensor of 2 or more dimensions, "
                             f"got shape {tuple(shape)}")
        if axis != -1:
            raise ValueError("2-D tiles cover the last two dimensions; axis does not apply to them")
        group = (1,) * (ndim - 2) + tuple(block_size)
    else:
        if not isinstance(axis, int) or isinstance(axis, bool) or not -ndim <= axis < ndim:
            raise ValueError(f"axis must be an int in [{-ndim}, {ndim}) for a tensor of shape "
                             f"{tuple(shape)}, got {axis!r}")
        axis %= ndim
        if granularity == "channel":
            group = tuple(1 if d == axis else n for d, n in enumerate(shape))
        else:
            size = block_size or DEFAULT_BLOCK_SIZES[granularity]
            group = tuple(size if d == axis else 1 for d in range(ndim))
    for d, (n, g) in enumerate(zip(shape, group)):
        if n % g:
            raise ValueError(f"dimension {d} of x has size {n}, not a multiple of the block "
                             f"size {g}; pad x with zeros (they change no amax) or choose a "
                             "block size that divides it")
    return group


# --- checks ----------------------------------------------------------------------------------
def _checked_input(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize takes a torch tensor, not {type(x).__name__}; "
                        "for NumPy, pass torch.from_numpy(array)")
    if not x.is_floating_point():
        raise TypeError(f"quantize takes a floating-point tensor, got dtype {x.dtype}; "
                        "convert it first, e.g. x.float()")
    if x.numel() == 0:
        raise ValueError("x is empty: there is no amax to scale by")
    x = x.detach().float()
    if not bool(x.abs().amax().isfinite()):  # amax propagates NaN (and costs a fifth of isfinite)
        raise ValueError("x contains NaN or infinity: a scale needs a finite amax (infinity would "
                         "give scale 0, NaN would spread to its whole group); find where it came from")
    return x


def _element_format(fmt, granularity: str) -> FloatFormat:
    if fmt is None:
        return E2M1 if granularity == "nvfp4" else E4M3
    fmt = get_format(fmt)
    if not (fmt.signed and fmt.has_zero):
        raise ValueError(f"{fmt.name} has no sign or no zero: it is a scale format, not one for data")
    if granularity == "mx" and fmt not in MX_ELEMENT_FORMATS:
        raise ValueError(f"MX element formats are {', '.join(f.name for f in MX_ELEMENT_FORMATS)}, "
                         f"not {fmt.name}")
    if granularity == "nvfp4" and fmt != E2M1:
        raise ValueError(f"NVFP4 elements are E2M1, not {fmt.name}")
    return fmt


def _check_keywords(granularity: str, block_size, scale, scale_rounding) -> None:
    if granularity == "block" and block_size is None:
        raise ValueError("granularity='block' needs block_size: an int (e.g. 128, runs along axis) "
                         "or a pair (e.g. (128, 128), 2-D tiles)")
    if block_size is not None:
        if granularity in ("tensor", "channel"):
            raise ValueError(f"block_size applies to 'block', 'mx' and 'nvfp4', not {granularity!r}")
        sizes = block_size if isinstance(block_size, (tuple, list)) else (block_size,)
        tiled = granularity in ("block", "nvfp4")
        allowed = (1, 2) if tiled else (1,)
        if len(sizes) not in allowed or not all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in sizes):
            raise ValueError(f"block_size for {granularity!r} is a positive int"
                             + (" or a pair of them" if tiled else "")
                             + f", not {block_size!r}")
    if scale is not None and granularity != "tensor":
        raise ValueError("scale= sets the one scale of granularity='tensor'; "
                         f"{granularity!r} computes a scale per group")
    if scale_rounding is not None and granularity not in ("mx", "block"):
        raise ValueError("scale_rounding applies to granularity='mx' and 'block' only")
    if granularity == "block" and scale_rounding not in (None, "power_of_two"):
        raise ValueError(f"scale_rounding for 'block' is 'power_of_two' or None, "
                         f"not {scale_rounding!r}")


def _checked_scale(scale, device) -> torch.Tensor:
    scale = torch.as_tensor(scale, dtype=torch.float32).to(device)
    if scale.numel() != 1:
        raise ValueError(f"scale= is one number for the whole tensor, got shape {tuple(scale.shape)}")
    if not bool((scale > 0) & (scale < math.inf)):  # positive and finite (NaN fails both)
        raise ValueError(f"scale must be positive and finite, got {float(scale)}")
    return scale.reshape(())
