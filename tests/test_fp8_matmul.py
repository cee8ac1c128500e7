"""scaled_matmul against a float64 product of the dequantized operands (FP32 accumulation within
its error bound, float64 accumulation exactly), against PyTorch's FP8 product (F.scaled_mm, on the
tests' device: the CPU kernel of torch 2.13, which torch 2.11 lacks, or a GPU's tensor cores), and
its narrow accumulator against a scalar loop of round_scalar calls."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from mpcourse.formats import round_scalar
from mpcourse.fp8 import accumulator_format, native_fp8_support, native_scaled_mm, quantize, scaled_matmul
from tests.ml_reference import TORCH_VERSION

U32 = 2.0**-24  # float32's unit roundoff
U_TENSOR_CORE = 2.0**-13  # what one cut to 14 significant bits loses, at most (DeepSeek-V3, section 3.3.2)


def operands(M=32, K=256, N=48, seed=0):
    """a (M, K) and w (N, K), so that the product is a @ w.T, as in a linear layer."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g) * 2.0 ** (torch.rand(M, K, generator=g) * 8 - 4)
    w = torch.randn(N, K, generator=g) * 2.0 ** (torch.rand(N, K, generator=g) * 8 - 4)
    return a, w


def exact(q) -> torch.Tensor:
    """What a quantized tensor stands for, in float64 (data / scale without rounding)."""
    return q.data.double() / q.scale_per_element().double()


def fp32_bound(a_q, b_q) -> torch.Tensor:
    """Error bound of an FP32-accumulated product: K additions, then two roundings applying the
    scales and one promoting, each at most one unit roundoff of |a| @ |b|."""
    K = a_q.shape[1]
    return (K + 4) * U32 * (exact(a_q).abs() @ exact(b_q).abs())


