"""mpcourse.debugging.preflight: one FP32 forward and backward that says, per format, whether the
activations and gradients fit (overflow / needs loss scaling / ok), which modules are to blame, and
which FP16 loss scales work, on models it was not tuned on; the model and the RNG untouched."""
import copy
import math
import re

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.debugging import PreflightReport, preflight
from mpcourse.formats import FP16, round_to
from tests.test_debugging import Scale as Amplify  # multiplies by a constant: a layer whose activations grow

matplotlib.use("Agg")


def mlp(*layers, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), *layers, nn.Linear(32, 4))


def data(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_an_overflowing_layer_is_named_and_bf16_and_fp8_are_unaffected():
    model = mlp(Amplify(1e5), nn.Linear(32, 32))
    x, y = data()
    report = preflight(model, x, F.cross_entropy, y, formats=("fp16", "bf16", "e4m3"))
    assert report.verdicts["fp16"] == "overflow"
    assert "2" in report.culprits["fp16"]  # the Amplify module, named as in named_modules()
    assert report.verdicts["bf16"] != "overflow" and report.verdicts["e4m3"] != "overflow"
    assert report.loss_scale is None and "forward" in report.loss_scale_reason


def test_an_overflow_is_blamed_where_it_starts_not_on_the_layers_and_containers_that_carry_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 32), Amplify(1e5), nn.ReLU()),
                          nn.Linear(32, 32), nn.Linear(32, 4))
    x, y = data()
    report = preflight(model, x, F.cross_entropy, y, formats=("fp16", "bf16"))
    assert report.verdicts["fp16"] == "overflow"
    assert report.culprits["fp16"] == ["0.1"]                  # the Amplify module alone
    assert {"0", "0.2", "1"} <= set(report.carriers["fp16"])   # its container, the layers after it
    assert "0.0" not in report.carriers["fp16"]                # the layer before it fits FP16
    assert "carried on by 0, 0.2" in report.to_markdown(rows=False)
    assert report.culprits["bf16"] == [] and report.carriers.get("bf16", []) == []


def test_an_input_beyond_the_format_still_names_a_culprit():
    """Every module's input overflows FP16 when the data itself does: the first module that
    passes the overflow on is named, never an empty list beside an "overflow" verdict."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = data()
    report = preflight(model, x * 1e6, F.cross_entropy, y, formats=("fp16",))
    assert report.verdicts["fp16"] == "overflow"
    assert report.culprits["fp16"][:1] == ["0"]


class Peak(nn.Module):
    """Sets one output value to ``peak``: an activation at the edge of FP16's range."""

    def __init__(self, peak):
        super().__init__()
        self.peak = peak

    def forward(self, x):
        out = x.clone()
        out[0, 0] = self.peak
        return out


@pytest.mark.parametrize("peak", [65504.0, 65519.0])
def test_an_activation_that_rounds_to_fp16s_largest_value_is_not_an_overflow(peak):
    assert round_to(peak, FP16) == FP16.max_value  # below 65520, FP16 rounds it down to 65504
    x, y = data()
    report = preflight(mlp(Peak(peak)), x, F.cross_entropy, y)
    assert report.verdicts["fp16"] != "overflow"
    assert "forward" not in report.loss_scale_reason  # no "overflow in the forward pass"


def test_an_underflowing_model_gets_a_loss_scale_range_that_works_in_fp16():
    model = mlp(nn.Linear(32, 32), nn.Tanh())
    x, y = data()
    tiny = lambda out, target: F.cross_entropy(out, target) * 2.0**-20  # gradients far below FP16
    report = preflight(model, x, tiny, y)
    assert report.verdicts["fp16"] == "needs loss scaling" and report.culprits["fp16"]
    assert report.verdicts["bf16"] == "ok" and report.culprits["bf16"] == []
    lo, hi = report.loss_scale
    assert lo <= hi and all(math.frexp(s)[0] == 0.5 for s in (lo, hi))  # powers of two
    model.zero_grad()
    tiny(model(x), y).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    nonzero = grads[grads != 0].abs()
    for scale in (lo, hi):  # the promise, checked on the real weight gradients
        assert (round_to(nonzero * scale, FP16) == 0).double().mean() <= 0.01
        assert torch.isfinite(round_to(grads * scale, FP16)).all()
    assert (round_to(grads * lo, FP16)[grads != 0] == 0).double().mean() < (
        round_to(grads, FP16)[grads != 0] == 0).double().mean()


