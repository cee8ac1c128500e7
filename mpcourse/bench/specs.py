"""What the hardware promises: peak throughput per precision, memory bandwidth, and support.

A datasheet's "peak TFLOP/s" is the clock rate times the operations every unit can start per
cycle: a ceiling no real program reaches. Two traps when reading one:

- **Sparsity.** Since Ampere, NVIDIA's headline tensor-core figures assume 2:4 structured
  sparsity (half the weights zero, in a fixed pattern), marked with an asterisk. Dense training
  gets half of them. Every figure below is **dense**.
- **Tensor cores versus CUDA cores.** The FP32 figure is the plain (non-tensor) FP32 rate. TF32,
  FP16, BF16 and FP8 run on tensor cores, on matrix products only; everything else (LayerNorm,
  softmax, the optimizer) runs on the CUDA cores and is usually limited by memory bandwidth.

- **Accumulation on GeForce cards.** A GeForce whitepaper (RTX 4090, RTX 5090) lists the
  tensor-core rate with FP16 accumulation, twice the rate with FP32 accumulation, which is what
  mixed-precision training uses (autocast and cuBLAS accumulate in FP32). The figures below are
  the FP32-accumulation rates; data-centre GPUs run both at the same rate.
- **FP8 is two families.** NVIDIA (compute capability 8.9 and newer) and AMD's MI350 use the OCP
  formats (``torch.float8_e4m3fn``, ``torch.float8_e5m2``); AMD's MI300 series (gfx942) uses
  the FNUZ variants (``torch.float8_e4m3fnuz``, ``torch.float8_e5m2fnuz``: no infinities, no
  negative zero, NaN is the code of -0, exponent bias one higher, so E4M3FNUZ tops out at 240,
  not 448). And on AMD GPUs, torch's "compute capability" is the gfx version (9.4 is gfx942,
  MI300), not NVIDIA's: 9.4 is not Hopper.

Peaks are in TFLOP/s (10^12 floating-point operations per second; a multiply-add counts as
two) and bandwidth in GB/s (10^9 bytes per second), as in the datasheets.
"""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field

import torch