def native_bound(a_q, b_q, device) -> torch.Tensor:
    """How far PyTorch's FP8 product on ``device`` may lie from the exact product. On a CPU it is an
    FP32 product (fp32_bound). Hopper's FP8 tensor cores add the products in groups, each aligned
    with the running sum to the group's largest exponent and cut to about 14 significant bits
    (DeepSeek-V3 measured about 14 on an H800), before the sum reaches FP32. Each cut loses less
    than 2**-13 of the largest magnitude in its group, at most sum |a||b|; with K products and the
    running sum once per group (of 16 or more products) there are at most K + K/16 + 1 cuts. A
    bound, not an estimate: an H200 stayed far inside it; a wrong scale, layout or operand breaks it."""
    bound = fp32_bound(a_q, b_q)
    if torch.device(device).type == "cuda":
        K = a_q.shape[1]
        bound = bound + (K + K // 16 + 1) * U_TENSOR_CORE * (exact(a_q).abs() @ exact(b_q).abs())
    return bound


def on(device, name, seed=0):
    """quantize_pair's operands, moved to ``device`` as they are (data, scales, amax)."""
    def moved(q):
        return replace(q, data=q.data.to(device), scale=q.scale.to(device), amax=q.amax.to(device))
    a_q, b_q = quantize_pair(name, seed)
    return moved(a_q), moved(b_q)


def needs_native(device):
    """Skip where PyTorch's FP8 product does not run on this device (torch 2.11 has no CPU kernel
    for its public scaled_mm; 2.13 has one; a GPU older than compute capability 8.9 has no FP8)."""
    supported, reason = native_fp8_support(device)
    if not supported:
        pytest.skip(f"PyTorch's FP8 product does not run here: {reason}")


PAIRS = {  # (a's quantize kwargs, w's) — w is quantized as (N, K) and transposed
    "tensor x tensor": (dict(), dict()),
    "row x column": (dict(granularity="channel", axis=0), dict(granularity="channel", axis=0)),
    "1x128 x 128x16 tiles": (dict(granularity="block", block_size=128),
                             dict(granularity="block", block_size=(16, 128))),
    "MXFP8 x MXFP8": (dict(granularity="mx"), dict(granularity="mx")),
    "MXFP4 x MXFP6": (dict(fmt="e2m1", granularity="mx"), dict(fmt="e3m2", granularity="mx")),
    "NVFP4 x NVFP4": (dict(granularity="nvfp4"), dict(granularity="nvfp4")),
    "E5M2 tensor x E4M3 rows": (dict(fmt="e5m2"), dict(granularity="channel", axis=0)),
    "per-K-column x tensor": (dict(granularity="channel", axis=1), dict()),
}


def quantize_pair(name, seed=0):
    a_kwargs, w_kwargs = (dict(k) for k in PAIRS[name])
    a, w = operands(seed=seed)
    a_q = quantize(a, a_kwargs.pop("fmt", None), **a_kwargs)
    w_q = quantize(w, w_kwargs.pop("fmt", None), **w_kwargs)
    return a_q, w_q.t()


@pytest.mark.parametrize("name", PAIRS)
def test_fp32_accumulation_is_within_its_error_bound(name):
    a_q, b_q = quantize_pair(name)
    reference = exact(a_q) @ exact(b_q)
    result = scaled_matmul(a_q, b_q)
    assert result.dtype == torch.float32 and result.shape == (32, 48)
    assert ((result.double() - reference).abs() <= fp32_bound(a_q, b_q)).all()


@pytest.mark.parametrize("name", ["MXFP8 x MXFP8", "MXFP4 x MXFP6", "per-K-column x tensor"])
def test_fp64_accumulation_is_exact_with_power_of_two_scales(name):
    a_q, b_q = quantize_pair(name)
    if a_q.granularity == "channel":  # make its scales powers of two too
        a_q = quantize(exact(a_q).float(), scale=2.0**3)
        b_q = quantize(exact(b_q).float(), scale=2.0**-2)
    result = scaled_matmul(a_q, b_q, accumulate="fp64", out_dtype=torch.float64)
    assert torch.equal(result, exact(a_q) @ exact(b_q))


@pytest.mark.parametrize("name", ["tensor x tensor", "row x column", "E5M2 tensor x E4M3 rows"])
def test_torch_scaled_mm_agrees_with_the_emulation(name, device):
    needs_native(device)
    a_q, b_q = on(device, name, seed=1)
    emulated = scaled_matmul(a_q, b_q, backend="emulate")
    if device.type == "cuda" and name != "tensor x tensor":  # the library uses per-tensor kernels only
        with pytest.raises(ValueError, match="per-tensor"):
            scaled_matmul(a_q, b_q, backend="torch")
        assert torch.equal(scaled_matmul(a_q, b_q), emulated)  # auto emulates
        return
    native = scaled_matmul(a_q, b_q, backend="torch")
    assert native.device == a_q.data.device
    # each is within its bound of the exact product (the emulation: FP32's)
    bound = native_bound(a_q, b_q, device).to(device) + fp32_bound(a_q, b_q).to(device)
    assert ((native.double() - emulated.double()).abs() <= bound).all()
    bf16 = scaled_matmul(a_q, b_q, backend="torch", out_dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16
    assert ((bf16.double() - native.double()).abs() <= 2.0**-8 * native.abs()).all()  # one rounding


def test_auto_emulates_on_cpu():
    """On a CPU PyTorch's FP8 product is itself an emulation (a slow one with oneDNN), where a
    torch has it at all: auto takes the exact emulation on any torch."""
    for name in ("tensor x tensor", "row x column"):
        a_q, b_q = quantize_pair(name)
        assert torch.equal(scaled_matmul(a_q, b_q), scaled_matmul(a_q, b_q, backend="emulate"))


def test_native_support_on_cpu_follows_the_torch_version():
    """torch 2.13's public scaled_mm runs on a CPU; torch 2.11's has no CPU kernel (it dispatches to
    aten::_scaled_mm_v2, which has none): backend="torch" then says so instead of failing deep."""
    supported, reason = native_fp8_support("cpu")
    if TORCH_VERSION >= (2, 13):
        assert supported and "CPU" in reason
    elif TORCH_VERSION == (2, 11):
        assert not supported and "no CPU kernel" in reason and torch.__version__ in reason
        with pytest.raises(ValueError, match="no CPU kernel.*backend='emulate' can"):
            scaled_matmul(*quantize_pair("tensor x tensor"), backend="torch")
    else:
        pytest.skip(f"torch {torch.__version__}: checked on 2.11 and 2.13 only")


@pytest.mark.skipif(TORCH_VERSION < (2, 13), reason="torch 2.11's public scaled_mm has no CPU kernel; "
                    "torch 2.13's has, and this test watches which one backend='torch' calls on a CPU")
def test_torch_means_the_public_scaled_mm(monkeypatch):
    """backend="torch" is torch 2.13's public F.scaled_mm, told each scale's kind; the private
    torch._scaled_mm only where a torch lacks the public one."""
    assert native_fp8_support("cpu")[0]  # probed once, before the functions are watched
    calls = []
    public = torch.nn.functional.scaled_mm
    monkeypatch.setattr(torch.nn.functional, "scaled_mm",
                        lambda *args, **kwargs: calls.append(args[3]) or public(*args, **kwargs))
    private = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kwargs: calls.append("private") or private(*args, **kwargs))
    a_q, b_q = quantize_pair("tensor x tensor")
    scaled_matmul(a_q, b_q)
    assert calls == []  # auto: the emulation on a CPU
    scaled_matmul(a_q, b_q, backend="torch")
    scaled_matmul(*quantize_pair("row x column"), backend="torch")
    ScalingType = torch.nn.functional.ScalingType
    assert calls == [ScalingType.TensorWise, ScalingType.RowWise]
    monkeypatch.delattr(torch.nn.functional, "scaled_mm")  # an older torch
    assert torch.equal(scaled_matmul(a_q, b_q, backend="torch"), native_scaled_mm(
        a_q.data, b_q.data.t().contiguous().t(), 1.0 / a_q.scale, 1.0 / b_q.scale))
    assert calls[2:] == ["private", "private"]


def sequential_reference(a_q, b_q, fmt, stretch):
    """The narrow-accumulator product, one element at a time: round_scalar after each addition
    within a stretch, then the scales applied and the partial sum added, in float32."""
    a_d, b_d = a_q.data.double().numpy(), b_q.data.double().numpy()
    s_a, s_b = np.float32(a_q.scale.item()), np.float32(b_q.scale.item())
    M, K = a_d.shape
    out = np.zeros((M, b_d.shape[1]), dtype=np.float32)
    for m in range(M):
        for n in range(b_d.shape[1]):
            for start in range(0, K, stretch):
                partial = 0.0
                for k in range(start, start + stretch):
                    partial = round_scalar(partial + a_d[m, k] * b_d[k, n], fmt)
                out[m, n] += np.float32(partial) / (s_a * s_b)
    return out


@pytest.mark.parametrize("promote_every", [None, 8])
def test_narrow_accumulator_matches_a_scalar_loop(promote_every):
    a, w = operands(M=3, K=32, N=2, seed=2)
    a_q, b_q = quantize(a), quantize(w).t()
    fmt = accumulator_format(4)
    result = scaled_matmul(a_q, b_q, accumulate=fmt, promote_every=promote_every)
    expected = sequential_reference(a_q, b_q, fmt, promote_every or 32)
    assert np.array_equal(result.numpy(), expected)


def test_promotion_rescues_a_narrow_accumulator():
    """Positive products: the running sum grows and each addition loses the low bits of the new
    term. Promoting every 64 elements limits that to sums of 64 terms."""
    g = torch.Generator().manual_seed(3)
    a_q = quantize(torch.rand(4, 512, generator=g))
    b_q = quantize(torch.rand(4, 512, generator=g)).t()
    reference = exact(a_q) @ exact(b_q)

    def error(**kwargs):
        return ((scaled_matmul(a_q, b_q, **kwargs).double() - reference).abs() / reference).mean()

    narrow = accumulator_format(7)  # BF16's precision
    assert error(accumulate=narrow) > 2 * error(accumulate=narrow, promote_every=64)
    assert error(accumulate=narrow, promote_every=64) > error(accumulate="fp32")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(backend="gpu"), ValueError, "unknown backend"),
    (dict(backend="torch", accumulate="fp64"), ValueError, "emulated"),
    (dict(backend="torch", promote_every=128), ValueError, "emulated"),
    (dict(backend="torch", out_dtype=torch.float64), ValueError, "float32"),
    (dict(accumulate=32), TypeError, "accumulate"),
    (dict(accumulate="fp33"), ValueError, "unknown format"),
    (dict(promote_every=0), ValueError, "positive int"),
])
def test_bad_arguments_get_a_sentence(kwargs, error, match):
    a_q, b_q = quantize_pair("tensor x tensor")
    with pytest.raises(error, match=match):
        scaled_matmul(a_q, b_q, **kwargs)


