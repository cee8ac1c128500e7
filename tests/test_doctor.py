"""mpcourse.doctor: each code from a broken loop that must produce it and the corrected loop that
must not; no error or warning on correct loops (AMP FP16, BF16 with master weights, the course's
trainer, FP32 parameters under autocast), on models of varied depth, width, optimizer and scaler;
a watched run bit for bit the unwatched one, with nothing left behind; clear errors for bad input."""
import dataclasses
import io
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpcourse import doctor
from mpcourse.doctor import diagnosis
from mpcourse.doctor.watching import Observations
from mpcourse.bench.probes import tf32_state
from mpcourse.optim import CompensatedOptimizer, MasterWeightOptimizer
from mpcourse.scaling import DynamicLossScaler, StaticLossScaler
from mpcourse.training import MixedPrecisionTrainer, TrainerConfig

CODES = ("fp16-without-scaling", "half-params-without-masters", "clip-before-unscale",
         "scaler-misuse", "nonfinite", "half-loss", "eps-underflow", "half-batchnorm",
         "emulated-bf16", "checkpoint-without-scaler", "tf32")
SHAPES = [(1, 8), (3, 32)]  # (hidden layers, width): the codes are not tuned to one model
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
}
SCALERS = {
    "GradScaler": lambda device: torch.amp.GradScaler(device.type, init_scale=2.0**10),
    "DynamicLossScaler": lambda device: DynamicLossScaler(2.0**10),
    "StaticLossScaler": lambda device: StaticLossScaler(2.0**10),
}


def mlp(depth=2, width=16, dtype=torch.float32, device="cpu", seed=0, extra=()):
    """depth hidden Linear+ReLU layers of the given width on 6 inputs, 3 outputs."""
    torch.manual_seed(seed)
    layers, inputs = [], 6
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), nn.ReLU()]
        inputs = width
    model = nn.Sequential(*layers, *extra, nn.Linear(inputs, 3))
    return model.to(device=device, dtype=dtype)


def batch(step, device="cpu", n=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    return x.to(device, dtype), y.to(device)


def serious(report) -> set:
    return {f.code for f in report.findings if f.severity in ("error", "warning")}


def codes(report, severity=None) -> set:
    return {f.code for f in report.findings if severity is None or f.severity == severity}


def watched(model, optimizer, scaler, loop, steps=3, passed="same"):
    """Run loop(step) for each step inside a session; the report."""
    with doctor.watch(model, optimizer, scaler if passed == "same" else passed) as session:
        for step in range(steps):
            loop(step)
    return session.report()


# --- the loops ------------------------------------------------------------------------------------

def amp_loop(model, optimizer, scaler, device, dtype=torch.float16, clip="after", loss_fn=None):
    """An autocast loop with a loss scaler; clip: "after" unscale_ (correct), "before" or None."""
    loss_fn = loss_fn or F.cross_entropy

    def step(i):
        x, y = batch(i, device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if clip == "before":
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.unscale_(optimizer)
        if clip == "after":
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    return step


def plain_loop(model, optimizer, device, autocast=None, to_float=True, dtype=torch.float32):
    """No scaler: an FP32 / BF16 loop (autocast, or a model converted to ``dtype``)."""
    def step(i):
        x, y = batch(i, device, dtype=dtype)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16,
                            enabled=autocast is not None):
            logits = model(x)
        F.cross_entropy(logits.float() if to_float else logits, y).backward()
        optimizer.step()
    return step


# --- no false positives ---------------------------------------------------------------------------

@pytest.mark.parametrize("scaler_kind", SCALERS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_a_correct_amp_fp16_loop_has_no_error_or_warning(scaler_kind, shape, opt, device):
    model = mlp(*shape, device=device)
    optimizer = OPTIMIZERS[opt](model.parameters())
    scaler = SCALERS[scaler_kind](device)
    report = watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device))
    assert serious(report) == set(), str(report)
    assert report.ok and report.steps == 3


