"""mpcourse.fp8 quantization and scaling, checked against independent references: torch's and
ml_dtypes' casts for the rounded values, amaxes taken group by group with plain slicing, the MX
exponent rule from math.frexp, NVIDIA's NVFP4 formula, and the E8M0/E4M3 codecs of
mpcourse.formats for the hardware scales."""
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mpcourse.formats import E2M1, E2M3, E3M2, E4M3, E5M2, E8M0, decode, encode, round_to
from mpcourse.fp8 import (CurrentScaling, DelayedScaling, QuantizedTensor, amax_to_scale,
                          mx_shared_exponent, quantize)

ML = {E4M3: ml_dtypes.float8_e4m3fn, E5M2: ml_dtypes.float8_e5m2, E3M2: ml_dtypes.float6_e3m2fn,
      E2M3: ml_dtypes.float6_e2m3fn, E2M1: ml_dtypes.float4_e2m1fn}


def sample(*shape, seed=0):
    """Normal values times log-uniform magnitudes over 2**-12 .. 2**6: normals and subnormals."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2.0 ** (torch.rand(*shape, generator=g) * 18 - 12)


def cast_reference(scaled: torch.Tensor, fmt) -> torch.Tensor:
    """Saturating round to nearest by ml_dtypes (an independent implementation), as float32."""
    clamped = scaled.clamp(-fmt.max_value, fmt.max_value).numpy()
    return torch.from_numpy(clamped.astype(ML[fmt]).astype(np.float32))


def loop_amax(x: torch.Tensor, group_shape) -> torch.Tensor:
    """One amax per group, by slicing group after group (2-D x only)."""
    (M, K), (gm, gk) = x.shape, group_shape
    out = torch.empty(M // gm, K // gk)
    for i in range(M // gm):
        for j in range(K // gk):
            out[i, j] = x[i * gm:(i + 1) * gm, j * gk:(j + 1) * gk].abs().max()
    return out


# --- the convention: scale multiplies x, data = round(x * scale), dequantize = data / scale -------
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=str)
def test_per_tensor_matches_torch_float8_cast(fmt):
    x = sample(64, 96)
    q = quantize(x, fmt.name)
    scale = torch.tensor(fmt.max_value, dtype=torch.float32) / x.abs().max()
    assert q.scale.shape == () and q.scale.dtype == torch.float32 and q.scale == scale
    assert q.data.dtype == {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}[fmt]
    torch_cast = (x * scale).clamp(-fmt.max_value, fmt.max_value).to(q.data.dtype)
    assert torch.equal(q.data.view(torch.uint8), torch_cast.view(torch.uint8))
    assert torch.equal(q.dequantize(), q.data.float() / scale)
    assert q.data.float().abs().max() == fmt.max_value  # amax lands on the largest value


GROUPINGS = {  # kwargs -> the group shape of a (256, 256) tensor
    "tensor": (dict(), (256, 256)),
    "channel-rows": (dict(granularity="channel", axis=0), (1, 256)),
    "channel-cols": (dict(granularity="channel", axis=1), (256, 1)),
    "block-1x128": (dict(granularity="block", block_size=128), (1, 128)),
    "block-128x1": (dict(granularity="block", block_size=128, axis=0), (128, 1)),
    "tile-128x128": (dict(granularity="block", block_size=(128, 128)), (128, 128)),
    "tile-64x32": (dict(granularity="block", block_size=[64, 32]), (64, 32)),
}


@pytest.mark.parametrize("name", GROUPINGS)
@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M3], ids=str)
def test_every_group_gets_max_over_its_own_amax(name, fmt):
    kwargs, group_shape = GROUPINGS[name]
    x = sample(256, 256, seed=1)  # 256: room for two 128x128 tiles each way
    q = quantize(x, fmt, **kwargs)
    amax = loop_amax(x, group_shape)
    assert q.group_shape == group_shape
    expected_scale = torch.tensor(fmt.max_value, dtype=torch.float32) / amax
    assert torch.equal(q.scale, expected_scale.reshape(q.scale.shape))
    assert torch.equal(q.amax, amax.reshape(q.amax.shape))
    per_element = expected_scale.repeat_interleave(group_shape[0], 0).repeat_interleave(group_shape[1], 1)
    assert torch.equal(q.data.float(), cast_reference(x * per_element, fmt))
    assert torch.equal(q.dequantize(), q.data.float() / per_element)


def test_scale_shapes_follow_the_contract():
    x = sample(128, 256)
    assert quantize(x).scale.shape == ()
    assert quantize(x, granularity="channel", axis=0).scale.shape == (128, 1)
    assert quantize(x, granularity="channel", axis=-1).scale.shape == (1, 256)
    assert quantize(x, granularity="block", block_size=128).scale.shape == (128, 2)
    assert quantize(x, granularity="block", block_size=(128, 128)).scale.shape == (1, 2)
    assert quantize(x, granularity="mx").scale.shape == (128, 8)
    assert quantize(x, granularity="nvfp4").scale.shape == (128, 16)
    x3 = sample(4, 6, 8)  # channel: one scale per index along axis, amax over all the others
    q = quantize(x3, granularity="channel", axis=-1)
    assert q.scale.shape == (1, 1, 8)
    assert torch.equal(q.amax.reshape(-1), x3.abs().amax(dim=(0, 1)))
    q = quantize(x3, granularity="block", block_size=(2, 4))
    assert q.scale.shape == (4, 3, 2) and q.dequantize().shape == x3.shape


def test_finer_groups_survive_an_outlier():
    """One value 10**6 times the rest: one scale per tensor pushes the rest below E4M3's smallest
    subnormal, one per 1x128 block keeps every other block within E4M3's unit roundoff."""
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(8, 256, generator=g) + 0.5) * torch.where(torch.rand(8, 256, generator=g) < 0.5, -1, 1)
    x[0, 0] = 1e6
    rest = torch.ones_like(x, dtype=torch.bool)
    rest[0, :128] = False  # everything outside the outlier's block
    per_tensor = (quantize(x).dequantize() - x).abs() / x.abs()
    per_block = (quantize(x, granularity="block", block_size=128).dequantize() - x).abs() / x.abs()
    assert per_block[rest].max() <= E4M3.epsilon / 2
    assert per_tensor[rest].median() > 0.5  # most values flushed to zero or nearly


