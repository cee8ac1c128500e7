"""The engines: mixed precision inside DDP and FSDP2, on real processes.

Chapter 11 all-reduces bare tensors. Training frameworks do it for you, inside an *engine*:

- **DDP** (``DistributedDataParallel``) keeps a full replica of the model on every rank and
  all-reduces the gradients in *buckets* (flat buffers of several gradients) during backward. A
  *communication hook* ``hook(state, bucket) -> Future`` replaces that all-reduce: it may compress
  the bucket first (:func:`bf16_hook`, :func:`fp8_hook`), as long as the future it returns holds
  the averaged bucket, in the bucket's own dtype.
- **FSDP2** (``torch.distributed.fsdp.fully_shard``) shards every parameter across the ranks.
  Before a module's forward it all-gathers the full parameters, cast to ``param_dtype``; after
  backward it reduce-scatters the gradients in ``reduce_dtype``, so each rank keeps the FP32
  gradient of its own shard only, next to its FP32 shard of the weights and of the optimizer
  state (ZeRO-3). ``output_dtype`` casts what a module returns.

FP16 under FSDP2 and sharded checkpoints (DCP) are in :mod:`mpcourse.sharded_checkpoints`.

The workers import the functions they run by name (see
:func:`mpcourse.communication.run_workers`), so the chapter's experiments live here, each one
launch of processes. They run on CPU with gloo, even where GPUs exist: one GPU cannot host two
NCCL ranks, and the dtypes, bytes and rounding measured are the same.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mpcourse.communication import (_gather_sums, digits_model, rank_batch, relative_error,
                                    ring_allreduce_reference, ring_traffic_bytes, run_workers)

BACKEND = "gloo"  # every experiment here runs on CPU processes (see the module docstring)
# FSDP2 warns that the root returns a view (F.linear reshapes); no in-place op follows here.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
# ShardedGradScaler's found-inf flag is a one-element tensor that DTensor replicates: harmless.
warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")


# ---------------------------------------------------------------------------------------------
# DDP communication hooks

@dataclass
class HookState:
    """The ``state`` DDP hands to our hooks: what each call saw and sent, and the residuals of
    error feedback.

    ``bucket_dtypes``: the dtype of every bucket the hook received; ``wire_bytes``: the bytes this
    rank sent over the links (ring all-reduce ``2 (N-1)/N * message``, ring all-gather
    ``(N-1) * message``); ``residuals``: per parameter (by ``id``), what error feedback has not
    sent yet;
    ``sent`` and ``changed``: how many values went on the wire, and how many of them the cast to
    the wire format changed (against the exact ``g / N``), ``largest_changed`` the largest
    magnitude among those.
    """

    process_group: object = None
    fmt: str = "e4m3"
    feedback: bool = True
    bucket_dtypes: list = field(default_factory=list)
    wire_bytes: float = 0.0
    residuals: dict = field(default_factory=dict)
    sent: int = 0
    changed: int = 0
    largest_changed: float = 0.0

    def record_cast(self, exact: torch.Tensor, on_wire: torch.Tensor) -> None:
        """Count the values that the cast to the wire format changed (``exact``: ``g / N`` in
        float64; ``on_wire``: what is sent, decoded)."""
        differs = on_wire.double() != exact
        self.sent += exact.numel()
        self.changed += int(differs.sum())
        if differs.any():
            self.largest_changed = max(self.largest_changed, exact[differs].abs().max().item())


def _allreduce_in(state: HookState, buffer: torch.Tensor, wire: torch.dtype):
    """Average ``buffer`` over the ranks, sent as ``wire``; a future holding it in its own dtype.

    In the order of PyTorch's own compression hooks (``buffer.to(dtype).div_(world_size)``): cast
    to the wire format first, then divide by N in it, before the sum, so the sum cannot overflow.
    Unless N is a power of two, the division rounds a second time.
    """
    state.bucket_dtypes.append(buffer.dtype)
    n = dist.get_world_size(state.process_group)
    message = buffer.to(wire, copy=True).div_(n)
    state.record_cast(buffer.double() / n, message)
    state.wire_bytes += ring_traffic_bytes(message.numel() * message.element_size(), n)
    future = dist.all_reduce(message, group=state.process_group, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0])  # cast back into the bucket's dtype
        return buffer

    return future.then(decompress)


def fp32_hook(state: HookState, bucket):
    """DDP's default, recorded: the bucket all-reduced as it is (the gradients' dtype)."""
    buffer = bucket.buffer()
    return _allreduce_in(state, buffer, buffer.dtype)


def fp16_hook(state: HookState, bucket):
    """PyTorch's own ``fp16_compress_hook`` (it works on gloo), recorded."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    buffer = bucket.buffer()
    state.bucket_dtypes.append(buffer.dtype)
    n = dist.get_world_size(state.process_group)
    state.wire_bytes += ring_traffic_bytes(buffer.numel() * 2, n)
    state.record_cast(buffer.double() / n, buffer.to(torch.float16).div_(n))  # as the hook computes it
    return fp16_compress_hook(state.process_group, bucket)