@pytest.mark.parametrize("method", ["masters", "kahan", "stochastic"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_correct_bf16_loop_with_fp32_copies_has_no_error_or_warning(method, shape, device):
    model = mlp(*shape, dtype=torch.bfloat16, device=device)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer = (MasterWeightOptimizer(inner) if method == "masters"
                 else CompensatedOptimizer(inner, method=method))
    loop = plain_loop(model, optimizer, device, dtype=torch.bfloat16)
    report = watched(model, optimizer, None, loop)
    assert serious(report) == set(), str(report)


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
def test_fp16_weights_with_masters_and_a_scaler_have_no_error_or_warning(scaler_kind, device):
    """The README's loop: an FP16 model, FP32 masters, a loss scaler, the loss in FP32."""
    model = mlp(2, 16, dtype=torch.float16, device=device)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    scaler = SCALERS[scaler_kind](device)

    def step(i):
        x, y = batch(i, device, dtype=torch.float16)
        optimizer.zero_grad()
        scaler.scale(F.cross_entropy(model(x).float(), y)).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(optimizer.master_params(), 1.0)
        scaler.step(optimizer)
        scaler.update()

    report = watched(model, optimizer, scaler, step)
    assert serious(report) == set(), str(report)


@pytest.mark.parametrize("scaler_kind", SCALERS)
def test_gradient_accumulation_with_a_scaler_has_no_error_or_warning(scaler_kind, device):
    """Four micro-batches: scale and backward each, then unscale_, step and update once."""
    model = mlp(3, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = SCALERS[scaler_kind](device)

    def step(i):
        x, y = batch(i, device)
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            with torch.autocast(device.type, dtype=torch.float16):
                loss = F.cross_entropy(model(xs), ys) / 4
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()

    report = watched(model, optimizer, scaler, step)
    assert serious(report) == set(), str(report)


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16, None])
def test_fp32_params_under_autocast_are_not_half_params(autocast, device):
    model = mlp(3, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, autocast=autocast))
    assert not {"half-params-without-masters", "eps-underflow", "half-loss"} & codes(report)
    if autocast != torch.float16:  # FP16 without a scaler may underflow: see its own test
        assert serious(report) == set(), str(report)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_course_trainer_has_no_error_or_warning(precision, device, tmp_path):
    model = mlp(2, 16, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = MixedPrecisionTrainer(model, optimizer,
                                    TrainerConfig(precision, max_grad_norm=1.0, accumulate_steps=2))

    def step(i):
        trainer.train_step(batch(i, device), lambda m, b: F.cross_entropy(m(b[0]), b[1]))
        trainer.save_checkpoint(tmp_path / "run.pt")

    report = watched(model, optimizer, trainer.scaler, step)
    assert serious(report) == set(), str(report)
    assert report.steps == 3


# --- each code: the broken loop produces it, the corrected loop does not ------------------------

def regression_step(model, optimizer, device, scaler=None):
    """Targets close to the model's own output: small errors, so FP16 gradients are tiny. FP16
    computation comes from autocast (FP32 model) or from the model's own FP16 weights."""
    dtype = next(model.parameters()).dtype

    def step(i):
        x, _ = batch(i, device, n=64, dtype=dtype)
        with torch.no_grad():
            target = model(x).float() + 1e-3
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16, enabled=dtype == torch.float32):
            loss = F.mse_loss(model(x).float(), target)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    return step


