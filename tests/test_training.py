"""mpcourse.training, proven against the real thing: the canonical torch AMP loop written out
here (torch.autocast, torch.amp.GradScaler, clip_grad_norm_) step for step and bit for bit, a plain
FP32 big-batch gradient for accumulation, an uninterrupted run for checkpoint/resume, and the
compute capabilities of real GPUs for the precision flowchart."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.fp8 import Fp8Linear, Fp8Recipe, get_recipe
from mpcourse.training import (KNOWN_GPUS, PRECISIONS, DeviceProfile, MixedPrecisionTrainer,
                               PrecisionChoice, StepRecord, TrainerConfig, select_precision)
from mpcourse.workloads import DigitsMLP, accuracy, load_digits

TRAIN, TEST = load_digits()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models are tiny: on a shared CPU, more threads cost more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def schedule(steps, batch_size=64, seed=0, device="cpu"):
    """A fixed list of batches: step t always trains on batch t, so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, len(TRAIN), (steps, batch_size), generator=g)
    return [(TRAIN.x[i].to(device), TRAIN.y[i].to(device)) for i in index]


def dropout_mlp(seed):
    """A small MLP with dropout, so that a resumed run also depends on the restored RNG."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 10))


def make_trainer(config, seed=0, model_fn=None, lr=3e-3, device="cpu"):
    model = (model_fn or (lambda s: (torch.manual_seed(s), DigitsMLP(width=64))[1]))(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return MixedPrecisionTrainer(model, optimizer, config, device=device)


def same_bits(a, b):
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def same_records(a, b):
    """StepRecords equal field by field, a NaN gradient norm equal to a NaN."""
    def fields(r):
        return [("nan" if isinstance(v, float) and math.isnan(v) else v) for v in vars(r).values()]
    return len(a) == len(b) and all(fields(r) == fields(s) for r, s in zip(a, b))


def all_same_bits(model_a, model_b):
    return all(same_bits(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))


# --- training in each precision ------------------------------------------------------------------

@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_trains_the_digits_mlp(precision, device):
    trainer = make_trainer(TrainerConfig(precision, max_grad_norm=1.0), device=device)
    records = [trainer.train_step(b, loss_fn) for b in schedule(60, device=device)]
    assert all(isinstance(r, StepRecord) for r in records)
    assert [r.step for r in records] == list(range(60)) and trainer.step == 60
    first, last = records[0].loss, sum(r.loss for r in records[-10:]) / 10
    assert last < 0.3 * first
    assert not any(r.skipped for r in records)
    assert trainer.evaluate(lambda m: accuracy(m, TEST.to(device))) > 0.85
    assert (records[0].scale is not None) == (precision == "fp16")
    if precision == "fp8":
        assert sum(isinstance(m, Fp8Linear) for m in trainer.model.modules()) == 3


def reference_run(precision, batches, max_grad_norm, init_scale, device):
    """The canonical torch loop, written from PyTorch's AMP recipe: autocast, GradScaler,
    unscale_ before clip_grad_norm_, scaler.step, scaler.update."""
    torch.manual_seed(0)
    model = DigitsMLP(width=64).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_train_step_is_the_canonical_torch_amp_loop_bit_for_bit(precision, device):
    batches = schedule(25, device=device)
    init_scale = 2.0**24  # high enough that GradScaler skips the first steps
    config = TrainerConfig(precision, max_grad_norm=0.5,
                           **({"init_scale": init_scale} if precision == "fp16" else {}))
    trainer = make_trainer(config, device=device)
    records = [trainer.train_step(b, loss_fn) for b in batches]
    reference, losses = reference_run(precision, batches, 0.5, init_scale, device)
    assert all_same_bits(trainer.model, reference)
    assert [r.loss for r in records] == losses
    if precision == "fp16":
        assert any(r.skipped for r in records)  # the comparison covered skipped steps


# --- skipped steps -------------------------------------------------------------------------------

def plant_inf(parameter):
    """A hook that sets one gradient entry of ``parameter`` to +inf."""
    def hook(grad):
        grad = grad.clone()
        grad.view(-1)[0] = math.inf
        return grad
    return parameter.register_hook(hook)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_step_with_an_inf_gradient_is_skipped_and_changes_nothing(precision, device):
    config = TrainerConfig(precision, **({"init_scale": 2.0**10} if precision == "fp16" else {}))
    trainer = make_trainer(config, device=device)
    batches = schedule(5, device=device)
    for b in batches[:3]:
        assert not trainer.train_step(b, loss_fn).skipped
    before = copy.deepcopy(trainer.model)
    state_before = copy.deepcopy(trainer.optimizer.state_dict())
    handle = plant_inf(trainer.model.layers[0].weight)
    record = trainer.train_step(batches[3], loss_fn)
    handle.remove()
    assert record.skipped and not math.isfinite(record.grad_norm)
    assert all_same_bits(trainer.model, before)
    after = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(after[k]["exp_avg"], v["exp_avg"]) for k, v in state_before["state"].items())
    following = trainer.train_step(batches[4], loss_fn)
    assert not following.skipped
    if precision == "fp16":
        assert following.scale == record.scale / 2  # the scaler backed off



def test_fp8_an_inf_that_reaches_an_fp8_cast_raises_instead_of_skipping(device):
    """FP8 checks before each cast (a cast could turn an overflow into a finite value), so an
    overflowing loss raises in backward rather than reaching the trainer's skip."""
    trainer = make_trainer(TrainerConfig("fp8"), device=device)
    batch = schedule(1, device=device)[0]
    with pytest.raises(ValueError, match="NaN or infinity"):
        trainer.train_step(batch, lambda model, b: loss_fn(model, b) * math.inf)

