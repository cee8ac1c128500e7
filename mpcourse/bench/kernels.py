"""Which kernels ran: the names ``torch.profiler`` saw for one call.

A timing table does not say whether tensor cores did the work; the kernel names usually do
(cuBLAS and CUTLASS names carry the precision: ``bf16``, ``f16``, ``tf32``, ``e4m3``). Chapter
*Hardware* records them for the key matrix products when it runs on a GPU::

    from mpcourse.bench.kernels import kernel_names
    kernel_names(lambda: a @ b, "cuda")   # e.g. ['sm90_xmma_gemm_bf16bf16_bf16f32_...']

On a GPU the names are those of the device kernels (``DeviceType.CUDA`` events); on a CPU, where
there are no kernels to see, those of the ATen operators that ran (``aten::mm``), so the function
can be tried anywhere. :func:`short_kernel_names` shortens ATen's element-wise kernels, whose
demangled names spell out a whole template, to the operation they run, for a table a reader scans.
"""
from __future__ import annotations

import re

import torch

_WRAPPERS = {"AUnary", "BUnary", "Binary", "Unary", "CUDA"}  # functors that only hold another one


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


def short_kernel_name(name: str) -> str:
    """``"elementwise: reciprocal"`` for ATen's ``void at::native::vectorized_elementwise_kernel<4,
    at::native::reciprocal_kernel_cuda(...)...>(...)``, hundreds of characters long; any other
    name (cuBLAS's, an ATen operator's) as it is.

    The operation is the ``<op>_kernel_cuda`` function in the template, else its innermost
    ``<Op>Functor`` (``MulFunctor`` inside ``AUnaryFunctor<...>``), else the kernel's own name."""
    if not name.startswith("void ") or "elementwise_kernel" not in name:
        return name
    kernel = re.search(r"at::native::(\w+?)_kernel_cuda", name)
    functors = [f for f in re.findall(r"(\w+?)Functor<", name) if f.split("::")[-1] not in _WRAPPERS]
    if kernel:
        op = kernel.group(1)
    elif functors:
        op = functors[0].split("::")[-1].lower()
    else:
        op = re.match(r"void (?:\w+::)*(\w+)", name).group(1)
    return f"elementwise: {op}"


def short_kernel_names(text: str) -> str:
    """:func:`short_kernel_name` of each name in a ``", "``-joined list of kernel names (a comma
    inside a template's ``<>``, ``()`` or ``{}`` does not split a name)."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "<({") - (char in ">)}")
        if text.startswith(", ", i) and depth == 0:
            names.append(text[start:i])
            start = i + 2
    names.append(text[start:])
    return ", ".join(short_kernel_name(n) for n in names)
