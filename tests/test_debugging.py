"""mpcourse.debugging: planted failures are found by name, in the forward and the backward pass;
statistics agree with torch's own FP16/BF16 casts; hooks never outlive the debugger."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.debugging import (GradientRow, activation_gradients, NonFiniteError, PrecisionDebugger,
                                compare_layer_outputs, gradient_table, layer_outputs, tensor_stats)
from mpcourse.optim import MasterWeightOptimizer


class Scale(nn.Module):
    """Multiply by a constant k: the forward pass by k, and so the backward pass by k too."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def overflowing_model():
    """Its third layer multiplies by 1e5: in FP16 its output overflows (inputs are O(1))."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Scale(1e5), nn.Linear(16, 4)).half()


def hook_count(model):
    modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                  for m in model.modules())
    return modules + sum(len(p._backward_hooks or {}) for p in model.parameters())


def fp16_fate(values):
    """Independent reference: what torch's own FP16 cast makes of float64 values."""
    finite = values[torch.isfinite(values)]
    stored = finite.to(torch.float16).double().abs()
    n = values.numel()
    return {"flushed": ((stored == 0) & (finite != 0)).sum().item() / n,
            "subnormal": ((stored > 0) & (stored < 2.0**-14)).sum().item() / n,
            "overflow": torch.isinf(stored).sum().item() / n}


# --- tensor_stats ----------------------------------------------------------------------------
def test_tensor_stats_on_a_hand_made_tensor():
    t = torch.tensor([0.0, 0.0, 1e-9, -1e-6, 3.0, -7e4, math.inf, math.nan])
    s = tensor_stats(t, "fp16")
    assert (s.dtype, s.shape, s.nan, s.inf, s.nonfinite) == ("float32", (8,), 1, 1, 2)
    assert (s.min, s.max, s.max_abs) == (-7e4, 3.0, 7e4)
    assert s.min_nonzero_abs == pytest.approx(1e-9)
    assert s.mean_abs == pytest.approx((1e-9 + 1e-6 + 3.0 + 7e4) / 6)
    assert s.zeros == 2 / 8
    assert s.flushed == 1 / 8     # 1e-9 <= 2**-25: FP16 rounds it to zero
    assert s.subnormal == 1 / 8   # 1e-6 is stored as a subnormal
    assert s.overflow == 1 / 8    # 7e4 >= 65520 rounds to inf; the inf itself is counted apart
    b = tensor_stats(t, "bf16")   # BF16 has FP32's range
    assert (b.flushed, b.subnormal, b.overflow) == (0, 0, 0)


def test_tensor_stats_at_fp16_boundaries_agrees_with_torch_cast():
    edges = [2.0**-25, 2.0**-25 * (1 + 2.0**-10), 2.0**-24, 2.0**-14 * (1 - 2.0**-12),
             2.0**-14, 65504.0, 65519.99, 65520.0]
    t = torch.tensor(edges + [-e for e in edges], dtype=torch.float64)
    s = tensor_stats(t)
    reference = fp16_fate(t)
    assert (s.flushed, s.subnormal, s.overflow) == (
        reference["flushed"], reference["subnormal"], reference["overflow"])
    assert (s.flushed, s.overflow) == (2 / 16, 2 / 16)  # 2**-25 (a tie, to even: 0) and 65520


def test_tensor_stats_on_wide_random_values_agrees_with_torch_cast():
    g = torch.Generator().manual_seed(0)
    t = torch.ldexp(torch.rand(20000, generator=g, dtype=torch.float64) + 0.5,
                    torch.randint(-30, 20, (20000,), generator=g))
    s = tensor_stats(t)
    reference = fp16_fate(t)
    assert min(reference.values()) > 0  # every category is exercised
    assert (s.flushed, s.subnormal, s.overflow) == tuple(reference.values())


def test_tensor_stats_of_fp16_and_all_nonfinite_tensors():
    half = torch.tensor([2.0**-24, 1.0, 0.0], dtype=torch.float16)
    s = tensor_stats(half)
    assert (s.dtype, s.subnormal, s.flushed, s.zeros) == ("float16", 1 / 3, 0, 1 / 3)
    nothing = tensor_stats(torch.tensor([math.nan, math.inf]))
    assert math.isnan(nothing.max) and math.isnan(nothing.min_nonzero_abs)


@pytest.mark.parametrize("bad, error", [([1.0], TypeError), (torch.arange(3), TypeError),
                                        (torch.empty(0), ValueError)])
