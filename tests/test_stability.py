"""mpcourse.stability: each trick against an independent reference or its defining property."""
import math

import pytest
import torch
import torch.nn.functional as F

from mpcourse.stability import (AdamLowPrecisionStates, SpikeDetector, StableAttention,
                                angle_error, chunked_cross_entropy, rope_angles, router_top_k,
                                saved_tensor_bytes, soft_cap, stable_tiny_transformer, z_loss)
from mpcourse import stability
from mpcourse.workloads import CausalSelfAttention, TinyTransformer, addition_corpus, encode_text


# --- z-loss and soft-capping -----------------------------------------------------------------

def test_z_loss_is_weight_times_mean_squared_log_normaliser():
    logits = torch.randn(4, 7, 13, dtype=torch.float64)
    expected = 1e-3 * (logits.exp().sum(-1).log() ** 2).mean()
    assert torch.allclose(z_loss(logits, 1e-3).double(), expected, rtol=1e-6)


def test_z_loss_vanishes_when_the_probabilities_are_the_logits():
    log_probs = torch.randn(5, 11).log_softmax(-1)  # log Z = 0 exactly in exact arithmetic
    assert z_loss(log_probs, 1.0).item() < 1e-12


def test_z_loss_rejects_a_negative_weight():
    with pytest.raises(ValueError, match="weight"):
        z_loss(torch.zeros(2, 3), -1.0)


def test_soft_cap_bounds_and_is_nearly_the_identity_for_small_logits():
    big = torch.tensor([-1e30, -1e4, 1e4, 1e30])
    assert soft_cap(big, 30.0).abs().max().item() <= 30.0
    small = torch.linspace(-1, 1, 101, dtype=torch.float64)
    # tanh(x) = x − x³/3 + …: the cap changes a logit by at most |x|³ / (3 cap²)
    assert ((soft_cap(small, 30.0) - small).abs() <= small.abs() ** 3 / (3 * 30.0 ** 2) + 1e-15).all()


@pytest.mark.parametrize("cap", [0.0, -5.0, float("nan")])
def test_soft_cap_rejects_a_cap_that_is_not_positive(cap):
    with pytest.raises(ValueError, match="positive"):
        soft_cap(torch.zeros(3), cap)


# --- attention with QK-norm ------------------------------------------------------------------

def test_stable_attention_without_qk_norm_is_the_course_attention():
    torch.manual_seed(0)
    plain, stable = CausalSelfAttention(32, 4), StableAttention(32, 4)
    stable.load_state_dict(plain.state_dict())
    x = torch.randn(2, 9, 32)
    assert torch.allclose(stable(x), plain(x), atol=1e-6)


def test_stable_attention_records_its_largest_logit():
    torch.manual_seed(0)
    attention, x = StableAttention(32, 4), torch.randn(2, 9, 32)
    attention(x)
    q, k, _ = attention.qkv(x).split(32, dim=2)
    q, k = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k))
    logits = (q @ k.transpose(-2, -1) / math.sqrt(8)).tril()
    assert attention.max_logit == pytest.approx(logits.abs().max().item(), rel=1e-6)


def test_qk_norm_bounds_the_logits_whatever_the_weights():
    torch.manual_seed(0)
    attention = StableAttention(32, 4, qk_norm=True)
    with torch.no_grad():
        attention.qkv.weight.mul_(1000)  # queries and keys a thousand times too long
    attention(torch.randn(2, 9, 32))
    # unit-gain LayerNorm: |q| = |k| = √d, so |q·k| / √d <= √d (Cauchy-Schwarz), d = 8
    assert attention.max_logit <= math.sqrt(8) * (1 + 1e-4)


def test_stable_tiny_transformer_trains_its_qk_norm():
    model = stable_tiny_transformer(qk_norm=True, dim=32, heads=4, layers=1, context=8)
    assert isinstance(model, TinyTransformer)
    tokens = torch.randint(0, 13, (2, 8))
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    q_norm = model.blocks[0].attention.q_norm
    assert q_norm.weight.grad is not None and q_norm.weight.grad.abs().sum() > 0


# --- RoPE angles -----------------------------------------------------------------------------

def test_rope_angles_in_float64_are_position_times_frequency():
    angles = rope_angles(torch.arange(50), 8, base=100.0, dtype=torch.float64)
    for p in (0, 1, 49):
        for i in range(4):
            assert angles[p, i].item() == pytest.approx(p * 100.0 ** (-2 * i / 8), rel=1e-15)


