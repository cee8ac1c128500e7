""":func:`~mpcourse.bench.benchmark` checked against an independent timer, Triton's ``do_bench``.

Both time the same BF16 matrix product at several sizes, eager and replayed from a CUDA graph,
under the same conditions: eager with the L2 cache flushed before every call (``do_bench``
always flushes), graphs without (``do_bench_cudagraph`` does not flush). ``ratio`` is our median
over theirs: near 1 where the two agree. Triton reports quantiles when asked,
``quantiles=[0.5, 0.2, 0.8]``; the median is compared, not its default mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.bench.specs import as_device
from mpcourse.bench.timing import benchmark

SIZES = (256, 1024, 4096)


@dataclass(frozen=True)
class CrosscheckRow:
    """One size and graph setting: our median and do_bench's, in ms; ``ratio`` = ours / theirs."""
    size: int
    cuda_graph: bool
    flush_l2: bool
    ours_ms: float
    do_bench_ms: float

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.do_bench_ms


def crosscheck_support(device=None) -> tuple[bool, str]:
    """Whether the comparison can run here, and why not: it needs a CUDA GPU and Triton."""
    device = as_device(device)
    if device.type != "cuda":
        return False, f"needs a CUDA GPU and Triton; the device is {device}"
    try:
        import triton.testing  # noqa: F401
    except ImportError:
        return False, "needs Triton (triton.testing.do_bench), which is not installed"
    return True, "CUDA and Triton present"


def compare_with_do_bench(device=None, sizes=SIZES, budget_ms: float = 100.0
                          ) -> list[CrosscheckRow]:
    """Time ``a @ b`` (BF16, n x n x n for n in ``sizes``) with both timers, graphs off and on.

    Raises:
        ValueError: :func:`crosscheck_support` says no.
    """
    device = as_device(device)
    supported, reason = crosscheck_support(device)
    if not supported:
        raise ValueError(f"cannot compare with triton's do_bench: {reason}")
    from triton.testing import do_bench, do_bench_cudagraph

    rows = []
    for n in sizes:
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        for graph in (False, True):
            ours = benchmark(torch.matmul, a, b, budget_ms=budget_ms, warmup_ms=budget_ms / 4,
                             flush_l2=not graph, cuda_graph=graph)
            fn = lambda: torch.matmul(a, b)  # noqa: E731
            if graph:
                with torch.cuda.stream(torch.cuda.Stream(device)):  # capture needs a side stream
                    theirs = do_bench_cudagraph(fn, rep=int(budget_ms), quantiles=[0.5])
            else:
                theirs = do_bench(fn, warmup=int(budget_ms / 4) or 1, rep=int(budget_ms),
                                  quantiles=[0.5])
            theirs = theirs[0] if isinstance(theirs, (list, tuple)) else theirs
            rows.append(CrosscheckRow(n, graph, not graph, ours.median_ms, float(theirs)))
    return rows