from mpcourse.fp8 import native_fp8_support

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
PRECISION_LABELS = {"fp32": "FP32", "tf32": "TF32", "fp16": "FP16", "bf16": "BF16", "fp8": "FP8"}
# What a matrix product of each precision stores its operands in ("tf32" is FP32 storage, with
# TF32 tensor cores allowed; "fp8" is E4M3).
PRECISION_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                    "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
# Compute capability at which NVIDIA GPUs gain tensor cores for each precision: Volta (7.0) FP16,
# Ampere (8.0) TF32 and BF16, Ada and Hopper (8.9, 9.0) FP8.
TENSOR_CORES_SINCE = {"fp16": (7, 0), "tf32": (8, 0), "bf16": (8, 0), "fp8": (8, 9)}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet figures (dense; see the module docstring).

    Attributes:
        name: a short name, e.g. ``"H100 SXM"``.
        pattern: a regular expression matched (case-insensitively) against
            ``torch.cuda.get_device_name()``, e.g. ``"NVIDIA H100 80GB HBM3"``.
        compute_capability: (major, minor).
        peak_tflops: dense peak TFLOP/s per precision (``PRECISIONS``); None where the GPU has
            no tensor cores for that precision. ``"fp32"`` is the non-tensor FP32 rate.
        memory_bandwidth_gbs: peak memory bandwidth in GB/s.
        source: the document the figures come from.
        approximate: True where no NVIDIA datasheet exists and the figures are less certain.
        fp4_tflops: dense peak of FP4 (E2M1) tensor-core products, None where the GPU has none.
        vendor: ``"nvidia"`` or ``"amd"`` (whose ``compute_capability`` is torch's gfx number).
        note: what else to know when reading this GPU's datasheet.
        memory: the GPU's memory as its datasheet gives it, e.g. ``"80 GB HBM3"``.
    """
    name: str
    pattern: str
    compute_capability: tuple[int, int]
    peak_tflops: dict[str, float | None]
    memory_bandwidth_gbs: float
    source: str
    approximate: bool = False
    fp4_tflops: float | None = None
    vendor: str = "nvidia"
    note: str = ""
    memory: str = ""

    @property
    def fp8_dtypes(self) -> tuple[torch.dtype, torch.dtype] | None:
        """The torch dtypes of this GPU's FP8 tensor cores (E4M3, E5M2), or None without any."""
        if self.peak_tflops["fp8"] is None:
            return None
        return fp8_dtypes_of(self.vendor, self.compute_capability)


def fp8_dtypes_of(vendor: str, capability: tuple[int, int]) -> tuple[torch.dtype, torch.dtype] | None:
    """The FP8 dtypes (E4M3, E5M2) a GPU's tensor cores take, from its vendor and torch's
    capability number; None for a GPU without FP8 units (or one this function does not know).

    NVIDIA from 8.9 (Ada, Hopper, Blackwell): the OCP formats ``float8_e4m3fn``/``float8_e5m2``.
    AMD gfx94x (MI300 series, torch reports 9.4): the FNUZ variants ``float8_e4m3fnuz``/
    ``float8_e5m2fnuz``. AMD gfx95x (MI350 series): the OCP formats.
    """
    ocp = (torch.float8_e4m3fn, torch.float8_e5m2)
    if vendor == "nvidia":
        return ocp if capability >= TENSOR_CORES_SINCE["fp8"] else None
    if vendor == "amd":
        if capability[0] == 9 and capability[1] in (4,):
            return (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
        return ocp if capability[0] == 9 and capability[1] == 5 else None
    raise ValueError(f"vendor is 'nvidia' or 'amd', not {vendor!r}")


def _peaks(fp32, tf32=None, fp16=None, bf16=None, fp8=None) -> dict[str, float | None]:
    return {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "fp8": fp8}


# Datasheets print tensor-core peaks with sparsity ("*"): the dense figure is half. Where
# NVIDIA's architecture whitepaper gives the dense figure more precisely, it is used.
GPU_SPECS: tuple[GpuSpec, ...] = (
    # NVIDIA T4 Tensor Core GPU datasheet: FP32 8.1, mixed-precision FP16/FP32 65 TFLOPS
    # (Turing tensor cores: no TF32, no BF16), 320 GB/s GDDR6.
    GpuSpec("T4", r"\bt4\b", (7, 5), _peaks(8.1, fp16=65.0), 320.0,
            "NVIDIA T4 datasheet", memory="16 GB GDDR6"),
    # NVIDIA Tesla V100 datasheet, SXM2 column: FP32 15.7, tensor (FP16) 125, 900 GB/s HBM2.
    GpuSpec("V100 SXM2", r"v100-sxm2", (7, 0), _peaks(15.7, fp16=125.0), 900.0,
            "NVIDIA Tesla V100 datasheet (SXM2)", memory="16 or 32 GB HBM2"),
    # NVIDIA Tesla V100 datasheet, PCIe column: FP32 14, tensor (FP16) 112, 900 GB/s.
    GpuSpec("V100 PCIe", r"v100-pcie", (7, 0), _peaks(14.0, fp16=112.0), 900.0,
            "NVIDIA Tesla V100 datasheet (PCIe)", memory="16 or 32 GB HBM2"),
    # NVIDIA V100S datasheet: FP32 16.4, tensor (FP16) 130, 1134 GB/s.
    GpuSpec("V100S PCIe", r"v100s", (7, 0), _peaks(16.4, fp16=130.0), 1134.0,
            "NVIDIA V100S datasheet", memory="32 GB HBM2"),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*), 600 GB/s GDDR6.
    GpuSpec("A10", r"\ba10\b", (8, 6), _peaks(31.2, 62.5, 125.0, 125.0), 600.0,
            "NVIDIA A10 datasheet", memory="24 GB GDDR6"),
    # A10G: AWS's variant of the A10 (G5 instances). NVIDIA publishes no A10G datasheet; these
    # are the figures AWS quotes (as compiled in Baseten's "NVIDIA A10 vs A10G"): FP32 35,
    # TF32 35, BF16/FP16 70 (half the A10's tensor rate), 600 GB/s. Treat them as approximate.
    GpuSpec("A10G", r"\ba10g\b", (8, 6), _peaks(35.0, 35.0, 70.0, 70.0), 600.0,
            "AWS G5 figures (no NVIDIA datasheet), approximate", approximate=True, memory="24 GB GDDR6"),
    # NVIDIA A100 datasheet: FP32 19.5, TF32 156 (312*), BF16/FP16 312 (624*) for every form
    # factor; bandwidth 1555 GB/s (40GB), 1935 GB/s (80GB PCIe), 2039 GB/s (80GB SXM).
    GpuSpec("A100 SXM4 40GB", r"a100-sxm\d?-40gb", (8, 0), _peaks(19.5, 156.0, 312.0, 312.0),
            1555.0, "NVIDIA A100 datasheet (40GB SXM)", memory="40 GB HBM2"),
    GpuSpec("A100 SXM4 80GB", r"a100-sxm\d?-80gb", (8, 0), _peaks(19.5, 156.0, 312.0, 312.0),
            2039.0, "NVIDIA A100 datasheet (80GB SXM)", memory="80 GB HBM2e"),
    GpuSpec("A100 PCIe 40GB", r"a100-pcie-40gb", (8, 0), _peaks(19.5, 156.0, 312.0, 312.0),
            1555.0, "NVIDIA A100 datasheet (40GB PCIe)", memory="40 GB HBM2"),
    GpuSpec("A100 PCIe 80GB", r"a100 80gb pcie|a100-pcie-80gb", (8, 0),
            _peaks(19.5, 156.0, 312.0, 312.0), 1935.0, "NVIDIA A100 datasheet (80GB PCIe)",
            memory="80 GB HBM2e"),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485*, 300 GB/s GDDR6.
    GpuSpec("L4", r"\bl4\b", (8, 9), _peaks(30.3, 60.0, 121.0, 121.0, 242.5), 300.0,
            "NVIDIA L4 datasheet", memory="24 GB GDDR6"),
    # NVIDIA H100 datasheet (SXM): FP32 67, TF32 989*, BF16/FP16 1979*, FP8 3958*, 3.35 TB/s
    # HBM3; dense figures from the NVIDIA H100 (Hopper) architecture whitepaper: FP32 66.9,
    # TF32 494.7, BF16/FP16 989.4, FP8 1978.9. torch names it "NVIDIA H100 80GB HBM3".
    GpuSpec("H100 SXM", r"h100.*(hbm3|sxm)", (9, 0), _peaks(66.9, 494.7, 989.4, 989.4, 1978.9),
            3350.0, "NVIDIA H100 datasheet (SXM) and Hopper whitepaper", memory="80 GB HBM3"),
    # NVIDIA H100 datasheet (PCIe): FP32 51, TF32 756*, BF16/FP16 1513*, FP8 3026*, 2.0 TB/s
    # HBM2e. (The H100 NVL is a different board, with a row of its own.)
    GpuSpec("H100 PCIe", r"h100[ -]pcie", (9, 0), _peaks(51.0, 378.0, 756.0, 756.0, 1513.0),
            2000.0, "NVIDIA H100 datasheet (PCIe)", memory="80 GB HBM2e"),
    # NVIDIA H100 datasheet, H100 NVL column (the PCIe dual-slot board with 94 GB, sold in
    # NVLink-bridged pairs): FP32 60, TF32 835*, BF16/FP16 1,671*, FP8 3,341*, 3.9 TB/s HBM3.
    # Its own clocks and power limit (350-400 W), so neither the SXM nor the PCIe row fits it.
    GpuSpec("H100 NVL", r"h100 nvl", (9, 0), _peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
            3900.0, "NVIDIA H100 datasheet (H100 NVL)", memory="94 GB HBM3"),
    # NVIDIA H200 datasheet (SXM): the H100 SXM's compute (FP32 67, TF32 989*, BF16/FP16 1979*,
    # FP8 3958*; dense as for the H100 SXM) with 141 GB of HBM3e at 4.8 TB/s. (The H200 NVL,
    # a lower-power board, is not matched.)
    GpuSpec("H200 SXM", r"\bh200\b(?!.*nvl)", (9, 0), _peaks(66.9, 494.7, 989.4, 989.4, 1978.9),
            4800.0, "NVIDIA H200 datasheet (SXM)", memory="141 GB HBM3e"),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), FP8 733
    # (1,466*), 864 GB/s GDDR6. (The datasheet's own dense figures, not quite in 1:2:4 ratio.)
    GpuSpec("L40S", r"\bl40s\b", (8, 9), _peaks(91.6, 183.0, 362.05, 362.05, 733.0), 864.0,
            "NVIDIA L40S datasheet", memory="48 GB GDDR6"),
    # NVIDIA Ada GPU architecture whitepaper, appendix (GeForce RTX 4090): FP32 82.6; with FP32
    # accumulation TF32 82.6, FP16/BF16 165.2, FP8 330.3 (dense); 1,008 GB/s GDDR6X. torch
    # names it "NVIDIA GeForce RTX 4090" (the China-only "RTX 4090 D" and laptop chips differ).
    GpuSpec("RTX 4090", r"geforce rtx 4090$", (8, 9), _peaks(82.6, 82.6, 165.2, 165.2, 330.3),
            1008.0, "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090)",
            note="FP16 and FP8 with FP16 accumulation run twice as fast (330.3 and 660.6 dense): "
                 "the whitepaper lists them beside these; training accumulates in FP32", memory="24 GB GDDR6X"),
    # NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090): FP32 104.8; with FP32
    # accumulation TF32 104.8, FP16/BF16 209.5, FP8 419, FP4 1,676 (3,352* "AI TOPS") dense;
    # 1,792 GB/s GDDR7. Compute capability 12.0 (data-centre Blackwell is 10.0).
    GpuSpec("RTX 5090", r"geforce rtx 5090$", (12, 0), _peaks(104.8, 104.8, 209.5, 209.5, 419.0),
            1792.0, "NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090)",
            fp4_tflops=1676.0,
            note="FP16 and FP8 with FP16 accumulation run twice as fast (419 and 838 dense): "
                 "the whitepaper lists them beside these; training accumulates in FP32. The FP4 figure is twice "
                 "the FP16-accumulation FP8 rate", memory="32 GB GDDR7"),
    # NVIDIA Blackwell datasheet, HGX B200 column, per GPU: FP4 18*, FP8/FP6 9*, FP16/BF16 4.5*,
    # TF32 2.2* PFLOPS, FP32 75 TFLOPS, 180 GB HBM3e at 7.7 TB/s. torch names it "NVIDIA B200".
    GpuSpec("B200", r"\bb200\b", (10, 0), _peaks(75.0, 1100.0, 2250.0, 2250.0, 4500.0), 7700.0,
            "NVIDIA Blackwell datasheet (HGX B200, per GPU)", fp4_tflops=9000.0, memory="180 GB HBM3e"),
    # Same datasheet, GB200 NVL72 column, per GPU: FP4 20*, FP8/FP6 10*, FP16/BF16 5*, TF32 2.5*
    # PFLOPS, FP32 80 TFLOPS, 186 GB HBM3e at 8 TB/s (a higher power limit than the HGX B200).
    GpuSpec("GB200", r"\bgb200\b", (10, 0), _peaks(80.0, 1250.0, 2500.0, 2500.0, 5000.0), 8000.0,
            "NVIDIA Blackwell datasheet (GB200 NVL72, per GPU)", fp4_tflops=10000.0, memory="186 GB HBM3e"),
    # AMD Instinct MI300X data sheet: peak FP32 vector 163.4, TF32 653.7, FP16/BF16 1,307.4,
    # FP8 2,614.9 TFLOPS dense (twice that with sparsity), 5.3 TB/s HBM3. CDNA 3, gfx942: torch
    # reports capability 9.4, and its FP8 is the FNUZ pair (float8_e4m3fnuz, float8_e5m2fnuz).
    GpuSpec("MI300X", r"\bmi300x\b", (9, 4), _peaks(163.4, 653.7, 1307.4, 1307.4, 2614.9), 5300.0,
            "AMD Instinct MI300X data sheet", vendor="amd",
            note="FP8 as float8_e4m3fnuz / float8_e5m2fnuz, not the OCP e4m3fn / e5m2", memory="192 GB HBM3"),
    # AMD Instinct MI325X data sheet: the MI300X's compute (same CDNA 3 chip) with 256 GB HBM3E
    # at 6 TB/s.
    GpuSpec("MI325X", r"\bmi325x\b", (9, 4), _peaks(163.4, 653.7, 1307.4, 1307.4, 2614.9), 6000.0,
            "AMD Instinct MI325X data sheet", vendor="amd",
            note="FP8 as float8_e4m3fnuz / float8_e5m2fnuz, not the OCP e4m3fn / e5m2",
            memory="256 GB HBM3E"),
)
# Not listed, for want of a datasheet figure found: the B300 (NVIDIA's Blackwell Ultra material
# gives sparse FP4 and FP8 rates, no dense table per precision) and the H200 NVL (its name matches
# no row, so its peaks are not guessed from the H200 SXM's).