def bf16_hook(state: HookState, bucket):
    """The bucket sent in BF16. PyTorch's ``bf16_compress_hook`` insists on NCCL; this one runs
    on any backend that all-reduces BF16 tensors, gloo included."""
    return _allreduce_in(state, bucket.buffer(), torch.bfloat16)


def fp8_hook(state: HookState, bucket):
    """The bucket sent as FP8 (``state.fmt``, one scale per rank and bucket), with error feedback
    when ``state.feedback``: each rank adds what it failed to send last time,
    ``e_t = (g_t/N + e_{t-1}) - decompress(compress(g_t/N + e_{t-1}))``.

    Each rank has its own scale, so FP8 values of different ranks cannot be added as they are: the
    codes (1 byte each) and the scale (4 bytes) are all-gathered and summed in FP32 on every rank.
    An all-gather sends ``(N-1)`` messages per rank, so compared with an FP32 all-reduce
    (``2 (N-1)/N`` messages of 4 bytes per value) it saves bytes only while ``N < 8``.
    """
    from mpcourse.fp8 import quantize

    buffer = bucket.buffer()
    state.bucket_dtypes.append(buffer.dtype)
    n = dist.get_world_size(state.process_group)
    # The residuals are kept per parameter, not per bucket: DDP rebuilds its buckets after the
    # first iteration, and a bucket's index then holds other parameters, or the same in another order.
    params = bucket.parameters()
    corrected = buffer.float() / n
    if state.feedback:
        corrected = corrected + torch.cat([state.residuals.get(id(p), torch.zeros(p.numel()))
                                           for p in params])
    message = quantize(corrected, state.fmt)
    state.record_cast(corrected.double(), message.dequantize())
    if state.feedback:
        left = (corrected - message.dequantize()).split([p.numel() for p in params])
        state.residuals.update({id(p): r for p, r in zip(params, left)})
    state.wire_bytes += (n - 1) * (message.data.numel() + 4)
    buffer.copy_(_gather_sums([message], n)[0])
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


HOOKS = {"fp32": fp32_hook, "fp16": fp16_hook, "bf16": bf16_hook,
         "fp8": fp8_hook, "fp8 + feedback": fp8_hook}


@dataclass(frozen=True)
class HookResult:
    """One DDP comm hook over ``steps`` backward passes with the weights held fixed:
    ``bucket_dtypes`` it received; ``wire_bytes`` per step and rank; ``step_error`` the mean over
    steps of the relative error of the averaged gradient against the exact (float64) mean of the
    ranks' own gradients; ``accumulated_error`` that of the sum over all steps; ``inexact`` the
    share of the values sent that the cast to the wire format changed, and ``largest_inexact`` the
    largest magnitude among them (for error feedback, what the compression changed)."""

    hook: str
    bucket_dtypes: tuple
    wire_bytes: float
    step_error: float
    accumulated_error: float
    inexact: float = 0.0
    largest_inexact: float = 0.0