def fp16_setup(shape, how, device):
    if how == "autocast":
        model = mlp(*shape, device=device)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)
    model = mlp(*shape, device=device, dtype=torch.float16)
    return model, MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("how", ["autocast", "fp16 weights"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp16_without_scaling_counts_the_underflowing_gradients(shape, how, device):
    model, optimizer = fp16_setup(shape, how, device)
    report = watched(model, optimizer, None, regression_step(model, optimizer, device))
    found = [f for f in report.findings if f.code == "fp16-without-scaling"]
    assert [f.severity for f in found] == ["warning"]
    counted = re.search(r"(\d+) of (\d+) FP16 gradient values", found[0].message)
    assert 0 < int(counted[1]) <= int(counted[2]) and "2**-14" in found[0].message
    model, optimizer = fp16_setup(shape, how, device)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12)
    report = watched(model, optimizer, scaler, regression_step(model, optimizer, device, scaler))
    assert "fp16-without-scaling" not in codes(report), str(report)


def test_the_underflow_count_matches_an_independent_count(device):
    """One Linear layer: the only FP16 gradient is the one of its output, kept by retain_grad."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 6, device=device)
    with doctor.watch(model, optimizer) as session:
        with torch.autocast(device.type, dtype=torch.float16):
            out = model(x)
        out.retain_grad()
        F.mse_loss(out.float(), out.detach().float() + 1e-3 * torch.randn_like(out.float())).backward()
        optimizer.step()
    tiny = int(((out.grad != 0) & (out.grad.abs() < 2.0**-14)).sum())
    found = [f for f in session.report().findings if f.code == "fp16-without-scaling"]
    assert tiny > 0 and f"{tiny} of {out.grad.numel()} FP16 gradient values" in found[0].message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_half_params_without_masters(dtype, opt, device):
    model = mlp(2, 16, dtype=dtype, device=device, seed=3)
    optimizer = OPTIMIZERS[opt](model.parameters())
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=dtype))
    found = [f for f in report.findings if f.code == "half-params-without-masters"]
    assert len(found) == 1 and "rounded away" in found[0].message
    assert found[0].where.startswith("optimizer.param_groups[0]: 0.weight")
    model = mlp(2, 16, dtype=dtype, device=device, seed=3)
    optimizer = MasterWeightOptimizer(OPTIMIZERS[opt](model.parameters()))
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=dtype))
    assert "half-params-without-masters" not in codes(report)


@pytest.mark.parametrize("lr", [1e-3, 3e-2])
def test_the_rounded_away_share_matches_an_independent_count(lr, device):
    """Plain SGD on BF16 weights: w - lr * g computed in FP32 and rounded once to BF16 (as torch
    does) is the reference; an update rounded away leaves w unchanged where g != 0."""
    model = mlp(2, 16, dtype=torch.bfloat16, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with doctor.watch(model, optimizer) as session:
        x, y = batch(0, device, dtype=torch.bfloat16)
        F.cross_entropy(model(x).float(), y).backward()
        params = list(model.parameters())
        expected = [(p.float() - lr * p.grad.float()).bfloat16() for p in params]
        kept = sum(int(((e == p) & (p.grad != 0)).sum()) for e, p in zip(expected, params))
        moved = sum(int((p.grad != 0).sum()) for p in params)
        optimizer.step()
    assert all(torch.equal(e, p) for e, p in zip(expected, params))  # the reference is torch's
    found = [f for f in session.report().findings if f.code == "half-params-without-masters"]
    assert 0 < kept < moved and f"{kept} of {moved} updates" in found[0].message


def test_half_params_with_no_update_rounded_away_says_so_without_a_zero_share(device):
    """Large SGD updates on FP16 weights: none is rounded away, and the warning says so in words
    (with the risk that remains), not as "0 of N updates (0.0%) rounded away"."""
    model = mlp(2, 16, dtype=torch.float16, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)
    with doctor.watch(model, optimizer) as session:
        x, y = batch(0, device, dtype=torch.float16)
        F.cross_entropy(model(x).float(), y).backward()
        moved = sum(int((p.grad != 0).sum()) for p in model.parameters())
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
    changed = sum(int(((b != p) & (p.grad != 0)).sum()) for b, p in zip(before, model.parameters()))
    assert changed == moved > 0  # the independent count: every update moved its weight
    found = [f for f in session.report().findings if f.code == "half-params-without-masters"]
    assert found[0].severity == "warning"
    assert f"none of its {moved} updates was rounded away" in found[0].message
    assert "(0.0%)" not in found[0].message


def test_pure_bf16_adamw_stall_is_an_error(device):
    """Weights near 1 and lr=1e-4: every update is below half BF16's spacing (2**-8)."""
    model = mlp(1, 8, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=torch.bfloat16))
    found = [f for f in report.findings if f.code == "half-params-without-masters"]
    assert found[0].severity == "error" and "(100.0%) rounded away" in found[0].message


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
def test_clip_before_unscale(scaler_kind, device):
    model = mlp(2, 16, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = SCALERS[scaler_kind](device)
    loop = amp_loop(model, optimizer, scaler, device, clip="before")
    report = watched(model, optimizer, scaler, loop)
    assert "clip-before-unscale" in codes(report, "error")
    assert not report.ok
    assert "clip-before-unscale" not in codes(
        watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device, clip="after")))


def small_sgd_run(scaler_kind: str, device):
    """A one-layer MLP, SGD and a scaler of `scaler_kind`: the set-up of the scaler-misuse tests."""
    model = mlp(1, 8, device=device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01), SCALERS[scaler_kind](device)