# --- clipping after unscaling --------------------------------------------------------------------

def test_clipping_happens_after_unscaling_in_true_units():
    x, y = schedule(1)[0]
    torch.manual_seed(0)
    reference = DigitsMLP(width=64)
    loss_fn(reference, (x, y)).backward()
    true_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()]))
    max_norm = 0.05
    assert true_norm > 2 * max_norm  # so that clipping has work to do

    model = copy.deepcopy(reference)
    model.zero_grad()
    trainer = MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                    TrainerConfig("fp16", max_grad_norm=max_norm))
    record = trainer.train_step((x, y), loss_fn)
    assert record.scale == 2.0**16 and not record.skipped
    # the norm it reports is the true one (FP16 rounding aside), not 2^16 times larger
    assert record.grad_norm == pytest.approx(true_norm.item(), rel=1e-2)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert clipped.item() == pytest.approx(max_norm, rel=1e-4)


# --- gradient accumulation -----------------------------------------------------------------------

def fp32_gradient(model, x, y):
    model = copy.deepcopy(model)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("precision,tolerance", [("fp32", 1e-6), ("fp16", 1e-2), ("bf16", 3e-2)])
@pytest.mark.parametrize("batch_size,k", [(64, 4), (62, 4), (63, 3)])
def test_accumulating_micro_batches_gives_the_big_batch_gradient(precision, tolerance, batch_size, k):
    x, y = schedule(1, batch_size)[0]
    torch.manual_seed(0)
    model = DigitsMLP(width=64)
    exact = fp32_gradient(model, x, y)
    exact_loss = F.cross_entropy(model(x), y).item()
    trainer = MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                    TrainerConfig(precision, accumulate_steps=k))
    record = trainer.train_step((x, y), loss_fn)
    accumulated = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert ((accumulated - exact).norm() / exact.norm()).item() < tolerance
    assert record.loss == pytest.approx(exact_loss, rel=tolerance)
    assert accumulated.dtype == torch.float32


def test_accumulation_in_fp32_agrees_to_rounding_of_the_sum_order():
    """Not bit for bit: one big matmul and four small ones add the same terms in another order."""
    x, y = schedule(1, 64)[0]
    grads = []
    for k in (1, 4):
        torch.manual_seed(0)
        model = DigitsMLP(width=64)
        trainer = MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                        TrainerConfig("fp32", accumulate_steps=k))
        trainer.train_step((x, y), loss_fn)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    scale = grads[0].abs().max()
    assert (grads[1] - grads[0]).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


# --- checkpoint and resume -----------------------------------------------------------------------

RESUME_CONFIGS = {
    "fp32": TrainerConfig("fp32", max_grad_norm=1.0),
    # starts far above the overflow edge, so steps are skipped before the checkpoint; a short
    # growth interval makes the scaler's growth counter matter too
    "fp16": TrainerConfig("fp16", max_grad_norm=1.0, init_scale=2.0**24, growth_interval=3,
                          accumulate_steps=2),
    "bf16": TrainerConfig("bf16", accumulate_steps=2),
    "fp8": TrainerConfig("fp8", max_grad_norm=1.0),
}


