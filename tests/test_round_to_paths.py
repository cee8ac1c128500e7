"""round_to's paths give the same bits: torch's own cast (method="cast", the fast path for
rounding to nearest into FP32, BF16, FP16, E4M3, E5M2), float arithmetic round(|x| / gap) * gap
(method="gaps", for signed formats with subnormals) and the bit-level algorithm the book teaches
(method="bits"). Boundary-driven: every value and tie of each format, one ulp either
side, subnormals, the overflow edge, ±inf, -0, NaNs with payloads, float64 inputs just past the
ties (which torch's own cast would round twice)."""
import math

import numpy as np
import pytest
import torch

from mpcourse import formats
from mpcourse.formats import (BF16, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0, FP16, FP32, TF32,
                              round_scalar, round_to)
from tests.test_formats import boundary_inputs, random_inputs

CAST_FORMATS = [FP32, BF16, FP16, E4M3, E5M2]
GAP_FORMATS = [FP32, TF32, BF16, FP16, E4M3, E5M2, E3M2, E2M3, E2M1]  # signed, with subnormals
ids = lambda f: f.name  # noqa: E731
NAN_BITS_32 = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001, 0xFFFFFFFF],
                       dtype=np.uint32)


def inputs(fmt, dtype) -> np.ndarray:
    """Boundary and random inputs, as float32 or float64; float64 also just past every point."""
    if fmt.bits <= 16:
        x32 = np.concatenate([boundary_inputs(fmt), random_inputs(20_000)])
    else:  # FP32: around every power of two, its neighbours, and random bit patterns
        powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
        x32 = np.concatenate([powers, np.nextafter(powers, np.float32(0)),
                              np.nextafter(powers, np.float32(np.inf)), random_inputs(20_000)])
        x32 = np.concatenate([x32, -x32])
    x32 = np.concatenate([x32, np.float32([0.0, -0.0, np.inf, -np.inf]), NAN_BITS_32.view(np.float32)])
    if dtype == np.float32:
        return x32
    with np.errstate(over="ignore", invalid="ignore"):  # signalling NaNs, the overflow at 1e308
        x64 = x32.astype(np.float64)
        return np.concatenate([x64, x64 * (1 + 2.0**-40), x64 * (1 - 2.0**-40),
                               np.nextafter(x64, np.inf), np.nextafter(x64, -np.inf), [1e300, -1e300]])


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit-for-bit equality (so -0.0 differs from 0.0); any NaN equals any NaN."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", CAST_FORMATS, ids=ids)
def test_torch_cast_path_equals_the_bit_level_path(fmt, saturate, dtype):
    x = inputs(fmt, dtype)
    cast = round_to(x, fmt, saturate=saturate, method="cast")
    bits = round_to(x, fmt, saturate=saturate, method="bits")
    agree = same_bits(cast, bits)
    assert agree.all(), f"{(~agree).sum()} differences, first at x={x[~agree][:3]}"
    assert same_bits(round_to(torch.from_numpy(x), fmt, saturate=saturate).numpy(), bits).all()