def lookup_spec(device_name: str) -> GpuSpec | None:
    """The :data:`GPU_SPECS` entry whose pattern matches ``device_name``, or None if none does.

    ``device_name`` is what ``torch.cuda.get_device_name()`` returns, e.g. ``"Tesla T4"``,
    ``"NVIDIA A100-SXM4-80GB"``, ``"NVIDIA H100 80GB HBM3"``. A name matched by no pattern
    (or, by mistake, by two) gives None: peaks are never guessed.
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string, not {type(device_name).__name__}")
    matches = [spec for spec in GPU_SPECS if re.search(spec.pattern, device_name, re.IGNORECASE)]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`device_info` found out about a device.

    Attributes:
        name: the GPU's name, or the CPU's model name.
        kind: ``"cuda"`` or ``"cpu"``.
        device: the torch device string (``"cuda:0"``, ``"cpu"``).
        compute_capability: (major, minor) on CUDA, else None.
        accelerates: for ``"fp16"``, ``"bf16"``, ``"tf32"``, ``"fp8"``: True where the hardware
            has units for it (tensor cores on a GPU; AVX-512/AMX instructions on a CPU), False
            where it has none, None where unknown.
        peak_tflops: dense peak TFLOP/s per precision of :data:`PRECISIONS` from the spec table;
            every value None for a device the table does not know (and for every CPU).
        memory_bandwidth_gbs: peak bandwidth from the spec table, or None.
        spec: the :class:`GpuSpec` used, or None.
        spec_note: where the peaks come from, or a sentence starting with "unknown".
        memory_gb: the GPU's memory (None on a CPU).
        l2_cache_mb: the GPU's L2 cache (None where torch does not report it, and on a CPU).
        threads: torch's CPU threads (``torch.get_num_threads()``) when this was read.
        fp8_dtypes: the torch dtypes (E4M3, E5M2) of the GPU's FP8 units: the OCP pair on NVIDIA,
            the FNUZ pair on an AMD MI300; None without FP8 units (and on every CPU).
        vendor: ``"nvidia"`` or ``"amd"`` for a GPU (torch calls both "cuda"), None on a CPU.
    """
    name: str
    kind: str
    device: str
    compute_capability: tuple[int, int] | None
    accelerates: dict[str, bool | None]
    peak_tflops: dict[str, float | None]
    memory_bandwidth_gbs: float | None
    spec: GpuSpec | None
    spec_note: str
    memory_gb: float | None = None
    l2_cache_mb: float | None = None
    threads: int = field(default_factory=torch.get_num_threads)
    fp8_dtypes: tuple[torch.dtype, torch.dtype] | None = None
    vendor: str | None = None

    def peak(self, precision: str) -> float | None:
        """The dense peak TFLOP/s for ``precision`` (a name of :data:`PRECISIONS`), or None."""
        return self.peak_tflops[precision_name(precision)]


