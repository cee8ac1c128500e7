"""Fp8Linear and convert_to_fp8: forward and the three gradients against (1) the exact product of
independently fake-quantized operands (torch's float8 casts) within FP32 accumulation error, and
(2) nn.Linear in FP32 within a bound derived from E4M3's and E5M2's unit roundoff; delayed
scaling's histories step by step; a converted model trains on CPU."""
import copy

import pytest
import torch
from torch import nn

from mpcourse.formats import E4M3, E5M2
from mpcourse.fp8 import CurrentScaling, DelayedScaling, Fp8Linear, Fp8Recipe, convert_to_fp8

U32 = 2.0**-24
TORCH_DTYPE = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
CURRENT = Fp8Recipe(scaling="current")


def fake_quantize(t: torch.Tensor, fmt, scale=None) -> torch.Tensor:
    """What t becomes in fmt with a per-tensor scale (default max / amax), in float64, by
    torch's own saturating float8 cast."""
    if scale is None:  # a float32 division (a Python number over a tensor would round twice)
        scale = torch.tensor(fmt.max_value) / t.abs().max()
    scaled = (t.detach() * scale).clamp(-fmt.max_value, fmt.max_value)
    return scaled.to(TORCH_DTYPE[fmt]).double() / float(scale)


def quantization_error_bound(t: torch.Tensor, fmt) -> torch.Tensor:
    """|fake_quantize(t) - t| <= u |t| + (half the smallest subnormal) / scale, with u = 2**-(M+1)
    the unit roundoff: relative error in the normal range, absolute below it. Current scaling
    only (nothing saturates)."""
    scale = fmt.max_value / t.abs().max().double()
    return fmt.epsilon / 2 * t.detach().abs().double() + fmt.min_subnormal / 2 / scale


def assert_fp32_product(result, a, b, extra=0.0):
    """result = a @ b + extra (float64 operands) up to FP32 accumulation: K additions, and the
    roundings applying the scales and adding extra."""
    reference = a @ b + extra
    bound = (a.shape[1] + 4) * U32 * (a.abs() @ b.abs()) + 2 * U32 * torch.as_tensor(extra).abs()
    assert ((result.double() - reference).abs() <= bound).all()


def product_bound(a_err, a_hat, b, b_err, K):
    """|a_hat @ b_hat - a @ b| for errors a_err, b_err, plus FP32 rounding on both sides."""
    return (a_err @ (b.abs() + b_err) + (a_hat.abs() + a_err) @ b_err
            + 2 * (K + 4) * U32 * ((a_hat.abs() + a_err) @ (b.abs() + b_err)))


def layer_and_data(seed=0, batch=24, fan_in=64, fan_out=40):
    torch.manual_seed(seed)
    linear = nn.Linear(fan_in, fan_out)
    x = torch.randn(batch, fan_in) * 3
    grad_y = torch.randn(batch, fan_out) * 1e-3  # gradients are small: E5M2's range at work
    return linear, x, grad_y


def run(layer, x, grad_y):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(grad_y)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def test_forward_and_gradients_are_the_exact_fp8_products():
    linear, x, g = layer_and_data()
    layer = Fp8Linear.from_linear(linear, CURRENT)
    y, gx, gw, gb = run(layer, x, g)
    w, b = linear.weight.detach(), linear.bias.detach()
    x8, w8, g8 = fake_quantize(x, E4M3), fake_quantize(w, E4M3), fake_quantize(g, E5M2)
    assert_fp32_product(y, x8, w8.T, b.double())
    assert_fp32_product(gx, g8, w8)
    assert_fp32_product(gw, g8.T, x8)
    assert torch.allclose(gb, g.sum(0), rtol=1e-6, atol=0)  # bias gradient: FP32, not quantized