@pytest.mark.parametrize("name", RESUME_CONFIGS)
def test_resume_from_a_checkpoint_is_bit_identical(name, tmp_path, device):
    config, batches, stop = RESUME_CONFIGS[name], schedule(16, device=device), 8
    uninterrupted = make_trainer(config, model_fn=dropout_mlp, device=device)
    expected = [uninterrupted.train_step(b, loss_fn) for b in batches]

    first = make_trainer(config, model_fn=dropout_mlp, device=device)
    before = [first.train_step(b, loss_fn) for b in batches[:stop]]
    first.save_checkpoint(tmp_path / "run.pt")
    if name == "fp16":
        assert any(r.skipped for r in before)
    torch.rand(1000, device=device)  # disturb the global RNG: the checkpoint must restore it

    resumed = make_trainer(config, seed=123, model_fn=dropout_mlp, device=device)  # other weights
    resumed.load_checkpoint(tmp_path / "run.pt")
    assert resumed.step == stop
    after = [resumed.train_step(b, loss_fn) for b in batches[stop:]]
    assert same_records(before + after, expected)  # loss, grad norm, skipped, scale
    assert all_same_bits(resumed.model, uninterrupted.model)


def test_a_checkpoint_of_another_precision_is_refused(tmp_path):
    trainer = make_trainer(TrainerConfig("fp16"))
    trainer.train_step(schedule(1)[0], loss_fn)
    trainer.save_checkpoint(tmp_path / "fp16.pt")
    with pytest.raises(ValueError, match="fp16"):
        make_trainer(TrainerConfig("bf16")).load_checkpoint(tmp_path / "fp16.pt")
    with pytest.raises(ValueError, match="state dict"):
        trainer.load_state_dict({"model": {}})


def test_evaluating_does_not_change_an_fp8_run():
    batches = schedule(8)
    plain, evaluated = (make_trainer(TrainerConfig("fp8")) for _ in range(2))
    for b in batches:
        plain.train_step(b, loss_fn)
        evaluated.train_step(b, loss_fn)
        evaluated.evaluate(lambda m: loss_fn(m, (TEST.x, TEST.y)))
    assert all_same_bits(plain.model, evaluated.model)


# --- the precision flowchart ---------------------------------------------------------------------

def test_the_fp16_reason_puts_the_flush_at_half_the_smallest_subnormal():
    reason = select_precision(capability=(7, 5)).reasons[-1]
    assert "at or below 2^-25 round to zero" in reason and "2^-14" in reason
    assert "2^-24" not in reason
    # the edge the sentence names: 2^-25 itself rounds to 0 (a tie, to the even neighbour), the
    # next FP32 value above it rounds up to the smallest subnormal
    edge = torch.tensor(2.0 ** -25)
    assert edge.half().item() == 0.0
    assert torch.nextafter(edge, torch.tensor(1.0)).half().item() == 2.0 ** -24


@pytest.mark.parametrize("gpu,precision,tf32", [
    ("P100", "fp32", False), ("V100", "fp16", False), ("T4", "fp16", False),
    ("A100", "bf16", True), ("L4", "bf16", True), ("H100", "bf16", True)])
def test_select_precision_for_known_gpus(gpu, precision, tf32):
    choice = select_precision(KNOWN_GPUS[gpu])
    assert isinstance(choice, PrecisionChoice)
    assert (choice.precision, choice.tf32) == (precision, tf32)
    assert choice.reasons and all(isinstance(r, str) and r.endswith(".") for r in choice.reasons)
    major, minor = KNOWN_GPUS[gpu].capability
    assert select_precision(capability=(major, minor)).precision == precision
    assert choice.config(max_grad_norm=1.0).precision == precision


def test_select_precision_does_not_promise_fp16_tensor_cores_to_every_7_5_gpu():
    # capability 7.5 covers the GTX 16 series, which has no tensor cores: the reason must say so
    reasons = " ".join(select_precision(capability=(7, 5)).reasons)
    assert "GTX 16" in reasons and "none" in reasons
    # ... and not pass the proxy's accident off as a reason (the P100, also without tensor cores, gets FP32)
    assert "cannot tell it from a T4" in reasons and "so FP16 there too" not in reasons
    assert "but FP16 ones (7.0 Volta, 7.5 Turing)" not in reasons


def test_select_precision_makes_bf16_the_default_and_fp8_a_step_asked_for():
    for gpu in ("L4", "H100"):
        default = select_precision(KNOWN_GPUS[gpu])
        assert (default.precision, default.fallback) == ("bf16", "fp32")
        assert any("allow_fp8=True" in r for r in default.reasons)  # says what the next step is
        asked = select_precision(KNOWN_GPUS[gpu], allow_fp8=True)
        assert (asked.precision, asked.fallback, asked.tf32) == ("fp8", "bf16", True)
    assert select_precision(capability=(10, 0), allow_fp8=True).precision == "fp8"  # Blackwell
    assert select_precision(capability=(10, 0)).precision == "bf16"
    # no FP8 tensor cores: allow_fp8 changes nothing
    for capability in ((8, 6), (8, 0), (7, 5), (6, 0)):
        assert select_precision(capability=capability, allow_fp8=True) == select_precision(capability=capability)
    assert not any("FP8" in r for r in select_precision(capability=(8, 6)).reasons)


