"""mpcourse.scaling, proven against torch.amp.GradScaler step for step (scales, skipped steps,
parameters bit for bit), and its hysteresis rules against a small reference written here from the
rules as stated (Megatron-LM's, which is also DeepSpeed's default, and DeepSpeed's opt-in
consecutive variant), not from the library's code."""
import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

from mpcourse.scaling import DynamicLossScaler, ScaleRecord, StaticLossScaler

INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))


class Recorded:
    """A duck-typed optimizer (param_groups and step) that numbers the steps that really ran."""

    def __init__(self, optimizer):
        self.optimizer, self.param_groups, self.steps_run = optimizer, optimizer.param_groups, 0

    def step(self):
        self.optimizer.step()
        self.steps_run += 1
        return self.steps_run


def make_model(seed=0, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(device, dtype)


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
}


def plant(model, step, plan):
    """After backward: put an inf or a NaN into one gradient entry at the planned steps."""
    kind = plan.get(step)
    if kind is not None:
        params = list(model.parameters())
        params[step % len(params)].grad.view(-1)[step % 3] = {"inf": math.inf, "-inf": -math.inf,
                                                               "nan": math.nan}[kind]


def run_side_by_side(scaler, reference, optimizer="sgd", steps=24, plan=(), seed=0,
                     dtype=torch.float32, device="cpu", loss_gain=1.0, clip=None):
    """Train two identical models, one with each scaler, on the same batches; compare every step.

    Returns our scaler's record of skipped steps."""
    plan = dict(plan)
    models = [make_model(seed, dtype, device) for _ in range(2)]
    optimizers = [Recorded(OPTIMIZERS[optimizer](m.parameters())) for m in models]
    generator = torch.Generator().manual_seed(seed + 1)
    skipped = []
    for step in range(steps):
        x = torch.randn(5, 6, generator=generator).to(device, dtype)
        y = torch.randn(5, 3, generator=generator).to(device, dtype)
        returned = []
        for model, opt, s in zip(models, optimizers, (scaler, reference)):
            for p in model.parameters():
                p.grad = None
            loss = nn.functional.mse_loss(model(x), y) * loss_gain
            s.scale(loss).backward()
            plant(model, step, plan)
            if clip is not None:
                s.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            returned.append(s.step(opt))
            s.update()
        assert returned[0] == returned[1], f"step {step}: skipped by one scaler only"
        assert scaler.get_scale() == reference.get_scale(), f"step {step}: scales differ"
        for ours, theirs in zip(*(m.parameters() for m in models)):
            assert same_bits(ours, theirs), f"step {step}: parameters differ"
            assert same_bits(torch.nan_to_num(ours.grad), torch.nan_to_num(theirs.grad))
        skipped.append(returned[0] is None)
    assert [r.found_inf for r in scaler.history] == skipped
    return skipped


PLAN = {1: "inf", 4: "nan", 5: "inf", 9: "-inf", 15: "nan", 16: "nan", 17: "inf"}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("growth_interval", [1, 3])
def test_matches_gradscaler_with_inf_and_nan(optimizer, seed, growth_interval):
    ours = DynamicLossScaler(growth_interval=growth_interval)
    theirs = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    skipped = run_side_by_side(ours, theirs, optimizer, plan=PLAN, seed=seed)
    assert [i for i, s in enumerate(skipped) if s] == sorted(PLAN)
    assert len({r.scale for r in ours.history}) > 2  # the run grew and backed off


def test_matches_gradscaler_with_default_arguments():
    skipped = run_side_by_side(DynamicLossScaler(), torch.amp.GradScaler("cpu"), "adam", plan=PLAN)
    assert sum(skipped) == len(PLAN)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_matches_gradscaler_for_other_gradient_dtypes(dtype):
    # bfloat16 grads are multiplied by the float32 1/S in float32 and rounded once; float64 grads
    # by the same float32 1/S, in float64. A scale that is no power of two makes 1/S inexact.
    args = dict(init_scale=3000.0, growth_factor=3.1, backoff_factor=0.3, growth_interval=2)
    run_side_by_side(DynamicLossScaler(**args), torch.amp.GradScaler("cpu", **args), "sgd",
                     plan=PLAN, dtype=dtype)