def device_info(device=None) -> DeviceInfo:
    """Name, kind, compute capability, accelerated precisions and datasheet peaks of a device.

    ``device``: a torch device or string; default CUDA if available, else the CPU. GPUs are
    looked up by name in :data:`GPU_SPECS`; a GPU the table does not know, and every CPU, gets
    None peaks and a ``spec_note`` saying "unknown" rather than a guess. On a CPU, the
    accelerated precisions come from the instruction-set flags in ``/proc/cpuinfo`` (Linux;
    None elsewhere): AVX512-BF16/AMX-BF16 for BF16, AVX512-FP16/AMX-FP16 for FP16.
    """
    device = as_device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("CUDA was asked for, but torch sees no CUDA GPU on this machine")
        return _cuda_info(device)
    if device.type != "cpu":
        raise ValueError(f"device_info knows CPUs and CUDA GPUs, not {device.type!r}")
    return _cpu_info()


def _cuda_info(device: torch.device) -> DeviceInfo:
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    capability = (props.major, props.minor)
    vendor = "amd" if torch.version.hip else "nvidia"
    spec = lookup_spec(props.name)
    if spec is None:
        note = (f"unknown: {props.name!r} is not in the spec table (mpcourse.bench.GPU_SPECS); "
                "peaks are not guessed")
    else:
        note = f"{spec.name}: {spec.source}"
    fp8 = fp8_dtypes_of(vendor, capability)
    if vendor == "nvidia":
        accelerates = {p: capability >= since for p, since in TENSOR_CORES_SINCE.items()}
    else:  # AMD's capability is a gfx number: NVIDIA's thresholds say nothing about it
        accelerates = {"fp16": True, "bf16": True, "tf32": None, "fp8": fp8 is not None}
    l2 = getattr(props, "L2_cache_size", 0)
    return DeviceInfo(
        name=props.name, kind="cuda", device=str(device), compute_capability=capability,
        accelerates=accelerates,
        peak_tflops=dict(spec.peak_tflops) if spec else dict.fromkeys(PRECISIONS),
        memory_bandwidth_gbs=spec.memory_bandwidth_gbs if spec else None, spec=spec,
        spec_note=note, memory_gb=props.total_memory / 1e9, l2_cache_mb=l2 / 2**20 if l2 else None,
        fp8_dtypes=fp8, vendor=vendor)