def test_tensor_stats_rejects_bad_input(bad, error):
    with pytest.raises(error):
        tensor_stats(bad)


def test_tensor_stats_rejects_unknown_and_scale_only_formats():
    with pytest.raises(ValueError, match="unknown format"):
        tensor_stats(torch.ones(2), "fp17")
    with pytest.raises(ValueError, match="scale"):
        tensor_stats(torch.ones(2), "e8m0")


# --- PrecisionDebugger -----------------------------------------------------------------------
def test_finds_forward_overflow_by_name_and_removes_its_hooks():
    model = overflowing_model()
    x = torch.randn(4, 8).half()
    with PrecisionDebugger(model) as debugger:
        assert hook_count(model) > 0
        F.cross_entropy(model(x).float(), torch.tensor([0, 1, 2, 3])).backward()
    assert hook_count(model) == 0
    report = debugger.first_nonfinite()
    assert (report.phase, report.module, report.record.tensor) == ("forward", "2", "output")
    assert report.record.inputs_finite and report.record.params_finite
    assert "'2' (Scale)" in str(report) and "inside this module" in str(report)
    forward = [r for r in debugger.records if r.phase == "forward"]
    assert [r.module for r in forward] == ["0", "1", "2", "3", "(model)"]
    assert forward[0].finite and forward[1].finite
    count = len(debugger.records)
    model(x)  # detached: nothing more is recorded
    assert len(debugger.records) == count


def test_same_model_in_fp32_has_no_nonfinite_record_and_a_table():
    model = overflowing_model().float()
    with PrecisionDebugger(model) as debugger:
        model(torch.randn(4, 8)).sum().backward()
    assert debugger.first_nonfinite() is None
    rows, headers = debugger.table("forward")
    assert [row[0] for row in rows] == ["0", "1", "2", "3", "(model)"]
    assert all(len(row) == len(headers) for row in rows)
    overflow = headers.index("overflow")
    assert rows[2][overflow] > 0 and rows[1][overflow] == 0  # FP32 predicts where FP16 breaks
    backward, _ = debugger.table("backward")
    assert {row[1] for row in backward} >= {"output gradient", "weight gradient", "bias gradient"}


def test_finds_backward_only_overflow_and_the_computation_before_it():
    # Scale(1e-4) then Scale(1e4): the forward pass stays in FP16's range (the product is a
    # subnormal-free 1e-4 * O(1)), but backward multiplies the gradient by 1e4 at Scale(1e4);
    # with the loss multiplied by 2**12 the gradient reaching Scale(1e-4)'s output overflows.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Scale(1e-4), Scale(1e4), nn.Linear(16, 4)).half()
    with PrecisionDebugger(model) as debugger:
        loss = model(torch.randn(4, 8).half()).float().square().sum() * 2.0**12
        loss.backward()
    assert all(r.finite for r in debugger.records if r.phase == "forward")
    report = debugger.first_nonfinite()
    assert (report.phase, report.module, report.record.tensor) == ("backward", "1",
                                                                     "output gradient")
    assert report.previous.module == "2" and report.previous.finite
    assert "'1' (Scale)" in str(report)
    assert hook_count(model) == 0


def test_finds_a_weight_gradient_overflow():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Scale(300.0), nn.Linear(16, 4)).half()
    with PrecisionDebugger(model) as debugger:  # a sum over 512 examples of 300 * O(1) * 2**6
        (model(torch.randn(512, 8).half()).float().sum() * 2.0**6).backward()
    report = debugger.first_nonfinite()
    assert (report.phase, report.module, report.record.tensor) == ("backward", "2",
                                                                     "weight gradient")
    assert "sums over the batch" in str(report)
    # a claim about this run, not a general ranking of parameter and activation gradients
    assert "can overflow while every activation gradient is finite" in str(report)


class GainNorm(nn.Module):
    """x * gain / (sqrt(sum (x * gain)^2) + eps): finite forward on a zero row, NaN backward (0 * inf)."""

    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x * self.gain
        return h / (h.square().sum(-1, keepdim=True).sqrt() + 1e-3)