def test_all_zero_groups_get_scale_one():
    x = sample(4, 64)
    x[1] = 0.0
    for kwargs in (dict(granularity="channel", axis=0), dict(granularity="block", block_size=32)):
        q = quantize(x, **kwargs)
        assert torch.all(q.scale[1] == 1.0) and torch.all(q.data[1].float() == 0)
        assert torch.equal(q.dequantize()[1], x[1])
    for kwargs in (dict(), dict(granularity="mx"), dict(granularity="nvfp4")):
        q = quantize(torch.zeros(4, 64), **kwargs)
        assert torch.all(q.scale == 1.0) and torch.all(q.dequantize() == 0)


def test_explicit_scale_saturates_instead_of_overflowing():
    x = torch.tensor([[1.0, -3.0, 500.0, 0.01]])
    q = quantize(x, "e4m3", scale=2.0)
    assert torch.equal(q.data.float(), cast_reference(x * 2.0, E4M3))
    assert q.data.float()[0, 2] == 448 and q.amax == 500
    q = quantize(x, "e5m2", scale=torch.tensor(1e3))
    assert q.data.float()[0, 2] == E5M2.max_value  # 5e5 saturates to 57344, not inf
    for bad in (0.0, -1.0, math.nan, math.inf, torch.ones(2)):
        with pytest.raises(ValueError, match="scale"):
            quantize(x, scale=bad)


def test_inputs_in_other_dtypes_and_the_transpose():
    x = sample(32, 64)
    assert torch.equal(quantize(x.bfloat16()).data.float(), quantize(x.bfloat16().float()).data.float())
    assert torch.equal(quantize(x.double()).scale, quantize(x).scale)
    q = quantize(x, granularity="block", block_size=(8, 16))
    qt = q.t()
    assert qt.shape == (64, 32) and qt.group_shape == (16, 8) and qt.scale.shape == (4, 4)
    assert torch.equal(qt.dequantize(), q.dequantize().t())
    assert isinstance(qt, QuantizedTensor) and "block" in repr(qt)