def test_matches_gradscaler_with_unusual_factors_and_real_overflow():
    # A huge scale overflows the float32 gradients themselves: no planted inf needed. Factors that
    # are not powers of two make every product round to float32.
    args = dict(init_scale=2.0**126, growth_factor=3.1, backoff_factor=0.3, growth_interval=2)
    ours = DynamicLossScaler(**args)
    skipped = run_side_by_side(ours, torch.amp.GradScaler("cpu", **args), "adam", steps=40,
                               loss_gain=1e3)
    assert skipped[0] and not all(skipped)


def test_matches_gradscaler_when_clipping_after_unscale():
    run_side_by_side(DynamicLossScaler(growth_interval=3),
                     torch.amp.GradScaler("cpu", growth_interval=3), "sgd", plan=PLAN, clip=0.05)


def test_matches_gradscaler_for_sparse_gradients():
    results = []
    for scaler in (DynamicLossScaler(growth_interval=2), torch.amp.GradScaler("cpu",
                                                                              growth_interval=2)):
        torch.manual_seed(0)
        embedding = nn.Embedding(10, 4, sparse=True)
        optimizer = torch.optim.SGD(embedding.parameters(), lr=0.5)
        for step in range(6):
            optimizer.zero_grad()
            loss = embedding(torch.tensor([step, step + 1, 3])).pow(2).sum()
            scaler.scale(loss * (math.inf if step == 2 else 1.0)).backward()
            scaler.step(optimizer)
            scaler.update()
        results.append((scaler.get_scale(), embedding.weight.detach().clone()))
    assert results[0][0] == results[1][0] and same_bits(results[0][1], results[1][1])


def test_scale_never_becomes_infinite():
    for growth_factor in (2.0, 3.0):
        ours = DynamicLossScaler(init_scale=2.0**127, growth_factor=growth_factor,
                                 growth_interval=1)
        theirs = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_factor=growth_factor,
                                      growth_interval=1)
        run_side_by_side(ours, theirs, "sgd", steps=4, loss_gain=1e-40)
        assert ours.get_scale() == 2.0**127
        assert all(math.isfinite(r.scale) for r in ours.history)


def test_multiple_optimizers():
    results = []
    for scaler in (DynamicLossScaler(growth_interval=2), torch.amp.GradScaler("cpu",
                                                                              growth_interval=2)):
        model = make_model(3)
        first = Recorded(torch.optim.SGD(model[0].parameters(), lr=0.1))
        second = Recorded(torch.optim.Adam(model[2].parameters(), lr=0.1))
        generator = torch.Generator().manual_seed(0)
        for step in range(8):
            model.zero_grad()
            loss = model(torch.randn(4, 6, generator=generator)).square().mean()
            scaler.scale(loss).backward()
            if step in (2, 5):
                model[2].bias.grad[0] = math.nan  # only the second optimizer sees it
            ran = (scaler.step(first), scaler.step(second))
            scaler.update()
            results.append((ran, scaler.get_scale()))
        results.append([p.detach().clone() for p in model.parameters()])
    ours, theirs = results[:8], results[9:17]
    assert ours == theirs
    assert all(same_bits(a, b) for a, b in zip(results[8], results[17]))
    assert ours[2][0][0] is not None and ours[2][0][1] is None  # the clean optimizer stepped
    assert ours[2][1] == ours[1][1] / 2  # ... and the scale backed off


# --- hysteresis, against a reference written from the rules -------------------------------------
def reference_scales(overflows, init, interval, hysteresis, consecutive, low=None, high=None):
    """Scale used at each step. Megatron: an overflow resets the clean-step count and spends one
    unit of hysteresis; once none is left, the scale halves. Growth (doubling after `interval`
    clean steps in a row) refills the hysteresis. DeepSpeed's opt-in consecutive_hysteresis: every
    clean step refills it too."""
    scale, clean, left, used = init, 0, hysteresis, []
    for overflow in overflows:
        used.append(scale)
        if overflow:
            clean, left = 0, left - 1
            if left <= 0:
                scale = scale / 2 if low is None else max(scale / 2, low)
        else:
            clean += 1
            if consecutive:
                left = hysteresis
            if clean == interval:
                clean, left = 0, hysteresis
                scale = scale * 2 if high is None else min(scale * 2, high)
    return used