def test_a_nan_born_in_a_parameters_backward_is_called_an_invalid_operation_not_an_overflow():
    x = torch.randn(4, 8)
    x[3] = 0.0                                  # a zero row: d sqrt(s)/ds is infinite at s = 0
    model = nn.Sequential(GainNorm(8), nn.Linear(8, 4))
    with PrecisionDebugger(model) as debugger:
        loss = F.cross_entropy(model(x), torch.arange(4))
        loss.backward()
    assert math.isfinite(loss.item())
    report = debugger.first_nonfinite()
    assert (report.phase, report.module, report.record.tensor) == ("backward", "0", "gain gradient")
    assert report.record.stats.nan > 0 and report.record.stats.inf == 0
    assert "invalid operation" in str(report) and "overflow" in str(report).splitlines()[1]
    assert "sums over the batch" not in str(report)  # the overflow reading is for an inf
    # torch's own norms have a zero gradient at 0: the report blames a square root, not "a norm"
    assert "square root at 0" in str(report) and "or a norm at 0" not in str(report)


def test_a_nan_handed_back_to_a_module_says_nan_not_overflow():
    x = torch.randn(4, 8)
    x[3] = 0.0
    norm = GainNorm(8).requires_grad_(False)  # no parameter gradient: the NaN goes on to layer 0
    model = nn.Sequential(nn.Linear(8, 8, bias=False), norm, nn.Linear(8, 4))
    with PrecisionDebugger(model) as debugger:
        F.cross_entropy(model(x), torch.arange(4)).backward()
    report = debugger.first_nonfinite()
    assert (report.module, report.record.tensor) == ("0", "output gradient")
    assert report.record.stats.inf == 0 and report.previous.module == "1"
    assert "NaN (an invalid operation" in str(report)
    assert report.consumer == "'1' (GainNorm)"  # the module whose backward made the NaN
    assert "backward of '1' (GainNorm), the module that uses this module's output" in str(report)


def test_the_consumer_is_found_inside_a_container_and_when_a_container_returns_the_output():
    # Layer '0.1' (nested) returns the output that container '0' returns too; '1.0' (nested in
    # another container) uses it: both producers' output gradients name '1.0' as the consumer.
    x = torch.randn(4, 8)
    x[3] = 0.0
    first = nn.Sequential(nn.Identity(), nn.Linear(8, 8, bias=False))
    second = nn.Sequential(GainNorm(8).requires_grad_(False), nn.Linear(8, 4))
    model = nn.Sequential(first, second)
    with PrecisionDebugger(model) as debugger:
        F.cross_entropy(model(x), torch.arange(4)).backward()
    report = debugger.first_nonfinite()
    assert report.record.tensor == "output gradient" and report.module in ("0", "0.1")
    assert report.consumer == "'1.0' (GainNorm)"


def test_without_a_module_that_uses_the_output_the_report_says_so_in_general():
    # The NaN arises in code outside any module (a function in the parent's forward): no consumer.
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8, bias=False)

        def forward(self, x):
            h = self.linear(x)
            return h / (h.square().sum(-1, keepdim=True).sqrt() + 1e-3)

    x = torch.randn(4, 8)
    x[3] = 0.0
    model = Outer()
    with PrecisionDebugger(model) as debugger:
        model(x).sum().backward()
    report = debugger.first_nonfinite()
    assert report.module == "linear" and report.consumer is None
    assert "what uses this module's output" in str(report)


def test_raise_on_nonfinite_names_the_module_and_hooks_go_even_so():
    model = overflowing_model()
    with pytest.raises(NonFiniteError, match="'2' \\(Scale\\)") as caught:
        with PrecisionDebugger(model, raise_on_nonfinite=True):
            model(torch.randn(4, 8).half())
    assert caught.value.report.module == "2"
    assert hook_count(model) == 0
    model(torch.randn(4, 8).half())  # no debugger any more: no error


def test_raise_on_nonfinite_in_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Scale(1e-4), Scale(1e4), nn.Linear(16, 4)).half()
    debugger = PrecisionDebugger(model, raise_on_nonfinite=True).attach()
    try:
        loss = model(torch.randn(4, 8).half()).float().square().sum() * 2.0**12
        with pytest.raises(NonFiniteError, match="backward pass"):
            loss.backward()
    finally:
        debugger.detach()
    assert hook_count(model) == 0


def test_raise_on_forward_only_lets_a_gradient_overflow_through():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Scale(1e-4), Scale(1e4), nn.Linear(16, 4)).half()
    with PrecisionDebugger(model, raise_on_nonfinite="forward") as debugger:
        loss = model(torch.randn(4, 8).half()).float().square().sum() * 2.0**12
        loss.backward()  # an inf gradient: a loss scaler's business, not an error here
    assert debugger.first_nonfinite().phase == "backward"
    model = overflowing_model()
    with pytest.raises(NonFiniteError, match="forward pass"):
        with PrecisionDebugger(model, raise_on_nonfinite="forward"):
            model(torch.randn(4, 8).half())