def misuse(report) -> list:
    return [f.message for f in report.findings if f.code == "scaler-misuse"]


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
def test_the_optimizer_stepping_scaled_gradients_is_scaler_misuse(scaler_kind, device):
    model, optimizer, scaler = small_sgd_run(scaler_kind, device)

    def step(i):
        x, y = batch(i, device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        (scaler.scale(loss) / 2).backward()  # found through the graph, not only the tensor
        optimizer.step()  # bypasses scaler.step

    report = watched(model, optimizer, scaler, step, steps=2)
    assert any("scaler.step(optimizer) was bypassed" in m for m in misuse(report))


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
def test_step_without_scale_is_scaler_misuse(scaler_kind, device):
    model, optimizer, scaler = small_sgd_run(scaler_kind, device)
    correct = amp_loop(model, optimizer, scaler, device)

    def step(i):
        if i == 0:
            return correct(i)  # GradScaler fails loudly only before its first scale()
        x, y = batch(i, device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            F.cross_entropy(model(x), y).backward()
        scaler.step(optimizer)
        scaler.update()

    with doctor.watch(model, optimizer, scaler) as session:
        try:
            for i in range(2):
                step(i)
        except RuntimeError:  # ours refuses; GradScaler silently divides unscaled gradients
            assert scaler_kind == "DynamicLossScaler"
    assert any("step() without scale()" in m for m in misuse(session.report()))


def scaled_backward(model, optimizer, scaler, i, device):
    """One FP16-autocast forward and scaled backward on batch ``i``, gradients zeroed first."""
    x, y = batch(i, device)
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
@pytest.mark.parametrize("mistake", ["unscale twice", "update skipped", "update per micro-batch"])
def test_scaler_call_order_mistakes_are_named_and_the_exception_propagates(mistake, scaler_kind,
                                                                           device):
    model, optimizer, scaler = small_sgd_run(scaler_kind, device)

    def step(i):
        scaled_backward(model, optimizer, scaler, i, device)
        if mistake == "update per micro-batch":
            scaler.update()
        scaler.unscale_(optimizer)
        if mistake == "unscale twice":
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        if mistake != "update skipped":
            scaler.update()

    expected = {"unscale twice": "unscale_() called twice", "update skipped": "update() was skipped",
                "update per micro-batch": "update() without step()"}[mistake]
    with pytest.raises((RuntimeError, AssertionError)):
        with doctor.watch(model, optimizer, scaler) as session:
            for i in range(3):
                step(i)
    assert any(expected in m for m in misuse(session.report())), str(session.report())
    assert torch.Tensor.backward is ORIGINALS["backward"]


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
def test_step_and_update_skipped_on_an_overflow_step_is_not_called_a_double_unscale(scaler_kind,
                                                                                    device):
    """`if not overflow: scaler.step(optimizer); scaler.update()`: one unscale_() per iteration,
    and the next iteration's unscale_() comes after a new scale(). The mistake is the skipped
    update(), not a second unscale_() in one step."""
    model, optimizer, scaler = small_sgd_run(scaler_kind, device)

    def step(i):
        scaled_backward(model, optimizer, scaler, i, device)
        scaler.unscale_(optimizer)
        # every step treated as an overflow: step() and update() skipped

    with pytest.raises((RuntimeError, AssertionError)):  # GradScaler refuses the second unscale_
        with doctor.watch(model, optimizer, scaler) as session:
            for i in range(2):
                step(i)
    messages = misuse(session.report())
    assert any("update() was skipped" in m for m in messages), messages
    assert not any("called twice" in m for m in messages), messages


def test_update_skipped_at_the_end_of_the_block_is_named(device):
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type)

    def step(i):
        x, y = batch(i, device)
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)

    report = watched(model, optimizer, scaler, step, steps=1)
    assert any("update() was skipped" in m for m in misuse(report))


class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Norm(nn.Module):
    """The length of each row: sqrt(sum x^2), NaN gradient at a zero row unless eps > 0."""
    def __init__(self, eps=0.0):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return torch.sqrt((x * x).sum(-1, keepdim=True) + self.eps) * torch.ones_like(x)


def nonfinite(report) -> list:
    return [f for f in report.findings if f.code == "nonfinite" and f.severity == "error"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_forward_overflow_is_told_from_a_nan_born_in_backward(shape, device):
    model = mlp(*shape, device=device, extra=(Scale(1e6),))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type)
    report = watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device))
    found = nonfinite(report)
    assert len(found) == 1 and found[0].where == f"forward: {2 * shape[0]}"
    assert "inf" in found[0].message and "overflow" in found[0].message

    # A zero row into sqrt: the forward pass is finite, the gradient NaN.
    model = nn.Sequential(nn.Linear(6, 4), Scale(0.0), Norm(), nn.Linear(4, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device))
    found = nonfinite(report)
    assert len(found) == 1 and found[0].where == "backward: the input of 2"
    assert "NaN" in found[0].message and "born in backward" in found[0].message

    # The same under a loss scaler: a NaN first is no overflow, whatever the scaler then skips.
    model = nn.Sequential(nn.Linear(6, 4), Scale(0.0), Norm(), nn.Linear(4, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = DynamicLossScaler(2.0**10)
    found = nonfinite(watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device)))
    assert len(found) == 1 and found[0].where == "backward: the input of 2"

    model = nn.Sequential(nn.Linear(6, 4), Scale(0.0), Norm(eps=1e-6), nn.Linear(4, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device))
    assert nonfinite(report) == []