class HookRun(NamedTuple):
    """What :func:`ddp_hooks` measured: a :class:`HookResult` per hook (rank 0's view); the error
    PyTorch's ``bf16_compress_hook`` raised on gloo (None if it ran); the parameter count; and
    ``compute_error``, the mean over steps of the relative error of the exact mean of the ranks'
    gradients under autocast against the same mean computed in FP32 (0 with autocast off): the
    error of the low-precision computation itself, which the hooks' errors add to."""

    rows: list
    refused: str | None
    n_params: int
    compute_error: float


def _flat_grad(module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def _backward(model, rank, step, seed, autocast_dtype) -> None:
    """One forward under autocast (in FP32 if ``autocast_dtype`` is None) and one backward of this
    rank's batch for ``step``."""
    x, y = rank_batch(rank, step=step, seed=seed)
    model.zero_grad()
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        loss = F.cross_entropy(model(x), y)
    loss.backward()


def _ddp_worker(rank, world_size, hooks, steps, autocast_dtype, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The reference: every rank's own gradient, and their exact mean; and the same in FP32.
    plain, exact, compute_error = digits_model(seed), [], 0.0
    for step in range(steps):
        _backward(plain, rank, step, seed, autocast_dtype)
        mean = _flat_grad(plain).double()
        dist.all_reduce(mean)
        exact.append(mean / world_size)
        if autocast_dtype is not None:
            _backward(plain, rank, step, seed, None)
            mean32 = _flat_grad(plain).double()
            dist.all_reduce(mean32)
            compute_error += relative_error(exact[-1], mean32 / world_size) / steps

    rows, refused = [], None
    for name in hooks:
        model = DDP(digits_model(seed))
        state = HookState(feedback=name.endswith("feedback"))
        model.register_comm_hook(state, HOOKS[name])
        averaged = []
        for step in range(steps):
            _backward(model, rank, step, seed, autocast_dtype)
            averaged.append(_flat_grad(model).double())
        step_error = sum(relative_error(a, e) for a, e in zip(averaged, exact)) / steps
        rows.append(HookResult(name, tuple(sorted({str(d) for d in state.bucket_dtypes})),
                               state.wire_bytes / steps, step_error,
                               relative_error(sum(averaged), sum(exact)),
                               state.changed / state.sent, state.largest_changed))
    # PyTorch's own BF16 hook, asked to run on gloo.
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    try:
        DDP(digits_model(seed)).register_comm_hook(None, bf16_compress_hook)
    except Exception as error:  # noqa: BLE001 - the message is the result
        refused = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    dist.barrier()
    return rows, refused, sum(p.numel() for p in plain.parameters()), compute_error


def ddp_hooks(world_size: int = 2, hooks=tuple(HOOKS), *, steps: int = 10,
              autocast_dtype=torch.bfloat16, seed: int = 0):
    """Train-step the digits MLP under DDP and autocast with each comm hook (one launch).

    ``autocast_dtype=None`` runs the forward and backward in FP32 (FP32-valued gradients: the
    ablation of the BF16-valued ones that BF16 autocast produces).

    Returns a :class:`HookRun`, which unpacks as ``rows, refused, n_params, compute_error``.
    """
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown:
        raise ValueError(f"unknown hooks {unknown}; choose from {list(HOOKS)}")
    _check_steps(steps)
    return HookRun(*run_workers(_ddp_worker, world_size, tuple(hooks), steps, autocast_dtype, seed,
                                backend=BACKEND)[0])


@dataclass(frozen=True)
class ScaleError:
    """The errors of one mean gradient over ``world_size`` ranks: ``compute`` the relative error of
    the exact mean of the ranks' BF16-autocast gradients against the exact mean of their FP32
    gradients; ``wire[w]`` that of the ring all-reduce of the autocast gradients in wire format
    ``w`` (each divided by N before the sum, as DDP's hooks do) against their exact mean;
    ``per_rank`` the mean over the ranks of each rank's own compute error (its BF16-autocast
    gradient against its FP32 one), which the mean's ``compute`` error falls below where the
    ranks' errors partly cancel."""

    world_size: int
    compute: float
    wire: dict
    per_rank: float


def wire_and_compute_error(world_sizes=(2, 8, 32, 128), wires=("fp16", "bf16"), *, seed: int = 0,
                           step: int = 0) -> list[ScaleError]:
    """How the error of a 16-bit reduction grows with the number of ranks, next to the error of
    BF16 autocast itself, in one process: each rank's gradient of the digits MLP (its own batch of
    ``step``) is computed under BF16 autocast and in FP32, and the reduction is chapter 11's exact
    emulation of gloo's ring (:func:`mpcourse.communication.ring_allreduce_reference`)."""
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in world_sizes):
        raise ValueError(f"world_sizes must be whole numbers >= 2, got {world_sizes!r}")
    rows, model = [], digits_model(seed)
    for n in world_sizes:
        grads = {}
        for autocast_dtype in (torch.bfloat16, None):
            grads[autocast_dtype] = []
            for rank in range(n):
                _backward(model, rank, step, seed, autocast_dtype)
                grads[autocast_dtype].append(_flat_grad(model).clone())
        exact = torch.stack(grads[torch.bfloat16]).double().mean(0)
        exact32 = torch.stack(grads[None]).double().mean(0)
        wire = {w: relative_error(ring_allreduce_reference([g / n for g in grads[torch.bfloat16]], w), exact)
                for w in wires}
        per_rank = sum(relative_error(a, b) for a, b in zip(grads[torch.bfloat16], grads[None])) / n
        rows.append(ScaleError(n, relative_error(exact, exact32), wire, per_rank))
    return rows


@dataclass(frozen=True)
class AccumulationError:
    """Gradient accumulation over ``micro_batches`` micro-batches: the relative error of the
    accumulated gradient held in BF16 (``bf16``) and in FP32 (``fp32``) against the exact sum of
    the same micro-batch gradients."""

    micro_batches: int
    bf16: float
    fp32: float


def accumulation_error(micro_batches=(2, 8, 32), *, seed: int = 0) -> list[AccumulationError]:
    """What FSDP2's accumulation dtype costs, in one process. The digits MLP runs one backward
    per micro-batch of 32 digits; each micro-batch's gradient, divided by the number of
    micro-batches k (as when its loss is) and rounded to BF16 (FSDP2 holds the unsharded gradient
    in ``param_dtype``), is added to a running sum held in BF16 (``reduce_dtype`` unset: every
    addition rounded to 8 significant bits) or in FP32 (``reduce_dtype=torch.float32``). Both are
    compared with the exact (float64) sum of the same BF16 gradients: the error is the
    accumulation's alone, whatever computed the gradients."""
    if not micro_batches or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                for k in micro_batches):
        raise ValueError(f"micro_batches must be whole numbers >= 1, got {micro_batches!r}")
    model, grads, rows = digits_model(seed), [], []
    for i in range(max(micro_batches)):
        _backward(model, i, 0, seed, None)  # micro-batch i: the batch rank i would draw
        grads.append(_flat_grad(model).clone())
    for k in micro_batches:
        parts = [(g / k).bfloat16() for g in grads[:k]]
        in_bf16, in_fp32 = torch.zeros_like(parts[0]), torch.zeros_like(parts[0], dtype=torch.float32)
        for g in parts:
            in_bf16 += g   # BF16 + BF16, rounded to BF16
            in_fp32 += g   # into an FP32 sum
        exact = torch.stack(parts).double().sum(0)
        rows.append(AccumulationError(k, relative_error(in_bf16, exact), relative_error(in_fp32, exact)))
    return rows


