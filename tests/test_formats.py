"""mpcourse.formats, proven against independent references: ml_dtypes, torch's casts, and the
exact scalar reference round_scalar. Exhaustive where the space is small (every code of a 16-bit
or smaller format), boundary-driven where it is not (every midpoint, one ulp either side, the
overflow edge, specials), plus a large random sample."""
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mpcourse.formats import (BF16, E2M1, E4M3, E5M2, E8M0, FORMATS, FP16, FP32, TF32, decode,
                              describe, encode, get_format, round_scalar, round_to)
from tests.ml_reference import (ML_DTYPES, TORCH_DTYPES, ml_dtypes_deviations, ml_dtypes_round, same,
                                torch_e4m3_saturates)

SMALL_FORMATS = [f for f in FORMATS if f.bits <= 16]
ids = lambda f: f.name  # noqa: E731


def boundary_inputs(fmt) -> np.ndarray:
    """float32 inputs where rounding to fmt can go wrong: every value, every midpoint between
    neighbours (the ties), one float32 ulp either side of each, the overflow edge, and specials."""
    v = fmt.values().astype(np.float64)
    top_gap = 2.0 ** (fmt.emax - fmt.mantissa_bits)
    grid = np.concatenate([v, [v[-1] + top_gap]])  # + the value the format would have next
    mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    assert np.all(mid.astype(np.float64) == (grid[1:] + grid[:-1]) / 2), "midpoints are exact"
    points = np.concatenate([v.astype(np.float32), mid,
                             np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
                             np.float32([2 * fmt.max_value, 1e30, 3.4e38, np.inf, np.nan, 1e-45, 0.0])])
    return np.concatenate([points, -points])