def drive(scaler, overflows):
    """One parameter whose gradient is inf at the steps marked True; returns the scales used."""
    param = nn.Parameter(torch.ones(2))
    optimizer = Recorded(torch.optim.SGD([param], lr=0.1))
    scales = []
    for overflow in overflows:
        scales.append(scaler.get_scale())
        loss = (param * (math.inf if overflow else 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        param.grad = None
    assert optimizer.steps_run == overflows.count(False)
    return scales


def test_hysteresis_by_hand():
    # overflow, clean, overflow, overflow, overflow, clean; no growth (interval 100), hysteresis 2.
    pattern = [True, False, True, True, True, False]
    megatron = drive(DynamicLossScaler(8.0, growth_interval=100, hysteresis=2), pattern)
    deepspeed = drive(DynamicLossScaler(8.0, growth_interval=100, hysteresis=2,
                                        consecutive_hysteresis=True), pattern)
    assert megatron == [8, 8, 8, 4, 2, 1]  # the 2nd overflow backs off, though not in a row
    assert deepspeed == [8, 8, 8, 8, 4, 2]  # the clean step refilled: 2 in a row back off


@pytest.mark.parametrize("hysteresis", [1, 2, 3])
@pytest.mark.parametrize("consecutive", [False, True])
def test_hysteresis_matches_reference(hysteresis, consecutive):
    generator = torch.Generator().manual_seed(hysteresis)
    overflows = (torch.rand(80, generator=generator) < 0.35).tolist()
    scaler = DynamicLossScaler(2.0**10, growth_interval=3, hysteresis=hysteresis,
                               consecutive_hysteresis=consecutive)
    assert drive(scaler, overflows) == reference_scales(overflows, 2.0**10, 3, hysteresis,
                                                         consecutive)


def test_hysteresis_one_is_gradscaler():
    generator = torch.Generator().manual_seed(7)
    overflows = (torch.rand(60, generator=generator) < 0.3).tolist()
    expected = drive(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2), overflows)
    for consecutive in (False, True):  # with one unit of hysteresis, refilling changes nothing
        scaler = DynamicLossScaler(2.0**10, growth_interval=2, consecutive_hysteresis=consecutive)
        assert drive(scaler, overflows) == expected
        assert [r.scale for r in scaler.history] == expected


def test_min_and_max_scale():
    overflows = [True] * 6 + [False] * 8
    scaler = DynamicLossScaler(16.0, growth_interval=1, min_scale=2.0, max_scale=64.0)
    expected = reference_scales(overflows, 16.0, 1, 1, False, low=2.0, high=64.0)
    assert drive(scaler, overflows) == expected
    assert min(expected) == 2.0 and max(expected) == 64.0 and scaler.get_scale() == 64.0


# --- skipped steps, state, history -----------------------------------------------------------
def test_skipped_step_leaves_parameters_and_adam_state_untouched():
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer, scaler = Recorded(adam), DynamicLossScaler()
    x = torch.randn(4, 6)
    for step in range(4):
        adam.zero_grad()
        scaler.scale(model(x).square().mean() * (math.nan if step == 3 else 1.0)).backward()
        if step == 3:
            params = [p.detach().clone() for p in model.parameters()]
            state = copy.deepcopy(adam.state_dict())
        assert (scaler.step(optimizer) is None) == (step == 3)
        scaler.update()
    assert all(same_bits(a, b) for a, b in zip(params, model.parameters()))
    after = adam.state_dict()
    for key, saved in state["state"].items():
        for name, value in saved.items():
            assert same_bits(value, after["state"][key][name]), name  # exp_avg(_sq), step
    assert after["state"][0]["step"].item() == 3


def test_state_dict_round_trip_continues_identically():
    plan = {2: "inf", 3: "inf", 9: "nan", 10: "inf"}  # with hysteresis 2 the state matters
    generator = torch.Generator()

    def train(scaler, model, optimizer, steps):
        for step in steps:
            x, y = torch.randn(5, 6, generator=generator), torch.randn(5, 3, generator=generator)
            model.zero_grad(set_to_none=True)
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            plant(model, step, plan)
            scaler.step(optimizer)
            scaler.update()

    def new_run(scaler_state=None, model_state=None, optimizer_state=None):
        scaler = DynamicLossScaler(growth_interval=2, hysteresis=2)
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for thing, state in ((scaler, scaler_state), (model, model_state),
                             (optimizer, optimizer_state)):
            if state is not None:
                thing.load_state_dict(copy.deepcopy(state))
        return scaler, model, optimizer

    generator.manual_seed(1)
    full = new_run()
    train(*full, range(14))

    generator.manual_seed(1)
    first = new_run()
    train(*first, range(7))
    resumed = new_run(*(thing.state_dict() for thing in first))
    train(*resumed, range(7, 14))

    assert first[0].history + resumed[0].history == full[0].history
    assert len({r.scale for r in full[0].history}) > 2
    assert all(same_bits(a, b) for a, b in zip(full[1].parameters(), resumed[1].parameters()))


def test_gradscaler_loads_our_state_dict():
    ours = DynamicLossScaler(init_scale=1024.0, growth_interval=5)
    drive(ours, [False, False, True, False])
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(ours.state_dict())
    assert theirs.get_scale() == ours.get_scale() == 512.0
    assert theirs.get_growth_interval() == 5 and theirs._get_growth_tracker() == 1


def test_history_records_each_update():
    scaler = DynamicLossScaler(init_scale=4.0, growth_interval=2)
    drive(scaler, [False, False, True, False])
    assert scaler.history == [ScaleRecord(0, 4.0, False), ScaleRecord(1, 4.0, False),
                              ScaleRecord(2, 8.0, True), ScaleRecord(3, 4.0, False)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        scaler.history[0].scale = 1.0


def test_static_scaler_keeps_its_scale_and_skips_overflows():
    scaler = StaticLossScaler(1000.0)
    assert drive(scaler, [False, True, True, False]) == [1000.0] * 4
    assert [r.found_inf for r in scaler.history] == [False, True, True, False]
    param = nn.Parameter(torch.tensor([2.0]))
    scaler.scale(param.sum() * 0.25).backward()
    assert param.grad.item() == 250.0
    scaler.unscale_(torch.optim.SGD([param], lr=1.0))
    assert param.grad.item() == pytest.approx(0.25, rel=1e-7)
    restored = StaticLossScaler(1.0)
    restored.load_state_dict(scaler.state_dict())
    assert restored.get_scale() == 1000.0


def test_scale_accepts_lists_and_tuples():
    scaler = StaticLossScaler(8.0)
    a, b = torch.tensor(1.5), torch.tensor([2.0, 3.0], dtype=torch.float64)
    scaled = scaler.scale([a, (b,)])
    assert isinstance(scaled, list) and isinstance(scaled[1], tuple)
    assert scaled[0].item() == 12.0 and scaled[1][0].tolist() == [16.0, 24.0]
    assert scaled[1][0].dtype == torch.float64
    for loss in (torch.tensor(1.0, dtype=torch.float16), torch.ones(2, dtype=torch.float16)):
        # the same product as GradScaler's: a 0-dim FP16 loss times the FP32 scale is FP32
        assert scaler.scale(loss).dtype == torch.amp.GradScaler("cpu").scale(loss).dtype


# --- FP16: what loss scaling is for ----------------------------------------------------------
def test_fp16_gradient_that_underflows_survives_scaling():
    x = torch.full((4,), 1e-3, dtype=torch.float16)
    true_gradient = float(x[0]) * 1e-4 / 4  # d(loss)/dw_i, about 2.5e-8

    def backward(scaler):
        w = nn.Parameter(torch.ones(4, dtype=torch.float16))
        loss = (w * x).float().mean() * 1e-4  # FP16 activations, FP32 loss, as under autocast
        (loss if scaler is None else scaler.scale(loss)).backward()
        return w

    assert true_gradient < 2.0**-25  # below half of FP16's smallest subnormal: rounds to zero
    assert torch.all(backward(None).grad == 0)
    scaler = DynamicLossScaler()
    w = backward(scaler)
    assert torch.all(w.grad != 0)
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(torch.optim.SGD([w], lr=1.0))
    master = w.detach().float().requires_grad_()  # an FP32 master copy takes the gradient
    master.grad = w.grad.float()
    scaler.unscale_(torch.optim.SGD([master], lr=1.0))
    assert master.grad.tolist() == pytest.approx([true_gradient] * 4, rel=2e-3)


# --- misuse ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(init_scale=0.0), dict(init_scale=-1.0), dict(init_scale=math.inf),
    dict(init_scale=math.nan), dict(init_scale=1e39), dict(init_scale=1e-50),
    dict(growth_factor=1.0), dict(growth_factor=0.5), dict(growth_factor=math.inf),
    dict(backoff_factor=1.0), dict(backoff_factor=0.0), dict(backoff_factor=1.5),
    dict(growth_interval=0), dict(growth_interval=2.5), dict(hysteresis=0),
    dict(min_scale=8.0, max_scale=4.0), dict(min_scale=0.0), dict(max_scale=math.inf),
    dict(init_scale=2.0**16, max_scale=2.0**10), dict(init_scale=1.0, min_scale=2.0),
])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize("scale", [0.0, -2.0, math.inf, math.nan])
def test_bad_static_scale(scale):
    with pytest.raises(ValueError):
        StaticLossScaler(scale)


