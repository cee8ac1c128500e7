"""mpcourse.bench.kernels: the names the profiler saw (on the CPU: the ATen operators)."""
import pytest
import torch

from mpcourse.bench.kernels import kernel_names, short_kernel_name, short_kernel_names


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


# two names torch.profiler gave on an H200 (torch 2.11): 1 / scale and a multiply, before an FP8 product
RECIPROCAL = ("void at::native::vectorized_elementwise_kernel<4, at::native::reciprocal_kernel_cuda(at::TensorIteratorBase&)"
              "::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
              "(int, at::native::reciprocal_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::"
              "{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)")
MULTIPLY = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
            "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, at::native::AUnaryFunctor"
            "<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)")


def test_an_elementwise_kernel_is_named_by_its_operation_and_other_names_stay():
    assert short_kernel_name(RECIPROCAL) == "elementwise: reciprocal"
    assert short_kernel_name(MULTIPLY) == "elementwise: mul"
    for name in ("nvjet_sm90_qqsss_128x64_128x8_1x2_h_bz_algo2_TNT", "aten::mm", "void cutlass::Kernel<foo>(bar)"):
        assert short_kernel_name(name) == name


def test_a_joined_list_splits_only_between_names():
    gemm = "nvjet_sm90_qqsss_128x64_128x8_1x2_h_bz_algo2_TNT"
    assert short_kernel_names(", ".join([RECIPROCAL, MULTIPLY, gemm])) == \
        f"elementwise: reciprocal, elementwise: mul, {gemm}"
    assert short_kernel_names("aten::mm") == "aten::mm"
