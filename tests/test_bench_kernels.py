"""mpcourse.bench.kernels: the names the profiler saw (on the CPU: the ATen operators)."""
import pytest
import torch

from mpcourse.bench.kernels import kernel_names


def test_a_cpu_matmul_shows_its_aten_operator():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    names = kernel_names(lambda: a @ b, "cpu")
    assert any(name in ("aten::mm", "aten::matmul") for name in names), names
    assert len(names) == len(set(names))


def test_the_warm_up_calls_are_not_profiled():
    calls = []
    kernel_names(lambda: calls.append(torch.ones(2).sum()), "cpu", warmup=3)
    assert len(calls) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_matmul_shows_a_device_kernel():
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    names = kernel_names(lambda: a @ b, "cuda")
    assert names and not any(name.startswith("aten::") for name in names), names