def test_nan_inputs_and_weights_are_told_apart(device):
    model = mlp(2, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def bad_input(i):
        x, y = batch(i, device)
        x[0, 0] = float("nan")
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    found = nonfinite(watched(model, optimizer, None, bad_input, steps=1))
    assert found[0].where == "forward: the model" and "bad data" in found[0].message
    model = mlp(2, 8, device=device)
    with torch.no_grad():
        model[2].weight[0, 0] = float("inf")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    found = nonfinite(watched(model, optimizer, None, plain_loop(model, optimizer, device), steps=1))
    assert found[0].where == "forward: 2.weight" and "weights" in found[0].message


def cross_entropy_with_fp16_log_softmax(logits, target):
    """F.cross_entropy on FP16 logits as CUDA autocast runs it (torch 2.11 to 2.13): cross_entropy
    passes the logits' dtype to log_softmax, so autocast leaves log_softmax in FP16, and only
    nll_loss runs in FP32. CPU autocast casts the logits to FP32 first."""
    with torch.autocast(logits.device.type, enabled=False):
        return F.nll_loss(torch.log_softmax(logits, 1).float(), target)


def test_fp16_log_softmax_turns_an_overflowed_scaled_gradient_into_nan_and_inf(device):
    """The gradient of the logits of a loss scaled by 2^40: with log_softmax in FP16 NaN at the
    target (-inf - p * -inf) and inf beside it; CPU autocast's cross_entropy, in FP32 throughout,
    gives only infs; CUDA autocast's gives the FP16 log_softmax's NaN and inf."""
    def grad(loss_fn):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(4, 3, generator=g).to(device, torch.float16).requires_grad_()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = loss_fn(logits, target)
        (loss * 2.0**40).backward()
        return logits.grad

    target = torch.tensor([0, 1, 2, 0], device=device)
    at_target = torch.zeros(4, 3, dtype=torch.bool, device=device).scatter_(1, target[:, None], True)
    fp16_log_softmax = grad(cross_entropy_with_fp16_log_softmax)
    assert fp16_log_softmax[at_target].isnan().all() and fp16_log_softmax[~at_target].isposinf().all()
    autocast = grad(F.cross_entropy)
    if device.type == "cuda":
        assert torch.equal(autocast.isnan(), at_target) and autocast[~at_target].isposinf().all()
    else:
        assert autocast[at_target].isneginf().all() and autocast[~at_target].isposinf().all()


@pytest.mark.parametrize("loss_fn", [F.cross_entropy, cross_entropy_with_fp16_log_softmax],
                         ids=["cross_entropy", "fp16_log_softmax"])
def test_scaled_overflows_that_the_scaler_skips_are_information(loss_fn, device):
    """A correct loop whose first scale is far too large: the scaler's job, not a bug. Also where
    the overflow happens inside the loss (in FP16 log_softmax), and the first gradient the doctor
    sees holds NaN beside the inf."""
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**40, backoff_factor=2.0**-20)
    loop = amp_loop(model, optimizer, scaler, device, loss_fn=loss_fn)
    report = watched(model, optimizer, scaler, loop, steps=4)
    found = [f for f in report.findings if f.code == "nonfinite"]
    assert [f.severity for f in found] == ["info"], str(report)
    assert re.search("skipped [123] of 4 steps", found[0].message)
    assert "first seen in the gradient of the model's output" in found[0].message
    assert report.ok
    # A scale that never comes down far enough: every step skipped is a warning.
    scaler = DynamicLossScaler(2.0**100, backoff_factor=0.99)
    loop = amp_loop(model, optimizer, scaler, device, loss_fn=loss_fn)
    report = watched(model, optimizer, scaler, loop)
    found = [f for f in report.findings if f.code == "nonfinite"]
    assert [f.severity for f in found] == ["warning"] and "skipped 3 of 3 steps" in found[0].message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_loss(dtype, device):
    model = mlp(2, 8, dtype=dtype, device=device)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    loop = plain_loop(model, optimizer, device, to_float=False, dtype=dtype)
    found = [f for f in watched(model, optimizer, None, loop).findings if f.code == "half-loss"]
    assert len(found) == 1 and found[0].where == "torch.nn.functional.cross_entropy"
    model = mlp(2, 8, dtype=dtype, device=device)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    loop = plain_loop(model, optimizer, device, to_float=True, dtype=dtype)
    assert "half-loss" not in codes(watched(model, optimizer, None, loop))


def test_eps_underflow(device):
    model = mlp(2, 8, dtype=torch.float16, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=torch.float16))
    found = [f for f in report.findings if f.code == "eps-underflow"]
    assert found[0].severity == "error" and "rounds to 0 in FP16" in found[0].message
    model = mlp(2, 8, dtype=torch.float16, device=device)
    optimizer = MasterWeightOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8))
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=torch.float16))
    assert "eps-underflow" not in codes(report)


def dead_first_input(model, optimizer, device):
    """An FP16 Adam loop whose first input is always 0: no gradient reaches 0.weight[:, 0]."""
    def step(i):
        x, y = batch(i, device, dtype=torch.float16)
        x[:, 0] = 0
        optimizer.zero_grad()
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
    return step


@pytest.mark.parametrize("width", [8, 24])
def test_a_nan_born_in_the_optimizer_step(width, device):
    """Adam in FP16 with eps=1e-8 (0 in FP16): where v = 0 the update is 0 / (0 + 0)."""
    model = mlp(1, width, dtype=torch.float16, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)
    report = watched(model, optimizer, None, dead_first_input(model, optimizer, device), steps=2)
    found = nonfinite(report)
    assert len(found) == 1 and found[0].where == "optimizer: 0.weight"
    assert {"eps-underflow", "nonfinite"} <= codes(report, "error")
    model = mlp(1, width, dtype=torch.float16, device=device)
    optimizer = MasterWeightOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8))
    report = watched(model, optimizer, None, dead_first_input(model, optimizer, device), steps=2)
    assert not {"eps-underflow", "nonfinite"} & codes(report)


def test_an_eps_that_outweighs_the_squared_gradients(device):
    model = mlp(1, 8, dtype=torch.float16, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-2)
    report = watched(model, optimizer, None, dead_first_input(model, optimizer, device), steps=2)
    found = [f for f in report.findings if f.code == "eps-underflow"]
    assert [f.severity for f in found] == ["warning"] and "outweighs sqrt(v)" in found[0].message
    assert found[0].where == "optimizer.param_groups[0]"


