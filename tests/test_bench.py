"""mpcourse.bench: timing against torch.utils.benchmark, the spec table, the probes, the suite.

Timings themselves are never asserted. Where a test needs known times it gives ``benchmark`` a
fake clock (the ``timer=`` option, as ``torch.utils.benchmark.Timer`` has) that advances only
when the timed function runs, so every count and statistic is known in advance.
"""
import itertools
import math
import statistics
import subprocess
import re
import sys

import pytest
import torch
from torch.utils.benchmark import Timer

from mpcourse.bench import (GPU_SPECS, PRECISIONS, alignment_effect, alignment_multiple,
                            benchmark, compare_precisions, device_info, lookup_spec,
                            matmul_tflops, max_matmul_tflops, memory_bandwidth, pad_to_multiple,
                            precision_name, precision_support, tf32_mode, tf32_state)
from mpcourse.bench.timing import ESTIMATE_CALLS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class FakeWork:
    """A clock, and work that advances it: call i takes durations_ms[i % len] milliseconds."""

    def __init__(self, durations_ms):
        self.durations = itertools.cycle(durations_ms)
        self.now = 0.0
        self.calls = 0

    def clock(self) -> float:  # seconds, like time.perf_counter
        return self.now

    def __call__(self, *args):
        self.calls += 1
        self.now += next(self.durations) / 1e3


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# --- benchmark ---------------------------------------------------------------------------------
def test_benchmark_agrees_with_torch_utils_benchmark_timer(one_thread):
    # A ~1 ms product on one thread, as Timer(num_threads=1) runs it. Both sides time single
    # calls and take the median: Timer.blocked_autorange's median of *block means* is pulled up
    # by preemptions on a busy machine (2x on a loaded 2-core machine), which a median of single
    # calls resists. Measured in turn, three times each, so a busy spell hits both sides; the
    # medians must agree within 1.5x, with one retry for a spell that hit only one side.
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    timer = Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=1)
    for _ in range(2):
        ours, theirs = [], []
        for _ in range(3):
            theirs += [timer.timeit(number=1).median * 1e3 for _ in range(40)]
            ours += benchmark(torch.mm, a, b, repeats=40, warmup_ms=10).samples_ms
        ratio = statistics.median(ours) / statistics.median(theirs)
        if 1 / 1.5 < ratio < 1.5:
            break
    assert 1 / 1.5 < ratio < 1.5, (statistics.median(ours), statistics.median(theirs))


def test_statistics_come_from_the_samples_and_the_budget_sets_the_counts():
    work = FakeWork(range(1, 11))  # 1, 2, ..., 10 ms, over and over
    result = benchmark(work, warmup_ms=10, budget_ms=90, timer=work.clock, device="cpu")
    # The first call (1 ms) is never used; the next five (2..6 ms) give the estimate.
    assert result.estimate_ms == pytest.approx(sum(range(2, 7)) / ESTIMATE_CALLS)
    assert result.warmup == math.ceil(10 / 4)
    assert result.repeats == math.ceil(90 / 4) == len(result.samples_ms)
    assert work.calls == 1 + ESTIMATE_CALLS + result.warmup + result.repeats
    first_timed = 1 + ESTIMATE_CALLS + result.warmup
    expected = [(first_timed + i) % 10 + 1 for i in range(result.repeats)]
    assert result.samples_ms == pytest.approx(expected)
    quintiles = statistics.quantiles(expected, n=5, method="inclusive")
    assert result.median_ms == pytest.approx(statistics.median(expected))
    assert result.p20_ms == pytest.approx(quintiles[0])
    assert result.p80_ms == pytest.approx(quintiles[3])
    assert result.mean_ms == pytest.approx(statistics.mean(expected))
    assert result.min_ms == pytest.approx(min(expected))
    assert result.device == "cpu" and result.flush_l2 is False


def test_repeat_bounds_and_explicit_counts():
    slow = FakeWork([50.0])
    assert benchmark(slow, budget_ms=100, min_repeats=5, timer=slow.clock, device="cpu").repeats == 5
    fast = FakeWork([0.01])
    assert benchmark(fast, budget_ms=100, max_repeats=50, timer=fast.clock, device="cpu").repeats == 50
    fixed = FakeWork([1.0])
    assert benchmark(fixed, repeats=7, timer=fixed.clock, device="cpu").repeats == 7
    # A first call longer than the whole budget: a single call makes the estimate.
    long = FakeWork([500.0])
    result = benchmark(long, budget_ms=100, warmup_ms=0, timer=long.clock, device="cpu")
    assert long.calls == 1 + 1 + 0 + result.repeats and result.estimate_ms == 500