def test_stochastic_rounding_is_reproducible_and_unbiased():
    x = torch.full((20000,), 1.0 + 2.0**-5)  # a quarter of the way from 1 to 1.125 (E4M3)
    q1 = quantize(x, scale=1.0, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    q2 = quantize(x, scale=1.0, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    assert torch.equal(q1.data.float(), q2.data.float())
    assert set(q1.data.float().unique().tolist()) == {1.0, 1.125}
    assert abs(q1.dequantize().double().mean().item() - (1 + 2.0**-5)) < 0.002  # ~6 sigma


# --- MX -------------------------------------------------------------------------------------
def spec_exponent(amax: float, fmt) -> int:
    """OCP MX v1.0: floor(log2(amax)) - emax_elem, with math.frexp; 0 for an all-zero block."""
    if amax == 0:
        return 0
    return max(math.frexp(amax)[1] - 1 - fmt.emax, -127)


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E3M2, E2M3, E2M1], ids=str)
def test_mx_floor_follows_the_spec(fmt):
    x = sample(16, 128, seed=4)
    x[3, :32] = 0.0
    q = quantize(x, fmt, granularity="mx")
    amax = loop_amax(x, (1, 32))
    exponents = torch.tensor([[spec_exponent(float(a), fmt) for a in row] for row in amax])
    assert torch.equal(q.scale, torch.pow(2.0, -exponents.double()).float())
    assert q.scale_e8m0.dtype == torch.uint8 and torch.equal(q.scale_e8m0.long(), exponents + 127)
    # the stored codes are E8M0's own: they decode to 1 / scale and 1 / scale encodes to them
    assert torch.equal(decode(q.scale_e8m0.long(), E8M0), 1 / q.scale)
    assert torch.equal(encode(1 / q.scale, E8M0), q.scale_e8m0.long())
    assert torch.equal(q.scale_e8m0.view(torch.float8_e8m0fnu).float(), 1 / q.scale)
    per_element = q.scale.repeat_interleave(32, 1)
    assert torch.equal(q.data.float(), cast_reference(x * per_element, fmt))
    assert q.data.dtype == (torch.float8_e4m3fn if fmt == E4M3 else torch.float8_e5m2 if fmt == E5M2
                            else torch.float32)


@pytest.mark.parametrize("fmt", [E4M3, E2M1], ids=str)
def test_mx_rceil_never_saturates_and_is_the_smallest_such_power(fmt):
    x = sample(64, 64, seed=5)
    x[0, :32] = torch.linspace(-1, 1, 32) * 1.9 * 2.0**fmt.emax  # saturates under floor
    floor = quantize(x, fmt, granularity="mx")
    ceil = quantize(x, fmt, granularity="mx", scale_rounding="rceil")
    blocks = lambda q: (x * q.scale_per_element()).abs().reshape(64, 2, 32).amax(-1)  # noqa: E731
    assert blocks(floor)[0, 0] > fmt.max_value  # floor: this block's max saturates
    assert blocks(ceil).max() <= fmt.max_value  # ceil: none does
    assert torch.all(2 * blocks(ceil) > fmt.max_value)  # one binade less would saturate
    assert torch.all((ceil.scale == floor.scale) | (ceil.scale == floor.scale / 2))


def test_mx_rounding_up_is_named_rceil_and_ceil_is_refused_as_torchaos_other_rule():
    # torchao: CEIL is 2**(ceil(log2 amax) - emax), RCEIL 2**ceil(log2(amax / max)); at amax 300 in E4M3
    # they differ (E = 1 and E = 0). Ours is RCEIL: 300 fits under 448 without moving a binade.
    assert mx_shared_exponent(torch.tensor([300.0, 449.0]), E4M3, "rceil").tolist() == [0, 1]
    with pytest.raises(ValueError, match="rceil"):
        mx_shared_exponent(torch.tensor([300.0]), E4M3, "ceil")
    with pytest.raises(ValueError, match="rceil"):
        quantize(torch.ones(1, 32), granularity="mx", scale_rounding="ceil")


def test_mx_shared_exponent_at_the_edges_of_e8m0():
    amax = torch.tensor([0.0, 2.0**-149, 2.0**-140, 1.0, 448.0, 449.0, 3.0e38])
    floor = mx_shared_exponent(amax, E4M3)
    ceil = mx_shared_exponent(amax, E4M3, "rceil")
    assert floor.tolist() == [0, -127, -127, -8, 0, 0, 119]
    assert ceil.tolist() == [0, -127, -127, -8, 0, 1, 120]
    x = torch.full((1, 32), 2.0**-140)  # far below E8M0's 2**-127: clamped, stored as zeros
    q = quantize(x, granularity="mx")
    assert q.scale_e8m0.tolist() == [[0]] and torch.isfinite(q.dequantize()).all()