def setup_step():
    param = nn.Parameter(torch.ones(3))
    return param, torch.optim.SGD([param], lr=0.1), DynamicLossScaler()


def test_unscale_twice_or_after_step():
    param, optimizer, scaler = setup_step()
    scaler.scale(param.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(optimizer)


def test_step_twice_without_update():
    param, optimizer, scaler = setup_step()
    scaler.scale(param.sum()).backward()
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="update"):
        scaler.step(optimizer)
    scaler.update()


def test_step_or_unscale_before_scale():
    param, optimizer, scaler = setup_step()
    param.sum().backward()
    for call in (scaler.step, scaler.unscale_):
        with pytest.raises(RuntimeError, match="before scale"):
            call(optimizer)
    scaler.scale(param.sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    with pytest.raises(RuntimeError, match="before scale"):  # a new step needs a new scale()
        scaler.step(optimizer)


def test_update_before_step_and_step_without_gradients():
    param, optimizer, scaler = setup_step()
    with pytest.raises(RuntimeError, match="before step"):
        scaler.update()
    scaler.scale(param.sum())  # no backward(): no gradient
    with pytest.raises(RuntimeError, match="no parameter"):
        scaler.step(optimizer)


def test_step_with_closure_and_non_optimizer():
    param, optimizer, scaler = setup_step()
    scaler.scale(param.sum()).backward()
    with pytest.raises(RuntimeError, match="closure"):
        scaler.step(optimizer, closure=lambda: param.sum())
    with pytest.raises(TypeError, match="optimizer"):
        scaler.step([param])


@pytest.mark.parametrize("loss", [1.0, torch.tensor(3), torch.tensor([True]), "loss", [1.0]])
def test_scale_refuses_non_float_losses(loss):
    with pytest.raises(TypeError):
        StaticLossScaler(2.0).scale(loss)


def test_load_state_dict_with_missing_or_bad_keys():
    state = DynamicLossScaler().state_dict()
    del state["_hysteresis_tracker"]
    with pytest.raises(ValueError, match="_hysteresis_tracker"):
        DynamicLossScaler().load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):  # a GradScaler state dict lacks our keys
        DynamicLossScaler().load_state_dict(torch.amp.GradScaler("cpu").state_dict())
    state = DynamicLossScaler(growth_interval=3).state_dict() | {"_growth_tracker": 5}
    with pytest.raises(ValueError, match="tracker"):
        DynamicLossScaler().load_state_dict(state)


