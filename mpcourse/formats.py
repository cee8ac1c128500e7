"""Binary floating-point formats, exactly: describe them, round to them, and look at their bits.

A floating-point format spends a fixed number of bits on a sign ``s``, an exponent field ``e`` and
a mantissa field ``m`` (``M`` bits). A *normal* number is::

    (-1)**s * 2**(e - bias) * (1 + m / 2**M)

and where the exponent field is zero, a *subnormal* number fills the gap down to zero evenly::

    (-1)**s * 2**(1 - bias) * (m / 2**M)

Everything else about a format (its largest value, its smallest, its spacing, what happens on
overflow) follows from a handful of choices, which is all a :class:`FloatFormat` records. Every
algorithm in this module reads those fields; none of them asks a format its name.

Rounding works on the bit patterns of the input (float32, or float64 so that nothing is rounded
twice), with vectorised integer operations in torch: :func:`_round_magnitudes`, the algorithm the
book teaches. Two faster paths give the same numbers where they apply, and :func:`round_to` takes
them only after checking, once per device, that they do on every boundary case
(:func:`_fast_path_agrees`): torch's own cast, for rounding to nearest into a format torch has a
dtype for (FP32, BF16, FP16, E4M3, E5M2; the places where the cast differs on purpose or between
torch versions, E4M3 overflow (±448 in torch 2.13, NaN in torch 2.11, on CPU and CUDA alike) and
float64 rounded twice through float32, are handled around it), and
``round(|x| / gap) * gap`` in float arithmetic for the other signed formats with subnormals (TF32,
FP6, FP4), and for stochastic rounding into any signed format with subnormals (``floor(|x| / gap)``
plus one step with probability equal to the fractional part: the same numbers as the bit-level
algorithm, from the same random draws). NumPy input goes through the same code.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from dataclasses import dataclass

import numpy as np
import torch

ROUNDING_MODES = ("nearest_even", "toward_zero", "stochastic")
NAN_ENCODINGS = ("ieee", "all_ones", "none")


@dataclass(frozen=True)
class FloatFormat:
    """An immutable description of a binary floating-point format.

    Args:
        name: short name, as used by :func:`get_format` (``"fp16"``, ``"e4m3"``, ...).
        exponent_bits, mantissa_bits: widths of the two fields (the sign bit is extra).
        has_infinity: whether the all-ones exponent field with a zero mantissa means infinity.
        nan: how NaN is encoded. ``"ieee"``: all-ones exponent with a non-zero mantissa (IEEE 754).
            ``"all_ones"``: only the code with every exponent and mantissa bit set is NaN, so the
            all-ones exponent field holds ordinary numbers too (OCP E4M3, E8M0). ``"none"``: no
            NaN at all (OCP FP6, FP4), every code is a number.
        signed: False for a format with no sign bit (E8M0).
        has_subnormals: False where the all-zero exponent field is an ordinary normal exponent;
            such a format has no zero (E8M0: its smallest code means 2**-127).
        bias: exponent bias; defaults to the IEEE choice ``2**(exponent_bits - 1) - 1``.
        aliases: other names :func:`get_format` accepts for this format.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    has_infinity: bool = True
    nan: str = "ieee"
    signed: bool = True
    has_subnormals: bool = True
    bias: int | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        if self.nan not in NAN_ENCODINGS:
            raise ValueError(f"nan must be one of {NAN_ENCODINGS}, got {self.nan!r}")
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exponent_bits - 1) - 1)
        # round_to returns float32, so every value of the format must be a float32 value.
        if self.max_value > float(torch.finfo(torch.float32).max) or self.min_subnormal < 2.0**-149:
            raise ValueError(f"{self.name}: this module handles formats that fit inside float32")
        if self.mantissa_bits > 23:
            raise ValueError(f"{self.name}: at most 23 mantissa bits (float32's)")

    # --- the layout ---------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width in bits, sign included."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @property
    def has_zero(self) -> bool:
        """Without subnormals the all-zero code is 2**emin, not zero."""
        return self.has_subnormals

    # --- the range ----------------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return (1 if self.has_subnormals else 0) - self.bias

    @property
    def _top_exponent_field(self) -> int:
        """The largest exponent field that still holds finite numbers."""
        all_ones = 2**self.exponent_bits - 1
        if self.nan == "ieee" or self.has_infinity:
            return all_ones - 1  # IEEE reserves the whole all-ones field for inf and NaN
        if self.nan == "all_ones" and self.mantissa_bits == 0:
            return all_ones - 1  # with no mantissa, the NaN code takes the whole field
        return all_ones

    @property
    def _top_mantissa(self) -> int:
        """The largest mantissa field at the top exponent (one less where NaN sits there)."""
        full = 2**self.mantissa_bits - 1
        if self.nan == "all_ones" and self.mantissa_bits > 0 and not self.has_infinity:
            return full - 1
        return full

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        return self._top_exponent_field - self.bias

    @property
    def max_value(self) -> float:
        """The largest finite value."""
        return math.ldexp(1 + self._top_mantissa / 2**self.mantissa_bits, self.emax)

    @property
    def min_normal(self) -> float:
        """The smallest positive normal value, 2**emin."""
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value: 2**(emin - M), or min_normal without subnormals."""
        if not self.has_subnormals:
            return self.min_normal
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def epsilon(self) -> float:
        """The gap between 1 and the next larger value, 2**-M (machine epsilon)."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits the mantissa carries: (M + 1) * log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    def values(self) -> np.ndarray:
        """Every finite representable value, sorted ascending (zero once), as float32."""
        if self.bits > 16:
            raise ValueError(
                f"{self.name} has 2**{self.bits} codes; values() lists formats of 16 bits or fewer"
            )
        all_values = decode(np.arange(2**self.bits, dtype=np.uint32), self)
        return np.unique(all_values[np.isfinite(all_values)])

    def __str__(self) -> str:
        return self.name