def test_half_batchnorm_in_a_cnn(device):
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 5 * 5, 3)).to(device, torch.float16)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    scaler = DynamicLossScaler(2.0**8)

    def step(i):
        x, y = torch.randn(8, 2, 5, 5, device=device).half(), torch.randint(0, 3, (8,), device=device)
        optimizer.zero_grad()
        scaler.scale(F.cross_entropy(model(x).float(), y)).backward()
        scaler.step(optimizer)
        scaler.update()

    report = watched(model, optimizer, scaler, step)
    assert [(f.code, f.where) for f in report.findings if f.severity != "info"] == \
        [("half-batchnorm", "1")]


def test_half_batchnorm(device):
    def model_with_bn():
        return mlp(2, 8, device=device, extra=(nn.BatchNorm1d(8),))

    model = model_with_bn().to(torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device, dtype=torch.bfloat16))
    found = [f for f in report.findings if f.code == "half-batchnorm"]
    assert [f.where for f in found] == ["4"]
    model = model_with_bn()  # FP32 model, autocast: BatchNorm's statistics stay FP32
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loop = plain_loop(model, optimizer, device, autocast=torch.bfloat16)
    assert "half-batchnorm" not in codes(watched(model, optimizer, None, loop))


@pytest.mark.parametrize("capability, expected", [((7, 5), True), ((8, 0), False), (None, False)])
def test_emulated_bf16_through_the_capability_seam(capability, expected, monkeypatch):
    monkeypatch.setattr(doctor, "capability", lambda device: capability)
    model = mlp(2, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loop = plain_loop(model, optimizer, torch.device("cpu"), autocast=torch.bfloat16)
    report = watched(model, optimizer, None, loop)
    assert ("emulated-bf16" in codes(report, "warning")) == expected
    for f in report.findings:  # a CPU with a capability reads as a bug: the message says simulated
        if f.code == "emulated-bf16":
            assert "simulated GPU of compute capability 7.5" in f.message and "cpu," not in f.message
            assert f.where == "cpu (simulated capability 7.5)"
    loop = plain_loop(model, optimizer, torch.device("cpu"), autocast=torch.float16)
    assert "emulated-bf16" not in codes(watched(model, optimizer, None, loop))


def test_the_capability_seam_on_this_machine():
    assert doctor.capability(torch.device("cpu")) is None
    if torch.cuda.is_available():
        assert doctor.capability(torch.device("cuda")) == torch.cuda.get_device_capability()


@pytest.mark.parametrize("scaler_kind", ["GradScaler", "DynamicLossScaler"])
@pytest.mark.parametrize("with_scaler", [False, True])
def test_checkpoint_without_scaler(scaler_kind, with_scaler, device):
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = SCALERS[scaler_kind](device)
    train = amp_loop(model, optimizer, scaler, device)

    def step(i):
        train(i)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if with_scaler:
            state["scaler"] = scaler.state_dict()
        torch.save(state, io.BytesIO())

    found = "checkpoint-without-scaler" in codes(watched(model, optimizer, scaler, step, steps=2))
    assert found != with_scaler


def test_a_checkpoint_without_a_dynamic_scaler_needs_none(device):
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = StaticLossScaler(2.0**10)
    train = amp_loop(model, optimizer, scaler, device)

    def step(i):
        train(i)
        torch.save({"model": model.state_dict()}, io.BytesIO())

    assert "checkpoint-without-scaler" not in codes(watched(model, optimizer, scaler, step))


def test_tf32_is_information_read_from_torch(device):
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, device))
    found = [f for f in report.findings if f.code == "tf32"]
    assert [f.severity for f in found] == ["info"] and tf32_state() in found[0].message
    assert f"computed on {device.type}," in found[0].message


@pytest.mark.parametrize("devices, applies", [
    ({"cpu"}, "computed on cpu, where TF32 does not apply"),
    ({"cuda"}, "computed on cuda, where it applies"),
    ({"cpu", "cuda"}, "computed on cpu, cuda: it applies on cuda"),
    (set(), "computed on no device, where TF32 does not apply")], ids=["cpu", "cuda", "cpu+cuda", "none"])
def test_tf32_names_every_device_the_run_computed_on_as_torch_does(devices, applies):
    """On a CPU too: the message for a CUDA run, or one that used a CPU and a GPU."""
    found = diagnosis._tf32(Observations(devices=devices), None)
    assert [f.code for f in found] == ["tf32"] and found[0].message.endswith(applies)


def test_a_scaler_that_was_not_passed_is_named_and_still_followed(device):
    model = mlp(1, 8, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type)
    loop = amp_loop(model, optimizer, scaler, device, clip="before")
    report = watched(model, optimizer, scaler, loop, passed=None)
    assert "unwatched-scaler" in codes(report, "info")
    assert "clip-before-unscale" in codes(report, "error")
    assert "fp16-without-scaling" not in codes(report)