def test_close_to_nn_linear_within_the_fp8_rounding_bound():
    linear, x, g = layer_and_data(seed=1)
    y32, gx32, gw32, gb32 = run(copy.deepcopy(linear), x, g)
    y8, gx8, gw8, gb8 = run(Fp8Linear.from_linear(copy.deepcopy(linear), CURRENT), x, g)
    w = linear.weight.detach().double()
    xd, gd = x.double(), g.double()
    e_x, e_w, e_g = (quantization_error_bound(x, E4M3), quantization_error_bound(w, E4M3),
                     quantization_error_bound(g, E5M2))
    K = x.shape[1]
    assert ((y8 - y32).double().abs() <= product_bound(e_x, xd, w.T, e_w.T, K) + 2 * U32 * y32.abs()).all()
    assert ((gx8 - gx32).double().abs() <= product_bound(e_g, gd, w, e_w, g.shape[1])).all()
    assert ((gw8 - gw32).double().abs() <= product_bound(e_g.T, gd.T, xd, e_x, x.shape[0])).all()
    assert torch.allclose(gb8, gb32, rtol=1e-6, atol=0)
    # and it is FP8, not FP32 in disguise: relative errors of the order of the unit roundoffs
    relative = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert 0.1 * 2**-4 < relative(y8, y32) < 2**-4
    assert 0.1 * 2**-3 < relative(gx8, gx32) < 2**-3 and 0.1 * 2**-3 < relative(gw8, gw32) < 2**-3


def test_delayed_scaling_records_one_amax_per_pass_and_uses_the_past():
    linear, x, g = layer_and_data(seed=2)
    layer = Fp8Linear.from_linear(linear)  # default recipe: delayed, history 16
    assert isinstance(layer.input_scaling, DelayedScaling)
    w = linear.weight.detach()
    seen = []
    for step in range(4):
        x_t, g_t = x * (step + 1), g / (step + 1)
        # the scale from the history: 448 / (largest amax so far), a float32 division
        scale = 1.0 if step == 0 else torch.tensor(E4M3.max_value) / max(a for a, _ in seen)
        w_scale = 1.0 if step == 0 else torch.tensor(E4M3.max_value) / w.abs().max()
        y, *_ = run(layer, x_t, g_t)
        seen.append((x_t.abs().max().item(), g_t.abs().max().item()))
        assert layer.input_scaling.amax_history.tolist() == [a for a, _ in seen]
        assert layer.grad_output_scaling.amax_history.tolist() == [b for _, b in seen]
        assert torch.equal(layer.weight_scaling.amax_history, w.abs().max().repeat(step + 1))
        # this step's output used the scales from the steps before
        assert_fp32_product(y, fake_quantize(x_t, E4M3, scale), fake_quantize(w, E4M3, w_scale).T,
                            linear.bias.double())
        layer.zero_grad()
    with torch.no_grad():  # a forward pass alone records no gradient amax
        layer(x)
    assert len(layer.input_scaling.amax_history) == 5 and len(layer.grad_output_scaling.amax_history) == 4


def test_a_converted_model_trains_on_cpu():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(128, 8)
    labels = teacher(x).argmax(1).detach()

    def train(model, steps=30):
        opt = torch.optim.Adam(model.parameters(), lr=2e-2)
        losses = []
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    torch.manual_seed(1)
    fp32 = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    fp8 = convert_to_fp8(copy.deepcopy(fp32))
    assert sum(isinstance(m, Fp8Linear) for m in fp8.modules()) == 3
    losses8, losses32 = train(fp8), train(fp32)
    assert losses8[-1] < 0.1 * losses8[0]
    assert losses8[-1] < 2 * losses32[-1] + 0.02  # and about as well as in FP32
    assert len(fp8[0].input_scaling.amax_history) == 16  # full: one per step, the last 16