def test_select_precision_fp8_follows_the_tensor_cores_scaling_per_tensor_then_per_block():
    # Hopper and Ada: one scale per tensor (E4M3 forward, E5M2 gradients); Blackwell (10.0+)
    # scales blocks of 32 in hardware: MXFP8, E4M3 in both passes (Transformer Engine's docs).
    for capability in ((8, 9), (9, 0)):
        choice = select_precision(capability=capability, allow_fp8=True)
        assert choice.fp8_recipe == "hybrid" and "per tensor" in " ".join(choice.reasons)
        assert choice.config().fp8_recipe == "hybrid"
    blackwell = select_precision(capability=(10, 0), allow_fp8=True)
    assert blackwell.fp8_recipe == "mxfp8" and blackwell.config().fp8_recipe == "mxfp8"
    text = " ".join(blackwell.reasons)
    assert "MXFP8" in text and "32" in text and "per tensor" not in text and "E5M2" not in text
    assert select_precision(capability=(10, 0)).fp8_recipe is None  # BF16: no FP8 recipe


def test_select_precision_names_block_recipes_only_where_transformer_engine_runs_them():
    # Transformer Engine (transformer_engine/pytorch/quantization.py): Float8BlockScaling needs
    # capability 9.0 and CUDA 12.9; MXFP8 runs on 10.x and 11.x and "is not supported on 12.0+
    # architectures yet", where its default recipe is per-tensor current scaling.
    ada, hopper = (" ".join(select_precision(capability=c, allow_fp8=True).reasons)
                   for c in ((8, 9), (9, 0)))
    assert "block of 128" not in ada and "needs 9.0" in ada
    assert "block of 128" in hopper and "CUDA 12.9" in hopper
    consumer = select_precision(capability=(12, 0), allow_fp8=True)
    assert consumer.precision == "fp8" and "per tensor" in " ".join(consumer.reasons)
    assert "12.x" in " ".join(consumer.reasons) and "current scaling" in " ".join(consumer.reasons)
    # 12.x has block-scaled FP8 MMA instructions (CUTLASS cute/arch/mma_sm120.hpp): the reason
    # must not read as if the hardware lacked them (round-7 review of the field guide, F1)
    assert "block-scaled FP8 instructions too" in " ".join(consumer.reasons)
    # nothing public says whether 12.x's MXFP8 gap is software or hardware: the reason repeats
    # Transformer Engine's message and claims neither (round-9 review of the field guide, U1)
    assert "software limit" not in " ".join(consumer.reasons)
    assert "not supported for all matrix layouts on 12.0 and newer yet" in " ".join(consumer.reasons)
    # what the reason says is what the trainer gets: Transformer Engine's 12.x default,
    # per-tensor current scaling (get_default_fp8_recipe), not delayed scaling
    recipe = get_recipe(consumer.config().fp8_recipe)
    assert isinstance(recipe, Fp8Recipe) and recipe.scaling == "current"
    assert (recipe.forward_format, recipe.backward_format) == ("e4m3", "e5m2")
    assert select_precision(capability=(10, 3), allow_fp8=True).fp8_recipe == "mxfp8"


def test_select_precision_fp8_needs_a_working_scaled_mm():
    no_scaled_mm = DeviceProfile("cuda", "L4, old PyTorch", (8, 9), fp8_matmul=False)
    choice = select_precision(no_scaled_mm, allow_fp8=True)
    assert choice.precision == "bf16" and any("_scaled_mm" in r for r in choice.reasons)