def test_names_nonfinite_weights_and_nonfinite_inputs():
    model = overflowing_model()
    model[2].k = 1.0
    with torch.no_grad():
        model[3].weight[0, 0] = math.nan  # as a bad optimizer step would leave it
    with PrecisionDebugger(model) as debugger:
        model(torch.randn(4, 8).half())
    report = debugger.first_nonfinite()
    assert report.module == "3" and report.record.params_finite is False
    assert "optimizer step" in str(report)

    class Parent(nn.Module):  # the overflow happens in a function call between two modules
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x) * 1e6)

    model = Parent().half()
    with PrecisionDebugger(model) as debugger:
        model(torch.ones(2, 4).half())
    report = debugger.first_nonfinite()
    assert report.module == "b" and report.record.inputs_finite is False
    assert "outside any module" in str(report)


def test_works_with_inplace_relu_and_several_outputs():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True))
            self.heads = nn.Linear(8, 2)

        def forward(self, x):
            h = self.body(x)
            return self.heads(h), h

    model = TwoHeads()
    with PrecisionDebugger(model) as debugger:
        out, hidden = model(torch.randn(3, 4))
        (out.sum() + hidden.sum()).backward()
    tensors = {(r.module, r.tensor) for r in debugger.records}
    assert {("(model)", "output[0]"), ("(model)", "output[1]"),
            ("body.0", "output gradient")} <= tensors
    assert debugger.first_nonfinite() is None


def test_steps_are_counted_and_table_shows_the_last():
    model = overflowing_model().float()
    with PrecisionDebugger(model) as debugger:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
    assert {r.step for r in debugger.records} == {0, 1, 2}
    assert all(r.step == 2 for r in debugger.records[-10:])
    rows, _ = debugger.table("forward", step=0)
    assert len(rows) == 5
    debugger.clear()
    assert debugger.records == []


def test_debugger_rejects_bad_input_and_misuse():
    with pytest.raises(TypeError):
        PrecisionDebugger(lambda x: x)
    with pytest.raises(ValueError, match="unknown format"):
        PrecisionDebugger(nn.Linear(2, 2), fmt="fp17")
    with pytest.raises(ValueError, match="raise_on_nonfinite"):
        PrecisionDebugger(nn.Linear(2, 2), raise_on_nonfinite="sometimes")
    debugger = PrecisionDebugger(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no forward records"):
        debugger.table()
    with debugger:
        with pytest.raises(RuntimeError, match="attached already"):
            debugger.attach()
    with pytest.raises(ValueError):
        debugger.first_nonfinite("sideways")
    with pytest.raises(ValueError, match="unknown columns"):
        debugger.table(columns=("max_abs", "colour"))
    with pytest.raises(ValueError, match="unknown columns"):
        debugger.table(columns=("index",))  # a tuple method, not a statistic


# --- gradient_table --------------------------------------------------------------------------
def test_gradient_table_matches_direct_computation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    F.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 4, (32,))).backward()
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():  # spread the gradients over FP16's whole range and beyond
        p.grad = torch.ldexp(p.grad, torch.randint(-24, 28, p.shape, generator=g))
    rows = gradient_table(model)
    assert [row.name for row in rows] == [name for name, _ in model.named_parameters()]
    for row, (_, p) in zip(rows, model.named_parameters()):
        grad = p.grad.double()
        magnitude = grad.abs()
        assert row.dtype == "float32"
        assert row.min_nonzero_abs == magnitude[magnitude > 0].min().item()
        assert row.max_abs == magnitude.max().item()
        assert row.zeros == (grad == 0).double().mean().item()
        fate = fp16_fate(grad)
        assert (row.flushed, row.subnormal, row.overflow) == (
            fate["flushed"], fate["subnormal"], fate["overflow"])
        assert row.nonfinite == 0
    assert any(row.flushed > 0 for row in rows) and any(row.overflow > 0 for row in rows)
    assert gradient_table(list(model.named_parameters())) == rows
    assert list(GradientRow._fields)[:2] == ["name", "dtype"]


def test_gradient_table_reads_master_weights_by_the_model_names():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(5, 8).half()).float().sum().backward()
    with pytest.raises(ValueError, match="pass the optimizer"):
        gradient_table(model)  # the model's .grad is None: the gradients are on the masters
    rows = gradient_table(optimizer, names=model)
    assert [row.name for row in rows] == [name for name, _ in model.named_parameters()]
    for row, master in zip(rows, optimizer.master_params()):
        assert row.dtype == "float32" and row.max_abs == master.grad.abs().max().item()
    unnamed = gradient_table(optimizer)
    assert unnamed[0].name == "param_groups[0][0]" and unnamed[0][1:] == rows[0][1:]


