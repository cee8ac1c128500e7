"""DDP comm hooks, FSDP2 mixed precision, memory per rank and DCP checkpoints, on 2 gloo processes."""
import pytest
import torch

from mpcourse import engines, sharded_checkpoints


@pytest.fixture(scope="module")
def hooks():
    return engines.ddp_hooks(2, steps=3)


def test_ddp_buckets_hold_fp32_gradients_under_autocast(hooks):
    rows, refused, _, _ = hooks
    assert all(row.bucket_dtypes == ("torch.float32",) for row in rows)
    if torch.version.cuda is not None or torch.version.hip is not None:
        assert refused is None  # a CUDA build registers it on gloo (seen with 2.11; 2.13 checks the build)
    elif torch.__version__ >= (2, 13):  # 2.13 checks the build, not the backend: a CPU build refuses
        assert refused is not None and "NCCL" in refused


def test_ddp_compression_halves_bytes_and_costs_precision(hooks):
    rows = {row.hook: row for row in hooks[0]}
    assert rows["fp16"].wire_bytes == rows["bf16"].wire_bytes == rows["fp32"].wire_bytes / 2
    assert rows["fp32"].step_error < rows["fp16"].step_error < rows["bf16"].step_error
    assert rows["bf16"].step_error < 2 ** -7  # within a few BF16 roundings


def test_fp32_valued_gradients_cost_the_fp16_hook_its_exactness(hooks):
    """Under BF16 autocast the gradients are BF16-valued, which FP16 holds exactly; with autocast
    off (FP32-valued gradients) the FP16 hook must round its inputs too."""
    rows32, _, _, compute32 = engines.ddp_hooks(2, hooks=("fp16", "bf16"), steps=2, autocast_dtype=None)
    by32 = {row.hook: row for row in rows32}
    by = {row.hook: row for row in hooks.rows}
    assert by32["fp16"].step_error > by["fp16"].step_error
    assert by32["fp16"].step_error < by32["bf16"].step_error
    assert by["bf16"].inexact == 0 and by32["bf16"].inexact > 0.5  # BF16-valued inputs go out exactly
    assert 0 < by["fp16"].inexact < 0.1 and by["fp16"].largest_inexact < 2.0**-14  # FP16's subnormals only
    assert compute32 == 0  # no autocast, nothing to compare with FP32


def test_at_two_ranks_bf16_compute_costs_more_than_the_16_bit_wire(hooks):
    """The hooks' errors are against the exact mean of gradients already computed under BF16
    autocast; the error of that computation against FP32 is the larger one at N = 2."""
    by = {row.hook: row for row in hooks.rows}
    assert hooks.compute_error > 3 * by["bf16"].step_error > 3 * by["fp16"].step_error


def test_the_16_bit_wire_error_grows_with_the_ranks_and_overtakes_the_compute_error():
    rows = engines.wire_and_compute_error((2, 128))
    small, large = rows
    assert small.wire["bf16"] < large.wire["bf16"] and small.wire["fp16"] < large.wire["fp16"]
    assert small.wire["bf16"] < small.compute and large.wire["bf16"] > large.compute
    assert all(r.wire["fp16"] < r.wire["bf16"] for r in rows)
    # each rank's own compute error does not fall with N; the mean's does: the errors partly cancel
    assert 0.5 < large.per_rank / small.per_rank < 2 and large.compute < large.per_rank / 2
    with pytest.raises(ValueError, match="whole numbers >= 2"):
        engines.wire_and_compute_error((1, 2))


def test_output_dtype_on_every_block_fails_in_the_roots_norm_not_the_next_block():
    seen = engines.output_dtype_on_every_block(2)
    assert seen["first block output"] == "torch.float32"
    assert seen["second block input"] == "torch.bfloat16"  # FSDP2 casts each module's inputs
    assert seen["error"] is not None and seen["failing module"] == "norm"


def test_unknown_hook_is_refused():
    with pytest.raises(ValueError, match="unknown hooks"):
        engines.ddp_hooks(2, hooks=("fp64",))


def test_fsdp2_policy_dtypes_and_reduction_error():
    dtypes, errors = engines.fsdp_policies(2)
    plain = dtypes["BF16 params, FP32 reduce"]
    assert plain["linear weight"] == plain["block (residual stream) output"] == "torch.bfloat16"
    assert plain["reduce-scatter"] == "torch.float32"
    assert plain["sharded parameter"].startswith("torch.float32")
    assert dtypes["BF16 params, BF16 reduce"]["reduce-scatter"] == "torch.bfloat16"
    assert dtypes["BF16 params, FP32 reduce, FP32 output (root)"]["model output"] == "torch.float32"
    assert dtypes["norms in FP32"]["LayerNorm weight"] == "torch.float32"
    assert errors["fp32"] < errors["fp16"] and errors["fp32"] < errors["bf16"]
    # gradient accumulation without sync: in reduce_dtype if it differs, else in param_dtype
    assert plain["accumulated without sync"] == "torch.float32"
    assert dtypes["BF16 params, BF16 reduce"]["accumulated without sync"] == "torch.bfloat16"