def _check_steps(steps) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")


# ---------------------------------------------------------------------------------------------
# FSDP2 and its MixedPrecisionPolicy

def transformer(seed: int = 0, **options):
    """The course's ``TinyTransformer`` (64 wide, 2 blocks), its weights drawn from ``seed``;
    ``options`` go to ``TinyTransformer`` (``softmax_dtype=torch.float32``: the softmax in FP32,
    as CUDA autocast runs it), with the same weights whatever they choose."""
    from mpcourse.workloads import TinyTransformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyTransformer(**options)


def _check_world_sizes(*sizes, global_batch: int = 16) -> None:
    """Before any process starts: each world size must share the global batch evenly."""
    for n in sizes:
        if not isinstance(n, int) or n < 1 or global_batch % n:
            raise ValueError(f"a world size must be a positive divisor of the global batch of "
                             f"{global_batch}, got {n!r}")


def lm_rank_batch(rank: int, world_size: int, *, step: int = 0, seed: int = 0,
                  global_batch: int = 16):
    """Rank ``rank``'s slice of the global batch of ``global_batch`` addition-corpus windows of
    ``step``: the same global batch whatever the world size (it must divide ``global_batch``)."""
    from mpcourse.workloads import addition_corpus, encode_text, lm_batch

    _check_world_sizes(world_size, global_batch=global_batch)
    tokens = encode_text(addition_corpus(400, seed=seed))
    draw = torch.Generator().manual_seed(1009 * seed + step)
    x, y = lm_batch(tokens, global_batch, 32, generator=draw)
    share = global_batch // world_size
    return x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def saved_for_backward(autocast: bool, *, world_size: int = 2, **options) -> dict:
    """Bytes of the tensors autograd saves in one forward pass of :func:`transformer` on rank 0's
    micro-batch (:func:`lm_rank_batch`), by kind: ``torch.float32``, ``torch.bfloat16``, and
    ``"copies"``, autocast's BF16 copies of the weights (found by value, transposed or not). The
    parameters themselves are not counted. ``autocast``: under CPU BF16 autocast; ``options`` go to
    :func:`transformer` (``softmax_dtype=torch.float32``: the softmax in FP32, as on CUDA)."""
    import contextlib

    model, (x, y) = transformer(0, **options), lm_rank_batch(0, world_size)
    weights = {p.data_ptr() for p in model.parameters()}
    copies = [p.detach().bfloat16() for p in model.parameters()]
    saved = {}

    def is_copy(t):
        return t.dtype == torch.bfloat16 and any(
            (t.shape == c.shape and torch.equal(t, c)) or (t.shape == c.mT.shape and torch.equal(t, c.mT))
            for c in copies if c.dim() == t.dim())

    def keep(t):
        if t.data_ptr() not in weights:
            saved[t.data_ptr()] = ("copies" if is_copy(t) else t.dtype, t.untyped_storage().nbytes())
        return t

    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), context:
        lm_loss(model, x, y)
    return {kind: sum(b for d, b in saved.values() if d == kind)
            for kind in (torch.float32, torch.bfloat16, "copies")}