# --- NVFP4 ----------------------------------------------------------------------------------
def test_nvfp4_two_level_scales():
    x = sample(8, 64, seed=6)
    q = quantize(x, granularity="nvfp4")
    assert q.fmt == E2M1 and q.group_shape == (1, 16)
    tensor_scale = x.abs().max() / torch.tensor(448.0 * 6.0)
    assert q.tensor_scale == tensor_scale  # NVIDIA: amax / (E4M3 max * E2M1 max)
    block = q.scale_e4m3.float()
    wanted = loop_amax(x, (1, 16)) / 6 / tensor_scale
    assert torch.equal(block, cast_reference(wanted, E4M3))  # E4M3-rounded, as hardware stores it
    assert torch.equal(encode(block, E4M3), q.scale_e4m3.view(torch.uint8).long())
    assert block.max() == 448 and q.scale_e4m3.dtype == torch.float8_e4m3fn
    assert set(q.data.unique().tolist()) <= set(E2M1.values().tolist())
    # x ≈ element × block scale × tensor scale, and scale is that product's reciprocal
    hardware = q.data * block.repeat_interleave(16, 1) * tensor_scale
    assert torch.allclose(q.dequantize(), hardware, rtol=2.0**-21, atol=0)
    assert torch.equal(q.scale, 1 / (block * tensor_scale))
    # E2M1's widest gap is 2 (4 to 6) at a block maximum near 6: an error of at most 1/6 of the
    # block maximum, plus a little where the E4M3 block scale rounded down and 6 saturated
    block_max = loop_amax(x, (1, 16)).repeat_interleave(16, 1)
    assert ((q.dequantize() - x).abs() <= 0.25 * block_max).all()


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("x, kwargs, error, match", [
    (torch.ones(4, dtype=torch.int32), {}, TypeError, "floating-point"),
    (torch.ones(4, dtype=torch.bool), {}, TypeError, "floating-point"),
    (np.ones(4, dtype=np.float32), {}, TypeError, "torch tensor"),
    (torch.ones(0, 4), {}, ValueError, "empty"),
    (torch.tensor([1.0, math.nan]), {}, ValueError, "NaN"),
    (torch.tensor([1.0, -math.inf]), dict(granularity="mx"), ValueError, "infinity"),
    (torch.ones(4), dict(fmt="e9m9"), ValueError, "unknown format"),
    (torch.ones(4), dict(fmt="e8m0"), ValueError, "scale format"),
    (torch.ones(4), dict(granularity="row"), ValueError, "unknown granularity"),
    (torch.ones(4, 100), dict(granularity="block", block_size=32), ValueError, "not a multiple"),
    (torch.ones(100, 32), dict(granularity="block", block_size=(32, 32)), ValueError, "not a multiple"),
    (torch.ones(4, 48), dict(granularity="mx"), ValueError, "not a multiple"),
    (torch.ones(4, 32), dict(granularity="block"), ValueError, "needs block_size"),
    (torch.ones(4, 32), dict(granularity="block", block_size=0), ValueError, "positive int"),
    (torch.ones(4, 32), dict(granularity="block", block_size=(2, 2, 2)), ValueError, "pair"),
    (torch.ones(4, 32), dict(granularity="mx", block_size=(2, 2)), ValueError, "positive int"),
    (torch.ones(4, 32), dict(block_size=32), ValueError, "block_size applies"),
    (torch.ones(4, 32), dict(granularity="channel", scale=2.0), ValueError, "scale="),
    (torch.ones(4, 32), dict(granularity="block", block_size=8, scale_rounding="ceil"), ValueError,
     "'power_of_two' or None"),
    (torch.ones(4, 32), dict(granularity="channel", scale_rounding="ceil"), ValueError,
     "applies to granularity=.mx. and .block. only"),
    (torch.ones(4, 32), dict(granularity="mx", scale_rounding="up"), ValueError, "unknown MX scale"),
    (torch.ones(4, 32), dict(granularity="mx", fmt="fp16"), ValueError, "MX element formats"),
    (torch.ones(4, 32), dict(granularity="nvfp4", fmt="e4m3"), ValueError, "E2M1"),
    (torch.ones(4, 32), dict(granularity="channel", axis=2), ValueError, "axis"),
    (torch.ones(32), dict(granularity="block", block_size=(4, 4)), ValueError, "2-D tiles"),
    (torch.ones(8, 8), dict(granularity="block", block_size=(4, 4), axis=0), ValueError, "axis"),
])
def test_bad_input_gets_a_sentence(x, kwargs, error, match):
    kwargs = dict(kwargs)
    fmt = kwargs.pop("fmt", None)
    with pytest.raises(error, match=match):
        quantize(x, fmt, **kwargs)