def test_convert_keeps_parameters_and_skips_what_it_is_told():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    before = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    assert convert_to_fp8(model, CURRENT, skip=["2.1"]) is model
    assert [type(m) for m in (model[0], model[2][0], model[2][1])] == [Fp8Linear, Fp8Linear, nn.Linear]
    assert all(p is before[name] for name, p in model.named_parameters())  # same tensors
    assert list(model.state_dict()) == keys
    assert isinstance(model[0].input_scaling, CurrentScaling)
    assert model[0].input_scaling is not model[2][0].input_scaling  # each layer its own

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    convert_to_fp8(model, skip=lambda name, module: module.out_features == 2)
    assert [type(m) for m in model] == [Fp8Linear, nn.Linear]
    with pytest.raises(ValueError, match="no module"):
        convert_to_fp8(model, skip=["head"])
    single = nn.Linear(3, 5)
    converted = convert_to_fp8(single)
    assert isinstance(converted, Fp8Linear) and converted.weight is single.weight


def test_drop_in_for_nn_linear():
    linear = nn.Linear(16, 8, bias=False)
    layer = Fp8Linear(16, 8, bias=False)
    layer.load_state_dict(linear.state_dict())
    x = torch.randn(2, 5, 16, requires_grad=True)  # any leading dimensions
    y = layer(x)
    assert y.shape == (2, 5, 8) and y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == (8, 16)
    assert "scaling=delayed" in repr(layer)
    with pytest.raises(ValueError, match="expected input"):
        layer(torch.randn(3, 15))


@pytest.mark.parametrize("kwargs, match", [
    (dict(scaling="jit"), "unknown scaling"),
    (dict(scaling="current", margin=1), "margin"),
    (dict(amax_history_len=0), "amax_history_len"),
    (dict(amax_compute_algo="mean"), "amax_compute_algo"),
    (dict(backward_format="e9m9"), "unknown format"),
])
def test_bad_recipes_get_a_sentence(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8Recipe(**kwargs)
    with pytest.raises(ValueError, match="choose one of hybrid, mxfp8, nvfp4, blockwise"):
        Fp8Linear(4, 4, recipe="HYBRID")
    with pytest.raises(TypeError, match="Fp8Recipe"):
        Fp8Linear(4, 4, recipe=Fp8Recipe)


def tensor_core_vs_fp32_bound(a, b) -> torch.Tensor:
    """|GPU - CPU| for one FP8 product of the float64 operands a @ b: the GPU's tensor cores cut
    their sums to about 14 significant bits (DeepSeek-V3, section 3.3.2), at most K + K/16 + 1 cuts
    each losing less than 2**-13 of sum |terms| (tests/test_fp8_matmul.py, native_bound), the CPU's
    emulation sums in FP32 (fp32 bound, both sides)."""
    K = a.shape[1]
    return ((K + K // 16 + 1) * 2.0**-13 + 2 * (K + 4) * U32) * (a.abs() @ b.abs())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_linear_on_cuda_matches_cpu():
    """Same layer, same data: the same quantized operands on both devices, so the results differ
    only by how the products are summed (PyTorch's tensor-core product on an FP8 GPU, the FP32
    emulation on a CPU), within that bound for each of the three products."""
    linear, x, g = layer_and_data(batch=32, fan_in=64, fan_out=48)
    cpu = run(Fp8Linear.from_linear(copy.deepcopy(linear), CURRENT), x, g)
    gpu = run(Fp8Linear.from_linear(copy.deepcopy(linear).cuda(), CURRENT), x.cuda(), g.cuda())
    assert all(d.is_cuda for d in gpu)
    w = linear.weight.detach()
    x8, w8, g8 = fake_quantize(x, E4M3), fake_quantize(w, E4M3), fake_quantize(g, E5M2)
    bounds = (tensor_core_vs_fp32_bound(x8, w8.T) + 4 * U32 * cpu[0].double().abs(),  # + the bias
              tensor_core_vs_fp32_bound(g8, w8), tensor_core_vs_fp32_bound(g8.T, x8),
              2 * g.shape[0] * U32 * g.double().abs().sum(0))  # the bias gradient: FP32 sums
    for c, d, bound in zip(cpu, gpu, bounds):
        assert ((d.cpu().double() - c.double()).abs() <= bound).all()
