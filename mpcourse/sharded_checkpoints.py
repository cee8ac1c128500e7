"""FP16 under FSDP2 with a sharded gradient scaler, and sharded checkpoints (DCP), on real processes.

``torch.distributed.checkpoint`` (DCP) saves each rank's shards in parallel and loads them back
into any sharding, including another number of ranks. :func:`checkpoint_roundtrip` trains the
course's tiny transformer in FP16 under FSDP2 with ``ShardedGradScaler``, saves model, optimizer and
scaler, and resumes on as many ranks and on fewer. The loaded state is the saved one bit for bit;
training on after a change of the number of ranks is the same computation rounded differently, as
:func:`split_batch_gap` measures without any process: the gradient of the whole batch against the
mean of the gradients of its halves.
"""
from __future__ import annotations

import pathlib

import torch

from mpcourse.communication import relative_error, run_workers
from mpcourse.engines import BACKEND, _check_steps, _check_world_sizes, lm_loss, lm_rank_batch, shard, transformer


CHECKPOINT_LR = 3e-3  # AdamW's learning rate in checkpoint_roundtrip


def _fp16_trainer(seed, init_scale):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    model = transformer(seed)
    shard(model, MixedPrecisionPolicy(torch.float16, torch.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=CHECKPOINT_LR)
    return model, optimizer, ShardedGradScaler("cpu", init_scale=init_scale)


def _train(rank, world_size, model, optimizer, scaler, steps, first_step, seed):
    """``steps`` FP16 steps; per step: the loss, the scale used, and whether this rank's shard
    of the weights changed."""
    log = []
    for step in range(first_step, first_step + steps):
        x, y = lm_rank_batch(rank, world_size, step=step, seed=seed)
        before = [p.to_local().clone() for p in model.parameters()]
        optimizer.zero_grad()
        loss = lm_loss(model, x, y)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        changed = any(not torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters()))
        log.append((loss.item(), scale, changed))
    return log


def _snapshot(model, optimizer, scaler) -> dict:
    """The full training state, gathered (every rank must call it): weights, Adam moments and
    the scaler's state."""
    # clone(): on one rank, full_tensor() returns the local tensor itself, which training changes
    full = {f"weight {n}": p.detach().full_tensor().clone() for n, p in model.named_parameters()}
    for i, p in enumerate(model.parameters()):
        for key, value in optimizer.state[p].items():
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            full[f"{key} {i}"] = value.clone()
    full["scaler"] = scaler.state_dict()
    return full


def _checkpoint_worker(rank, world_size, path, mode, steps, init_scale, seed):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # "load" starts from other weights (seed + 1): what it ends with came from the checkpoint.
    model, optimizer, scaler = _fp16_trainer(seed if mode == "save" else seed + 1, init_scale)
    out = {}
    if mode == "save":
        out["before"] = _train(rank, world_size, model, optimizer, scaler, steps, 0, seed)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state, "scaler": scaler.state_dict()},
                 checkpoint_id=path)
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state, "scaler": scaler.state_dict()}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        scaler.load_state_dict(state["scaler"])
    out["at checkpoint"] = _snapshot(model, optimizer, scaler)
    out["after"] = _train(rank, world_size, model, optimizer, scaler, steps, steps, seed)
    out["end"] = _snapshot(model, optimizer, scaler)
    out["files"] = sorted(p.name for p in pathlib.Path(path).iterdir())
    return out if rank == 0 else None


def checkpoint_roundtrip(path, *, save_world_size: int = 2, load_world_sizes=(2, 1),
                         steps: int = 4, init_scale: float = 2.0**21, seed: int = 0):
    """Train the tiny transformer in FP16 under FSDP2 with ``ShardedGradScaler`` for ``steps``
    steps on ``save_world_size`` ranks, save model, optimizer and scaler with DCP into ``path``
    (an empty directory), train ``steps`` more; then for each of ``load_world_sizes``, start
    other ranks from other weights, load the checkpoint and train the same ``steps`` steps.

    Returns ``{"saved": run, n: run, ...}``, rank 0's view of each run: per-step logs
    ``(loss, scale, weights changed)`` and gathered snapshots at the checkpoint and at the end.
    The global batch is the same whatever the number of ranks.
    """
    _check_world_sizes(save_world_size, *load_world_sizes)
    path = pathlib.Path(path)
    if not path.is_dir() or any(path.iterdir()):
        raise ValueError(f"checkpoint_roundtrip needs an empty directory, got {str(path)!r}")
    _check_steps(steps)
    runs = {"saved": run_workers(_checkpoint_worker, save_world_size, str(path), "save", steps,
                                 float(init_scale), seed, backend=BACKEND)[0]}
    for n in load_world_sizes:
        runs[n] = run_workers(_checkpoint_worker, n, str(path), "load", steps, float(init_scale),
                              seed, backend=BACKEND)[0]
    return runs


def same_state(a: dict, b: dict) -> bool:
    """Whether two snapshots hold the same keys and bit-identical tensors (and equal scalers)."""
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def split_batch_gradients(dtype=torch.float16, *, world_size: int = 2, step: int = 0,
                          seed: int = 0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g_whole, mean_r g_r)`` in float64: the gradient of one pass over the global batch and
    the mean of the gradients of its ``world_size`` equal slices, all computed with the tiny
    transformer's weights in ``dtype``, the loss multiplied by the loss scale ``scale`` before
    backward and each gradient divided by it afterwards (in float64), as a gradient scaler does.

    In exact arithmetic the two are the same vector (:func:`~mpcourse.engines.lm_loss` is a mean
    and the slices are equal), which is what FSDP2 computes on 1 rank and on ``world_size`` ranks:
    what separates them is rounding alone."""
    _check_world_sizes(world_size)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")

    def gradient(x, y):
        model = transformer(seed).to(dtype)
        (lm_loss(model, x, y) * scale).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]).double() / scale

    whole = gradient(*lm_rank_batch(0, 1, step=step, seed=seed))
    parts = [gradient(*lm_rank_batch(r, world_size, step=step, seed=seed)) for r in range(world_size)]
    return whole, torch.stack(parts).mean(0)


def split_batch_gap(dtype=torch.float16, *, world_size: int = 2, step: int = 0, seed: int = 0) -> float:
    """How far the gradient of one pass over the global batch lies from the mean of the gradients
    of its ``world_size`` equal slices (:func:`split_batch_gradients`), compared in float64:
    ``||g_whole - mean_r g_r|| / ||g_whole||``. The gap is rounding alone, and scales with
    ``dtype``'s precision."""
    whole, mean = split_batch_gradients(dtype, world_size=world_size, step=step, seed=seed)
    return relative_error(mean, whole)