# --- delayed and current scaling -------------------------------------------------------------
def test_delayed_scaling_uses_the_history_before_this_step():
    scaling = DelayedScaling("e4m3", amax_history_len=3)
    assert scaling.scale == 1.0 and len(scaling.amax_history) == 0  # nothing recorded yet
    amaxes = [10.0, 40.0, 5.0, 2.0, 1.0]
    for step, amax in enumerate(amaxes):
        x = torch.tensor([amax, -amax / 3])
        expected = 1.0 if step == 0 else 448 / max(amaxes[max(0, step - 3):step])
        assert scaling.scale == pytest.approx(expected, rel=1e-7)
        q = scaling.quantize(x)
        assert q.scale == pytest.approx(expected, rel=1e-7)  # used the scale from before x
        assert scaling.amax_history.tolist() == amaxes[max(0, step - 2):step + 1]
    assert scaling.scale == pytest.approx(448 / 5.0, rel=1e-7)  # window of 3: 5, 2, 1


def test_delayed_scaling_options():
    recent = DelayedScaling("e5m2", amax_compute_algo="most_recent", margin=2)
    for amax in (100.0, 1.0):
        recent.update(amax)
    assert recent.scale == pytest.approx(57344 / 1.0 / 4)
    recent.update(torch.tensor(0.0))  # all-zero step: keep the previous scale
    assert recent.scale == pytest.approx(57344 / 4)
    assert torch.equal(amax_to_scale(torch.tensor([0.0, 2.0, 1e-45]), "e4m3"),
                       torch.tensor([1.0, 224.0, torch.finfo(torch.float32).max]))
    for bad in (dict(amax_history_len=0), dict(amax_compute_algo="mean"), dict(margin=0.5)):
        with pytest.raises((ValueError, TypeError)):
            DelayedScaling(**bad)
    with pytest.raises(ValueError, match="finite"):
        recent.update(math.inf)


def test_current_scaling_is_quantize_with_the_tensors_own_amax():
    x = sample(16, 16)
    q = CurrentScaling("e5m2").quantize(x)
    assert torch.equal(q.data.view(torch.uint8), quantize(x, "e5m2").data.view(torch.uint8))
    assert q.scale == 57344 / x.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quantize_on_cuda_matches_cpu():
    x = sample(64, 256)
    for kwargs in (dict(), dict(granularity="block", block_size=128), dict(granularity="mx"),
                   dict(granularity="nvfp4")):
        cpu, gpu = quantize(x, **kwargs), quantize(x.cuda(), **kwargs)
        assert gpu.data.device.type == "cuda"
        assert torch.equal(gpu.dequantize().cpu(), cpu.dequantize())
    scaling = DelayedScaling()
    scaling.quantize(x.cuda())
    assert scaling.scale.device.type == "cuda"


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_the_fast_cast_rounds_as_round_to(fmt):
    """quantize casts E4M3/E5M2 with torch's own cast: the same values as round_to on every code,
    every midpoint between neighbours (ties), one float32 ulp either side, and beyond the max."""
    codes = torch.arange(256, dtype=torch.uint8).view({E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}[fmt]).float()
    grid = codes[torch.isfinite(codes)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, mids.nextafter(torch.tensor(math.inf)),
                   mids.nextafter(torch.tensor(-math.inf)), torch.tensor([fmt.max_value * 1.1, -1e9])])
    q = quantize(x, fmt, scale=1.0)
    assert torch.equal(q.data.float(), round_to(x, fmt, saturate=True))