def test_a_healthy_model_is_ok_in_bf16():
    model = mlp(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU())
    x, y = data()
    report = preflight(model, x, F.cross_entropy, y, formats=("bf16",))
    assert report.verdicts == {"bf16": "ok"} and report.culprits == {"bf16": []}


def test_rows_cover_every_submodule_and_parameter():
    model = mlp(nn.Linear(32, 32))
    x, y = data()
    report = preflight(model, x, F.cross_entropy, y, formats=("fp16", "e5m2"))
    modules = [name for name, _ in model.named_modules() if name]
    assert [(r["module"], r["tensor"]) for r in report.rows if r["parameter"] is None] == [
        (m, t) for m in modules for t in ("activation", "output gradient")]
    weight_rows = [r for r in report.rows if r["tensor"] == "weight gradient"]
    assert [r["parameter"] for r in weight_rows] == [n for n, _ in model.named_parameters()]
    assert all(r["module"] == r["parameter"].rpartition(".")[0] for r in weight_rows)
    for row in report.rows:
        assert set(row["fp16"]) == set(row["e5m2"]) == {"overflow", "underflow", "underflow_mass"}
        assert 0 <= row["fp16"]["underflow"] <= 1 and row["max_abs"] >= 0
    relu = next(r for r in report.rows if r["module"] == "1" and r["tensor"] == "activation")
    assert relu["max_abs"] == pytest.approx(torch.relu(model[0](x)).max().item())


def test_fp8_is_measured_after_per_tensor_scaling():
    """Tiny values underflow E4M3 at scale 1 but not after scaling by max / amax."""
    model = nn.Sequential(nn.Linear(8, 8))
    with torch.no_grad():
        model[0].weight.fill_(1e-6)
        model[0].bias.zero_()
    x = torch.full((4, 8), 1e-3)
    report = preflight(model, x, lambda out: out.sum(), formats=("e4m3",))
    activation = next(r for r in report.rows if r["tensor"] == "activation")
    assert round_to(torch.tensor(8e-9), "e4m3").item() == 0  # unscaled, it would all be lost
    assert activation["e4m3"] == {"overflow": 0.0, "underflow": 0.0, "underflow_mass": 0.0}