def _cpu_info() -> DeviceInfo:
    name, flags = _cpu_model_and_flags()
    if flags is None:
        accelerates = {"fp16": None, "bf16": None, "tf32": False, "fp8": False}
    else:
        accelerates = {"fp16": bool(flags & {"avx512_fp16", "amx_fp16"}),
                       "bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
                       "tf32": False, "fp8": False}
    note = ("unknown: no spec table for CPUs (peak FLOP/s depend on the core count, clock and "
            "vector units); measure them with max_matmul_tflops")
    return DeviceInfo(name=name, kind="cpu", device="cpu", compute_capability=None,
                      accelerates=accelerates, peak_tflops=dict.fromkeys(PRECISIONS),
                      memory_bandwidth_gbs=None, spec=None, spec_note=note)


def _cpu_model_and_flags() -> tuple[str, set[str] | None]:
    """The CPU's model name and instruction-set flags, from /proc/cpuinfo (Linux only)."""
    name, flags = platform.processor() or platform.machine() or "CPU", None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags" and flags is None:
                    flags = set(value.split())
    except OSError:
        pass
    return name, flags


def precision_name(precision) -> str:
    """``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``, from a name or torch dtype.

    ``torch.float32`` means ``"fp32"`` (TF32 is a mode, not a dtype), ``torch.float8_e4m3fn``
    ``"fp8"``. Anything else is a ValueError.
    """
    if isinstance(precision, torch.dtype):
        by_dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                    torch.float8_e4m3fn: "fp8"}
        if precision not in by_dtype:
            raise ValueError(f"no benchmark precision for {precision}; use one of {PRECISIONS}")
        return by_dtype[precision]
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return precision.lower()
    raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)} "
                     "(or a torch dtype)")


