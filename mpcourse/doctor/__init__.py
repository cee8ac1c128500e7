"""The precision doctor: watch a few real training steps and name every mixed-precision mistake
in them, with its fix.

Wrap your own, unchanged training steps::

    session = doctor.watch(model, optimizer, scaler=None)   # scaler: GradScaler, ours, or None
    with session:
        for step in range(3):
            ...                                              # your training step
    report = session.report()
    print(report)              # report.findings, report.ok; report._repr_markdown_() in notebooks

For example, an FP16 model stepped by AdamW with no master weights:

>>> import torch
>>> from mpcourse import doctor
>>> torch.manual_seed(0) and None
>>> model = torch.nn.Linear(8, 2).half()
>>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
>>> x, y = torch.randn(16, 8).half(), torch.randint(0, 2, (16,))
>>> with doctor.watch(model, optimizer) as session:
...     for _ in range(2):
...         optimizer.zero_grad()
...         torch.nn.functional.cross_entropy(model(x), y).backward()
...         optimizer.step()
>>> report = session.report()
>>> report.ok
False
>>> sorted({f.code for f in report.findings if f.severity == "error"})
['eps-underflow', 'half-loss']
>>> report.findings[0].where, report.findings[0].guide
('torch.nn.functional.cross_entropy', 'fg-half-loss')

Each :class:`Finding` comes from what happened in the watched steps (the hooks and wrappers are
listed in :mod:`mpcourse.doctor.watching`), never from names. The codes:

========================== ==========================================================================
fp16-without-scaling       backward ran through FP16 without loss scaling (count of underflowing
                           gradient values)
half-params-without-masters  the optimizer steps 16-bit tensors itself (share of updates rounded away)
clip-before-unscale        gradients clipped while still multiplied by the loss scale
scaler-misuse              scaler.step bypassed, update() skipped or per micro-batch, step() without
                           scale(), unscale_() twice
nonfinite                  the first module and phase (forward / backward / optimizer) with inf/NaN,
                           inputs and weights told apart; scaled overflows the scaler skipped (info)
half-loss                  the loss computed from 16-bit logits
eps-underflow              an optimizer eps that rounds to 0, or dominates, in its state's format
half-batchnorm             BatchNorm running statistics kept in 16 bits
emulated-bf16              BF16 on a CUDA device of compute capability below 8.0
checkpoint-without-scaler  torch.save of model/optimizer state without the dynamic scaler's state
tf32 (info)                the TF32 settings for FP32 matmuls and convolutions
unwatched-scaler (info)    the loop used a scaler that was not passed to watch()
========================== ==========================================================================

Under ``torch.distributed`` (two ranks or more), watch the same steps on every rank, one session
per rank: on leaving the block the ranks exchange what they saw (a collective), and three more
codes apply (:mod:`mpcourse.doctor.distributed` runs broken and correct set-ups of each):

================================ ===================================================================
fsdp-fp16-without-sharded-scaler FSDP2 with an FP16 ``param_dtype`` and no loss scaler (error), or a
                                 plain GradScaler instead of ShardedGradScaler (error if the ranks
                                 disagreed on an inf, else an info: DTensor reduces its check)
half-reduce (warning)            gradients reduced across ranks in FP16/BF16 (FSDP2's
                                 ``reduce_dtype``, a DDP comm hook), with the relative error of one
                                 such reduction against the same reduction in FP32
unsynced-found-inf               one rank skipped a step for an inf/NaN while another stepped
================================ ===================================================================

The device seam: :func:`capability` gives the compute capability the ``emulated-bf16`` check
believes. Tests replace it, ``monkeypatch.setattr(doctor, "capability", lambda device: (7, 5))``,
to fake a GPU without native BF16.
"""
from __future__ import annotations

import torch

from mpcourse.doctor.report import Finding, Report
from mpcourse.doctor.watching import Session


def capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability ``(major, minor)`` of a CUDA device; None for other devices, where
    the question of native BF16 does not apply."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def watch(model, optimizer, scaler=None) -> Session:
    """A :class:`Session` that watches the training steps run inside ``with session:``.

    ``model``: the ``torch.nn.Module`` trained; ``optimizer``: a ``torch.optim.Optimizer``, or a
    :class:`~mpcourse.optim.MasterWeightOptimizer` / :class:`~mpcourse.optim.CompensatedOptimizer`
    around one; ``scaler``: the ``torch.amp.GradScaler`` or :class:`~mpcourse.scaling.LossScaler`
    the loop uses, or None. On leaving the block, even by an exception, every hook and wrapper is
    removed and nothing is left on the model, optimizer or scaler; the steps run bit for bit as
    they would unwatched. Watch a few steps: the session keeps a little for each one.

    Under ``torch.distributed`` with two ranks or more, call it on every rank around the same
    steps: leaving the block is a collective (the ranks exchange what they saw), so a rank that
    watches alone waits for the others. Not seen there: gradients that DDP's own C++ reducer
    all-reduces (FP16 or BF16 parameters under DDP without a comm hook), only Python-level
    ``torch.distributed`` reductions (comm hooks, FSDP2's reduce-scatter).
    """
    return Session(model, optimizer, scaler)


__all__ = ["Finding", "Report", "Session", "capability", "watch"]