def test_the_model_and_the_random_state_are_left_exactly_as_they_were():
    model = mlp(nn.BatchNorm1d(32), nn.Dropout(0.5))
    x, y = data()
    F.cross_entropy(model(x), y).backward()  # existing gradients must survive
    model.train()
    handle = model[0].register_forward_hook(lambda *args: None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    hooks = {name: len(m._forward_hooks) + len(m._forward_pre_hooks) for name, m in model.named_modules()}
    rng = torch.get_rng_state()
    preflight(model, x, F.cross_entropy, y)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats too
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert hooks == {name: len(m._forward_hooks) + len(m._forward_pre_hooks) for name, m in model.named_modules()}
    handle.remove()


def test_a_half_precision_model_is_checked_in_fp32_and_left_in_half():
    model = mlp(nn.Linear(32, 32)).half()
    x, y = data()
    report = preflight(model, x.half(), F.cross_entropy, y, formats=("fp16",))
    assert next(model.parameters()).dtype == torch.float16
    as_fp32 = preflight(copy.deepcopy(model).float(), x.half().float(), F.cross_entropy, y, formats=("fp16",))
    assert report.verdicts == as_fp32.verdicts
    assert [r["max_abs"] for r in report.rows] == [r["max_abs"] for r in as_fp32.rows]


def test_report_renders_as_markdown_and_a_figure():
    model = mlp(Amplify(1e5))
    x, y = data()
    report = preflight(model, x, F.cross_entropy, y)
    assert isinstance(report, PreflightReport)
    text = report.to_markdown()
    assert "| fp16 | overflow |" in text and "weight gradient (0.weight)" in text
    ax = report.plot()
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert len(labels) == len(report.rows) and len(set(labels)) == len(labels)  # one per row
    assert "0.weight: gradient" in labels and "0.bias: gradient" in labels


@pytest.mark.parametrize("call, error, match", [
    (lambda m, x, y: preflight(m, x, lambda out, t: F.cross_entropy(out, t, reduction="none"), y),
     ValueError, "single number"),
    (lambda m, x, y: preflight(nn.ReLU(), x, F.cross_entropy, y), ValueError, "parameters"),
    (lambda m, x, y: preflight(m, x, F.cross_entropy, y, formats=("fp17",)), ValueError, "unknown format"),
    (lambda m, x, y: preflight(m, x, F.cross_entropy, y, formats=()), ValueError, "formats"),
    (lambda m, x, y: preflight(m, x, F.cross_entropy, y, formats=("e8m0",)), ValueError, "sign"),
    (lambda m, x, y: preflight(lambda t: t, x, F.cross_entropy, y), TypeError, "nn.Module"),
    (lambda m, x, y: preflight(m, x, "cross_entropy", y), TypeError, "callable"),
])
def test_bad_input_is_a_clear_error(call, error, match):
    x, y = data()
    with pytest.raises(error, match=match):
        call(mlp(), x, y)


def fp16_verdict_at(model, x, y, scale):
    """preflight's own FP16 verdict on the real gradients of ``scale`` times the loss."""
    scaled = lambda out, target: F.cross_entropy(out, target) * scale
    return preflight(model, x, scaled, y, formats=("fp16",)).verdicts["fp16"]


class Nudge(nn.Module):
    """Adds ``factor * offset`` (an (8, 32) parameter, repeated over a batch of 64): its gradient is
    ``factor`` times the gradient that reaches the layer, and 2% of all the gradient elements, too
    few to move the median parameter gradient."""

    def __init__(self, factor=1e-6):
        super().__init__()
        self.factor = factor
        self.offset = nn.Parameter(torch.zeros(8, 32))

    def forward(self, x):
        return x + self.factor * self.offset.repeat(8, 1)


@pytest.mark.parametrize("loss_scale, extra, verdict", [
    (2.0**-20, [], "needs loss scaling"),   # gradients far below FP16's range
    (1.0, [Nudge()], "needs loss scaling"),  # the median gradient is normal, yet >1% round to zero
    (1.0, [], "ok"),
    (2.0**22, [], "overflow"),               # the gradients overflow, the activations do not
])
def test_the_loss_scale_range_agrees_with_the_verdict_at_both_edges(loss_scale, extra, verdict):
    """Every scale in [lo, hi] gets the verdict "ok" on the real gradients, lo / 2 underflows
    (more than 1%) and 2 hi overflows: the verdict at scale 1 is then "needs loss scaling" exactly
    when 1 < lo, "ok" when lo <= 1 <= hi, and a gradient "overflow" when hi < 1."""
    model = mlp(nn.Linear(32, 32), *extra, nn.Tanh())
    x, y = data()
    report = preflight(model, x, lambda out, t: F.cross_entropy(out, t) * loss_scale, y, formats=("fp16",))
    assert report.verdicts["fp16"] == verdict
    lo, hi = report.loss_scale
    assert all(math.frexp(s)[0] == 0.5 for s in (lo, hi)) and lo <= hi  # powers of two
    assert {"needs loss scaling": 1 < lo, "ok": lo <= 1 <= hi, "overflow": hi < 1}[verdict]
    assert fp16_verdict_at(model, x, y, loss_scale * lo) == "ok"
    assert fp16_verdict_at(model, x, y, loss_scale * hi) == "ok"
    assert fp16_verdict_at(model, x, y, loss_scale * lo / 2) == "needs loss scaling"  # underflow below
    assert fp16_verdict_at(model, x, y, loss_scale * hi * 2) == "overflow"            # overflow above
    assert f"| from 2^{int(math.log2(lo))} |" in report.to_markdown()
    assert f"| to 2^{int(math.log2(hi))} |" in report.to_markdown()
    below = re.search(rf"at 2\^{int(math.log2(lo)) - 1}, ([0-9.]+)% do, carrying", report.loss_scale_reason)
    assert below and float(below.group(1)) > 1  # the rejected scale is shown above 1%, never as 1.0%


def test_no_loss_scale_when_the_gradients_span_more_than_fp16():
    """2% of the gradients 1e20 times smaller than the rest: lifting them overflows the largest."""
    x, y = data()
    report = preflight(mlp(nn.Linear(32, 32), Nudge(1e-20), nn.Tanh()), x, F.cross_entropy, y, formats=("fp16",))
    assert report.verdicts["fp16"] == "needs loss scaling"
    assert report.loss_scale is None and "span more than FP16's range" in report.loss_scale_reason


def test_no_loss_scale_when_every_gradient_is_zero():
    model = mlp()
    x, y = data()
    report = preflight(model, x, lambda out, t: 0.0 * out.sum(), y, formats=("fp16",))
    assert report.verdicts["fp16"] == "ok"
    assert report.loss_scale is None and "zero" in report.loss_scale_reason


def spread_input(ratio, n=64):
    """Inputs whose odd columns are `ratio` times smaller: the first weight gradient spans `ratio`."""
    x, y = data(n)
    x[:, 1::2] *= ratio
    return x, y


def test_fp8_gradients_are_judged_in_e5m2_the_gradient_format_of_per_tensor_recipes():
    # A weight gradient spanning 2^-20: beyond E4M3's 2^17.8 binades after a per-tensor scale,
    # well inside E5M2's 2^31.8. The per-tensor recipes store gradients in E5M2.
    x, y = spread_input(2.0**-20)
    report = preflight(mlp(), x, F.cross_entropy, y, formats=("e4m3", "e5m2"))
    first = next(r for r in report.rows if r["parameter"] == "0.weight")
    assert first["e4m3"] == first["e5m2"]            # gradients: both columns measured in E5M2
    assert first["e4m3"]["underflow"] == 0
    assert report.verdicts["e4m3"] == "ok"
    assert round_to(torch.tensor(448 * 2.0**-20 * 0.5), "e4m3").item() == 0  # E4M3 would lose them
    assert "e4m3 (gradients in e5m2)" in report.to_markdown()


def test_needs_finer_scaling_is_said_and_defined_where_a_per_tensor_scale_cannot_serve():
    x, y = spread_input(2.0**-40)                   # beyond E5M2's range too
    report = preflight(mlp(), x, F.cross_entropy, y, formats=("e4m3",))
    assert report.verdicts["e4m3"] == "needs finer scaling" and "0" in report.culprits["e4m3"]
    assert "per-tensor scale" in report.to_markdown() and "per block" in report.to_markdown()


def test_the_underflow_count_and_the_magnitude_it_carries_are_both_reported():
    """Many tiny gradient values, a few large ones: most values flush in FP16, yet they carry almost
    none of the gradient's magnitude; both numbers are reported, each against an independent count."""
    model = nn.Sequential(nn.Linear(8, 8, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    x = torch.full((4, 8), 1e-9)
    x[:, 0] = 1.0                                        # weight gradient: column 0 large, the rest 1e-9
    report = preflight(model, x, lambda out: out.sum(), formats=("fp16",))
    grad = next(r for r in report.rows if r["parameter"] == "0.weight")
    exact = torch.full((8, 8), 4e-9)
    exact[:, 0] = 4.0
    flushed = round_to(exact, FP16) == 0
    assert grad["fp16"]["underflow"] == pytest.approx(flushed.double().mean().item()) == 7 / 8
    assert grad["fp16"]["underflow_mass"] == pytest.approx((exact[flushed].sum() / exact.sum()).item(), rel=1e-5)
    assert grad["fp16"]["underflow_mass"] < 1e-8
    assert f"87.50% / {grad['fp16']['underflow_mass']:.1e}" in report.to_markdown()


def test_the_loss_scale_range_is_called_a_candidate_with_no_headroom_at_the_top():
    model = mlp(nn.Linear(32, 32), nn.Tanh())
    x, y = data()
    report = preflight(model, x, lambda out, t: F.cross_entropy(out, t) * 2.0**-20, y, formats=("fp16",))
    text = report.to_markdown()
    assert "candidate range from this batch" in text and "no headroom" in text.lower()
    assert "of the gradients' total magnitude" in report.loss_scale_reason


def test_the_summary_leaves_out_the_rows_and_the_legend_on_request_and_tabulates_the_range():
    """The loss-scale range is a two-row table (each edge with its reason, no nested brackets);
    rows=False stops before the per-tensor table, legend=False leaves out the finer-scaling paragraph."""
    x, y = spread_input(2.0**-40)
    report = preflight(mlp(), x, F.cross_entropy, y, formats=("fp16", "e4m3"))
    full, summary = report.to_markdown(), report.to_markdown(rows=False)
    assert full.startswith(summary) and "| module |" in full and "| module |" not in summary
    assert "per block" in summary and "per block" not in report.to_markdown(rows=False, legend=False)
    x, y = data()
    report = preflight(mlp(nn.Linear(32, 32), nn.Tanh()), x, lambda out, t: F.cross_entropy(out, t) * 2.0**-20,
                       y, formats=("fp16",))
    lo, hi = report.loss_scale
    summary = report.to_markdown(rows=False)
    bottom, top = report.loss_scale_edges
    assert f"| from 2^{int(math.log2(lo))} | {bottom} |" in summary
    assert f"| to 2^{int(math.log2(hi))} | {top}. No headroom" in summary
    for reason in (bottom, top):
        depth = 0
        for ch in reason:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            assert depth <= 0, reason                # no parenthesis at all in either reason