def test_bf16_angles_collide_above_256_and_fp32_ones_do_not():
    positions = torch.arange(256, 1024)
    bf16 = rope_angles(positions, 4, dtype=torch.bfloat16)[:, 0]  # frequency 1: the position
    fp32 = rope_angles(positions, 4, dtype=torch.float32)[:, 0]
    assert bf16.unique().numel() < len(positions) == fp32.unique().numel()


@pytest.mark.parametrize("positions, dim", [(torch.arange(4), 7), (torch.arange(4), 0),
                                            (torch.arange(4.0), 8), (torch.zeros(2, 2, dtype=torch.long), 8)])
def test_rope_angles_reject_bad_input(positions, dim):
    with pytest.raises(ValueError):
        rope_angles(positions, dim)


def test_angle_error_wraps_full_turns():
    zero = torch.zeros(3, dtype=torch.float64)
    turned = torch.tensor([2 * math.pi, -4 * math.pi, math.pi], dtype=torch.float64)
    assert torch.allclose(angle_error(turned, zero), torch.tensor([0.0, 0.0, math.pi], dtype=torch.float64))


# --- router ----------------------------------------------------------------------------------

def test_router_picks_the_largest_gate_logits_sorted():
    gate = torch.eye(4)
    hidden = torch.tensor([[0.1, 0.9, 0.5, 0.0], [3.0, 1.0, 2.0, 4.0]])
    assert router_top_k(hidden, gate, 2).tolist() == [[1, 2], [0, 3]]


def test_router_in_bf16_flips_a_near_tie_that_fp32_keeps():
    gate = torch.eye(2)
    hidden = torch.tensor([[1.0, 1.0 + 2.0 ** -12]])  # expert 1 wins by less than BF16's gap
    assert router_top_k(hidden, gate, 1, dtype=torch.float32).item() == 1
    assert router_top_k(hidden, gate, 1, dtype=torch.bfloat16).item() == 0  # a tie: the first wins


@pytest.mark.parametrize("k", [0, 5])
def test_router_rejects_k_outside_the_experts(k):
    with pytest.raises(ValueError, match="k must be"):
        router_top_k(torch.zeros(3, 2), torch.zeros(4, 2), k)


# --- chunked cross-entropy -------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [1, 7, 50, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_cross_entropy_equals_the_full_loss_and_its_gradients(chunk_size, with_bias):
    g = torch.Generator().manual_seed(chunk_size)
    tokens, dim, vocab = 50, 8, 97
    hidden = torch.randn(tokens, dim, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64) if with_bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    inputs = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
    reference = F.cross_entropy(F.linear(*inputs), targets)
    reference.backward()
    mine = [t.detach().float().requires_grad_() for t in inputs]
    loss = chunked_cross_entropy(mine[0], mine[1], mine[2] if with_bias else None, targets,
                                 chunk_size=chunk_size)
    (2 * loss).backward()  # a factor on the loss reaches every gradient
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    for ours, theirs in zip(mine, inputs):
        assert torch.allclose(ours.grad.double(), 2 * theirs.grad, rtol=1e-4, atol=1e-6)


