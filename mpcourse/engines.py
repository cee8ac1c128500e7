"""The engines: mixed precision inside DDP, FSDP2 and sharded checkpoints, on real processes.

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
- **DCP** (``torch.distributed.checkpoint``) saves each rank's shards in parallel and loads them
  back into any sharding, including another number of ranks.

The workers import the functions they run by name (see
:func:`mpcourse.communication.run_workers`), so the chapter's experiments live here, each one
launch of processes. They run on CPU with gloo, even where GPUs exist: one GPU cannot host two
NCCL ranks, and the dtypes, bytes and rounding measured are the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mpcourse.communication import (_gather_sums, digits_model, rank_batch, relative_error,
                                    ring_traffic_bytes, run_workers)

BACKEND = "gloo"  # every experiment here runs on CPU processes (see the module docstring)


# ---------------------------------------------------------------------------------------------
# DDP communication hooks

@dataclass
class HookState:
    """The ``state`` DDP hands to our hooks: what each call saw and sent, and the residuals of
    error feedback.

    ``bucket_dtypes``: the dtype of every bucket the hook received; ``wire_bytes``: the bytes this
    rank sent over the links (ring all-reduce ``2 (N-1)/N * message``, ring all-gather
    ``(N-1) * message``); ``residuals``: per bucket, what error feedback has not sent yet.
    """

    process_group: object = None
    fmt: str = "e4m3"
    feedback: bool = True
    bucket_dtypes: list = field(default_factory=list)
    wire_bytes: float = 0.0
    residuals: dict = field(default_factory=dict)


def _allreduce_in(state: HookState, buffer: torch.Tensor, wire: torch.dtype):
    """Average ``buffer`` over the ranks, sent as ``wire``; a future holding it in its own dtype.

    The division by N comes first, as in DDP's own hooks, so the sum cannot overflow FP16.
    """
    state.bucket_dtypes.append(buffer.dtype)
    n = dist.get_world_size(state.process_group)
    message = (buffer / n).to(wire)
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
    (``2 (N-1)/N`` messages of 4 bytes per value) it saves bytes only while ``N < 9``.
    """
    from mpcourse.fp8 import quantize

    buffer = bucket.buffer()
    state.bucket_dtypes.append(buffer.dtype)
    n = dist.get_world_size(state.process_group)
    key = (bucket.index(), buffer.numel())
    corrected = buffer.float() / n
    if state.feedback and key in state.residuals:
        corrected = corrected + state.residuals[key]
    message = quantize(corrected, state.fmt)
    if state.feedback:
        state.residuals[key] = corrected - message.dequantize()
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
    ranks' own gradients; ``accumulated_error`` that of the sum over all steps."""

    hook: str
    bucket_dtypes: tuple
    wire_bytes: float
    step_error: float
    accumulated_error: float


def _flat_grad(module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def _ddp_worker(rank, world_size, hooks, steps, autocast_dtype, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The reference: every rank's own gradient, and their exact mean.
    plain, exact = digits_model(seed), []
    for step in range(steps):
        x, y = rank_batch(rank, step=step, seed=seed)
        plain.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype):
            loss = F.cross_entropy(plain(x), y)
        loss.backward()
        mean = _flat_grad(plain).double()
        dist.all_reduce(mean)
        exact.append(mean / world_size)

    rows, refused = [], None
    for name in hooks:
        model = DDP(digits_model(seed))
        state = HookState(feedback=name.endswith("feedback"))
        model.register_comm_hook(state, HOOKS[name])
        averaged = []
        for step in range(steps):
            x, y = rank_batch(rank, step=step, seed=seed)
            model.zero_grad()
            with torch.autocast("cpu", dtype=autocast_dtype):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            averaged.append(_flat_grad(model).double())
        step_error = sum(relative_error(a, e) for a, e in zip(averaged, exact)) / steps
        rows.append(HookResult(name, tuple(sorted({str(d) for d in state.bucket_dtypes})),
                               state.wire_bytes / steps, step_error,
                               relative_error(sum(averaged), sum(exact))))
    # PyTorch's own BF16 hook, asked to run on gloo.
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    try:
        DDP(digits_model(seed)).register_comm_hook(None, bf16_compress_hook)
    except Exception as error:  # noqa: BLE001 - the message is the result
        refused = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    dist.barrier()
    return rows, refused, sum(p.numel() for p in plain.parameters())


def ddp_hooks(world_size: int = 2, hooks=tuple(HOOKS), *, steps: int = 10,
              autocast_dtype=torch.bfloat16, seed: int = 0):
    """Train-step the digits MLP under DDP and autocast with each comm hook (one launch).

    Returns ``(rows, refused, n_params)``: a :class:`HookResult` per hook (rank 0's view), the
    error PyTorch's ``bf16_compress_hook`` raised on gloo (None if it ran), and the parameter count.
    """
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown:
        raise ValueError(f"unknown hooks {unknown}; choose from {list(HOOKS)}")
    _check_steps(steps)
    return run_workers(_ddp_worker, world_size, tuple(hooks), steps, autocast_dtype, seed,
                       backend=BACKEND)[0]


def _check_steps(steps) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