def shard(model, policy=None, *, norm_policy=None, root_policy=None,
          reshard_after_forward: bool = True):
    """Apply FSDP2 to a ``TinyTransformer``: each block, then the root (which holds the
    embeddings, the final norm and the head), all with ``policy``; with ``norm_policy``, every
    LayerNorm first becomes a module of its own with that policy (``fully_shard`` on the inner
    modules first, the root last, as FSDP2 requires); ``root_policy``, if given, replaces
    ``policy`` for the root alone (an ``output_dtype`` belongs there: set on every block, the
    next block still receives BF16, since FSDP2 casts each module's inputs to ``param_dtype``, but
    the last block's FP32 output reaches the root's final LayerNorm, whose weight is BF16, and CPU
    LayerNorm refuses the mix: see :func:`output_dtype_on_every_block`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = policy or MixedPrecisionPolicy()
    if norm_policy is not None:
        for norm in [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]:
            fully_shard(norm, mesh=mesh, mp_policy=norm_policy,
                        reshard_after_forward=reshard_after_forward)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh, mp_policy=root_policy or policy,
                       reshard_after_forward=reshard_after_forward)


def _reduce_scatter_spy(model, seen: list):
    """Make every FSDP module of ``model`` record the dtype of each gradient reduce-scatter."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    class Recorded(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            seen.append(str(input_tensor.dtype))
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(Recorded())


