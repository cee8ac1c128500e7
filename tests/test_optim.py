"""mpcourse.optim, proven against the real thing: hand-written FP32 references fed the same
low-precision gradients (bit for bit), the bare torch optimizer over FP32 models,
torch.amp.GradScaler end to end, an independent NumPy/ml_dtypes Kahan summation, and the
statistics of stochastic rounding."""
import io
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from mpcourse.formats import BF16, FP16, round_to
from mpcourse.optim import CompensatedOptimizer, MasterWeightOptimizer, training_state

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
}


def mlp(dtype, seed=0, device="cpu"):
    """A small MLP whose weights are drawn in FP32 and rounded once to dtype."""
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.to(device=device, dtype=dtype)


def batch(step, micro, dtype, device="cpu"):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    return x.to(device, dtype), y.to(device, dtype)


def train(model, optimizer, steps, first_step=0, micro_batches=2):
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    for step in range(first_step, first_step + steps):
        optimizer.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(step, micro, dtype, device)
            nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (so -0.0 is not 0.0, and NaN is NaN)."""
    as_int = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.detach().view(as_int), b.detach().view(as_int))


# --- the vectorised copy the masters are rounded with ------------------------------------------
@pytest.mark.parametrize("name", DTYPES)
def test_foreach_copy_rounds_to_nearest_even_like_a_cast(name):
    dtype, fmt = DTYPES[name], {"fp16": FP16, "bf16": BF16}[name]
    g = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-2**31, 2**31, (100_000,), generator=g, dtype=torch.int64)
    grid = fmt.values().astype(np.float64)
    ties = torch.from_numpy(((grid[1:] + grid[:-1]) / 2).astype(np.float32))  # exact midpoints
    sources = [random_bits.to(torch.int32).view(torch.float32), ties, torch.tensor(
        [math.nan, math.inf, -math.inf, -0.0, 65504.0, 65520.0, 1e-45, 3.4e38])]
    targets = [torch.empty_like(s, dtype=dtype) for s in sources]
    torch._foreach_copy_(targets, sources)
    for target, source in zip(targets, sources):
        assert torch.equal(target.view(torch.int16), source.to(dtype).view(torch.int16))
        expected = round_to(source, fmt)
        finite = ~torch.isnan(expected)
        assert torch.equal(target.float()[finite], expected[finite])
        assert torch.isnan(target[~finite]).all()


# --- MasterWeightOptimizer ---------------------------------------------------------------------
def reference_run(dtype, make_optimizer, steps, device="cpu"):
    """Mixed precision written out by hand: an FP32 optimizer over FP32 weights, fed the gradients
    of a low-precision copy (accumulated over micro-batches in FP32), which is refreshed from the
    FP32 weights after every step."""
    model = mlp(dtype, device=device)
    weights = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = make_optimizer(weights)
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(2):
            x, y = batch(step, micro, dtype, device)
            nn.functional.mse_loss(model(x), y).backward()
            for p, w in zip(model.parameters(), weights):
                w.grad = p.grad.float() if w.grad is None else w.grad + p.grad.float()
                p.grad = None
        optimizer.step()
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(w.to(dtype))
    return weights, list(model.parameters())


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.parametrize("name", DTYPES)
def test_masters_match_a_hand_written_fp32_reference_bit_for_bit(name, opt_name):
    dtype, make_optimizer = DTYPES[name], OPTIMIZERS[opt_name]
    model = mlp(dtype)
    optimizer = MasterWeightOptimizer(make_optimizer(model.parameters()))
    train(model, optimizer, steps=15)
    ref_weights, ref_model = reference_run(dtype, make_optimizer, steps=15)
    for master, ref in zip(optimizer.master_params(), ref_weights):
        assert same_bits(master.detach(), ref.detach())
    for p, ref in zip(model.parameters(), ref_model):
        assert same_bits(p.detach(), ref.detach())
    assert all(p.grad is None for p in model.parameters())  # the gradients live on the masters


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_over_fp32_parameters_the_wrapper_is_the_bare_optimizer(opt_name):
    bare_model, wrapped_model = mlp(torch.float32), mlp(torch.float32)
    bare = OPTIMIZERS[opt_name](bare_model.parameters())
    wrapped = MasterWeightOptimizer(OPTIMIZERS[opt_name](wrapped_model.parameters()))
    train(bare_model, bare, steps=10)
    train(wrapped_model, wrapped, steps=10)
    for a, b in zip(bare_model.parameters(), wrapped_model.parameters()):
        assert same_bits(a.detach(), b.detach())
    assert wrapped.master_params() == list(wrapped_model.parameters())  # shared, not copied


def test_gradients_of_micro_batches_accumulate_in_fp32():
    plain = nn.Parameter(torch.ones(1, dtype=torch.float16))
    w = nn.Parameter(torch.ones(1, dtype=torch.float16))
    optimizer = MasterWeightOptimizer(torch.optim.SGD([w], lr=1.0))
    for p in (plain, w):
        (p * 1.0).sum().backward()
        (p * 2.0**-11).sum().backward()
    assert plain.grad.item() == 1.0  # in FP16, 1 + 2**-11 rounds back to 1
    assert optimizer.master_params()[0].grad.item() == 1 + 2.0**-11
    assert w.grad is None


def test_tiny_updates_vanish_in_fp16_but_add_up_in_the_master():
    lr, steps = 1e-4, 10  # lr * grad = 1e-4 < 2**-12, half the FP16 gap below 1
    plain = nn.Parameter(torch.ones(1, dtype=torch.float16))
    model = nn.Parameter(torch.ones(1, dtype=torch.float16))
    plain_sgd = torch.optim.SGD([plain], lr=lr)
    optimizer = MasterWeightOptimizer(torch.optim.SGD([model], lr=lr))
    master = optimizer.master_params()[0]
    for step in range(steps):
        for p, opt in ((plain, plain_sgd), (model, optimizer)):
            opt.zero_grad()
            p.sum().backward()  # gradient 1
            opt.step()
        if step == 0:
            assert master.item() < 1.0 and model.item() == 1.0  # moved, but not yet visible in FP16
    assert plain.item() == 1.0
    assert master.item() == pytest.approx(1 - steps * lr, rel=1e-6)
    assert model.item() < 1.0 and same_bits(model.detach(), master.detach().half())


def scaled_tiny_gradient_setup(wrapper):
    """One FP16 weight vector whose true gradient, 2**-26 per element, underflows to zero in FP16
    but is 2**-14 (an FP16 normal) at loss scale 2**12."""
    w = nn.Parameter(torch.ones(4, dtype=torch.float16))
    x = torch.full((4,), 2.0**-12, dtype=torch.float16)
    optimizer = wrapper(torch.optim.SGD([w], lr=2.0**10))
    return w, x, optimizer, lambda: (w * x).sum() * 2.0**-14


@pytest.mark.parametrize("wrapper", [MasterWeightOptimizer, CompensatedOptimizer])
def test_grad_scaler_unscales_the_fp32_gradients(wrapper):
    _, _, optimizer, loss_fn = scaled_tiny_gradient_setup(wrapper)
    copy = optimizer.param_groups[0]["params"][0]
    loss_fn().backward()
    assert torch.all(copy.grad == 0)  # unscaled, the FP16 gradient underflows
    optimizer.zero_grad()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaler.scale(loss_fn()).backward()
    scaler.unscale_(optimizer)  # GradScaler refuses to unscale FP16 gradients
    assert copy.grad.dtype == torch.float32 and torch.all(copy.grad == 2.0**-26)


def test_grad_scaler_end_to_end():
    w, x, optimizer, loss_fn = scaled_tiny_gradient_setup(MasterWeightOptimizer)
    master = optimizer.master_params()[0]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaler.scale(loss_fn()).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(optimizer.master_params(), max_norm=1.0)
    assert norm.item() == 2.0**-25  # sqrt(4 * (2**-26)**2); model.parameters() would give 0
    scaler.step(optimizer)
    scaler.update()
    assert torch.all(master == 1 - 2.0**10 * 2.0**-26)  # exact in FP32
    assert torch.all(w == 1)  # 1 - 2**-16 is 1 in FP16
    assert scaler.get_scale() == 2.0**12

    optimizer.zero_grad()  # an overflowing step is skipped, and the scale backs off
    x[0] = math.inf
    scaler.scale(loss_fn()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.all(master == 1 - 2.0**-16) and scaler.get_scale() == 2.0**11


def test_our_dynamic_loss_scaler_and_grad_scaler_drive_the_wrapper_alike():
    scaling = pytest.importorskip("mpcourse.scaling")
    runs = []
    for scaler in (torch.amp.GradScaler("cpu"), scaling.DynamicLossScaler()):
        model = mlp(torch.float16)
        optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
        scales = []
        for step in range(6):
            optimizer.zero_grad()
            x, y = batch(step, 0, torch.float16)
            scales.append(scaler.get_scale())
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()  # 2**16 overflows
            scaler.step(optimizer)
            scaler.update()
        runs.append((scales, optimizer.master_params()))
    (torch_scales, torch_masters), (our_scales, our_masters) = runs
    assert our_scales == torch_scales and len(set(torch_scales)) > 1  # an overflow was skipped
    for a, b, initial in zip(torch_masters, our_masters, mlp(torch.float16).parameters()):
        assert same_bits(a, b) and not torch.equal(a, initial.float())  # other steps were taken


def checkpoint(*objects) -> list:
    buffer = io.BytesIO()
    torch.save([o.state_dict() for o in objects], buffer)
    buffer.seek(0)
    return torch.load(buffer)


WRAPPERS = {
    "master": lambda opt, seed: MasterWeightOptimizer(opt),
    "kahan": lambda opt, seed: CompensatedOptimizer(opt, method="kahan"),
    "stochastic": lambda opt, seed: CompensatedOptimizer(
        opt, method="stochastic", generator=torch.Generator().manual_seed(seed)),
    "nearest": lambda opt, seed: CompensatedOptimizer(opt, method="nearest"),
}


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_resuming_from_a_checkpoint_is_bit_identical(wrapper):
    def fresh(seed):
        model = mlp(torch.bfloat16, seed=seed)
        return model, WRAPPERS[wrapper](torch.optim.AdamW(model.parameters(), lr=1e-2), seed)

    model, optimizer = fresh(seed=0)
    train(model, optimizer, steps=8)

    interrupted, interrupted_opt = fresh(seed=0)
    train(interrupted, interrupted_opt, steps=4)
    saved_model, saved_opt = checkpoint(interrupted, interrupted_opt)
    resumed, resumed_opt = fresh(seed=1)  # other weights, other generator seed
    resumed.load_state_dict(saved_model)
    resumed_opt.load_state_dict(saved_opt)
    train(resumed, resumed_opt, steps=4, first_step=4)

    for a, b in zip(model.parameters(), resumed.parameters()):
        assert same_bits(a.detach(), b.detach())
    for a, b in zip(optimizer.param_groups[0]["params"], resumed_opt.param_groups[0]["params"]):
        assert same_bits(a.detach(), b.detach())
        assert same_bits(optimizer.state[a]["exp_avg_sq"], resumed_opt.state[b]["exp_avg_sq"])


def test_closure_is_evaluated_at_the_current_masters():
    model = mlp(torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4))
    x, y = batch(0, 0, torch.bfloat16)
    evaluated_at = []

    def closure():
        optimizer.zero_grad()
        evaluated_at.append([p.detach().clone() for p in model.parameters()])
        for p, master in zip(model.parameters(), optimizer.master_params()):
            assert same_bits(p.detach(), master.detach().to(torch.bfloat16))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert len(evaluated_at) > 1 and not torch.equal(evaluated_at[0][0], evaluated_at[-1][0])
    assert loss.item() == pytest.approx(nn.functional.mse_loss(mlp(torch.bfloat16)(x), y).item())


def test_a_learning_rate_scheduler_on_the_inner_optimizer_drives_the_wrapper():
    model = mlp(torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" warning
        for step in range(3):
            train(model, optimizer, steps=1, first_step=step, micro_batches=1)
            scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.125


# --- misuse fails with a sentence ----------------------------------------------------------------
def test_wrapping_something_else_than_a_torch_optimizer_is_a_type_error():
    model = mlp(torch.float16)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        MasterWeightOptimizer(model.parameters())
    inner = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="not MasterWeightOptimizer"):
        MasterWeightOptimizer(inner)


def test_an_optimizer_can_be_wrapped_once():
    sgd = torch.optim.SGD(mlp(torch.float16).parameters(), lr=0.1)
    first = MasterWeightOptimizer(sgd)
    first.remove_hooks()
    with pytest.raises(ValueError, match="wrapped already"):
        MasterWeightOptimizer(sgd)


def test_an_optimizer_that_has_already_stepped_cannot_be_wrapped():
    model = mlp(torch.float16)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(0, 0, torch.float16)
    nn.functional.mse_loss(model(x), y).backward()
    sgd.step()
    with pytest.raises(ValueError, match="before its first step"):
        MasterWeightOptimizer(sgd)


def test_parameters_move_their_gradients_to_one_wrapper_at_a_time():
    model = mlp(torch.bfloat16)
    first = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="remove_hooks"):
        CompensatedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    first.remove_hooks()
    second = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    train(model, second, steps=1, micro_batches=1)
    assert all(m.grad is not None for m in second.master_params())
    assert all(m.grad is None for m in first.master_params())


def test_backward_after_step_without_the_optimizers_zero_grad_is_an_error():
    model = mlp(torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    train(model, optimizer, steps=1)
    model.zero_grad()  # clears nothing: the gradients are on the masters
    x, y = batch(1, 0, torch.bfloat16)
    with pytest.raises(RuntimeError, match="optimizer.zero_grad"):
        nn.functional.mse_loss(model(x), y).backward()


def test_a_gradient_set_by_hand_on_the_model_is_an_error():
    model = mlp(torch.float16)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="did not move"):
        optimizer.step()


def test_weights_changed_outside_the_optimizer_are_caught_and_can_be_reloaded():
    model = mlp(torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model.load_state_dict(mlp(torch.bfloat16, seed=5).state_dict())
    with pytest.raises(RuntimeError, match="reload_model_params"):
        train(model, optimizer, steps=1)
    optimizer.reload_model_params()
    for p, master in zip(model.parameters(), optimizer.master_params()):
        assert same_bits(master.detach(), p.detach().float())
    train(model, optimizer, steps=1)


def test_a_model_converted_after_wrapping_is_an_error():
    model = mlp(torch.float32)
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="before building the optimizer"):
        optimizer.step()


def test_a_state_dict_for_another_model_is_a_value_error():
    optimizer = MasterWeightOptimizer(torch.optim.SGD(mlp(torch.float16).parameters(), lr=0.1))
    other = MasterWeightOptimizer(torch.optim.SGD(nn.Linear(2, 2).half().parameters(), lr=0.1))
    with pytest.raises(ValueError, match="do not match"):
        optimizer.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="expected the keys"):
        optimizer.load_state_dict(optimizer.optimizer.state_dict())


# --- CompensatedOptimizer -------------------------------------------------------------------------
def sgd_run(wrapper, steps, dtype=torch.bfloat16, n=1, lr=1e-4, device="cpu"):
    """``steps`` steps of SGD with gradient 1 on weights starting at 1: the exact result is
    1 - steps * lr, and each update is far below half the BF16 gap below 1 (2**-9)."""
    w = nn.Parameter(torch.ones(n, dtype=dtype, device=device))
    optimizer = wrapper(torch.optim.SGD([w], lr=lr))
    for _ in range(steps):
        optimizer.zero_grad()
        w.sum().backward()
        optimizer.step()
    return w.detach(), optimizer


def bf16_gap_below(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(x)) - BF16.mantissa_bits)


def test_tiny_updates_stall_in_plain_bf16_and_kahan_recovers_them():
    steps = 1000
    exact, _ = sgd_run(lambda opt: opt, steps, dtype=torch.float32)
    plain, _ = sgd_run(lambda opt: opt, steps)
    kahan, optimizer = sgd_run(lambda opt: CompensatedOptimizer(opt, method="kahan"), steps)
    assert exact.item() == pytest.approx(1 - steps * 1e-4, abs=1e-4)  # FP32's own error is tiny
    assert plain.item() == 1.0
    assert abs(kahan.item() - exact.item()) <= bf16_gap_below(exact.item())
    assert optimizer.compensation[0].dtype == torch.bfloat16


def test_nearest_write_back_stalls_like_plain_bf16_despite_fp32_update_and_moments():
    steps = 1000
    nearest, optimizer = sgd_run(lambda opt: CompensatedOptimizer(opt, method="nearest"), steps)
    assert nearest.item() == 1.0  # each update is below half the gap: rounded away every time
    assert optimizer.compensation == []
    model = mlp(torch.bfloat16, seed=0)
    adam = CompensatedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), method="nearest")
    model(torch.randn(8, 6, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    adam.step()
    moments = [t for state in adam.state.values() for t in state.values() if torch.is_tensor(t) and t.dim()]
    assert moments and all(t.dtype == torch.float32 for t in moments)  # the moments are FP32


def stochastic_mean_sigma(steps, n):
    """Each stochastic rounding adds an independent zero-mean error of variance at most gap**2 / 4
    (the BF16 gap is at most 2**-7 near 1), so the mean over n weights after ``steps`` updates has
    a standard deviation of at most this."""
    return math.sqrt(steps * (2.0**-7) ** 2 / 4 / n)


def test_stochastic_rounding_is_unbiased_over_many_weights():
    steps, n = 1000, 4096
    exact, _ = sgd_run(lambda opt: opt, steps, dtype=torch.float32)
    w, _ = sgd_run(lambda opt: CompensatedOptimizer(
        opt, method="stochastic", generator=torch.Generator().manual_seed(0)), steps, n=n)
    sigma = stochastic_mean_sigma(steps, n)
    assert abs(w.float().mean().item() - exact.item()) < 5 * sigma
    assert 5 * sigma < (1 - exact.item()) / 10  # tight enough to tell it from stalling at 1
    assert w.float().std().item() > 0  # the weights really took different random paths


def test_kahan_matches_an_independent_numpy_ml_dtypes_summation():
    steps, n, lr = 200, 512, 1e-4
    rng = np.random.default_rng(0)
    # Gradients ±2**k keep lr * g exact in FP32, so SGD's single rounding is NumPy's too.
    signs, powers = rng.choice([-1, 1], (steps, n)), rng.integers(-3, 4, (steps, n))
    grads = (signs * 2.0**powers).astype(np.float32)
    w = nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
    optimizer = CompensatedOptimizer(torch.optim.SGD([w], lr=lr), method="kahan")
    for g in grads:
        optimizer.zero_grad()
        (w * torch.from_numpy(g).bfloat16()).sum().backward()
        optimizer.step()

    bf16, f32 = ml_dtypes.bfloat16, np.float32
    w_ref, c_ref = np.ones(n, bf16), np.zeros(n, bf16)
    for g in grads:
        w32 = w_ref.astype(f32)
        u = (w32 - f32(lr) * g) - w32
        y = u + c_ref.astype(f32)
        t = (w32 + y).astype(bf16)
        c_ref = (y - (t.astype(f32) - w32)).astype(bf16)
        w_ref = t
    assert np.array_equal(w.detach().view(torch.int16).numpy(), w_ref.view(np.int16))
    assert np.array_equal(optimizer.compensation[0].view(torch.int16).numpy(), c_ref.view(np.int16))


def test_fp32_parameters_mixed_in_are_stepped_directly():
    low, full = nn.Parameter(torch.ones(3, dtype=torch.bfloat16)), nn.Parameter(torch.ones(3))
    twin = nn.Parameter(torch.ones(3))
    optimizer = CompensatedOptimizer(torch.optim.SGD([low, full], lr=0.1))
    bare = torch.optim.SGD([twin], lr=0.1)
    for _ in range(3):
        for opt, params in ((optimizer, (low, full)), (bare, (twin,))):
            opt.zero_grad()
            sum((p.float() ** 2).sum() for p in params).backward()
            opt.step()
    assert optimizer.working_params()[1] is full and same_bits(full.detach(), twin.detach())


def test_compensated_optimizer_rejects_bad_arguments():
    def sgd(dtype=torch.bfloat16):
        return torch.optim.SGD([nn.Parameter(torch.ones(2, dtype=dtype))], lr=0.1)
    with pytest.raises(ValueError, match="unknown method 'sr'"):
        CompensatedOptimizer(sgd(), method="sr")
    with pytest.raises(ValueError, match="only used with method='stochastic'"):
        CompensatedOptimizer(sgd(), method="kahan", generator=torch.Generator())
    with pytest.raises(TypeError, match="torch.Generator"):
        CompensatedOptimizer(sgd(), method="stochastic", generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="nothing to compensate"):
        CompensatedOptimizer(sgd(torch.float32))
    stochastic = CompensatedOptimizer(sgd(), method="stochastic", generator=torch.Generator())
    with pytest.raises(ValueError, match="method='stochastic'"):
        CompensatedOptimizer(sgd(), method="kahan").load_state_dict(stochastic.state_dict())
    with pytest.raises(ValueError, match="pass generator="):
        CompensatedOptimizer(sgd(), method="stochastic").load_state_dict(stochastic.state_dict())


# --- CUDA ----------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_masters_match_the_reference_and_stochastic_rounding_runs():
    model = mlp(torch.bfloat16, device="cuda")
    optimizer = MasterWeightOptimizer(OPTIMIZERS["adamw"](model.parameters()))
    train(model, optimizer, steps=5)
    ref_weights, _ = reference_run(torch.bfloat16, OPTIMIZERS["adamw"], steps=5, device="cuda")
    for master, ref in zip(optimizer.master_params(), ref_weights):
        assert master.is_cuda and same_bits(master.detach(), ref.detach())
    steps, n = 100, 1000
    w, _ = sgd_run(lambda opt: CompensatedOptimizer(
        opt, method="stochastic", generator=torch.Generator("cuda").manual_seed(0)), steps, n=n,
        device="cuda")
    mean = w.float().mean().item()
    assert w.is_cuda and abs(mean - (1 - steps * 1e-4)) < 5 * stochastic_mean_sigma(steps, n)


def test_training_state_counts_every_copy_training_keeps():
    def state_after_one_step(model, optimizer):
        optimizer.zero_grad()
        model(torch.randn(4, 8, dtype=next(model.parameters()).dtype)).float().sum().backward()
        optimizer.step()
        return training_state(model, optimizer)

    def bytes_per_parameter(state, n):
        return {role: sum(t.numel() * t.element_size() for t in ts) / n for role, ts in state.items()}

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 16)
    n = sum(p.numel() for p in model.parameters())
    fp32 = bytes_per_parameter(state_after_one_step(model, torch.optim.AdamW(model.parameters())), n)
    assert fp32["weights"] == 4 and fp32["gradients"] == 4 and fp32["master weights"] == 0
    assert 8 < fp32["optimizer state"] < 8.5   # two FP32 moments, and a step counter per tensor

    half = torch.nn.Linear(8, 16).half()
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(half.parameters()))
    mixed = bytes_per_parameter(state_after_one_step(half, optimizer), n)
    assert mixed["weights"] == 2 and mixed["master weights"] == 4 and mixed["gradients"] == 4
    assert sum(mixed.values()) > sum(fp32.values())  # masters cost memory: no "25% saving" here