def test_gradient_table_rejects_bad_input():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="backward"):
        gradient_table(model)
    with pytest.raises(TypeError):
        gradient_table(42)
    with pytest.raises(TypeError):
        gradient_table([torch.ones(2)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not parameters of the model"):
        gradient_table(optimizer, names=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="names="):
        gradient_table(model, names=model)


# --- layer_outputs, compare_layer_outputs ----------------------------------------------------
def integer_model():
    """Small integer weights and inputs (in [-3, 3]): the first layer's sums stay within
    3 * 3 * 4 + 3 = 39, and with this seed its ReLU outputs are at most 9, so the second layer's
    within 3 * 3 * 9 + 3 = 84. All integers below 256: exact in FP32, FP16 and BF16 alike."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-3, 4, p.shape, generator=torch.Generator().manual_seed(0)))
    return model, torch.randint(-3, 4, (5, 4), generator=torch.Generator().manual_seed(1)).float()


@pytest.mark.parametrize("autocast", [False, True])
def test_compare_layer_outputs_is_exact_where_everything_is_representable(autocast):
    model, x = integer_model()
    rows = compare_layer_outputs(model, x, autocast=autocast)
    assert {row.dtype for row in rows} == {"float16", "bfloat16"}
    assert [row.module for row in rows[::2]] == ["0", "1", "2", "(model)"]
    assert all(row.relative_error == 0 and row.nonfinite == 0 for row in rows)


@pytest.mark.parametrize("autocast", [False, True])
def test_compare_layer_outputs_shows_rounding_and_overflow(autocast):
    model = overflowing_model().float()
    x = torch.randn(16, 8)
    rows = {(row.module, row.dtype): row
            for row in compare_layer_outputs(model, x, autocast=autocast)}
    assert 0 < rows["0", "float16"].relative_error < rows["0", "bfloat16"].relative_error < 1e-2
    assert rows["2", "float16"].relative_error == math.inf and rows["2", "float16"].nonfinite > 0
    assert rows["2", "bfloat16"].nonfinite == 0  # BF16 has the range
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched


def test_layer_outputs_keeps_every_module_output():
    model, x = integer_model()
    outputs = layer_outputs(model, x)
    assert list(outputs) == ["0", "1", "2", "(model)"]
    assert torch.equal(outputs["(model)"], model(x)) and not outputs["2"].requires_grad


def test_compare_layer_outputs_passes_integer_inputs_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 2))
    rows = compare_layer_outputs(model, torch.arange(10).reshape(2, 5))
    assert [row.module for row in rows[::2]] == ["0", "1", "(model)"]
    assert all(0 < row.relative_error < 0.05 for row in rows)


def test_compare_layer_outputs_rejects_bad_input():
    model, x = integer_model()
    with pytest.raises(TypeError):
        compare_layer_outputs(model, x, dtypes=(torch.int32,))
    with pytest.raises(ValueError, match="autocast"):
        compare_layer_outputs(model, x, dtypes=(torch.float64,), autocast=True)
    with pytest.raises(TypeError):
        compare_layer_outputs(model, [1.0, 2.0])
    with pytest.raises(TypeError):
        compare_layer_outputs("model", x)


def test_activation_gradients_are_the_gradients_of_each_layer_output_and_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    activations, weights = activation_gradients(model, x, y)
    hidden = model[0](x)
    logits = model[2](model[1](hidden))
    probabilities = torch.softmax(logits, dim=1)
    logit_grad = (probabilities - F.one_hot(y, 3)) / len(y)
    relu_grad = logit_grad @ model[2].weight
    expected = torch.cat([(relu_grad * (hidden > 0)).flatten(), relu_grad.flatten(), logit_grad.flatten()])
    torch.testing.assert_close(activations, expected.detach())
    assert torch.equal(weights, torch.cat([p.grad.flatten() for p in model.parameters()]))
    scaled, scaled_weights = activation_gradients(model, x, y, loss_scale=1024.0)
    torch.testing.assert_close(scaled, activations)
    torch.testing.assert_close(scaled_weights, weights)
    with pytest.raises(TypeError, match="nn.Module"):
        activation_gradients(lambda t: t, x, y)