def accumulation_dtypes(model) -> str:
    """The dtypes in which FSDP2 holds ``model``'s unsharded gradients between backward passes
    that do not reduce (``set_requires_gradient_sync(False)``, gradient accumulation): torch 2.13's
    ``FSDPParam`` upcasts them to ``reduce_dtype`` when that differs from ``param_dtype``, and
    otherwise keeps them, and adds the next micro-batch's to them, in ``param_dtype``. Read from
    FSDP2's private state (``_fsdp_param_group.fsdp_params``) after such a backward."""
    from torch.distributed.fsdp import FSDPModule

    seen = set()
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for param in group.fsdp_params if group is not None else ():
            grad = param.unsharded_accumulated_grad
            grad = grad if grad is not None else param._unsharded_param.grad
            if grad is not None:
                seen.add(str(grad.dtype))
    return ", ".join(sorted(seen))


def _watch(module, name: str, seen: dict, *, weight: bool = False):
    """Record the dtypes a module receives and returns (and its weight's, during forward)."""
    def hook(module, args, output):
        seen.setdefault(f"{name} input", str(args[0].dtype))
        seen.setdefault(f"{name} output", str(output.dtype))
        if weight:
            seen.setdefault(f"{name} weight", str(module.weight.dtype))
    module.register_forward_hook(hook)


def _policy_worker(rank, world_size, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    bf16, fp32 = torch.bfloat16, torch.float32
    x, y = lm_rank_batch(rank, world_size, seed=seed)
    out = {}
    # 1. What each field of the policy does, and a per-module policy for the norms.
    configs = {
        "BF16 params, FP32 reduce": dict(policy=MixedPrecisionPolicy(bf16, fp32)),
        "BF16 params, FP32 reduce, FP32 output (root)": dict(
            policy=MixedPrecisionPolicy(bf16, fp32),
            root_policy=MixedPrecisionPolicy(bf16, fp32, output_dtype=fp32)),
        "BF16 params, BF16 reduce": dict(policy=MixedPrecisionPolicy(bf16, bf16)),
        "norms in FP32": dict(policy=MixedPrecisionPolicy(bf16, fp32),
                              norm_policy=MixedPrecisionPolicy(fp32, fp32, output_dtype=bf16)),
    }
    for name, config in configs.items():
        model, seen, reduced = transformer(seed), {}, []
        shard(model, **config)
        _reduce_scatter_spy(model, reduced)
        block = model.blocks[0]
        _watch(block, "block (residual stream)", seen)
        _watch(block.mlp[0], "linear", seen, weight=True)
        _watch(block.norm1, "LayerNorm", seen, weight=True)
        _watch(model, "model", seen)
        model.set_requires_gradient_sync(False)  # a first micro-batch: accumulate, do not reduce
        lm_loss(model, x, y).backward()
        seen["accumulated without sync"] = accumulation_dtypes(model)
        model.set_requires_gradient_sync(True)  # the last micro-batch: reduce-scatter the sum
        lm_loss(model, x, y).backward()
        p = block.mlp[0].weight
        seen["reduce-scatter"] = ", ".join(sorted(set(reduced)))
        seen["sharded parameter"] = f"{p.to_local().dtype}, {tuple(p.to_local().shape)} of {tuple(p.shape)}"
        seen["sharded gradient"] = f"{p.grad.to_local().dtype}, {tuple(p.grad.to_local().shape)}"
        out[name] = seen
    # 2. The reduction alone: FP32 compute, gradients reduce-scattered in FP32, BF16 or FP16,
    #    against the exact mean of the ranks' own gradients.
    plain = transformer(seed)
    lm_loss(plain, x, y).backward()
    exact = torch.cat([p.grad.flatten() for p in plain.parameters()]).double()
    dist.all_reduce(exact)
    exact /= world_size
    errors = {}
    for wire, dtype in (("fp32", fp32), ("bf16", bf16), ("fp16", torch.float16)):
        model = transformer(seed)
        shard(model, MixedPrecisionPolicy(reduce_dtype=dtype))
        lm_loss(model, x, y).backward()
        full = torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()])
        errors[wire] = relative_error(full, exact)
    return (out, errors) if rank == 0 else None