# --- the formats of this course --------------------------------------------------------------
FP32 = FloatFormat("fp32", 8, 23, aliases=("float32", "single"))
TF32 = FloatFormat("tf32", 8, 10, aliases=("tensorfloat32",))
FP16 = FloatFormat("fp16", 5, 10, aliases=("float16", "half"))
BF16 = FloatFormat("bf16", 8, 7, aliases=("bfloat16",))
E4M3 = FloatFormat("e4m3", 4, 3, has_infinity=False, nan="all_ones",
                   aliases=("fp8_e4m3", "e4m3fn", "float8_e4m3fn"))
E5M2 = FloatFormat("e5m2", 5, 2, aliases=("fp8_e5m2", "float8_e5m2"))
E3M2 = FloatFormat("e3m2", 3, 2, has_infinity=False, nan="none",
                   aliases=("fp6_e3m2", "float6_e3m2fn"))
E2M3 = FloatFormat("e2m3", 2, 3, has_infinity=False, nan="none",
                   aliases=("fp6_e2m3", "float6_e2m3fn"))
E2M1 = FloatFormat("e2m1", 2, 1, has_infinity=False, nan="none",
                   aliases=("fp4", "fp4_e2m1", "float4_e2m1fn"))
E8M0 = FloatFormat("e8m0", 8, 0, has_infinity=False, nan="all_ones", signed=False,
                   has_subnormals=False, aliases=("e8m0fnu", "float8_e8m0fnu"))

FORMATS = (FP32, TF32, FP16, BF16, E4M3, E5M2, E3M2, E2M3, E2M1, E8M0)
_BY_NAME = {alias: f for f in FORMATS for alias in (f.name, *f.aliases)}


def get_format(name: str | FloatFormat) -> FloatFormat:
    """Look a format up by name, case-insensitively ("fp16", "BF16", "float8_e4m3fn", "fp4")."""
    if isinstance(name, FloatFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a format is a FloatFormat or a name such as 'fp16', not {type(name).__name__}")
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown format {name!r}; valid names: {', '.join(sorted(_BY_NAME))}"
        ) from None


# --- rounding --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Carrier:
    """The IEEE binary format whose bit patterns the rounding works on (float32 or float64)."""

    dtype: torch.dtype
    int_dtype: torch.dtype
    mantissa_bits: int
    bias: int

    @property
    def inf_bits(self) -> int:
        exponent_bits = torch.finfo(self.dtype).bits - 1 - self.mantissa_bits
        return (2**exponent_bits - 1) << self.mantissa_bits

    def bits_of(self, value: float) -> int:
        return int(torch.tensor(value, dtype=self.dtype).view(self.int_dtype))


_FLOAT32 = _Carrier(torch.float32, torch.int32, 23, 127)
_FLOAT64 = _Carrier(torch.float64, torch.int64, 52, 1023)


def _carrier_for(dtype: torch.dtype, fmt: FloatFormat) -> _Carrier:
    # float32 carries everything exactly, except float64 input (rounding it to float32 first would
    # round twice) and formats whose smallest normal is a float32 subnormal (E8M0's 2**-127).
    if dtype == torch.float64 or fmt.emin < 1 - _FLOAT32.bias:
        return _FLOAT64
    return _FLOAT32


def _round_magnitudes(a, c: _Carrier, fmt: FloatFormat, rounding: str, uniform):
    """Round finite magnitudes ``a`` (bit patterns of non-negative carrier floats) onto ``fmt``.

    Returns carrier bit patterns; values above ``fmt.max_value`` are left for the caller.
    """
    one = torch.ones((), dtype=c.int_dtype, device=a.device)
    field = a >> c.mantissa_bits
    # The significand as an integer, implicit leading 1 included for normal carrier values.
    implicit = one << c.mantissa_bits
    significand = torch.where(field > 0, (a & (implicit - 1)) | implicit, a)
    # How many low significand bits the format cannot keep: the mantissa it lacks, plus one more
    # for each binade the value lies below the format's smallest normal (its subnormal range).
    below_normal = (fmt.emin + c.bias) - torch.clamp(field, min=1)
    true_drop = (c.mantissa_bits - fmt.mantissa_bits) + torch.clamp(below_normal, min=0)
    # Dropping more than M+2 bits leaves less than half the smallest subnormal: it all goes.
    drop = torch.clamp(true_drop, max=c.mantissa_bits + 2)
    remainder = significand & ((one << drop) - 1)
    lower = torch.where(significand == remainder, 0, a - remainder)  # rounded toward zero
    next_up = one << drop
    upper = torch.where(lower == 0, c.bits_of(fmt.min_subnormal), lower + next_up)

    if rounding == "toward_zero":
        return lower
    if rounding == "nearest_even":
        half = next_up >> 1
        odd = ((significand >> drop) & 1) == 1  # parity of the kept significand, implicit bit too
        up = (remainder > half) | ((remainder == half) & odd & (drop > 0))
    else:  # stochastic: step up with probability equal to how far x lies from lower to upper
        fraction = remainder.to(torch.float64) * exact_pow2(torch.clamp(-true_drop, min=-1022))
        up = uniform(a.shape) < fraction
    return torch.where(up, upper, lower)