class LoggingScaler(torch.amp.GradScaler):
    """A subclass that overrides the scaler's methods and calls super(), as ShardedGradScaler does."""
    def scale(self, outputs):
        return super().scale(outputs)

    def unscale_(self, optimizer):
        return super().unscale_(optimizer)

    def update(self, new_scale=None):
        return super().update(new_scale)


@pytest.mark.parametrize("clip", ["after", "before"])
def test_a_scaler_subclass_is_followed_once_per_call(clip, device):
    model = mlp(2, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = LoggingScaler(device.type, init_scale=2.0**10)
    before = dict(vars(LoggingScaler))
    report = watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device, clip=clip))
    assert serious(report) == ({"clip-before-unscale"} if clip == "before" else set()), str(report)
    assert dict(vars(LoggingScaler)) == before


# --- the report -----------------------------------------------------------------------------------

def test_the_report_counts_the_steps_the_scaler_skipped_as_watched():
    model = mlp(1, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # FP16 gradients overflow: every step skipped
    report = watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, torch.device("cpu")),
                     steps=2)
    assert (report.steps, report.skipped) == (0, 2)
    summary = str(report).splitlines()[0]
    assert "2 watched steps (2 skipped by the scaler, 0 optimizer steps taken)" in summary, summary
    assert summary == report._repr_markdown_().splitlines()[0].strip("*")