def _every_block_worker(rank, world_size, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    x, y = lm_rank_batch(rank, world_size, seed=seed)
    model, seen, entered = transformer(seed), {}, []
    shard(model, MixedPrecisionPolicy(torch.bfloat16, torch.float32, output_dtype=torch.float32))
    _watch(model.blocks[0], "first block", seen)
    _watch(model.blocks[1], "second block", seen)
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda module, args, name=name: entered.append(name))
    try:
        lm_loss(model, x, y).backward()
        seen["error"] = None
    except RuntimeError as error:
        seen["error"] = f"RuntimeError: {str(error).strip().splitlines()[0]}"
    seen["failing module"] = entered[-1] if seen["error"] else None
    return seen if rank == 0 else None


def output_dtype_on_every_block(world_size: int = 2, *, seed: int = 0) -> dict:
    """FSDP2 with ``MixedPrecisionPolicy(bf16, fp32, output_dtype=fp32)`` on every block and the
    root of the tiny transformer (one launch): rank 0's dtypes (``"first block output"``,
    ``"second block input"``, ...), the ``"error"`` the forward raised (None if it ran) and the
    ``"failing module"``, the last module whose forward had started."""
    _check_world_sizes(world_size)
    return run_workers(_every_block_worker, world_size, seed, backend=BACKEND)[0]


def fsdp_policies(world_size: int = 2, *, seed: int = 0):
    """What ``MixedPrecisionPolicy`` does, measured on the tiny transformer (one launch).

    Returns ``(dtypes, errors)``: for each policy, the dtypes seen in rank 0's forward and
    backward (``dtypes[policy][what]``), and for each reduce dtype the relative error of the
    reduced gradient against the exact mean of the ranks' FP32 gradients.
    """
    _check_world_sizes(world_size)
    return run_workers(_policy_worker, world_size, seed, backend=BACKEND)[0]


# ---------------------------------------------------------------------------------------------
# Memory per parameter: DDP, ZeRO-1, ZeRO-2-like and ZeRO-3-like

def local_bytes(tensors) -> int:
    """Bytes of the tensors as this rank holds them: a DTensor counts its local shard only."""
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size()
               for t in tensors)