def test_bad_operands_get_a_sentence():
    a_q, b_q = quantize_pair("tensor x tensor")
    with pytest.raises(TypeError, match="QuantizedTensor"):
        scaled_matmul(a_q, torch.ones(256, 48))
    with pytest.raises(ValueError, match="cannot be multiplied"):
        scaled_matmul(a_q, a_q)
    with pytest.raises(ValueError, match="matrix"):
        scaled_matmul(quantize(torch.ones(2, 3, 4)), b_q)
    with pytest.raises(ValueError, match="per tensor or per row"):
        scaled_matmul(*quantize_pair("1x128 x 128x16 tiles"), backend="torch")
    with pytest.raises(ValueError, match="E4M3/E5M2"):
        scaled_matmul(*quantize_pair("NVFP4 x NVFP4"), backend="torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_native_or_a_clear_fallback():
    a_q, b_q = quantize_pair("tensor x tensor")
    a_cuda = quantize(exact(a_q).float().cuda(), scale=a_q.scale)
    b_cuda = quantize(exact(b_q).float().t().cuda(), scale=b_q.scale).t()
    cpu = scaled_matmul(a_q, b_q, backend="emulate")
    supported, reason = native_fp8_support("cuda")
    if supported:
        result = scaled_matmul(a_cuda, b_cuda, backend="torch")
        bound = native_bound(a_q, b_q, "cuda") + fp32_bound(a_q, b_q)  # tensor cores vs FP32 emulation
    else:
        with pytest.warns(UserWarning, match="no FP8"):
            result = scaled_matmul(a_cuda, b_cuda)
        bound = 2 * fp32_bound(a_q, b_q)
    assert result.is_cuda and ((result.cpu().double() - cpu.double()).abs() <= bound).all()


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_emulated_product_ignores_autocast(low):
    """Autocast casts bmm to 16 bits; the emulation must still accumulate in FP32."""
    generator = torch.Generator().manual_seed(0)
    a = quantize(torch.randn(16, 256, generator=generator), "e4m3")
    b = quantize(torch.randn(256, 8, generator=generator), "e4m3")
    outside = scaled_matmul(a, b, backend="emulate")
    with torch.autocast("cpu", dtype=low):
        inside = scaled_matmul(a, b, backend="emulate")
    assert inside.dtype == torch.float32
    assert torch.equal(inside, outside)


def test_torch_backend_is_not_changed_by_an_enclosing_autocast_region(device):
    """PyTorch's FP8 product has no autocast rule, but on a CPU (torch 2.13) it runs matmuls that
    autocast would cast to BF16; scaled_matmul switches autocast off around it, as the emulation
    does. On a GPU the same must hold of the tensor-core product."""
    needs_native(device)
    g = torch.Generator().manual_seed(0)
    a = quantize(torch.randn(32, 64, generator=g).to(device), "e4m3")
    b = quantize(torch.randn(64, 16, generator=g).to(device), "e4m3")
    plain = scaled_matmul(a, b, backend="torch")
    with torch.autocast(device.type, dtype=torch.bfloat16):
        inside = scaled_matmul(a, b, backend="torch")
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)
