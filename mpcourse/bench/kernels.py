"""Which kernels ran: the names ``torch.profiler`` saw for one call.

A timing table does not say whether tensor cores did the work; the kernel names usually do
(cuBLAS and CUTLASS names carry the precision: ``bf16``, ``f16``, ``tf32``, ``e4m3``). Chapter
*Hardware* records them for the key matrix products when it runs on a GPU::

    from mpcourse.bench.kernels import kernel_names
    kernel_names(lambda: a @ b, "cuda")   # e.g. ['sm90_xmma_gemm_bf16bf16_bf16f32_...']

On a GPU the names are those of the device kernels (``DeviceType.CUDA`` events); on a CPU, where
there are no kernels to see, those of the ATen operators that ran (``aten::mm``), so the function
can be tried anywhere.
"""
from __future__ import annotations

import torch


def kernel_names(fn, device="cpu", *, warmup: int = 1) -> list[str]:
    """The distinct names of the kernels (GPU) or ATen operators (CPU) that ``fn()`` ran, in the
    order the profiler first saw them. ``fn`` is called ``warmup`` times first, unprofiled, so
    that one-time set-up (cuBLAS handles, autotuning) is not what the profile shows."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    names = []
    for event in prof.events():
        on_device = "CUDA" in str(getattr(event, "device_type", ""))
        name = event.name
        wanted = on_device if cuda else (not on_device and name.startswith("aten::"))
        if wanted and name not in names:
            names.append(name)
    return names