def test_the_report_in_text_and_markdown():
    model = mlp(1, 8, dtype=torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    report = watched(model, optimizer, None, plain_loop(model, optimizer, torch.device("cpu"),
                                                        to_float=False, dtype=torch.float16))
    assert not report.ok
    text, markdown = str(report), report._repr_markdown_()
    assert text.splitlines()[0].startswith("doctor: ")
    assert markdown.splitlines()[2] == "| severity | code | where | what happened | fix |"
    for f in report.findings:
        assert f.code in text and f.fix in text and f"`{f.code}`" in markdown
        assert f.guide == (f"fg-{f.code}" if f.code in CODES else "")
        assert f.fix.endswith(".") and f.severity in ("error", "warning", "info")
    severities = [f.severity for f in report.findings]
    assert severities == sorted(severities, key=("error", "warning", "info").index)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.findings[0].code = "other"
    assert [field.name for field in dataclasses.fields(doctor.Finding)] == \
        ["code", "severity", "message", "where", "fix", "guide"]


# --- a watched run is the unwatched run -----------------------------------------------------------

ORIGINALS = {"backward": torch.Tensor.backward, "save": torch.save,
             "clip": nn.utils.clip_grad_norm_, "cross_entropy": F.cross_entropy,
             "GradScaler": dict(vars(torch.amp.GradScaler)),
             "LossScaler": dict(vars(DynamicLossScaler.__mro__[1]))}


def assert_nothing_left(model, optimizer):
    assert torch.Tensor.backward is ORIGINALS["backward"] and torch.save is ORIGINALS["save"]
    assert nn.utils.clip_grad_norm_ is ORIGINALS["clip"]
    assert F.cross_entropy is ORIGINALS["cross_entropy"]
    assert dict(vars(torch.amp.GradScaler)) == ORIGINALS["GradScaler"]
    assert dict(vars(DynamicLossScaler.__mro__[1])) == ORIGINALS["LossScaler"]
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    inner = getattr(optimizer, "optimizer", optimizer)
    assert not inner._optimizer_step_pre_hooks and not inner._optimizer_step_post_hooks


def same(a, b):
    """Equal bit for bit: tensors by their bytes, containers element by element."""
    if isinstance(a, torch.Tensor):
        bits = (lambda t: t.view(torch.uint8) if t.dim() else t)
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def dropout_model(device, dtype=torch.float32):
    return mlp(2, 16, dtype=dtype, device=device, extra=(nn.Dropout(0.3),))  # draws random numbers


SETUPS = {
    "amp + GradScaler": lambda device: _amp(device, lambda: torch.amp.GradScaler(device.type)),
    "amp + DynamicLossScaler": lambda device: _amp(device, lambda: DynamicLossScaler(2.0**10)),
    "bf16 + masters": lambda device: _bf16(device),
    "trainer fp16": lambda device: _trainer(device),
}


def _amp(device, make_scaler):
    model = dropout_model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = make_scaler()
    return model, optimizer, scaler, amp_loop(model, optimizer, scaler, device)


def _bf16(device):
    model = dropout_model(device, torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    return model, optimizer, None, plain_loop(model, optimizer, device, dtype=torch.bfloat16)


def _trainer(device):
    model = dropout_model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = MixedPrecisionTrainer(model, optimizer, TrainerConfig("fp16", max_grad_norm=1.0))
    return model, optimizer, trainer.scaler, lambda i: trainer.train_step(
        batch(i, device), lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def final_state(setup, device, watch: bool, steps=4):
    torch.manual_seed(123)
    model, optimizer, scaler, loop = SETUPS[setup](device)
    if watch:
        with doctor.watch(model, optimizer, scaler):
            for i in range(steps):
                loop(i)
        assert_nothing_left(model, optimizer)
    else:
        for i in range(steps):
            loop(i)
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": torch.get_rng_state(), "grads": [p.grad for p in model.parameters()],
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


@pytest.mark.parametrize("setup", SETUPS)
def test_a_watched_run_is_bit_identical_to_an_unwatched_one(setup, device):
    assert same(final_state(setup, device, watch=False), final_state(setup, device, watch=True))


def test_an_exception_in_the_block_propagates_and_everything_is_restored(device):
    model, optimizer, scaler, loop = SETUPS["amp + GradScaler"](device)

    class Stop(Exception):
        pass

    session = doctor.watch(model, optimizer, scaler)
    with pytest.raises(Stop):
        with session:
            loop(0)
            x, _ = batch(1, device)
            with torch.autocast(device.type, dtype=torch.float16):
                scaler.scale(model(x).sum()).backward()
            raise Stop()
    assert_nothing_left(model, optimizer)
    assert session.report().steps == 1
    with pytest.raises(RuntimeError, match="one with-block"):
        with session:
            pass
    with doctor.watch(model, optimizer, scaler) as again:  # a fresh session may watch again
        loop(2)
    assert again.report().steps == 1


# --- bad input ------------------------------------------------------------------------------------

def test_bad_input_gets_a_clear_error():
    model = mlp(1, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        doctor.watch(lambda x: x, optimizer)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        doctor.watch(model, model.parameters())
    empty = torch.optim.SGD(model.parameters(), lr=0.1)
    empty.param_groups[0]["params"] = []
    with pytest.raises(ValueError, match="no parameters"):
        doctor.watch(model, empty)
    with pytest.raises(TypeError, match="unknown scaler kind dict"):
        doctor.watch(model, optimizer, scaler={"scale": 1024.0})
    session = doctor.watch(model, optimizer)
    with pytest.raises(RuntimeError, match="never entered"):
        session.report()
    with session:
        with pytest.raises(RuntimeError, match="after the block ends"):
            session.report()
        with pytest.raises(RuntimeError, match="cannot nest"):
            with doctor.watch(model, optimizer):
                pass


def test_every_guide_anchor_is_a_label_in_the_book():
    """Each code's guide, fg-<code>, is a MyST label ``(fg-<code>)=`` in the book's sources (the
    book's own build, elsewhere in the suite, resolves every {ref} to them)."""
    import json
    import pathlib

    from mpcourse.doctor.report import FIXES, GUIDED, finding

    book = pathlib.Path(__file__).resolve().parent.parent / "book"
    labels = set()
    for path in [*book.glob("*.ipynb"), *book.glob("*.md")]:
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text())["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        else:
            text = path.read_text()
        labels |= set(re.findall(r"^\((fg-[\w-]+)\)=\s*$", text, flags=re.M))
    guides = {finding(code, "info", "", "").guide for code in FIXES}
    assert guides - {""} == {f"fg-{code}" for code in GUIDED}
    assert {*CODES, "fsdp-fp16-without-sharded-scaler", "half-reduce", "unsynced-found-inf"} <= GUIDED
    missing = sorted(g for g in guides - {""} if g not in labels)
    assert not missing, f"no (label)= in book/ for {missing}"


def test_skipped_steps_after_a_forward_overflow_blame_the_forward_pass_not_the_scale(device):
    """The loss is already inf/NaN: the scaler's skips are a symptom, and the message must not say
    that the *scaled* gradients overflowed (no loss scale fixes a forward overflow)."""
    model = mlp(1, 8, device=device)
    with torch.no_grad():
        model[0].weight *= 1e6                       # FP16 activations overflow in the forward pass
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type)
    report = watched(model, optimizer, scaler, amp_loop(model, optimizer, scaler, device, clip=None))
    skips = [f for f in report.findings if f.code == "nonfinite" and "skipped" in f.message]
    assert len(skips) == 1
    assert "no loss scale fixes" in skips[0].message and "scaled gradients overflowed" not in skips[0].message


def test_half_batchnorm_in_fp16_names_the_variance_overflow(device):
    model = mlp(2, 8, device=device, extra=(nn.BatchNorm1d(8),)).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    scaler = DynamicLossScaler(2.0**8)

    def step(i):
        x, y = batch(i, device)
        optimizer.zero_grad()
        scaler.scale(F.cross_entropy(model(x.half()).float(), y)).backward()
        scaler.step(optimizer)
        scaler.update()

    report = watched(model, optimizer, scaler, step)
    found = [f for f in report.findings if f.code == "half-batchnorm"]
    assert len(found) == 1 and "65504" in found[0].message and "inf" in found[0].message