def test_benchmark_passes_args_to_fn(device):
    seen = []
    benchmark(lambda x, y: seen.append((x, y)), 2, 3, device="cpu", budget_ms=1)
    assert set(seen) == {(2, 3)}
    x = torch.randn(64, 64, device=device)
    result = benchmark(torch.mm, x, x, budget_ms=5)
    assert result.device.startswith(device.type) and result.repeats >= 5
    assert all(s > 0 for s in result.samples_ms)
    assert result.p20_ms <= result.median_ms <= result.p80_ms


def test_benchmark_rejects_bad_options():
    with pytest.raises(TypeError, match="callable"):
        benchmark(42)
    with pytest.raises(ValueError, match="budget_ms"):
        benchmark(lambda: None, budget_ms=-1, device="cpu")
    with pytest.raises(ValueError, match="min_repeats"):
        benchmark(lambda: None, min_repeats=10, max_repeats=5, device="cpu")
    with pytest.raises(ValueError, match="repeats"):
        benchmark(lambda: None, repeats=0, device="cpu")
    with pytest.raises(ValueError, match="cuda_graph"):
        benchmark(lambda: None, cuda_graph=True, device="cpu")


# --- the spec table ----------------------------------------------------------------------------
REAL_NAMES = {  # torch.cuda.get_device_name() strings -> the table entry they must find
    "Tesla T4": "T4", "Tesla V100-SXM2-16GB": "V100 SXM2", "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-32GB": "V100 PCIe", "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "NVIDIA A10": "A10", "NVIDIA A10G": "A10G",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB", "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB", "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA L4": "L4", "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H200": "H200 SXM", "NVIDIA L40S": "L40S", "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA GeForce RTX 5090": "RTX 5090", "NVIDIA H100 NVL": "H100 NVL", "NVIDIA B200": "B200", "NVIDIA GB200": "GB200",
    "AMD Instinct MI300X": "MI300X", "AMD Instinct MI300X VF": "MI300X",
    "AMD Instinct MI325X": "MI325X",
}


def test_device_names_find_their_spec_and_unknown_names_find_none():
    for device_name, spec_name in REAL_NAMES.items():
        spec = lookup_spec(device_name)
        assert spec is not None and spec.name == spec_name, device_name
    assert {spec.name for spec in GPU_SPECS} == set(REAL_NAMES.values())  # every row reachable
    # Other boards of the same chips are not matched by their siblings' rows: a laptop or China
    # variant has fewer units, the H200 NVL other clocks (and no datasheet figure was found).
    for other in ("NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090 D",
                  "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 5090 D",
                  "NVIDIA A100X", "AMD Instinct MI300A", "NVIDIA L40", "NVIDIA B300", ""):
        assert lookup_spec(other) is None, other