def precision_support(precision, device=None) -> tuple[bool, str]:
    """Whether ``precision`` is worth measuring on ``device``, and a sentence saying why (not).

    False means a measurement would mislead or fail: TF32 and FP8 on a CPU (no such hardware;
    torch would emulate), BF16 on a GPU before Ampere (emulated, slower than FP32), TF32
    before Ampere, FP8 before compute capability 8.9. FP16 and BF16 always run on a CPU; the
    sentence says whether this CPU has instructions for them.
    """
    precision = precision_name(precision)
    info = device_info(device)
    if precision == "fp32":
        return True, "FP32 runs everywhere (CUDA cores / CPU vector units, no tensor cores)"
    if info.kind == "cpu":
        if precision == "tf32":
            return False, ("TF32 is a mode of NVIDIA tensor cores (compute capability 8.0+); "
                           "a CPU has none")
        if precision == "fp8":
            return False, ("a CPU has no FP8 units: F.scaled_mm there is an FP32 emulation, "
                           "whose speed says nothing about FP8")
        fast = info.accelerates[precision]
        label = PRECISION_LABELS[precision]
        if fast is None:
            return True, f"{label} runs; whether this CPU has {label} instructions is unknown"
        if not fast:
            return True, (f"{label} runs, but this CPU has no {label} instructions: kernels "
                          "convert to FP32, expect no speed-up")
        flags = _cpu_model_and_flags()[1] or set()
        if f"amx_{precision}" in flags:
            return True, (f"{label} runs; this CPU has AMX-{label} matrix tiles, which PyTorch's "
                          "matrix products use")
        amx_kinds = sorted(f[len("amx_"):].upper() for f in flags
                           if f.startswith("amx_") and f != "amx_tile")
        if amx_kinds:  # AMX tiles, but not for this precision (Sapphire Rapids: BF16 and INT8)
            return True, (f"{label} runs; this CPU has AVX-512 {label} vector instructions and AMX "
                          f"matrix tiles, but no AMX-{label} (its AMX does {' and '.join(amx_kinds)} "
                          f"only): PyTorch's {label} training path is often slower than FP32 on "
                          "such a CPU")
        return True, (f"{label} runs; this CPU has AVX-512 {label} vector instructions but no AMX "
                      f"matrix tiles: PyTorch's {label} training path is often slower than FP32 "
                      "on such a CPU")
    major, minor = info.compute_capability
    if info.vendor == "amd":
        return _amd_support(precision, info)
    here = f"{info.name} (compute capability {major}.{minor})"
    if precision == "fp8":
        return native_fp8_support(info.device)
    since = TENSOR_CORES_SINCE[precision]
    if precision == "fp16" or info.accelerates[precision]:
        cores = "with" if info.accelerates[precision] else "without"
        return True, f"{here} runs {PRECISION_LABELS[precision]} {cores} tensor cores"
    return False, (f"{here} has no {PRECISION_LABELS[precision]} tensor cores (they start at "
                   f"{since[0]}.{since[1]}, Ampere)" + ("; PyTorch would emulate BF16, slower "
                                                       "than FP32" if precision == "bf16" else ""))