# --- CUDA ------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_matches_gradscaler_on_cuda():
    run_side_by_side(DynamicLossScaler(growth_interval=2), torch.amp.GradScaler(
        "cuda", growth_interval=2), "adam", plan=PLAN, device="cuda")


# --- model parallelism: every rank agrees on found_inf ------------------------------------------

def test_unsynced_ranks_drift_apart_and_synced_ones_agree():
    from mpcourse.communication import run_workers
    from mpcourse.scaling import sharded_overflow_run
    ranks = run_workers(sharded_overflow_run, 2, backend="gloo")
    unsynced, synced = [rank[False] for rank in ranks], [rank[True] for rank in ranks]
    assert [skipped for _, skipped in unsynced[0]] == [False] * 8  # rank 0 never saw the inf
    assert [skipped for _, skipped in unsynced[1]][3] is True
    assert unsynced[0][-1][0] != unsynced[1][-1][0]             # scales drifted apart
    assert synced[0] == synced[1]                               # the same scales and skips
    assert [skipped for _, skipped in synced[0]] == [s == 3 for s in range(8)]


def test_sync_found_inf_needs_unscale_first_and_a_process_group():
    weight = torch.ones(2, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = DynamicLossScaler()
    scaler.scale(weight.sum()).backward()
    with pytest.raises(RuntimeError, match="unscale_"):
        scaler.sync_found_inf(optimizer)
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="process group"):
        scaler.sync_found_inf(optimizer)