def test_spec_table_is_consistent_with_the_architectures():
    for spec in GPU_SPECS:
        peaks, cc = spec.peak_tflops, spec.compute_capability
        assert set(peaks) == set(PRECISIONS) and spec.memory_bandwidth_gbs > 0 and spec.source
        assert peaks["fp32"] > 0
        assert peaks["fp16"] > peaks["fp32"]  # every GPU listed has FP16 tensor cores
        assert (peaks["bf16"] is None) == (peaks["tf32"] is None) == (cc < (8, 0))
        assert (peaks["fp8"] is None) == (spec.fp8_dtypes is None) == (cc < (8, 9))
        if peaks["bf16"] is not None:
            assert peaks["bf16"] == peaks["fp16"]      # same tensor-core rate on every GPU listed
            # TF32 runs at half the 16-bit rate, FP8 at twice it (dense; some datasheets round:
            # the L40S's TF32 183 against BF16 362.05, the B200's TF32 1.1 against 2.25 PFLOPS)
            assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.025)
        if peaks["fp8"] is not None:
            assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.025)
        # FP4 tensor cores came with Blackwell (10.0 data centre, 12.0 GeForce), at twice FP8
        assert (spec.fp4_tflops is not None) == (spec.vendor == "nvidia" and cc >= (10, 0))
        if spec.fp4_tflops is not None:  # twice FP8 (on GeForce, twice its FP16-accumulation rate)
            fp8_fastest = peaks["fp8"] * (2 if "FP16 accumulation" in spec.note else 1)
            assert spec.fp4_tflops == pytest.approx(2 * fp8_fastest, rel=0.01)
        assert spec.vendor in ("nvidia", "amd")
        assert spec.source.startswith("AMD" if spec.vendor == "amd" else ("NVIDIA", "AWS"))
    by_name = {spec.name: spec for spec in GPU_SPECS}
    # Same chip, same compute; only memory differs.
    a100s = [s for s in GPU_SPECS if s.name.startswith("A100")]
    assert len({tuple(s.peak_tflops.items()) for s in a100s}) == 1
    assert by_name["H200 SXM"].peak_tflops == by_name["H100 SXM"].peak_tflops
    assert by_name["H200 SXM"].memory_bandwidth_gbs > by_name["H100 SXM"].memory_bandwidth_gbs
    a100_40, a100_80 = by_name["A100 SXM4 40GB"], by_name["A100 SXM4 80GB"]
    assert a100_80.memory_bandwidth_gbs > a100_40.memory_bandwidth_gbs
    assert [s.name for s in GPU_SPECS if s.approximate] == ["A10G"]
    assert by_name["MI325X"].peak_tflops == by_name["MI300X"].peak_tflops  # same CDNA 3 chip
    # GeForce rows hold the FP32-accumulation rate, and say that FP16 accumulation doubles it.
    for name in ("RTX 4090", "RTX 5090"):
        assert "FP16 accumulation" in by_name[name].note and "twice" in by_name[name].note