def _round_tensor(x: torch.Tensor, fmt: FloatFormat, rounding: str, saturate: bool, uniform):
    """round_to for a floating torch tensor: returns float32 on the same device."""
    c = _carrier_for(x.dtype, fmt)
    x = _widened(x.detach(), c.dtype).contiguous()
    bits = x.view(c.int_dtype)
    sign_bit = torch.ones((), dtype=c.int_dtype, device=x.device) << (8 * x.element_size() - 1)
    negative = bits < 0
    a = bits & ~sign_bit
    is_nan = a > c.inf_bits
    is_inf = a == c.inf_bits
    is_zero = a == 0
    if not fmt.has_subnormals:  # no values below 2**emin, no zero: small values round up to it
        a = torch.clamp(a, min=c.bits_of(fmt.min_normal))

    magnitude = _round_magnitudes(torch.where(is_nan | is_inf, 0, a), c, fmt, rounding, uniform)

    max_bits, nan_bits = c.bits_of(fmt.max_value), c.bits_of(math.nan)
    # Overflow (and an infinite input): clamp where asked or where the format has neither
    # infinity nor NaN (FP6, FP4); otherwise infinity, or NaN in formats with NaN only (E4M3).
    if saturate or not (fmt.has_infinity or fmt.has_nan):
        overflow_bits = max_bits
    else:
        overflow_bits = c.inf_bits if fmt.has_infinity else nan_bits
    too_big = magnitude > max_bits
    magnitude = torch.where(is_inf | too_big, overflow_bits, magnitude)
    if rounding == "toward_zero":  # IEEE: rounding toward zero never turns a finite value into inf
        magnitude = torch.where(too_big & ~is_inf, max_bits, magnitude)

    out = torch.where(negative, magnitude | sign_bit, magnitude)
    invalid = is_nan  # and values the format has no code for:
    if not fmt.signed:
        invalid = invalid | (negative & ~is_zero)
    if not fmt.has_zero:
        invalid = invalid | is_zero
    out = torch.where(invalid, nan_bits, out)
    return _narrowed(out.view(c.dtype))


def _widened(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, but float32 subnormals reach float64 also when the CPU flushes denormals
    (``torch.set_flush_denormal(True)`` makes the cast read them as zero): there they are built
    as their integer significand times 2**-149, from operands and a product that are float64 normals."""
    if dtype != torch.float64 or x.dtype not in (torch.float32, torch.bfloat16):
        return x.to(dtype)
    x = x.to(torch.float32)  # bfloat16 to float32 moves bits only
    bits = x.view(torch.int32)
    magnitude = bits & 0x7FFFFFFF
    subnormal = (magnitude > 0) & (magnitude < 0x00800000)
    tiny = magnitude.to(torch.float64) * 2.0**-149
    return torch.where(subnormal, torch.where(bits < 0, -tiny, tiny), x.to(torch.float64))


def _narrowed(y: torch.Tensor) -> torch.Tensor:
    """``y.to(torch.float32)`` for values float32 holds exactly, float32 subnormals included also
    when the CPU flushes denormals: their bits are their significand, ``|y| * 2**149``."""
    if y.dtype != torch.float64:
        return y.to(torch.float32)
    a = y.abs()
    subnormal = (a > 0) & (a < 2.0**-126)
    significand = (a * 2.0**149).to(torch.int32)
    sign = torch.tensor(-2**31, dtype=torch.int32, device=y.device)
    bits = torch.where(y < 0, significand | sign, significand)
    return torch.where(subnormal, bits, y.to(torch.float32).view(torch.int32)).view(torch.float32)


def _check_rounding(rounding, generator, kind, kind_name):
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {', '.join(ROUNDING_MODES)}")
    if generator is not None and rounding != "stochastic":
        raise ValueError("a generator is only used with rounding='stochastic'")
    if generator is not None and not isinstance(generator, kind):
        raise TypeError(f"for this input, generator must be a {kind_name} (or None)")


def _as_tensor_input(x, what: str) -> torch.Tensor:
    """Check that x is a floating array or tensor we can round, and return it as a tensor."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise TypeError(f"{what} takes a floating-point tensor, got dtype {x.dtype}; "
                            "convert it first, e.g. x.float()")
        return x
    if isinstance(x, np.ndarray):
        ml_dtypes_float = x.dtype.type.__module__.split(".")[0] == "ml_dtypes"  # bfloat16, float8
        if x.dtype.kind != "f" and not ml_dtypes_float:
            raise TypeError(f"{what} takes a floating-point array, got dtype {x.dtype}; "
                            "convert it first, e.g. x.astype(np.float32)")
        if ml_dtypes_float or x.dtype == np.float16:  # exactly representable in float32
            x = x.astype(np.float32)
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"{what} takes float16, bfloat16, float32 or float64, got {x.dtype}")
        return torch.from_numpy(np.asarray(x, order="C"))
    raise TypeError(
        f"{what} takes a NumPy array, a torch tensor or a Python float, not {type(x).__name__}; "
        "for a list, pass np.asarray(values, dtype=np.float32)"
    )