def random_inputs(n=200_000, seed=0) -> np.ndarray:
    """Random float32 bit patterns (every exponent equally likely) and log-uniform magnitudes."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    logs = (rng.choice([-1, 1], n) * 2.0 ** rng.uniform(-150, 129, n)).astype(np.float32)
    return np.concatenate([bits, logs])


# --- the format descriptions ----------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_format_constants_match_ml_dtypes_finfo(fmt):
    info = ml_dtypes.finfo(ML_DTYPES[fmt])
    assert fmt.bits == info.bits
    assert fmt.max_value == float(info.max)
    assert fmt.min_normal == float(info.smallest_normal)
    assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)


def test_fp32_and_tf32_constants():
    info = torch.finfo(torch.float32)
    assert (FP32.max_value, FP32.min_normal, FP32.epsilon) == (info.max, info.tiny, info.eps)
    assert FP32.min_subnormal == float(np.nextafter(np.float32(0), np.float32(1)))
    # TF32: FP32's exponent range with FP16's 10-bit mantissa, 19 bits in all.
    assert (TF32.bits, TF32.min_normal, TF32.epsilon) == (19, FP32.min_normal, FP16.epsilon)
    assert TF32.max_value == (2 - TF32.epsilon) * 2.0**127
    assert TF32.min_subnormal == FP32.min_normal * TF32.epsilon


def test_formats_are_immutable():
    with pytest.raises(AttributeError):
        FP16.mantissa_bits = 3


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=ids)
def test_values_are_every_finite_value_sorted(fmt):
    values = fmt.values()
    assert np.all(np.diff(values) > 0)
    assert values[-1] == fmt.max_value
    reference = np.arange(2**fmt.bits, dtype=np.uint16 if fmt.bits > 8 else np.uint8)
    reference = reference.view(ML_DTYPES[fmt]).astype(np.float32)
    assert np.array_equal(values, np.unique(reference[np.isfinite(reference)]))


def test_values_refuses_wide_formats():
    with pytest.raises(ValueError, match="16 bits or fewer"):
        FP32.values()


@pytest.mark.parametrize("name,fmt", [("fp16", FP16), ("BF16", BF16), ("float8_e4m3fn", E4M3),
                                      ("E5M2", E5M2), ("fp4", E2M1), ("float8_e8m0fnu", E8M0),
                                      (" tf32 ", TF32), (E4M3, E4M3)])
def test_get_format_by_name(name, fmt):
    assert get_format(name) is fmt


def test_unknown_format_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown format 'fp7'.*e4m3.*fp16"):
        get_format("fp7")
    with pytest.raises(TypeError):
        get_format(16)


# --- bit patterns: every code of every small format ------------------------------------------
@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_decode_every_code_matches_ml_dtypes(fmt):
    codes = np.arange(2**fmt.bits, dtype=np.uint32)
    reference = codes.astype(np.uint16 if fmt.bits > 8 else np.uint8).view(ML_DTYPES[fmt])
    assert np.all(same(decode(codes, fmt), reference.astype(np.float32)))


@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_every_code_round_trips(fmt):
    codes = np.arange(2**fmt.bits, dtype=np.uint32)
    values = decode(codes, fmt)
    numbers = ~np.isnan(values)
    assert np.array_equal(encode(values[numbers], fmt), codes[numbers])      # -0 keeps its sign
    assert np.array_equal(decode(encode(values[numbers], fmt), fmt), values[numbers])
    if fmt.has_nan:
        assert np.all(np.isnan(decode(encode(values[~numbers], fmt), fmt)))


@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_encode_matches_ml_dtypes_bit_patterns(fmt):
    x = random_inputs(50_000)
    x = x[~ml_dtypes_deviations(x, fmt) & ~np.isnan(x)]
    codes = encode(x, fmt)
    reference = ml_dtypes_round(x, fmt).astype(ML_DTYPES[fmt]).view(codes.dtype)
    numbers = ~np.isnan(ml_dtypes_round(x, fmt))
    assert np.array_equal(codes[numbers], reference[numbers])


def test_encode_refuses_nan_where_there_is_no_code_for_it():
    with pytest.raises(ValueError, match="no NaN"):
        encode(np.float32([1.0, np.nan]), E2M1)


def test_encode_and_decode_return_the_input_kind():
    assert encode(1.5, E4M3) == 0x3C and isinstance(encode(1.5, E4M3), int)
    assert decode(0x3C, E4M3) == 1.5
    assert encode(torch.tensor([1.5]), E4M3).dtype == torch.int64
    assert encode(np.float32([1.5]), FP16).dtype == np.uint16
    with pytest.raises(ValueError, match=r"\[0, 2\*\*8\)"):
        decode(np.array([256]), E4M3)
    with pytest.raises(TypeError, match="integer codes"):
        decode(np.float32([1.0]), E4M3)


# --- round_to against the production casts ---------------------------------------------------
@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_round_to_equals_ml_dtypes_on_boundaries_and_random_inputs(fmt):
    x = np.concatenate([boundary_inputs(fmt) if fmt.bits <= 16 else [], random_inputs()])
    x = x.astype(np.float32)
    expected, got = ml_dtypes_round(x, fmt), round_to(x, fmt)
    agree = same(got, expected) | ml_dtypes_deviations(x, fmt)
    assert agree.all(), f"{(~agree).sum()} mismatches, first at x={x[~agree][:3]}"


@pytest.mark.parametrize("fmt", list(ML_DTYPES), ids=ids)
def test_where_ml_dtypes_deviates_round_to_is_the_exact_reference(fmt):
    x = np.concatenate([random_inputs(20_000), np.float32([np.nan]),
                        np.linspace(2.0**-127, 2.0**-126, 1001, dtype=np.float32)])
    odd = x[ml_dtypes_deviations(x, fmt)]
    expected = np.float32([round_scalar(v, fmt) for v in odd])
    assert np.all(same(round_to(odd, fmt), expected))


def test_ml_dtypes_e8m0_subnormal_quirk_is_real():
    """If ml_dtypes fixes this, ml_dtypes_deviations should drop it."""
    x = np.float32([1.25 * 2.0**-127])
    assert ml_dtypes_round(x, E8M0)[0] == 2.0**-126
    assert round_to(x, E8M0)[0] == 2.0**-127 == round_scalar(float(x[0]), E8M0)


@pytest.mark.parametrize("fmt", list(TORCH_DTYPES), ids=ids)
def test_round_to_equals_torch_casts(fmt):
    """torch 2.13 saturates E4M3 overflow (to ±448) where torch 2.11 and ml_dtypes give NaN:
    saturate=True reproduces torch 2.13, saturate=False torch 2.11 and ml_dtypes. E5M2, FP16, BF16
    overflow to inf."""
    x = torch.from_numpy(np.concatenate([boundary_inputs(fmt), random_inputs()]))
    expected = x.to(TORCH_DTYPES[fmt]).float()
    saturate = fmt is E4M3 and torch_e4m3_saturates()
    assert torch.equal(torch.isnan(expected), torch.isnan(round_to(x, fmt, saturate=saturate)))
    finite = ~torch.isnan(expected)
    assert torch.equal(round_to(x, fmt, saturate=saturate)[finite], expected[finite])


def test_e4m3_overflow_torch_2_13_saturates_torch_2_11_and_ml_dtypes_give_nan():
    x = np.float32([500.0, -1e6, np.inf])
    torch_e4m3 = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    if torch_e4m3_saturates():
        assert torch_e4m3.tolist() == [448.0, -448.0, 448.0] == round_to(x, E4M3, saturate=True).tolist()
    else:
        assert np.all(np.isnan(torch_e4m3))
    assert np.all(np.isnan(ml_dtypes_round(x, E4M3))) and np.all(np.isnan(round_to(x, E4M3)))
    assert round_to(x, E4M3, saturate=True).tolist() == [448.0, -448.0, 448.0]  # on any torch


def test_encode_and_decode_do_not_rest_on_an_exact_ldexp(monkeypatch):
    """On an H200 with torch 2.11, encode built on torch.ldexp gave 144 the E4M3 code of 128: the
    power of two it multiplied by was not exact there. An ldexp a little short stands in for it."""
    real = torch.ldexp
    monkeypatch.setattr(torch, "ldexp", lambda x, e, **kwargs: real(x, e, **kwargs) * (1 - 2.0**-52))
    for fmt in (E4M3, E5M2, BF16, E2M1):
        codes = encode(fmt.values(), fmt).astype(np.int64)
        assert np.array_equal(decode(codes, fmt), fmt.values())
        assert np.array_equal(codes, encode(fmt.values().astype(np.float64), fmt).astype(np.int64))
    assert encode(144.0, E4M3) == 0x71 and decode(0x71, E4M3) == 144.0


# --- round_to against the exact scalar reference ---------------------------------------------
@pytest.mark.parametrize("rounding", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_round_to_equals_exact_reference_for_float64_and_float32(fmt, rounding, saturate):
    rng = np.random.default_rng(1)
    x64 = np.concatenate([
        rng.choice([-1, 1], 3000) * 2.0 ** rng.uniform(-160, 130, 3000),
        np.float64([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1e300, -1e300]),
        boundary_inputs(fmt)[::97].astype(np.float64) if fmt.bits <= 16 else [],
    ])
    x64 = np.concatenate([x64, x64 * (1 + 2.0**-40)])  # just past ties: float64 must see them
    for x in (x64, x64.astype(np.float32)):
        expected = np.float32([round_scalar(v, fmt, rounding=rounding, saturate=saturate) for v in x])
        got = round_to(x, fmt, rounding=rounding, saturate=saturate)
        assert np.all(same(got, expected)), x[~same(got, expected)][:5]


def test_float64_is_rounded_once_not_through_float32():
    x = 1 + 2.0**-4 + 2.0**-30  # just above the tie between 1 and 1.125 in E4M3
    assert round_to(np.float64([x]), E4M3)[0] == 1.125
    assert round_to(np.float32([x]), E4M3)[0] == 1.0  # float32 already rounded it to the tie
    assert round_to(x, E4M3) == 1.125


def test_tf32_keeps_fp32_range_and_subnormals():
    x = np.float32([3 * 2.0**-136, 2.0**-138, 1.0 + 2.0**-11 + 2.0**-20, 3e38])
    got = round_to(x, TF32)
    assert got[0] == 3 * 2.0**-136 and got[1] == 0.0 and got[2] == 1.0 + 2.0**-10 and np.isfinite(got[3])


# --- overflow, saturation and special values -------------------------------------------------
@pytest.mark.parametrize("fmt,overflow", [(FP16, math.inf), (BF16, math.inf), (E5M2, math.inf),
                                          (E4M3, math.nan), (E2M1, 6.0)], ids=str)
def test_overflow_follows_the_format(fmt, overflow):
    x = np.float32([fmt.max_value * 4, np.inf, np.nan])
    got = round_to(x, fmt)
    assert same(got[:2], np.float32([overflow] * 2)).all() and np.isnan(got[2])
    saturated = round_to(-x, fmt, saturate=True)
    assert np.array_equal(saturated[:2], np.float32([-fmt.max_value] * 2)) and np.isnan(saturated[2])


def test_toward_zero_never_overflows_a_finite_value():
    assert round_to(np.float32([1e6, np.inf]), FP16, rounding="toward_zero")[0] == 65504
    assert round_to(np.float32([np.inf]), FP16, rounding="toward_zero")[0] == np.inf


def test_e8m0_has_no_sign_and_no_zero():
    got = round_to(np.float32([0.0, -1.0, 1e-45, 3.0, 2.0**128]), E8M0)
    assert np.isnan(got[[0, 1, 4]]).all() and got[2] == 2.0**-127 and got[3] == 4.0


# --- stochastic rounding ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt,x", [(BF16, 1 + 0.3 * 2.0**-7), (FP16, -3.3e-9), (E4M3, 300.0),
                                   (E2M1, 0.1), (FP16, 2.0**-40)], ids=str)
def test_stochastic_rounding_is_unbiased_and_stays_between_neighbours(fmt, x):
    n = 200_000
    draws = round_to(np.full(n, x), fmt, rounding="stochastic", generator=np.random.default_rng(2))
    lower = round_scalar(x, fmt, rounding="toward_zero")
    upper = round_scalar(x, fmt, rounding="stochastic", uniform=0.0)
    assert set(np.unique(draws)) <= {lower, upper}
    p = (x - lower) / (upper - lower)
    standard_error = abs(upper - lower) * math.sqrt(p * (1 - p) / n)
    assert abs(draws.astype(np.float64).mean() - x) < 5 * standard_error + 1e-300


def test_stochastic_rounding_is_reproducible_with_a_generator():
    x = torch.linspace(1, 2, 1000)
    a = round_to(x, BF16, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    b = round_to(x, BF16, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    c = round_to(x, BF16, rounding="stochastic", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    n = round_to(x.numpy(), BF16, rounding="stochastic", generator=np.random.default_rng(7))
    assert np.array_equal(n, round_to(x.numpy(), BF16, rounding="stochastic",
                                      generator=np.random.default_rng(7)))


# --- what round_to takes and gives -----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_torch_input_keeps_shape_device_and_is_not_modified(dtype):
    x = torch.randn(3, 4, dtype=torch.float64).to(dtype).requires_grad_()
    before = x.detach().clone()
    y = round_to(x, "e4m3")
    assert (y.shape, y.dtype, y.device, y.requires_grad) == (x.shape, torch.float32, x.device, False)
    assert torch.equal(x.detach(), before)
    assert torch.equal(y, x.detach().to(torch.float8_e4m3fn).float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_input_stays_on_the_gpu_and_matches_cpu():
    x = torch.from_numpy(random_inputs(10_000))
    for fmt in (BF16, E4M3, E8M0):
        for rounding in ["nearest_even", "toward_zero"]:
            y = round_to(x.cuda(), fmt, rounding=rounding)
            assert y.is_cuda
            assert np.all(same(y.cpu().numpy(), round_to(x, fmt, rounding=rounding).numpy()))
    codes = encode(x.cuda(), E4M3)
    assert codes.is_cuda and torch.equal(codes.cpu(), encode(x, E4M3))
    assert np.all(same(decode(codes, E4M3).cpu().numpy(), decode(codes.cpu(), E4M3).numpy()))
    g = torch.Generator(device="cuda").manual_seed(0)
    y = round_to(torch.full((1000,), 1 + 2.0**-10, device="cuda"), BF16, rounding="stochastic", generator=g)
    assert y.is_cuda and set(y.unique().tolist()) == {1.0, 1 + 2.0**-7}


def test_numpy_input_and_scalars():
    x = np.float64([[0.1, 0.2]])
    copy = x.copy()
    y = round_to(x, "bf16")
    assert y.dtype == np.float32 and y.shape == (1, 2) and np.array_equal(x, copy)
    assert round_to(np.float16([0.1]), BF16)[0] == round_to(float(np.float16(0.1)), BF16)
    assert round_to(x.astype(ml_dtypes.bfloat16), "bf16").dtype == np.float32
    assert isinstance(round_to(0.1, "fp16"), float) and round_to(3, "e2m1") == 3.0
    assert round_to(np.float32([]), FP16).shape == (0,)
    assert round_to(torch.empty(0, 3), FP16).shape == (0, 3)


@pytest.mark.parametrize("bad,error,message", [
    (np.arange(3), TypeError, "floating-point array"),
    (torch.arange(3), TypeError, "floating-point tensor"),
    (np.array([True]), TypeError, "floating-point array"),
    (True, TypeError, "real numbers"),
    (1 + 2j, TypeError, "real numbers"),
    (np.array([1 + 2j]), TypeError, "floating-point array"),
    ([0.1, 0.2], TypeError, "np.asarray"),
    ("0.1", TypeError, "NumPy array"),
])
def test_bad_inputs_get_a_clear_error(bad, error, message):
    with pytest.raises(error, match=message):
        round_to(bad, FP16)


@pytest.mark.parametrize("call", [describe, round_scalar], ids=["describe", "round_scalar"])
def test_scalar_functions_refuse_what_is_not_a_number(call):
    for bad in ("0.1", [0.1], None, True):
        with pytest.raises(TypeError, match="real number"):
            call(bad, FP16)


@pytest.mark.parametrize("call", [describe, round_scalar, round_to])
def test_an_int_too_large_for_float64_is_a_clear_error(call):
    with pytest.raises(ValueError, match="too large even for float64"):
        call(10**400, FP16)


def test_bad_options_get_a_clear_error():
    x = np.float32([1.0])
    with pytest.raises(ValueError, match="unknown format"):
        round_to(x, "fp12")
    with pytest.raises(ValueError, match="choose one of nearest_even"):
        round_to(x, FP16, rounding="nearest")
    with pytest.raises(ValueError, match="only used with rounding='stochastic'"):
        round_to(x, FP16, generator=np.random.default_rng())
    with pytest.raises(TypeError, match="numpy.random"):
        round_to(x, FP16, rounding="stochastic", generator=torch.Generator())
    with pytest.raises(TypeError, match="torch.Generator"):
        round_to(torch.ones(1), FP16, rounding="stochastic", generator=np.random.default_rng())


# --- describe ------------------------------------------------------------------------------
@pytest.mark.parametrize("value,fmt,kind", [(1.5, E4M3, "normal"), (1e-7, FP16, "subnormal"),
                                            (0.0, BF16, "zero"), (1e6, FP16, "infinity"),
                                            (1e6, E4M3, "NaN"), (3.0, E8M0, "normal")])
def test_describe_names_the_kind_and_the_stored_value(value, fmt, kind):
    text = describe(value, fmt)
    assert f"kind      {kind}\n" in text
    stored = round_to(value, fmt)
    assert f"value     {stored!r}" in text
    assert f"0x{encode(value, fmt):0{(fmt.bits + 3) // 4}X}" in text
    assert ("rounded from" in text) == (not stored == value)  # NaN never equals the input


def test_describe_shows_the_bit_fields():
    assert "0 0111 100" in describe(1.5, E4M3)  # sign, exponent 7 (= bias), mantissa .100


def test_no_format_is_special_cased_by_name():
    """round_to reads the format's fields; a renamed copy rounds identically."""
    import dataclasses
    twin = dataclasses.replace(E4M3, name="my_fp8", aliases=())
    x = random_inputs(10_000)
    assert np.all(same(round_to(x, twin), round_to(x, E4M3)))