def test_memory_per_rank_matches_the_formulas():
    bills, held, n_params, _ = engines.memory_per_rank(2)
    core = ("weights", "gradients", "Adam moments")
    for engine, per_param in (("DDP", 16), ("ZeRO-3-like", 16 / 2)):
        totals = [sum(bill[engine][role] for role in core) for bill in bills]
        assert sum(totals) == pytest.approx(per_param * 2 * n_params)
    zero1 = [bill["ZeRO-1"]["Adam moments"] for bill in bills]
    assert sum(zero1) == 8 * n_params and max(zero1) < 8 * n_params
    mixed = bills[0]["BF16 weights + FP32 masters"]
    assert mixed["weights"] + mixed["gradients"] + mixed["master weights"] + mixed["Adam moments"] \
        == 18 * n_params
    assert held[0]["ZeRO-2-like"] == 2 * n_params and held[0]["ZeRO-3-like"] < held[0]["ZeRO-2-like"]
    # DDP's buckets: a second FP32 copy of the gradients with its default gradient_as_bucket_view=False,
    # nothing more when the .grad tensors are views into them
    for bill in bills:
        assert bill["DDP"]["DDP buckets"] == 4 * n_params
        assert bill["DDP, gradient_as_bucket_view"]["DDP buckets"] == bill["ZeRO-1"]["DDP buckets"] == 0
        assert bill["ZeRO-3-like"]["DDP buckets"] == 0


def test_bf16_accumulation_error_grows_with_the_micro_batches_fp32_does_not():
    torch.set_num_threads(1)
    rows = engines.accumulation_error((1, 4, 16))
    assert [r.micro_batches for r in rows] == [1, 4, 16]
    assert rows[0].bf16 == rows[0].fp32 == 0  # one micro-batch: nothing to add
    assert rows[1].bf16 < rows[2].bf16 and 2.0**-10 < rows[1].bf16 < 2.0**-6
    assert all(r.fp32 < 1e-6 for r in rows)
    with pytest.raises(ValueError, match="whole numbers >= 1"):
        engines.accumulation_error((0,))


def test_dcp_roundtrip_is_bit_identical(tmp_path):
    runs = sharded_checkpoints.checkpoint_roundtrip(tmp_path, load_world_sizes=(2, 1))
    saved = runs["saved"]
    for n in (2, 1):
        assert sharded_checkpoints.same_state(saved["at checkpoint"], runs[n]["at checkpoint"])
    assert sharded_checkpoints.same_state(saved["end"], runs[2]["end"])
    assert saved["after"] == runs[2]["after"]
    skipped = [not changed for _, _, changed in saved["before"]]
    scales = [scale for _, scale, _ in saved["before"]]
    for i in range(len(scales) - 1):  # a skipped step halves the scale
        assert scales[i + 1] == (scales[i] / 2 if skipped[i] else scales[i])


def test_checkpoint_needs_an_empty_directory(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="empty directory"):
        sharded_checkpoints.checkpoint_roundtrip(tmp_path)


def test_one_rank_and_two_compute_the_same_gradient_up_to_rounding():
    """The whole batch in one pass against the mean of its two halves: equal in exact arithmetic,
    so the gap is rounding and shrinks with the format's precision."""
    torch.set_num_threads(1)
    fp16, fp32 = (sharded_checkpoints.split_batch_gap(d) for d in (torch.float16, torch.float32))
    assert 0 < fp32 < 1e-6 < 2.0**-16 < fp16 < 2.0**-8
    whole, mean = sharded_checkpoints.split_batch_gradients(torch.float16)
    assert whole.dtype == mean.dtype == torch.float64 and whole.shape == mean.shape
    assert ((mean - whole).norm() / whole.norm()).item() == fp16


@pytest.mark.parametrize("call", [lambda: engines.fsdp_policies(3), lambda: engines.memory_per_rank(5),
                                  lambda: sharded_checkpoints.checkpoint_roundtrip("/nonexistent", load_world_sizes=(2, 3)),
                                  lambda: sharded_checkpoints.split_batch_gap(world_size=3)])