def _python_float(value, what: str) -> float:
    """A real Python/NumPy number as a float, or a TypeError/ValueError that says what to pass."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} takes a real number (int or float), not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{what}: {value} is too large even for float64") from None


_CPU_PIECE = 2**18  # elements: 1 MiB of float32, small enough to stay in a CPU's cache


METHODS = ("auto", "bits", "cast", "gaps")


def round_to(x, fmt, *, rounding: str = "nearest_even", saturate: bool = False, generator=None,
             method: str = "auto"):
    """Round every element of ``x`` to the nearest value representable in ``fmt``.

    Args:
        x: a NumPy array or torch tensor (float16, bfloat16, float32 or float64, any device), or a
            Python float. It is never modified; ``requires_grad`` is allowed (the result has none).
        fmt: a :class:`FloatFormat` or a name for :func:`get_format`.
        rounding: ``"nearest_even"`` (IEEE's default: the nearest value, ties to the one with an
            even integer significand, implicit bit included; so in E8M0, which has no mantissa
            bits and an odd significand everywhere, ties round up, as in ml_dtypes), ``"toward_zero"`` (truncate), or ``"stochastic"`` (round up with
            probability equal to the distance from the value below, in units of the gap, so that
            the mean over many draws is the input itself).
        saturate: clamp everything beyond ``±fmt.max_value``, infinities included, to
            ``±fmt.max_value``. Otherwise overflow gives ±inf where the format has infinities,
            NaN where it has only NaN (E4M3), and saturates where it has neither (FP6, FP4).
        generator: for ``"stochastic"`` only: a ``numpy.random.Generator`` for NumPy input, a
            ``torch.Generator`` for torch input, to make the draws reproducible.
        method: ``"bits"``: the bit-level algorithm (:func:`_round_magnitudes`), always.
            ``"cast"``: torch's own cast (rounding to nearest into FP32, BF16, FP16, E4M3 or
            E5M2 only), with the fixes that make it give the same numbers. ``"gaps"``:
            float arithmetic, ``round(|x| / gap) * gap`` (:func:`_round_by_gaps`; signed formats
            with subnormals, any rounding; stochastic from the same draws). ``"auto"``: the first of
            "cast" and "gaps" that applies and has been checked on this device to agree with
            the bit-level algorithm (:func:`_fast_path_agrees`), else "bits". All give the same
            numbers.

    Returns:
        The same kind as ``x``: a float32 array or tensor of the same shape (and device), or a
        Python float. NaN stays NaN, also in formats that have no NaN to store it in.
    """
    fmt = get_format(fmt)
    if isinstance(x, (bool, np.bool_)) or isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"round_to takes real numbers, not {type(x).__name__}")
    if isinstance(x, (int, float, np.floating, np.integer)):
        return float(round_to(np.array(_python_float(x, "round_to")), fmt, rounding=rounding, saturate=saturate,
                              generator=generator, method=method)[()])
    is_numpy = isinstance(x, np.ndarray)
    if is_numpy:
        _check_rounding(rounding, generator, np.random.Generator, "numpy.random.Generator")
    else:
        _check_rounding(rounding, generator, torch.Generator, "torch.Generator")
    t = _as_tensor_input(x, "round_to")

    if is_numpy:
        rng = generator if generator is not None else np.random.default_rng()
        def uniform(shape):
            return torch.from_numpy(rng.random(tuple(shape)))
    else:
        # torch.Generator("cuda") may report "cuda" with no index: compare what both state.
        if generator is not None and (generator.device.type != t.device.type or
                                      generator.device.index not in (None, t.device.index)):
            raise ValueError(f"the generator is on {generator.device}, the tensor on {t.device}")
        def uniform(shape):
            return torch.rand(shape, dtype=torch.float64, device=t.device, generator=generator)

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method in _FAST_PATHS and not _applies(method, fmt, rounding):
        raise ValueError(f"method={method!r} does not apply to {fmt.name} with rounding={rounding!r}: "
                         + _FAST_PATHS[method])
    if method == "auto":  # the first fast path that applies and is proven on this device
        from_float64 = t.dtype == torch.float64
        method = next((m for m in _FAST_PATHS if _applies(m, fmt, rounding) and
                       _fast_path_agrees(m, fmt, rounding, t.device, from_float64)), "bits")
    if method == "cast":
        out = _in_pieces(t, lambda piece, target: _round_by_torch_cast(piece, fmt, _torch_dtype(fmt),
                                                                       saturate, target))
    elif method == "gaps":
        out = _in_pieces(t, lambda piece, target: _round_by_gaps(piece, fmt, rounding, saturate, target,
                                                                 uniform))
    else:
        out = _round_bit_level(t, fmt, rounding, saturate, uniform)
    return out.numpy() if is_numpy else out


def _in_pieces(t: torch.Tensor, fill) -> torch.Tensor:
    """A float32 tensor shaped like ``t``, filled by ``fill(piece_of_t, piece_of_out)``.

    Each step of the rounding is one pass over the data; on a CPU, passes over cache-sized
    pieces run two to three times as fast as passes over one large array (torch's own casts to
    BF16 and FP16 and back included: the narrow copy of a piece never leaves the cache)."""
    if t.device.type == "cpu":  # NumPy asks the kernel for huge pages: a large array is ready to
        out = torch.from_numpy(np.empty(t.shape, dtype=np.float32))  # write ~5x sooner
    else:
        out = torch.empty(t.shape, dtype=torch.float32, device=t.device)
    source, target = t.detach().reshape(-1), out.view(-1)
    if t.device.type != "cpu" or t.numel() <= _CPU_PIECE:  # one piece: no split to pay for
        fill(source, target)
        return out
    for source_piece, target_piece in zip(source.split(_CPU_PIECE), target.split(_CPU_PIECE)):
        fill(source_piece, target_piece)
    return out


def _round_bit_level(t: torch.Tensor, fmt: FloatFormat, rounding: str, saturate: bool, uniform):
    """round_to with the bit-level algorithm (:func:`_round_tensor`), piece by piece."""
    return _in_pieces(t, lambda piece, target: target.copy_(
        _round_tensor(piece, fmt, rounding, saturate, uniform)))


# --- the fast paths: torch's own casts and float arithmetic, where they give the same numbers
def _layout(fmt: FloatFormat) -> tuple:
    return (fmt.exponent_bits, fmt.mantissa_bits, fmt.has_infinity, fmt.nan, fmt.signed,
            fmt.has_subnormals, fmt.bias)


# torch dtypes by the layout they store (a renamed copy of a format finds its dtype too).
_CAST_FORMATS = (FP32, BF16, FP16, E4M3, E5M2)
_TORCH_DTYPE_BY_LAYOUT = {_layout(f): d for f, d in zip(_CAST_FORMATS, (
    torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2))}


def _torch_dtype(fmt: FloatFormat) -> torch.dtype | None:
    """The torch dtype that stores exactly ``fmt``'s values, or None."""
    return _TORCH_DTYPE_BY_LAYOUT.get(_layout(fmt))