def test_select_precision_on_cpus():
    amx = select_precision(DeviceProfile("cpu", "Sapphire Rapids", cpu_bf16="AVX512_BF16 and AMX"))
    # faster for large products only: the reason says that small ones can be slower
    assert amx.precision == "bf16" and "small ones" in amx.reasons[1] and "can be slower" in amx.reasons[1]
    # the instructions are named once: AMX-BF16's tiles, with AVX512_BF16's dot products beside them
    assert amx.reasons[1].startswith("It has AMX-BF16 matrix tiles (and AVX512_BF16 vector dot products):")
    assert amx.reasons[1].count("AMX-BF16") == 1
    # AVX512_BF16 is a vector extension (dot products); the matrix instructions are AMX's
    vector_only = select_precision(DeviceProfile("cpu", "Cooper Lake", cpu_bf16="AVX512_BF16"))
    assert vector_only.precision == "fp32" and "vector dot products, no AMX matrix tiles" in vector_only.reasons[1]
    assert not any("matrix instructions" in r for r in vector_only.reasons)
    plain = select_precision(DeviceProfile("cpu", "an older CPU"))
    assert plain.precision == "fp32" and "No BF16" in plain.reasons[-1]
    # BF16 instructions without AMX: native, but not reliably faster than FP32 (slower on the
    # course's AVX512_BF16 Xeon), so FP32, with BF16 named for memory
    for instructions in ("AVX512_BF16", "ARM BF16"):
        choice = select_precision(DeviceProfile("cpu", "Cooper Lake", cpu_bf16=instructions))
        assert choice.precision == "fp32" and "no AMX" in choice.reasons[-1]
    assert select_precision(DeviceProfile("mps", "Apple GPU")).precision == "fp32"


def test_select_precision_inspects_this_machine():
    choice = select_precision()
    assert choice.precision in PRECISIONS
    assert choice.profile.kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert select_precision("cpu").profile.kind == "cpu"


def test_select_precision_refuses_bad_descriptions():
    with pytest.raises(ValueError, match="not both"):
        select_precision("cpu", capability=(8, 0))
    with pytest.raises(ValueError, match="major, minor"):
        select_precision(capability=(8,))
    with pytest.raises(TypeError, match="tuple"):
        select_precision(capability="8.0")
    with pytest.raises(ValueError, match="capability"):
        DeviceProfile("cuda", "no capability")


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("options,error,match", [
    ({"precision": "fp64"}, ValueError, "unknown precision"),
    ({"precision": "fp16", "max_grad_norm": 0.0}, ValueError, "max_grad_norm"),
    ({"max_grad_norm": math.nan}, ValueError, "max_grad_norm"),
    ({"max_grad_norm": True}, ValueError, "max_grad_norm"),
    ({"accumulate_steps": 0}, ValueError, "accumulate_steps"),
    ({"accumulate_steps": 2.0}, ValueError, "accumulate_steps"),
    ({"tf32": "yes"}, TypeError, "tf32"),
    ({"precision": "bf16", "init_scale": 1024.0}, ValueError, "loss scaler"),
    ({"precision": "fp16", "init_scale": -1.0}, ValueError, "scale"),
    ({"precision": "fp16", "fp8_recipe": Fp8Recipe()}, ValueError, "fp8_recipe"),
    ({"precision": "fp8", "fp8_recipe": "mxfp9"}, ValueError, "hybrid, mxfp8, nvfp4, blockwise"),
    ({"precision": "fp8", "fp8_recipe": 8}, TypeError, "Fp8Recipe"),
])
def test_bad_configs_are_refused_with_a_sentence(options, error, match):
    with pytest.raises(error, match=match):
        TrainerConfig(**options)


def test_bad_trainers_and_steps_are_refused():
    model = DigitsMLP(width=8)
    with pytest.raises(ValueError, match="FP32"):
        half = DigitsMLP(width=8).half()
        MixedPrecisionTrainer(half, torch.optim.SGD(half.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="not this model's"):
        MixedPrecisionTrainer(model, torch.optim.SGD(DigitsMLP(width=8).parameters(), lr=0.1))
    with pytest.raises(TypeError, match="TrainerConfig"):
        MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), {"precision": "fp16"})
    trainer = MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                    TrainerConfig(accumulate_steps=4))
    x, y = schedule(1)[0]
    with pytest.raises(TypeError, match="mean loss"):
        trainer.train_step((x, y), lambda m, b: 1.0)
    with pytest.raises(TypeError, match="mean loss"):
        trainer.train_step((x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"))
    with pytest.raises(ValueError, match="cannot be split"):
        trainer.train_step((x[:3], y[:3]), loss_fn)
    with pytest.raises(ValueError, match="same size"):
        trainer.train_step((x, y[:10]), loss_fn)


def test_tf32_on_a_cpu_warns_and_changes_nothing():
    if torch.cuda.is_available():
        pytest.skip("TF32 does apply on this machine")
    model = DigitsMLP(width=8)
    before = torch.get_float32_matmul_precision()
    with pytest.warns(UserWarning, match="TF32"):
        MixedPrecisionTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), TrainerConfig(tf32=True))
    assert torch.get_float32_matmul_precision() == before