def test_chunked_cross_entropy_gives_gradients_in_the_input_dtype():
    hidden = torch.randn(6, 4, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(5, 4, requires_grad=True)
    chunked_cross_entropy(hidden, weight, None, torch.tensor([0, 1, 2, 3, 4, 0]), chunk_size=4).backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32


def test_chunked_cross_entropy_saves_no_logits():
    hidden = torch.randn(256, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    targets = torch.randint(0, 1000, (256,))
    _, full = saved_tensor_bytes(lambda: F.cross_entropy(hidden @ weight.T, targets))
    _, chunked = saved_tensor_bytes(lambda: chunked_cross_entropy(hidden, weight, None, targets,
                                                                  chunk_size=32))
    logits_bytes = 256 * 1000 * 4
    assert full >= logits_bytes > chunked


@pytest.mark.parametrize("targets", [torch.tensor([0, 5]), torch.tensor([-1, 0]), torch.tensor([0])])
def test_chunked_cross_entropy_rejects_bad_targets(targets):
    with pytest.raises(ValueError):
        chunked_cross_entropy(torch.zeros(2, 3), torch.zeros(5, 3), None, targets)


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(100, requires_grad=True)
    _, saved = saved_tensor_bytes(lambda: (x * x).sum())  # x saved twice, one storage
    assert saved == 100 * 4


# --- loss spikes and optimizer states --------------------------------------------------------

def test_spike_detector_waits_for_its_window_then_flags_outliers_only():
    detector = SpikeDetector(window=5, threshold=3.0)
    assert not any(detector.is_spike(100.0 * (i % 2)) for i in range(5))  # window not full yet
    calm = SpikeDetector(window=5, threshold=3.0)
    flags = [calm.is_spike(x) for x in [2.0, 2.1, 1.9, 2.0, 2.1, 2.0, 50.0, 2.0, float("nan"), 2.05]]
    assert flags == [False] * 6 + [True, False, True, False]
    assert 50.0 not in calm.recent


@pytest.mark.parametrize("state_format", ["fp32", "bf16", "8bit"])
def test_adam_low_precision_states_follows_torch_adam(state_format):
    torch.manual_seed(0)
    ours, theirs = torch.randn(300, requires_grad=True), None
    theirs = ours.detach().clone().requires_grad_()
    mine = AdamLowPrecisionStates([ours], lr=1e-2, state_format=state_format)
    reference = torch.optim.Adam([theirs], lr=1e-2)
    for step in range(20):
        grad = torch.randn(300, generator=torch.Generator().manual_seed(step))
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        mine.step()
        reference.step()
    tolerance = {"fp32": 1e-6, "bf16": 2e-3, "8bit": 3e-2}[state_format]
    assert (ours - theirs).abs().max().item() < tolerance


@pytest.mark.parametrize("state_format", ["bf16", "8bit"])
def test_low_precision_states_reach_the_weights_from_the_next_step_on(state_format):
    # bitsandbytes' order: update the states in FP32, step the weights with them, then store them;
    # so the first step is plain Adam's, even where storing flushes a state to zero
    grad = torch.cat([torch.full((4,), 1.0), torch.full((60,), 1e-4)])  # one block: v's small ones flush
    runs = {}
    for fmt in ("fp32", state_format):
        p = torch.zeros(64, requires_grad=True)
        optimizer = AdamLowPrecisionStates([p], lr=1e-3, state_format=fmt, v_code="e4m3")
        p.grad = grad.clone()
        optimizer.step()
        runs[fmt] = (p.detach().clone(), optimizer.state[p]["v"].clone())
    assert torch.equal(runs[state_format][0], runs["fp32"][0])
    if state_format == "8bit":
        assert (runs["8bit"][1][4:] == 0).all()  # stored v flushed, yet the step above was exact


def test_bf16_second_moment_cannot_decay_with_beta2_0999():
    parameter = torch.zeros(4, requires_grad=True)
    runs = {}
    for fmt in ("fp32", "bf16", "8bit"):
        p = parameter.detach().clone().requires_grad_()
        optimizer = AdamLowPrecisionStates([p], lr=1e-3, state_format=fmt)
        p.grad = torch.full((4,), 100.0)  # the spike
        optimizer.step()
        after_spike = optimizer.state[p]["v"].clone()
        for _ in range(50):
            p.grad = torch.full((4,), 1e-3)
            optimizer.step()
        runs[fmt] = (optimizer.state[p]["v"] / after_spike).max().item()
    assert runs["bf16"] == 1.0  # 0.999 v rounds back to v
    assert runs["fp32"] == pytest.approx(0.999 ** 50, rel=1e-3)
    assert runs["8bit"] < 0.99  # the block's FP32 scale carries the decay


@pytest.mark.parametrize("options", [dict(state_format="fp16"), dict(lr=0.0), dict(betas=(0.9, 1.0)),
                                     dict(block=0)])
def test_adam_low_precision_states_rejects_bad_settings(options):
    with pytest.raises(ValueError):
        AdamLowPrecisionStates([torch.zeros(2, requires_grad=True)], **options)


@pytest.mark.parametrize("window", [2.5, True, 1])
def test_a_spike_detector_window_must_be_an_integer_of_at_least_two(window):
    with pytest.raises(ValueError, match="window >= 2"):
        SpikeDetector(window=window)


def test_train_lm_records_every_step_and_applies_the_cap():
    torch.set_num_threads(1)
    tokens = encode_text(addition_corpus(200))
    model, history = stability.train_lm(tokens, steps=3, lr=3e-3, z_weight=1e-2, cap=5.0)
    assert all(len(values) == 3 for values in history.values())
    assert max(history["logit"]) <= 5.0 and all(a > 0 for a in history["attention"])
    again = stability.train_lm(tokens, steps=3, lr=3e-3, z_weight=1e-2, cap=5.0)[1]
    assert again == history  # weights and batches come from the seed alone


def test_train_lm_warms_the_learning_rate_up_linearly():
    torch.set_num_threads(1)
    tokens = encode_text(addition_corpus(200))
    warm = stability.train_lm(tokens, steps=2, lr=3e-3, warmup=2)[1]["loss"]
    half = stability.train_lm(tokens, steps=2, lr=1.5e-3)[1]["loss"]  # the warm-up's first step
    full = stability.train_lm(tokens, steps=2, lr=3e-3)[1]["loss"]
    assert warm == half != full  # the second loss is the first step's result


def test_train_lm_under_bf16_autocast_rounds_the_forward_pass_and_keeps_fp32_weights():
    torch.set_num_threads(1)
    tokens = encode_text(addition_corpus(200))
    _, fp32 = stability.train_lm(tokens, steps=2, lr=3e-3)
    model, bf16 = stability.train_lm(tokens, steps=2, lr=3e-3, autocast=torch.bfloat16)
    # the same weights and batch at step 1: the losses differ by the forward pass's rounding only
    assert bf16["loss"][0] != fp32["loss"][0] and abs(bf16["loss"][0] - fp32["loss"][0]) < 0.05
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="autocast is None"):
        stability.train_lm(tokens, steps=1, lr=3e-3, autocast=torch.float64)


def test_spike_runs_that_share_their_start_give_the_numbers_of_separate_runs():
    torch.set_num_threads(1)
    tokens = encode_text(addition_corpus(200))
    setups = {"plain": {}, "skipped": dict(skip=True), "m zeroed": dict(zero_m=True),
              "clipped": dict(clip=1e3), "clipped hard": dict(clip=1e-3),  # binds before the spike
              "bf16": dict(state_format="bf16")}
    shared = stability.spike_runs(tokens, setups, steps=24, spike_at=21)
    separate = stability.spike_runs(tokens, setups, steps=24, spike_at=21, share=False)
    assert shared["skipped"]["flagged"] == [21] and len(shared["skipped"]["updates"]) == 23
    for name in setups:
        for key in ("losses", "v", "flagged", "norms"):
            assert shared[name][key] == separate[name][key], (name, key)
        assert all(torch.equal(a, b) for a, b in zip(shared[name]["updates"], separate[name]["updates"]))
    assert shared["plain"]["losses"][22:] != shared["skipped"]["losses"][22:]


def test_spike_runs_take_the_spike_out_of_one_moment_only():
    # The ablation of chapter 12b: right after the spike step, m (or v) forgets the spike's own
    # gradient, as if it had been 0, and keeps the rest; the spike step's own update stands.
    torch.set_num_threads(1)
    tokens = encode_text(addition_corpus(200))
    setups = {"plain": {}, "out of m": dict(spike_out_of_m=True), "out of v": dict(spike_out_of_v=True)}
    runs = stability.spike_runs(tokens, setups, steps=24, spike_at=21)
    plain, out_of_m, out_of_v = runs.values()
    for run in (out_of_m, out_of_v):
        assert torch.equal(run["updates"][21], plain["updates"][21])  # the spike step itself
    # v: the spike's square is gone, the decayed rest is kept
    assert out_of_v["v"][21] == pytest.approx(0.999 * plain["v"][20], rel=1e-5)
    assert plain["v"][21] > 10 * plain["v"][20] and out_of_m["v"][21] == plain["v"][21]
    # m: the next update no longer points along the spike's
    cosine = lambda run: torch.nn.functional.cosine_similarity(run["updates"][22], plain["updates"][21], dim=0)
    assert cosine(plain) > 0.9 > 0.5 > cosine(out_of_m)


def test_spike_detector_flags_a_non_finite_loss_at_once_as_documented():
    # round 7, S2: the docstring said nothing is flagged before `window` losses; an inf or NaN is
    detector = SpikeDetector()
    assert detector.is_spike(float("nan")) and detector.is_spike(float("inf"))
    assert detector.recent == []  # a non-finite loss never enters the window
    assert "non-finite loss" in SpikeDetector.__doc__ and "no finite loss is flagged" in SpikeDetector.__doc__