def _amd_support(precision: str, info: DeviceInfo) -> tuple[bool, str]:
    """precision_support on an AMD GPU, where torch's "compute capability" is the gfx version."""
    major, minor = info.compute_capability
    here = f"{info.name} (AMD gfx{major}{minor:x}x, reported by torch as capability {major}.{minor})"
    if precision == "fp8":
        if info.fp8_dtypes is None:
            return False, f"{here} has no FP8 matrix cores that this library knows of"
        e4m3, e5m2 = (str(d).removeprefix("torch.") for d in info.fp8_dtypes)
        if info.fp8_dtypes[0] != PRECISION_DTYPES["fp8"]:
            return False, (f"{here} has FP8 matrix cores only for {e4m3} and {e5m2}, the FNUZ "
                           "variants (no infinities, no -0, E4M3 up to 240), not the OCP "
                           "float8_e4m3fn this library's FP8 products use")
        return True, f"{here} has FP8 matrix cores for {e4m3} and {e5m2}"
    if precision == "tf32":
        return False, (f"{here}: TF32 is measured on NVIDIA GPUs only (8.0 and newer); on an AMD "
                       "GPU this library cannot tell a TF32-like mode from plain FP32")
    return True, f"{here} runs {PRECISION_LABELS[precision]} on its matrix cores"


def device_slug(name: str) -> str:
    """A device name in lower-case-with-dashes, for folder names: ``"NVIDIA H100 80GB HBM3"`` ->
    ``"nvidia-h100-80gb-hbm3"`` (``"device"`` if nothing is left).

    >>> device_slug("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    """
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-") or "device"


def as_device(device) -> torch.device:
    """``device`` as a torch.device; None means CUDA if available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