def _float32_rounded_to_odd(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` to float32, rounding to odd: an inexact result keeps the value below in
    magnitude, with its last bit set. Rounding that to nearest in a format of at most 22
    significand bits then equals rounding ``x`` itself once (Boldo and Melquiond's theorem),
    where torch's cast to float32 and then to the format would round twice."""
    f = x.to(torch.float32)
    bits = f.view(torch.int32)
    went_up = f.to(torch.float64).abs() > x.abs()  # rounded away from zero: step back one ulp
    inexact = f.to(torch.float64) != x              # (NaN too: it stays NaN)
    bits = torch.where(inexact, (bits - went_up.to(torch.int32)) | 1, bits)
    return bits.view(torch.float32)


def exact_pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` in float64, exactly, for integers ``e`` in [-1022, 1023], built from its bits.

    Not ``torch.ldexp``: it computes ``x * torch.pow(2, e)``, and on CUDA (torch 2.11, an H200) that
    power is not exact: float64 ``torch.pow(2, -4.0)`` was 0.06249999999999999 there, so
    ``ldexp(144, -4)`` fell just short of 9 and ``encode`` gave 144 E4M3's code for 128."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def from_float8(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x.to(dtype)``; for a float8 tensor on a CPU, each code looked up in a table of all 256.

    The table is torch's own cast of the 256 codes, so the numbers are the cast's; torch's CPU
    cast from float8 is element by element, a few times slower than the lookup."""
    if x.device.type != "cpu" or x.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.to(dtype)
    codes = x.view(torch.uint8).reshape(-1).int()
    return _float8_values(x.dtype, dtype).index_select(0, codes).reshape(x.shape)


@functools.lru_cache(maxsize=None)
def _float8_values(float8: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(256, dtype=torch.uint8).view(float8).to(dtype)


def _round_by_torch_cast(x: torch.Tensor, fmt: FloatFormat, dtype: torch.dtype,
                         saturate: bool, out: torch.Tensor) -> torch.Tensor:
    """Write round_to(x, fmt, saturate=saturate) (to nearest) into ``out``, with torch's cast."""
    if x.dtype == torch.float64 and dtype != torch.float32:
        x = _float32_rounded_to_odd(x)
    elif x.dtype != torch.float64:
        x = x.to(torch.float32)  # float16 and bfloat16 are exact in float32
    if saturate:  # beyond max_value, rounding to nearest gives max_value or overflows: clamp first
        x = x.clamp(-fmt.max_value, fmt.max_value)  # (NaN stays NaN)
    out.copy_(from_float8(x.to(dtype)))
    if saturate or fmt.has_infinity or not fmt.has_nan:
        return out
    # No infinity (E4M3): torch's cast of an overflow (inf, |x| > 464) is ±448 in torch 2.13 and NaN
    # in torch 2.11, so set it here, by round_to's rule on either. The overflow starts at the
    # midpoint above max_value, which rounds up if max_value is odd.
    edge = fmt.max_value + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    overflow = x.abs() >= edge if fmt._top_mantissa % 2 else x.abs() > edge
    return out.masked_fill_(overflow, math.nan)


def _probe_inputs(fmt: FloatFormat, dtype: torch.dtype) -> torch.Tensor:
    """Inputs where a fast path to ``fmt`` can go wrong: values of the format, every midpoint
    between neighbours (the ties), one ulp of the input dtype either side, subnormals, the overflow edge,
    infinities, -0 and NaNs with payloads. Every code of a 16-bit format; for FP32, a sample."""
    if fmt.bits <= 16:
        v = fmt.values().astype(np.float64)
    else:  # every exponent field, with the smallest, largest and a few other mantissas
        fields = np.arange(2**fmt.exponent_bits - 1, dtype=np.int64)[:, None] << fmt.mantissa_bits
        mantissas = np.array([0, 1, 2, 3, 2**(fmt.mantissa_bits - 1), 2**fmt.mantissa_bits - 1])
        v = decode((fields | mantissas).ravel(), fmt).astype(np.float64)
        v = np.unique(np.concatenate([v, -v]))
    gap = 2.0 ** (fmt.emax - fmt.mantissa_bits)
    grid = np.concatenate([v, [v[-1] + gap, v[-1] + 2 * gap]])  # + what would come after max
    mid = (grid[1:] + grid[:-1]) / 2  # exact: float64 holds every midpoint of a <=24-bit format
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    with np.errstate(over="ignore"):  # FP32's midpoint above max_value is inf in float32
        mid = mid.astype(np_dtype)
        specials = np.array([0.0, -0.0, np.inf, -np.inf, 2 * fmt.max_value, 1e30, 3.4e38,
                             2.0**-149, 2.0**-150, 3 * 2.0**-151], dtype=np_dtype)
        x = np.concatenate([grid.astype(np_dtype), mid, np.nextafter(mid, np_dtype(np.inf)),
                            np.nextafter(mid, np_dtype(-np.inf)), specials])
    x = torch.from_numpy(np.concatenate([x, -x]))
    int_dtype = torch.int64 if dtype == torch.float64 else torch.int32
    bits = torch.tensor(_NAN_PATTERNS[int_dtype], dtype=int_dtype).view(dtype)
    return torch.cat([x, bits])


# NaN bit patterns: quiet and signalling, smallest and largest payloads, both signs.
_NAN_PATTERNS = {
    torch.int32: [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000, -0x00400000, -0x007FFFFF, -1],
    torch.int64: [0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000,
                  -0x0008000000000000, -1],
}


# The fast paths, each with when it applies (in words, for the error message).
_FAST_PATHS = {
    "cast": "it needs rounding='nearest_even' and a format torch has a dtype for "
            f"({', '.join(f.name for f in _CAST_FORMATS)})",
    "gaps": "it needs a signed format with subnormals",
}


def _applies(method: str, fmt: FloatFormat, rounding: str) -> bool:
    if method == "cast":
        return rounding == "nearest_even" and _torch_dtype(fmt) is not None
    return fmt.signed and fmt.has_subnormals


def _round_by_gaps(x: torch.Tensor, fmt: FloatFormat, rounding: str, saturate: bool,
                   out: torch.Tensor, uniform=None) -> torch.Tensor:
    """Write round_to(x, fmt, ...) into ``out`` with the carrier's own float arithmetic.

    Around ``|x|`` in ``[2**e, 2**(e+1))`` the format's values are the multiples of
    ``gap = 2**(max(e, emin) - M)`` (``max``: one spacing for the whole subnormal range), so
    ``round(|x| / gap) * gap`` is the rounded value: dividing by a power of two and multiplying
    back are exact, and ``torch.round`` rounds half to even (``torch.trunc``: toward zero).
    Stochastic rounding takes ``floor(|x| / gap)`` and one step more when a draw of
    ``uniform`` (one per element, as the bit-level path draws them) is below the fractional
    part, which is exact: the same rule, on the same draws, as :func:`_round_magnitudes`.
    """
    c = _carrier_for(x.dtype, fmt)
    x = x.to(c.dtype)
    a = x.abs()
    # 2**e for a in [2**e, 2**(e+1)): a's bits with the significand cleared (0 for a carrier
    # subnormal, inf for inf and NaN), at least 2**emin, times 2**-M: all exact powers of two.
    # At most 2**emax: inf and NaN (power inf) get a finite gap, so steps stay inf and NaN;
    # a finite a beyond the top binade still rounds to a multiple above max_value (overflow).
    power = (a.view(c.int_dtype) & c.inf_bits).view(c.dtype)
    gap = torch.clamp(power, min=2.0 ** fmt.emin, max=2.0 ** fmt.emax) * 2.0 ** -fmt.mantissa_bits
    steps = a / gap
    if rounding == "stochastic":
        below = torch.floor(steps)
        y = (below + (uniform(a.shape) < steps - below)) * gap   # up with probability = fraction
    else:
        y = (torch.round(steps) if rounding == "nearest_even" else torch.trunc(steps)) * gap
    # Overflow (and infinite input), by the same rules as the bit-level path.
    if saturate or not (fmt.has_infinity or fmt.has_nan):
        overflow = fmt.max_value
    else:
        overflow = math.inf if fmt.has_infinity else math.nan
    # (A clamp where the overflow is max_value: a mask and torch.where cost ten times more.)
    if rounding == "toward_zero":  # rounding toward zero never turns a finite value into inf
        too_big = y > fmt.max_value                              # NaN stays NaN: never too big
        y = torch.where(too_big & torch.isfinite(a), fmt.max_value, torch.where(too_big, overflow, y))
    elif overflow == fmt.max_value:
        y = y.clamp(max=fmt.max_value)                           # NaN stays NaN
    else:
        y = torch.where(y > fmt.max_value, overflow, y)
    return torch.copysign(y, x, out=out)


@functools.lru_cache(maxsize=None)
def _agrees_on(method: str, fmt: FloatFormat, rounding: str, device: torch.device,
               from_float64: bool, denormals_flushed: bool = False) -> bool:
    # denormals_flushed is only part of the cache key: the check runs in the state it names.
    dtype = torch.float64 if from_float64 else torch.float32
    x = _probe_inputs(fmt, dtype).to(device)
    for saturate in (False, True):
        fast = torch.empty_like(x, dtype=torch.float32)
        draws = {path: torch.Generator(device).manual_seed(0) for path in ("fast", "exact")}
        def uniform(path):  # stochastic rounding: the same draws for both paths
            return lambda shape: torch.rand(shape, dtype=torch.float64, device=device, generator=draws[path])
        if method == "cast":
            _round_by_torch_cast(x, fmt, _torch_dtype(fmt), saturate, fast)
        else:
            _round_by_gaps(x, fmt, rounding, saturate, fast, uniform("fast"))
        exact = _round_bit_level(x, fmt, rounding, saturate, uniform("exact"))
        same_bits = fast.view(torch.int32) == exact.view(torch.int32)  # -0.0 is not 0.0
        if not bool((same_bits | (fast.isnan() & exact.isnan())).all()):
            return False
    return True


def _fast_path_agrees(method: str, fmt: FloatFormat, rounding: str, device: torch.device,
                      from_float64: bool) -> bool:
    """Whether a fast path (``"cast"``, ``"gaps"``) gives, on this kind of device, the bit-level
    algorithm's numbers on every probe input (:func:`_probe_inputs`). Checked once per path,
    format, rounding, device, input width and, on a CPU, state of ``torch.set_flush_denormal``
    (with it on, float arithmetic reads float32 subnormals as zero: the "gaps" path then gives
    NaN for them); where it does not agree, round_to keeps the bit-level path."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _agrees_on(method, fmt, rounding, device, from_float64,
                      device.type == "cpu" and _denormals_flushed())


def _denormals_flushed() -> bool:
    """Whether this thread's CPU float arithmetic flushes subnormals (``torch.set_flush_denormal``;
    torch has no getter): twice the smallest float32 subnormal comes out as zero bits."""
    return int((_SMALLEST_SUBNORMAL * 2.0).view(torch.int32)) == 0


_SMALLEST_SUBNORMAL = torch.tensor(2.0**-149, dtype=torch.float32)  # made once: round_to asks often


def round_scalar(value: float, fmt, *, rounding: str = "nearest_even", saturate: bool = False,
                 uniform: float | None = None) -> float:
    """The same rounding as :func:`round_to`, for one Python float, in exact rational arithmetic.

    Slow and short: the reference the vectorised bit-level version is tested against. For
    ``"stochastic"``, ``uniform`` is the random draw in [0, 1): the result rounds up when
    ``uniform`` is below the fraction of the gap that lies under ``value``.
    """
    fmt = get_format(fmt)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {', '.join(ROUNDING_MODES)}")
    if rounding == "stochastic" and uniform is None:
        raise ValueError("stochastic rounding needs the draw: pass uniform=<a float in [0, 1)>")
    value = _python_float(value, "round_scalar")
    negative = math.copysign(1.0, value) < 0
    if math.isnan(value) or (negative and not fmt.signed) or (value == 0 and not fmt.has_zero):
        return math.nan

    def overflow(finite_input: bool) -> float:
        if saturate or not (fmt.has_infinity or fmt.has_nan) or (finite_input and rounding == "toward_zero"):
            return math.copysign(fmt.max_value, value)
        return math.copysign(math.inf, value) if fmt.has_infinity else math.nan

    if math.isinf(value):
        return overflow(finite_input=False)
    x = max(Fraction(abs(value)), Fraction(fmt.min_normal) if not fmt.has_subnormals else 0)
    if x == 0:
        return value
    exponent = math.frexp(x)[1] - 1                                  # x in [2**e, 2**(e+1))
    gap = Fraction(2) ** (max(exponent, fmt.emin) - fmt.mantissa_bits)  # the spacing around x
    steps = x / gap
    lower = math.floor(steps)
    fraction = steps - lower                                          # in [0, 1)
    if rounding == "nearest_even":
        up = fraction > Fraction(1, 2) or (fraction == Fraction(1, 2) and lower % 2 == 1)
    elif rounding == "toward_zero":
        up = False
    else:
        up = Fraction(uniform) < fraction
    result = (lower + up) * gap
    if result > Fraction(fmt.max_value):
        return overflow(finite_input=True)
    return math.copysign(float(result), value)


# --- bit patterns ----------------------------------------------------------------------------
def _nan_code(fmt: FloatFormat) -> int:
    exponent_all_ones = (2**fmt.exponent_bits - 1) << fmt.mantissa_bits
    if fmt.nan == "ieee":  # the quiet NaN: top mantissa bit set
        return exponent_all_ones | (1 << (fmt.mantissa_bits - 1))
    return exponent_all_ones | (2**fmt.mantissa_bits - 1)


def _numpy_code_dtype(fmt: FloatFormat):
    return np.uint8 if fmt.bits <= 8 else np.uint16 if fmt.bits <= 16 else np.uint32


def encode(x, fmt, *, rounding: str = "nearest_even", saturate: bool = False, generator=None):
    """The integer bit patterns of ``x`` rounded to ``fmt`` (same options as :func:`round_to`).

    Returns a NumPy array of the smallest unsigned integer dtype that holds the codes (as
    ``x.astype(ml_dtype).view(np.uint8)`` would), a torch int64 tensor, or a Python int.
    Raises ValueError for a value the format has no code for (NaN in FP6/FP4).
    """
    fmt = get_format(fmt)
    rounded = round_to(x, fmt, rounding=rounding, saturate=saturate, generator=generator)
    if isinstance(rounded, float):
        return int(encode(np.array(rounded, dtype=np.float32), fmt)[()])
    is_numpy = isinstance(rounded, np.ndarray)
    r = torch.from_numpy(rounded) if is_numpy else rounded

    magnitude = r.abs().to(torch.float64)
    is_nan, is_inf = torch.isnan(r), torch.isinf(r)
    if not fmt.has_nan and bool(is_nan.any()):
        raise ValueError(f"{fmt.name} has no NaN: there is no code for the NaN in the input")
    exponent = torch.frexp(magnitude).exponent.to(torch.int64) - 1  # magnitude in [2**e, 2**(e+1))
    normal = (magnitude > 0) & (exponent >= fmt.emin)
    field = torch.where(normal, exponent + fmt.bias, 0)
    # Normal: mantissa = (magnitude / 2**e - 1) * 2**M. Subnormal: magnitude / 2**(emin - M).
    # Exact products by powers of two (exact_pow2; NaN and inf give nonsense here, replaced below).
    shift = torch.where(normal, fmt.mantissa_bits - exponent, fmt.mantissa_bits - fmt.emin)
    scaled = magnitude * exact_pow2(torch.clamp(shift, -1022, 1023))
    mantissa = (scaled - torch.where(normal, 2.0**fmt.mantissa_bits, 0.0)).to(torch.int64)
    mantissa = torch.where(is_inf | is_nan, 0, mantissa)
    field = torch.where(is_inf, 2**fmt.exponent_bits - 1, field)

    codes = (field << fmt.mantissa_bits) | mantissa
    if fmt.signed:
        codes = codes | (torch.signbit(r).to(torch.int64) << (fmt.exponent_bits + fmt.mantissa_bits))
    if fmt.has_nan:
        codes = torch.where(is_nan, _nan_code(fmt), codes)
    return codes.numpy().astype(_numpy_code_dtype(fmt)) if is_numpy else codes


def decode(codes, fmt):
    """The values (float32) of integer bit patterns ``codes`` in ``fmt``: the inverse of encode.

    Takes a NumPy integer array, a torch integer tensor or a Python int, and returns the same kind.
    """
    fmt = get_format(fmt)
    if isinstance(codes, (int, np.integer)) and not isinstance(codes, (bool, np.bool_)):
        return float(decode(np.array([codes], dtype=np.int64), fmt)[0])
    is_numpy = isinstance(codes, np.ndarray)
    if is_numpy:
        if codes.dtype.kind not in "iu":
            raise TypeError(f"decode takes integer codes, got dtype {codes.dtype}")
        c = torch.from_numpy(codes.astype(np.int64))
    elif isinstance(codes, torch.Tensor):
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"decode takes integer codes, got dtype {codes.dtype}")
        c = codes.to(torch.int64)
    else:
        raise TypeError(f"decode takes integer codes (NumPy, torch or int), not {type(codes).__name__}")
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 2**fmt.bits):
        raise ValueError(f"{fmt.name} codes are integers in [0, 2**{fmt.bits})")

    mantissa = c & (2**fmt.mantissa_bits - 1)
    field = (c >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    subnormal = (field == 0) & fmt.has_subnormals
    significand = torch.where(subnormal, mantissa, mantissa + 2**fmt.mantissa_bits).double()
    exponent = torch.where(subnormal, fmt.emin, field - fmt.bias) - fmt.mantissa_bits
    value = significand * exact_pow2(exponent)

    all_ones = field == 2**fmt.exponent_bits - 1
    if fmt.has_infinity:
        value = torch.where(all_ones & (mantissa == 0), math.inf, value)
    if fmt.nan == "ieee":
        value = torch.where(all_ones & (mantissa != 0), math.nan, value)
    elif fmt.nan == "all_ones":
        value = torch.where(c & (2 ** (fmt.bits - int(fmt.signed)) - 1) == _nan_code(fmt), math.nan, value)
    if fmt.signed:
        value = torch.where(((c >> (fmt.bits - 1)) & 1) == 1, -value, value)
    value = value.to(torch.float32)
    return value.numpy() if is_numpy else value


def describe(value, fmt) -> str:
    """A human-readable breakdown of how ``fmt`` stores ``value`` (rounded to nearest first)."""
    fmt = get_format(fmt)
    value = _python_float(value, "describe")
    code = encode(value, fmt)
    stored = decode(code, fmt)
    M, E = fmt.mantissa_bits, fmt.exponent_bits
    mantissa, field = code & (2**M - 1), (code >> M) & (2**E - 1)
    sign = (code >> (E + M)) & 1 if fmt.signed else 0
    bits = (f"{sign} " if fmt.signed else "") + f"{field:0{E}b}" + (f" {mantissa:0{M}b}" if M else "")

    sign_text = ("-" if sign else "+") if fmt.signed else ""
    if math.isnan(stored):
        kind, reading = "NaN", "not a number"
    elif math.isinf(stored):
        kind, reading = "infinity", f"{sign_text}inf"
    elif fmt.has_subnormals and field == 0:
        kind = "zero" if mantissa == 0 else "subnormal"
        reading = f"{sign_text}2^{fmt.emin} x {mantissa}/{2**M}"
    else:
        kind = "normal"
        reading = f"{sign_text}2^({field}-{fmt.bias})" + (f" x (1 + {mantissa}/{2**M})" if M else "")
    lines = [
        f"{value!r} in {fmt.name} ({fmt.bits} bits: {int(fmt.signed)} sign, {E} exponent, "
        f"{M} mantissa; bias {fmt.bias})",
        f"  bits      {bits}   (0x{code:0{(fmt.bits + 3) // 4}X})",
        f"  kind      {kind}",
        f"  reads as  {reading}",
        f"  value     {stored!r}" + ("" if stored == value or math.isnan(value) else
                                     f"   (rounded from {value!r}, error {stored - value:+.3g})"),
    ]
    return "\n".join(lines)