@pytest.mark.parametrize("rounding", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", GAP_FORMATS, ids=ids)
def test_gap_arithmetic_path_equals_the_bit_level_path(fmt, dtype, rounding):
    x = inputs(fmt, dtype)
    for saturate in (False, True):
        gaps = round_to(x, fmt, saturate=saturate, rounding=rounding, method="gaps")
        bits = round_to(x, fmt, saturate=saturate, rounding=rounding, method="bits")
        agree = same_bits(gaps, bits)
        assert agree.all(), f"{(~agree).sum()} differences, first at x={x[~agree][:3]}"


@pytest.mark.parametrize("fmt, dtype", [(f, np.float32) for f in GAP_FORMATS]
                         + [(E2M1, np.float64), (TF32, np.float64)],  # float64 carries these
                         ids=lambda v: getattr(v, "name", getattr(v, "__name__", str(v))))
def test_stochastic_rounding_by_gap_arithmetic_equals_the_bit_level_path_draw_for_draw(fmt, dtype):
    """The same generator state gives the same numbers on both paths: one draw per element, in
    the same order, and the same rule (up when the draw is below the fraction of the gap)."""
    x = inputs(fmt, dtype)
    for saturate in (False, True):
        gaps = round_to(x, fmt, saturate=saturate, rounding="stochastic", method="gaps",
                        generator=np.random.default_rng(7))
        bits = round_to(x, fmt, saturate=saturate, rounding="stochastic", method="bits",
                        generator=np.random.default_rng(7))
        agree = same_bits(gaps, bits)
        assert agree.all(), f"{(~agree).sum()} differences, first at x={x[~agree][:3]}"
    t = torch.from_numpy(x)
    a = round_to(t, fmt, rounding="stochastic", method="gaps", generator=torch.Generator().manual_seed(3))
    b = round_to(t, fmt, rounding="stochastic", method="bits", generator=torch.Generator().manual_seed(3))
    assert same_bits(a.numpy(), b.numpy()).all()


@pytest.mark.parametrize("fmt", CAST_FORMATS, ids=ids)
def test_nan_of_any_payload_stays_nan_on_both_paths(fmt):
    x = NAN_BITS_32.view(np.float32)
    for method in ("cast", "bits"):
        for saturate in (False, True):
            assert np.isnan(round_to(x, fmt, method=method, saturate=saturate)).all()
            with np.errstate(invalid="ignore"):  # NumPy warns about the signalling NaNs
                x64 = x.astype(np.float64)
            assert np.isnan(round_to(x64, fmt, method=method, saturate=saturate)).all()


@pytest.mark.parametrize("fmt", CAST_FORMATS, ids=ids)
def test_auto_uses_the_cast_where_it_is_proven_on_this_device(fmt, monkeypatch):
    device = torch.device("cpu")
    for from_float64 in (False, True):
        assert formats._fast_path_agrees("cast", fmt, "nearest_even", device, from_float64)
    calls = []
    real = formats._round_by_torch_cast
    monkeypatch.setattr(formats, "_round_by_torch_cast", lambda *a: calls.append(1) or real(*a))
    round_to(np.float32([1.0, 3.0]), fmt)
    assert calls, "auto did not take the cast"
    calls.clear()
    round_to(np.float32([1.0, 3.0]), fmt, rounding="toward_zero")
    round_to(np.float32([1.0, 3.0]), fmt, method="bits")
    assert not calls


def test_the_check_rejects_a_cast_that_differs(monkeypatch):
    """Without the overflow fix (torch's E4M3 cast gives ±448 in torch 2.13 and NaN in 2.11; round_to
    NaN, or ±448 with saturate=True: one of the two differs on either version), the probe says no,
    and round_to then keeps the bit-level path."""
    def torch_cast_alone(x, fmt, dtype, saturate, out):
        return out.copy_(x.to(torch.float32).to(dtype))
    monkeypatch.setattr(formats, "_round_by_torch_cast", torch_cast_alone)
    formats._agrees_on.cache_clear()
    cpu = torch.device("cpu")
    try:
        assert not formats._fast_path_agrees("cast", E4M3, "nearest_even", cpu, False)
        assert not formats._fast_path_agrees("cast", BF16, "nearest_even", cpu, True)  # rounds twice
        assert np.isnan(round_to(np.float32([1000.0]), E4M3))[0]
    finally:
        formats._agrees_on.cache_clear()


def test_the_check_rejects_gap_arithmetic_that_differs(monkeypatch):
    """round(|x| / gap) * gap with ties away from zero (floor(steps + 0.5)) is wrong on the ties:
    the probe says no, and round_to keeps the bit-level path."""
    real_round = torch.round
    monkeypatch.setattr(torch, "round", lambda t: torch.floor(t + 0.5))
    formats._agrees_on.cache_clear()
    try:
        assert not formats._fast_path_agrees("gaps", E2M1, "nearest_even", torch.device("cpu"), False)
        monkeypatch.setattr(torch, "round", real_round)
        assert round_to(np.float32([2.5]), E2M1)[0] == 2.0  # a tie, to even
    finally:
        formats._agrees_on.cache_clear()


@pytest.mark.parametrize("fmt", [E3M2, E2M3, E2M1, TF32], ids=ids)
def test_auto_uses_the_gap_arithmetic_for_the_formats_torch_has_no_dtype_for(fmt, monkeypatch):
    assert formats._fast_path_agrees("gaps", fmt, "nearest_even", torch.device("cpu"), False)
    calls = []
    real = formats._round_by_gaps
    monkeypatch.setattr(formats, "_round_by_gaps", lambda *a: calls.append(1) or real(*a))
    round_to(np.float32([1.0, 3.0]), fmt)
    assert calls
    calls.clear()
    round_to(np.float32([1.0, 3.0]), fmt, rounding="stochastic")  # stochastic, from the same draws
    assert calls and formats._fast_path_agrees("gaps", fmt, "stochastic", torch.device("cpu"), False)
    calls.clear()
    round_to(np.float32([1.0]), E8M0)  # unsigned, no subnormals: the bit-level path
    round_to(np.float32([1.0]), E8M0, rounding="stochastic")
    assert not calls


def test_float64_ties_torch_rounds_twice_are_rounded_once():
    """1 + 2**-8 + 2**-40 lies just above a BF16 tie: torch's float64 -> bfloat16 cast goes
    through float32, which lands on the tie, then rounds to even (down); the value is nearer
    1 + 2**-7."""
    x = torch.tensor([1 + 2.0**-8 + 2.0**-40], dtype=torch.float64)
    assert x.to(torch.bfloat16).item() == 1.0  # torch's double rounding
    assert round_to(x, BF16).item() == round_scalar(x.item(), BF16) == 1 + 2.0**-7
    assert round_to(x, BF16, method="cast").item() == 1 + 2.0**-7


def test_e4m3_overflow_is_nan_unless_saturating_on_the_cast_path():
    x = np.float32([448.0, 464.0, np.nextafter(np.float32(464), np.float32(1e3)), 480.0, np.inf, -1e6])
    got = round_to(x, E4M3, method="cast")
    assert got[:2].tolist() == [448.0, 448.0] and np.isnan(got[2:]).all()  # 464 is a tie: to 448
    assert round_to(x, E4M3, method="cast", saturate=True).tolist() == [448.0] * 5 + [-448.0]


def test_minus_zero_keeps_its_sign_on_the_cast_path():
    x = np.float32([-0.0, -1e-30])
    for fmt in CAST_FORMATS:
        assert np.signbit(round_to(x, fmt, method="cast")).all(), fmt.name


def test_a_method_that_does_not_apply_is_a_clear_error():
    with pytest.raises(ValueError, match="method='cast' does not apply to e2m1"):
        round_to(np.float32([1.0]), E2M1, method="cast")
    with pytest.raises(ValueError, match="method='cast' does not apply to tf32"):
        round_to(np.float32([1.0]), TF32, method="cast")
    with pytest.raises(ValueError, match="rounding='toward_zero'"):
        round_to(np.float32([1.0]), BF16, method="cast", rounding="toward_zero")
    with pytest.raises(ValueError, match="method='gaps' does not apply to e8m0"):
        round_to(np.float32([1.0]), E8M0, method="gaps")
    with pytest.raises(ValueError, match="method='gaps' does not apply to e8m0"):
        round_to(np.float32([1.0]), E8M0, method="gaps", rounding="stochastic")
    with pytest.raises(ValueError, match="unknown method"):
        round_to(np.float32([1.0]), BF16, method="fast")
    assert math.isnan(round_to(math.nan, E4M3, method="cast"))