def test_a_world_size_that_cannot_share_the_batch_is_refused_before_any_process_starts(call):
    with pytest.raises(ValueError, match="positive divisor of the global batch"):
        call()


def test_the_course_hook_casts_then_divides_as_pytorchs_hooks_do(monkeypatch):
    """PyTorch's compression hooks compute ``buffer.to(dtype).div_(world_size)``; ours must too:
    at N = 3 dividing first in FP32 and casting rounds differently from casting and dividing."""
    sent = []

    def all_reduce(message, group=None, async_op=False):
        sent.append(message.clone())
        future = torch.futures.Future()
        future.set_result([message])
        return type("Work", (), {"get_future": lambda self: future})()

    monkeypatch.setattr(engines.dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(engines.dist, "all_reduce", all_reduce)
    buffer = torch.linspace(1, 2, 1000)
    pytorch_order = buffer.to(torch.bfloat16).div_(3)
    assert not torch.equal(pytorch_order, (buffer / 3).to(torch.bfloat16))  # the two orders differ here
    state = engines.HookState()
    engines._allreduce_in(state, buffer.clone(), torch.bfloat16).wait()
    assert torch.equal(sent[0], pytorch_order) and sent[0].dtype == torch.bfloat16


def test_split_batch_gradients_with_a_loss_scale_keeps_small_gradients_out_of_the_subnormals():
    torch.set_num_threads(1)
    signs = {}
    for scale in (1.0, 2.0**19):
        whole, mean = sharded_checkpoints.split_batch_gradients(torch.float16, scale=scale)
        signs[scale] = int((whole.sign() * mean.sign() < 0).sum())
    assert signs[1.0] > 0 and signs[2.0**19] == 0
    with pytest.raises(ValueError, match="positive finite"):
        sharded_checkpoints.split_batch_gradients(scale=0)


def test_transformer_passes_options_and_keeps_the_weights():
    """``engines.transformer(seed, softmax_dtype=...)``: the same weights as the default, with the
    attention's softmax in FP32 (chapter 11b's activation-memory row as CUDA autocast would keep)."""
    base, fp32_softmax = engines.transformer(0), engines.transformer(0, softmax_dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), fp32_softmax.state_dict().values()))
    assert fp32_softmax.blocks[0].attention.softmax_dtype == torch.float32
    assert base.blocks[0].attention.softmax_dtype is None


def test_saved_for_backward_counts_autocast_weight_copies():
    """FP32 saves no BF16 weight copies; CPU BF16 autocast saves some, and fewer bytes in all."""
    fp32, amp = engines.saved_for_backward(False), engines.saved_for_backward(True)
    assert fp32["copies"] == 0 and fp32[torch.bfloat16] == 0 and fp32[torch.float32] > 0
    assert amp["copies"] > 0 and amp[torch.bfloat16] > 0
    assert sum(amp.values()) < sum(fp32.values())


class _Bucket:
    """What the FP8 hook reads of DDP's ``GradBucket``: the flat buffer of its parameters'
    gradients, in the order of ``parameters()``, and its index."""

    def __init__(self, params, grads):
        self._params, self._buffer = params, torch.cat([g.flatten() for g in grads])

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def index(self):
        return 0


def test_fp8_error_feedback_follows_each_parameter_when_ddp_rebuilds_its_buckets(monkeypatch):
    """DDP rebuilds its buckets after the first iteration: bucket 0 then holds the same parameters
    in another order. Error feedback must carry each parameter's residual to that parameter, so
    that what it delivered over the steps plus what it still holds is the sum of its gradients."""
    monkeypatch.setattr(engines.dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(engines, "_gather_sums", lambda messages, n: [m.dequantize() for m in messages])
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(5))
    gen = torch.Generator().manual_seed(0)
    grads = [{a: torch.randn(3, generator=gen), b: torch.randn(5, generator=gen) * 100} for _ in range(3)]
    state = engines.HookState(feedback=True)
    delivered = {a: torch.zeros(3), b: torch.zeros(5)}
    for step, order in enumerate([(a, b), (b, a), (b, a)]):  # the buckets rebuilt after step 0
        out = engines.fp8_hook(state, _Bucket(list(order), [grads[step][p] for p in order])).wait()
        for p, part in zip(order, out.split([p.numel() for p in order])):
            delivered[p] += part
    for p in (a, b):
        total = sum(g[p] for g in grads)
        assert torch.allclose(delivered[p] + state.residuals[id(p)], total, rtol=0, atol=1e-4)
        assert not torch.equal(state.residuals[id(p)], torch.zeros_like(total))  # FP8 did round