@pytest.mark.parametrize("fmt,rounding", [(BF16, "toward_zero"), (BF16, "stochastic"), (TF32, "nearest_even"),
                                          (FP32, "toward_zero"), (FP32, "stochastic")])
def test_auto_route_rechecks_after_set_flush_denormal(fmt, rounding):
    # The fast-path check is cached; it used to be keyed without the CPU's flush-denormal state,
    # so a check passed with it off kept "gaps" after torch.set_flush_denormal(True): NaN for
    # float32 subnormals. Compare bit patterns (printing would flush them too).
    x = torch.tensor([3e-39, -2e-39, 2.0**-149, 1e-5, -3.0])
    def draws():
        return torch.Generator().manual_seed(0) if rounding == "stochastic" else None
    round_to(x, fmt, rounding=rounding, generator=draws())  # the check, cached with flushing off
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        auto = round_to(x, fmt, rounding=rounding, generator=draws())
        bits = round_to(x, fmt, rounding=rounding, generator=draws(), method="bits")
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(auto.view(torch.int32), bits.view(torch.int32))
    assert not auto.isnan().any()


def test_bit_level_route_reads_float32_subnormals_with_flush_denormal_on():
    # E8M0's carrier is float64; the float32 -> float64 cast reads subnormals as zero when the CPU
    # flushes denormals, and E8M0, which has no zero, gave NaN. Build the inputs from their bits
    # (creating them from Python floats would flush them too).
    x = torch.tensor([0x00200000, 0x00600000, 0x00000001, -0x7FA00000], dtype=torch.int32).view(torch.float32)
    expected = round_to(x.abs(), E8M0, method="bits")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        flushed = round_to(x.abs(), E8M0, method="bits")
        default = round_to(x.abs(), E8M0)
    finally:
        torch.set_flush_denormal(False)
    assert not expected.isnan().any()
    assert torch.equal(flushed.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(default.view(torch.int32), expected.view(torch.int32))
