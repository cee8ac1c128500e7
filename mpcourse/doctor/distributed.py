"""The doctor on FSDP2 and DDP: small broken and correct multi-process set-ups, each watched by one
session per rank, run on gloo processes (CPU) in one launch.

>>> from mpcourse.doctor import distributed
>>> reports = distributed.diagnose_setups(["fsdp fp16, ShardedGradScaler"])   # doctest: +SKIP
>>> reports["fsdp fp16, ShardedGradScaler"][0].ok                            # doctest: +SKIP
True

The workers import :func:`_worker` by name (see :func:`mpcourse.communication.run_workers`), which
is why the set-ups live in this module rather than in a notebook or a test.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BROKEN = {  # set-up -> the codes its report must hold (severity error or warning)
    "fsdp fp16, no scaler": {"fsdp-fp16-without-sharded-scaler"},
    "shards, unsynced scaler": {"unsynced-found-inf"},
}
# Trade-offs, not mistakes: gradients reduced in BF16 lose less than BF16 compute does at 2 ranks,
# but the reduction's error grows with the number of ranks (a warning, with the error measured).
AT_SCALE = {
    "fsdp bf16, bf16 reduce": {"half-reduce"},
    "ddp, bf16 comm hook": {"half-reduce"},
}
CORRECT = ("fsdp fp16, ShardedGradScaler", "fsdp fp16, plain GradScaler", "fsdp bf16, fp32 reduce",
           "ddp, fp32", "shards, synced scaler")
SETUPS = (*BROKEN, *AT_SCALE, *CORRECT)
INF_STEP = 1  # in the scaled FP16 set-ups, rank 0 finds an inf in its gradient shard at this step


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the same weights on every rank
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _build(setup: str, seed: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    model = _model(seed)
    scaler = None
    if setup.startswith("shards"):  # model parallelism by hand: each rank its own shard
        from mpcourse.scaling import DynamicLossScaler

        model = _model(seed + dist.get_rank())
        scaler = DynamicLossScaler(2.0**10)
    elif setup.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel

        from mpcourse.engines import HookState, bf16_hook

        model = DistributedDataParallel(model)
        if "bf16 comm hook" in setup:
            model.register_comm_hook(HookState(), bf16_hook)
    else:
        half = torch.float16 if "fp16" in setup else torch.bfloat16
        reduce = None if "bf16 reduce" in setup else torch.float32  # None: param_dtype's
        policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=reduce)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if "ShardedGradScaler" in setup:
            scaler = ShardedGradScaler("cpu", init_scale=2.0**10)
        elif "plain GradScaler" in setup:
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, scaler


def _inject_inf(model):
    """An overflow that landed in this rank's shard of the first gradient only."""
    grad = next(model.parameters()).grad
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    with torch.no_grad():
        local.view(-1)[0] = float("inf")


def _worker(rank, world_size, setups, steps, seed):
    from mpcourse import doctor

    reports = {}
    for setup in setups:
        model, optimizer, scaler = _build(setup, seed)
        g = torch.Generator().manual_seed(seed * 1000 + rank)
        with doctor.watch(model, optimizer, scaler) as session:
            for step in range(steps):
                x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x).float(), y)
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaler.scale(loss).backward()
                    if step == INF_STEP and rank == 0:
                        _inject_inf(model)
                    if setup == "shards, synced scaler":
                        scaler.unscale_(optimizer)
                        scaler.sync_found_inf(optimizer)
                    scaler.step(optimizer)
                    scaler.update()
        reports[setup] = session.report()
    return reports


def diagnose_setups(setups=SETUPS, *, world_size: int = 2, steps: int = 3, seed: int = 0) -> dict:
    """Run each named set-up (of :data:`SETUPS`) for ``steps`` watched steps on ``world_size`` gloo
    processes, all in one launch; ``{setup: [report of rank 0, report of rank 1, ...]}``.

    In every scaled set-up rank 0 alone finds an inf in its gradient shard at step
    :data:`INF_STEP`. The broken set-ups (:data:`BROKEN`): FSDP2 in FP16 with no scaler; model
    parallelism by hand (each rank its own weights, its own ``DynamicLossScaler``) with no agreement on the inf.
    The trade-offs that grow risky with the number of ranks (:data:`AT_SCALE`): gradients reduced
    in BF16 by FSDP2's ``reduce_dtype`` or by a DDP comm hook. The fixes (:data:`CORRECT`):
    ``ShardedGradScaler`` or a plain ``torch.amp.GradScaler`` (on FSDP2's DTensor gradients torch
    reduces its inf check over the ranks: an info), an FP32 ``reduce_dtype``, DDP's own FP32 all-reduce,
    ``sync_found_inf`` between ``unscale_`` and ``step``.
    """
    from mpcourse.communication import run_workers

    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        raise ValueError(f"unknown set-up {unknown[0]!r}: choose from {SETUPS}")
    per_rank = run_workers(_worker, world_size, list(setups), steps, seed, backend="gloo")
    return {setup: [reports[setup] for reports in per_rank] for setup in setups}