def test_fp8_formats_are_ocp_on_nvidia_and_fnuz_on_mi300():
    from mpcourse.bench.specs import fp8_dtypes_of
    ocp, fnuz = (torch.float8_e4m3fn, torch.float8_e5m2), (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    assert fp8_dtypes_of("nvidia", (9, 0)) == fp8_dtypes_of("nvidia", (8, 9)) == ocp
    assert fp8_dtypes_of("nvidia", (8, 6)) is None
    assert fp8_dtypes_of("amd", (9, 4)) == fnuz   # gfx942 (MI300): 9.4 is not Hopper
    assert fp8_dtypes_of("amd", (9, 5)) == ocp    # gfx950 (MI350)
    assert fp8_dtypes_of("amd", (9, 0)) is None   # gfx90a (MI200): no FP8
    with pytest.raises(ValueError, match="vendor"):
        fp8_dtypes_of("intel", (1, 0))
    # The FNUZ formats really differ: E4M3FNUZ tops out at 240, E4M3FN at 448.
    assert torch.finfo(fnuz[0]).max == 240 and torch.finfo(ocp[0]).max == 448
    assert lookup_spec("AMD Instinct MI300X").fp8_dtypes == fnuz
    assert lookup_spec("NVIDIA H100 80GB HBM3").fp8_dtypes == ocp


def test_an_mi300_is_described_as_amd_with_fnuz_fp8(monkeypatch):
    """device_info, precision_support and DeviceProfile.detect on a (simulated) ROCm MI300X."""
    from types import SimpleNamespace

    from mpcourse.training import DeviceProfile, select_precision
    props = SimpleNamespace(name="AMD Instinct MI300X", major=9, minor=4, total_memory=192e9,
                            L2_cache_size=4 * 2**20)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    info = device_info("cuda")
    assert info.vendor == "amd" and info.spec.name == "MI300X"
    assert info.fp8_dtypes == (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    supported, reason = precision_support("fp8", "cuda")
    assert not supported and "float8_e4m3fnuz" in reason and "gfx94" in reason
    assert "Hopper" not in reason
    assert precision_support("bf16", "cuda")[0]
    profile = DeviceProfile.detect("cuda")
    assert profile.kind == "rocm" and "float8_e4m3fnuz" in profile.name
    choice = select_precision(profile)
    assert choice.precision != "fp8" and not any("Hopper" in r for r in choice.reasons)


def test_device_info_on_the_cpu_says_unknown_instead_of_guessing():
    info = device_info("cpu")
    assert info.kind == "cpu" and info.device == "cpu" and info.compute_capability is None
    assert info.name and info.spec is None and info.spec_note.startswith("unknown")
    assert all(value is None for value in info.peak_tflops.values())
    assert info.peak("bf16") is None and info.memory_bandwidth_gbs is None
    assert info.accelerates["tf32"] is False and info.accelerates["fp8"] is False
    assert info.accelerates["bf16"] in (True, False, None) and info.threads >= 1


def test_precision_names_and_support_on_the_cpu():
    assert precision_name(torch.bfloat16) == "bf16" and precision_name("FP8") == "fp8"
    assert precision_name(torch.float32) == "fp32"
    with pytest.raises(ValueError, match="unknown precision"):
        precision_name("fp12")
    with pytest.raises(ValueError, match="no benchmark precision"):
        precision_name(torch.int8)
    for precision, expected in (("fp32", True), ("fp16", True), ("bf16", True),
                                ("tf32", False), ("fp8", False)):
        supported, reason = precision_support(precision, "cpu")
        assert supported is expected and reason, precision



def test_cpu_support_names_the_bf16_units_it_found(monkeypatch):
    """AVX-512 BF16 without AMX is said to be so (often slower than FP32), not 'AVX-512/AMX'."""
    from mpcourse.bench import specs
    for flags, words, absent in (({"avx512_bf16"}, "no AMX", "has AMX"),
                                 ({"avx512_bf16", "amx_bf16"}, "has AMX-BF16", "no AMX")):
        monkeypatch.setattr(specs, "_cpu_model_and_flags", lambda flags=flags: ("test CPU", flags))
        supported, reason = precision_support("bf16", "cpu")
        assert supported and words in reason and absent not in reason, reason
    monkeypatch.setattr(specs, "_cpu_model_and_flags", lambda: ("test CPU", set()))
    assert "no BF16 instructions" in precision_support("bf16", "cpu")[1]


def test_cpu_support_with_amx_for_another_precision(monkeypatch):
    """A Sapphire Rapids: AMX tiles for BF16 and INT8, AVX-512 FP16 but no AMX-FP16."""
    from mpcourse.bench import specs
    flags = {"avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}
    monkeypatch.setattr(specs, "_cpu_model_and_flags", lambda: ("test CPU", flags))
    supported, reason = precision_support("fp16", "cpu")
    assert supported and "no AMX-FP16 (its AMX does BF16 and INT8 only)" in reason, reason
    assert "no AMX matrix tiles" not in reason

# --- probes ------------------------------------------------------------------------------------
class SteppingClock:
    """A clock that moves by ``step_ms`` each time it is read: each timed call reads it twice
    (before and after), so every sample is exactly ``step_ms``, whatever the work costs."""

    def __init__(self, step_ms: float):
        self.step, self.now = step_ms / 1e3, 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_matmul_tflops_is_2mnk_over_the_median_time():
    m, n, k = 32, 48, 64
    result = matmul_tflops(m, n, k, "fp32", "cpu", timer=SteppingClock(2.0), repeats=5)
    assert result.timing.samples_ms == pytest.approx([2.0] * 5)
    assert result.tflops == pytest.approx(2 * 32 * 48 * 64 / 2e-3 / 1e12)
    assert result.percent_of_peak is None and result.peak_tflops is None  # a CPU: no datasheet


def test_memory_bandwidth_is_twice_the_bytes_over_the_median_time():
    result = memory_bandwidth("cpu", size_mb=1, timer=SteppingClock(0.5), repeats=5)
    assert result.bytes == 2**20
    assert result.gbs == pytest.approx(2 * 2**20 / 0.5e-3 / 1e9)
    assert result.peak_gbs is None and result.percent_of_peak is None


def test_matmul_tflops_arithmetic(device):
    m, n, k = 48, 32, 64
    result = matmul_tflops(m, n, k, "fp32", device, budget_ms=5)
    assert result.flops == 2 * m * n * k
    assert result.tflops == pytest.approx(2 * m * n * k / (result.timing.median_ms / 1e3) / 1e12)
    assert result.bytes_moved == 4 * (m * k + k * n + m * n)
    assert result.arithmetic_intensity == pytest.approx(result.flops / result.bytes_moved)
    assert (result.percent_of_peak is None) == (result.peak_tflops is None)


def test_matmul_probes_refuse_what_the_cpu_cannot_measure():
    with pytest.raises(ValueError, match="TF32"):
        matmul_tflops(64, 64, 64, "tf32", "cpu")
    with pytest.raises(ValueError, match="FP8"):
        max_matmul_tflops("fp8", "cpu")
    with pytest.raises(ValueError, match="positive int"):
        matmul_tflops(0, 64, 64, "fp32", "cpu")


def test_max_matmul_tflops_reports_the_best_shape(device):
    result = max_matmul_tflops("fp32", device, sizes=(16, (32, 16, 8)), budget_ms=5)
    assert [(r.m, r.n, r.k) for r in result.results] == [(16, 16, 16), (32, 16, 8)]
    assert result.best.tflops == max(r.tflops for r in result.results) == result.tflops
    assert result.skipped == ()


def test_pad_to_multiple_sizes_and_tensors():
    sizes = (0, 1, 8, 4095, 4096, 4097)
    assert [pad_to_multiple(n, 8) for n in sizes] == [0, 8, 8, 4096, 4096, 4104]
    a = torch.randn(2, 5, 13)
    padded = pad_to_multiple(a, 8)
    assert padded.shape == (2, 8, 16)
    assert torch.equal(padded[:, :5, :13], a)
    assert torch.count_nonzero(padded[:, 5:, :]) == 0
    assert torch.count_nonzero(padded[:, :, 13:]) == 0
    assert pad_to_multiple(a, 4, dims=0).shape == (4, 5, 13)
    aligned = torch.zeros(8, 16)
    assert pad_to_multiple(aligned, 8) is aligned
    # Zero padding keeps a matrix product exact on the original block.
    x, w = torch.randn(5, 13), torch.randn(13, 7)
    product = pad_to_multiple(x, 8) @ pad_to_multiple(w, 8)
    assert torch.allclose(product[:5, :7], x @ w, atol=1e-5)
    for bad in (-1, 2.5, "8"):
        with pytest.raises((TypeError, ValueError)):
            pad_to_multiple(bad, 8)
    with pytest.raises(ValueError, match="multiple"):
        pad_to_multiple(7, 0)
    with pytest.raises(ValueError, match="dims"):
        pad_to_multiple(torch.zeros(3), 8)  # a vector has no dim -2


def test_alignment_multiple_is_16_bytes_of_elements_and_alignment_effect_pads():
    for precision in PRECISIONS:
        itemsize = torch.empty(0, dtype={"fp32": torch.float32, "tf32": torch.float32,
                                         "fp16": torch.float16, "bf16": torch.bfloat16,
                                         "fp8": torch.float8_e4m3fn}[precision]).element_size()
        assert alignment_multiple(precision) == 16 // itemsize
    rows = alignment_effect((15, 16), "fp32", "cpu", budget_ms=5)
    assert [(r.size, r.aligned, r.padded_size) for r in rows] == [(15, False, 16), (16, True, 16)]
    assert rows[0].padded_result.m == 16 and rows[1].padded_result is rows[1].result
    assert rows[0].padded_tflops == pytest.approx(
        2 * 15**3 / (rows[0].padded_result.timing.median_ms / 1e3) / 1e12)


def test_alignment_effect_times_every_size_once_per_round_in_a_fresh_order(monkeypatch):
    """Sizes timed one after the other (all rounds of 60, then of 62, ...) turn a drifting machine
    into differences between sizes; interleaved rounds in random order spread the drift over all."""
    from mpcourse.bench import probes
    timed, real = [], probes.matmul_tflops
    monkeypatch.setattr(probes, "matmul_tflops", lambda m, *a, **k: timed.append(m) or real(m, *a, **k))
    rows = alignment_effect((13, 14, 16), "fp32", "cpu", rounds=4, seed=1, budget_ms=1, warmup_ms=0)
    assert sorted(timed) == [13] * 4 + [14] * 4 + [16] * 4  # 13 and 14 pad to 16: timed once a round
    rounds = [timed[i:i + 3] for i in range(0, 12, 3)]
    assert all(sorted(r) == [13, 14, 16] for r in rounds) and len({tuple(r) for r in rounds}) > 1
    for row in rows:
        assert len(row.results) == len(row.padded_results) == 4
        assert row.tflops_range[0] <= row.tflops <= row.tflops_range[1]
        assert row.padded_tflops_range[0] <= row.padded_tflops <= row.padded_tflops_range[1]
        assert row.result in row.results and row.padded_result in row.padded_results
    assert rows[0].padded_results == rows[2].results  # 13's padded product is the 16 of the same rounds
    with pytest.raises(ValueError, match="rounds"):
        alignment_effect((16,), "fp32", "cpu", rounds=0)


def test_tf32_mode_restores_the_flags_even_after_an_error():
    before = tf32_state()
    with tf32_mode(False):
        assert "matmul.fp32_precision='ieee'" in tf32_state() or \
            "matmul.allow_tf32=False" in tf32_state()
    with pytest.raises(RuntimeError):
        with tf32_mode(True):
            assert "matmul.fp32_precision='tf32'" in tf32_state() or \
                "matmul.allow_tf32=True" in tf32_state()
            raise RuntimeError("boom")
    assert tf32_state() == before


# --- compare_precisions and the command line -------------------------------------------------
def test_compare_precisions_gives_a_row_per_precision_with_reasons(device, one_thread):
    before = tf32_state()
    result = compare_precisions(device, dim=32, heads=2, batch=2, seq_len=16, budget_ms=10)
    assert tf32_state() == before and result.tf32_before == before
    assert [row.precision for row in result.rows] == list(PRECISIONS)
    for row in result.rows:
        supported, reason = precision_support(row.precision, device)
        if not supported:
            assert row.skipped == reason and row.forward_ms is None
        elif row.skipped is None:
            assert row.forward_ms > 0 and row.step_ms > 0
            assert (row.peak_memory_mb is None) == (device.type == "cpu")
    fp32 = result.row("fp32")
    assert fp32.skipped is None and fp32.forward_speedup == 1.0 and fp32.step_speedup == 1.0
    for row in result.rows:
        if row.skipped is None:
            assert row.step_speedup == pytest.approx(fp32.step_ms / row.step_ms)
    if device.type == "cpu":
        assert result.row("tf32").skipped and result.row("fp8").skipped
        assert result.row("bf16").skipped is None  # CPU autocast has BF16 in every torch >= 2.1


def test_compare_precisions_interleaves_rounds_and_reports_their_spread(monkeypatch, one_thread):
    """Each precision once per round, in a fresh order: drift spreads over all of them; the figures
    are the median round, the spread the lowest and highest, the speed-up's spread round by round."""
    from mpcourse.bench import precisions
    timed, real = [], precisions._measure
    monkeypatch.setattr(precisions, "_measure", lambda name, *a: timed.append(name) or real(name, *a))
    result = compare_precisions("cpu", dim=16, heads=2, batch=2, seq_len=16, precisions=("fp32", "bf16", "fp16"),
                                budget_ms=1, rounds=4, seed=3)
    rounds = [timed[i:i + 3] for i in range(0, 12, 3)]
    assert len(timed) == 12 and all(sorted(r) == ["bf16", "fp16", "fp32"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1
    fp32 = result.row("fp32")
    for row in result.rows:
        assert len(row.step_rounds_ms) == 4 and row.step_ms in row.step_rounds_ms
        assert min(row.step_rounds_ms) <= row.step_ms <= max(row.step_rounds_ms)
        ratios = [b / r for b, r in zip(fp32.step_rounds_ms, row.step_rounds_ms)]
        assert row.step_speedup_range == (min(ratios), max(ratios))
    assert result.model_flops_per_step == 2 * 16 * (6 * result.parameters + 12 * 16 * 16)
    with pytest.raises(ValueError, match="rounds"):
        compare_precisions("cpu", dim=16, heads=2, batch=2, seq_len=16, rounds=0)


def test_achieved_vs_peak_draws_points_on_its_log_axis_not_bars():
    # bars on a log axis misstate a ratio by their lengths; the two markers' distance does not
    from types import SimpleNamespace

    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    from mpcourse.bench import plot_achieved_vs_peak
    from mpcourse.bench.probes import MaxMatmulResult

    def measured(precision, tflops, peak):
        return MaxMatmulResult(precision=precision, device="cuda:0", skipped=(), peak_tflops=peak,
                               results=(SimpleNamespace(tflops=tflops),))
    results = SimpleNamespace(info=SimpleNamespace(name="a GPU"),
                              matmul={"fp32": measured("fp32", 51.4, 66.9), "fp8": measured("fp8", 1259.0, None)})
    ax = plot_achieved_vs_peak(results, Figure().add_subplot())
    assert ax.get_yscale() == "log"
    assert not [p for p in ax.patches if isinstance(p, Rectangle)]
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["51.4 TFLOP/s\n77% of peak", "1259 TFLOP/s"]


def test_bench_command_writes_the_report(tmp_path, device):
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "mpcourse", "bench", "--quick", "--device",
                          str(device), "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert str(out / "report.md") in run.stdout
    report = (out / "report.md").read_text()
    for name in ("achieved_vs_peak.png", "roofline.png", "precisions.png", "alignment.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in report
    if device.type == "cpu":
        assert "What a GPU would show" in report and "skipped: TF32" in report
        for spec in GPU_SPECS:
            assert f"| {spec.name}" in report


# --- GPU only ----------------------------------------------------------------------------------
@needs_cuda
def test_cuda_events_flush_and_graphs():
    x = torch.randn(1024, 1024, device="cuda")
    events = benchmark(torch.mm, x, x, budget_ms=20)
    assert events.method == "cuda events" and events.device.startswith("cuda")
    flushed = benchmark(torch.mm, x, x, budget_ms=20, flush_l2=True)
    assert flushed.flush_l2 and all(s > 0 for s in flushed.samples_ms)
    small = torch.randn(64, device="cuda")
    graph = benchmark(lambda v: v.mul(2).add(1).relu(), small, cuda_graph=True, budget_ms=20)
    assert graph.method == "cuda graph + cuda events" and all(s > 0 for s in graph.samples_ms)
    with pytest.raises(ValueError, match="timer"):
        benchmark(torch.mm, x, x, timer=lambda: 0.0)


@needs_cuda
def test_cuda_device_info_and_tensor_core_matmuls():
    info = device_info("cuda")
    assert info.kind == "cuda" and info.compute_capability == torch.cuda.get_device_capability()
    assert (info.spec is None) == info.spec_note.startswith("unknown")
    for precision in ("bf16", "fp8"):
        supported, reason = precision_support(precision, "cuda")
        if not supported:
            with pytest.raises(ValueError, match="cannot time"):
                matmul_tflops(256, 256, 256, precision, "cuda")
            continue
        result = matmul_tflops(2048, 2048, 2048, precision, "cuda", budget_ms=20)
        assert result.tflops > 0 and result.timing.flush_l2
        assert (result.percent_of_peak is None) == (info.peak(precision) is None)
    bandwidth = memory_bandwidth("cuda", size_mb=64, budget_ms=20)
    assert bandwidth.gbs > 0 and bandwidth.peak_gbs == info.memory_bandwidth_gbs


def test_matmul_bytes_is_the_one_traffic_definition_fp8_writes_a_bf16_result():
    from mpcourse.bench.probes import matmul_bytes, matmul_intensity
    m, n, k = 32, 48, 64
    assert matmul_bytes(m, n, k, "fp32") == 4 * (m * k + k * n + m * n)
    assert matmul_bytes(m, n, k, "bf16") == 2 * (m * k + k * n + m * n)
    assert matmul_bytes(m, n, k, "fp8") == (m * k + k * n) + 2 * m * n  # E4M3 in, BF16 out
    assert matmul_intensity(m, n, k, "fp8") == pytest.approx(2 * m * n * k / matmul_bytes(m, n, k, "fp8"))


def test_every_spec_states_its_memory_and_a_name_with_a_size_agrees_with_it():
    for spec in GPU_SPECS:
        found = re.fullmatch(r"(\d+)( or (\d+))? GB (HBM\w*|GDDR\w*)", spec.memory)
        assert found, f"{spec.name}: memory {spec.memory!r}"
        named = re.search(r"(\d+)GB", spec.name)  # "A100 SXM4 80GB"
        if named:
            assert named.group(1) == found.group(1)