def rank_bytes(model, optimizer, buckets=()) -> dict[str, int]:
    """Bytes this rank keeps between steps, by role (:func:`mpcourse.optim.training_state`),
    counted from its own tensors; the optimizer state is split into the tensors shaped like the
    parameters (Adam's two moments) and the per-tensor ``step`` counters.
    ``ZeroRedundancyOptimizer`` keeps its rank's share in an inner optimizer, ``.optim``.
    ``buckets``: DDP's flat bucket buffers (recorded by :func:`_bucket_spy`); the role ``"DDP
    buckets"`` counts the bytes of those that are not also the gradients' storage. With DDP's
    default ``gradient_as_bucket_view=False`` the buckets are a second copy of the gradients; with
    ``True`` the ``.grad`` tensors are views into them, and they cost nothing more."""
    from mpcourse.optim import training_state

    state = training_state(model, getattr(optimizer, "optim", optimizer))
    optimizer_state = state.pop("optimizer state")
    moments = [t for t in optimizer_state if t.dim() > 0]
    counters = [t for t in optimizer_state if t.dim() == 0]
    bill = {role: local_bytes(tensors) for role, tensors in state.items()}
    bill["Adam moments"], bill["step counters"] = local_bytes(moments), local_bytes(counters)
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in buckets}
    if storages:  # DDP keeps plain tensors (no DTensor shards), whose storage can be compared
        shared = {g.untyped_storage().data_ptr() for g in state["gradients"]}
        storages = {ptr: n for ptr, n in storages.items() if ptr not in shared}
    bill["DDP buckets"] = sum(storages.values())
    return bill


def _bucket_spy(buffers: dict, bucket):
    """A DDP comm hook: note the bucket's flat buffer in ``buffers``, then DDP's own all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffers[bucket.index()] = bucket.buffer()
    return allreduce_hook(None, bucket)


ENGINES = ("DDP", "DDP, gradient_as_bucket_view", "ZeRO-1", "ZeRO-2-like", "ZeRO-3-like",
           "BF16 weights + FP32 masters")


def _memory_worker(rank, world_size, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mpcourse.optim import MasterWeightOptimizer

    x, y = lm_rank_batch(rank, world_size, seed=seed)
    bills, held_after_forward = {}, {}
    for engine in ENGINES:
        model, buckets = transformer(seed), {}
        if engine.startswith("DDP") or engine == "ZeRO-1":
            # DDP's default copies the gradients into separate buckets; gradient_as_bucket_view=True
            # makes the .grad tensors views into the buckets (the ZeRO-1 row uses it too)
            model = DDP(model, gradient_as_bucket_view=engine != "DDP")
            model.register_comm_hook(buckets, _bucket_spy)
            params = model.parameters()
            optimizer = (torch.optim.AdamW(params) if engine.startswith("DDP") else
                         ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW))
        elif engine.startswith("ZeRO"):
            shard(model, MixedPrecisionPolicy(torch.bfloat16, torch.float32),
                  reshard_after_forward=engine == "ZeRO-3-like")
            optimizer = torch.optim.AdamW(model.parameters())
        else:  # what each DDP rank holds in the classic mixed-precision layout, on one replica
            model = model.to(torch.bfloat16)
            optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters()))
        for _ in range(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = lm_loss(model, x, y)
            # between forward and backward: the full (unsharded) parameters this rank holds
            held_after_forward[engine] = local_bytes(
                p for p in model.parameters() if not isinstance(p, DTensor))
            loss.backward()
            optimizer.step()
        bills[engine] = rank_bytes(model, optimizer, buckets.values())
    n_params = sum(p.numel() for p in transformer(seed).parameters())
    n_tensors = len(list(transformer(seed).parameters()))
    return bills, held_after_forward, n_params, n_tensors


def memory_per_rank(world_size: int = 2, *, seed: int = 0):
    """Bytes each rank holds under each engine of :data:`ENGINES`, counted from its real tensors
    after two AdamW steps of the tiny transformer (one launch): ``"DDP"`` with DDP's defaults
    (its buckets a second copy of the gradients), ``"DDP, gradient_as_bucket_view"`` and
    ``"ZeRO-1"`` with ``gradient_as_bucket_view=True``.

    Returns ``(bills, held_after_forward, n_params, n_tensors)``: ``bills[rank][engine][role]``,
    ``held_after_forward[rank][engine]`` (bytes of unsharded parameters between forward and
    backward), the parameter count and the number of parameter tensors.
    """
    _check_world_sizes(world_size)
    results = run_workers(_memory_worker, world_size, seed, backend=BACKEND)
    return ([r[0] for r in results], [r[1] for r in results], results[0][2], results[0][3])
