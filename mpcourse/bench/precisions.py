"""One transformer block, five precisions: forward and forward + backward time, memory, speed-up.

Measured the way chapter 7 teaches: every precision is timed once per round, the rounds in a
fresh random order each (a machine that drifts then spreads over all precisions instead of
favouring the ones timed first), and each figure is the median round with the lowest and
highest beside it. A speed-up is the ratio of the medians; its spread, the lowest and highest
ratio within one round (the two runs of a round share the machine's state: a paired design).

The precisions, each on a fresh copy of the same FP32 block:

    fp32   FP32 everywhere, TF32 off ("strict": the reference)
    tf32   FP32 tensors, TF32 tensor cores allowed for matmuls and convolutions
    fp16   autocast to FP16 (the autocast op lists decide which ops run in FP16)
    bf16   autocast to BF16
    fp8    every nn.Linear swapped for mpcourse.fp8.Fp8Linear (FP8 matmuls, delayed scaling),
           the other ops under BF16 autocast, as Transformer Engine runs them

The parameters stay FP32 in every case (mixed precision, not a model cast to half). A loss
scaler is left out: it adds one multiply and one inf/NaN check per step, not what is measured.
"""
from __future__ import annotations

import copy
import random
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from mpcourse.bench.probes import tf32_mode, tf32_state
from mpcourse.bench.specs import PRECISIONS, as_device, precision_name, precision_support
from mpcourse.bench.timing import benchmark
from mpcourse.fp8 import convert_to_fp8
from mpcourse.workloads import Block

DESCRIPTIONS = {
    "fp32": "FP32, TF32 off (strict)",
    "tf32": "FP32 tensors, TF32 matmuls",
    "fp16": "FP16 autocast",
    "bf16": "BF16 autocast",
    "fp8": "FP8 linears (Fp8Linear) + BF16 autocast",
}
# (dim, heads, batch, sequence length): big enough for tensor cores to matter on a GPU, small
# enough for a few seconds on a CPU.
DEFAULT_SHAPES = {"cuda": (1024, 16, 8, 512), "cpu": (128, 4, 8, 64)}


@dataclass(frozen=True)
class PrecisionRow:
    """One precision's measurements; the times are medians in ms, None where ``skipped``.

    Attributes:
        precision: a name of ``PRECISIONS``; ``description`` says what it means here.
        forward_ms: one forward pass under ``torch.no_grad()`` (inference).
        step_ms: forward, loss and backward (gradients set to None before each).
        peak_memory_mb: CUDA only: ``torch.cuda.max_memory_allocated()`` over one forward and backward pass,
            this precision's weights, gradients, activations and the input included (MiB).
            None on a CPU: PyTorch's CPU allocator keeps no such statistic.
        forward_speedup, step_speedup: FP32-strict time / this time (medians).
        skipped: why the precision was not measured here, or None.
        note: what to keep in mind about the figure.
        forward_rounds_ms, step_rounds_ms: each round's median time, in the order of the rounds.
        step_speedup_range: the lowest and highest FP32-strict / this time within a round.
    """
    precision: str
    description: str
    forward_ms: float | None = None
    step_ms: float | None = None
    peak_memory_mb: float | None = None
    forward_speedup: float | None = None
    step_speedup: float | None = None
    skipped: str | None = None
    note: str = ""
    forward_rounds_ms: tuple = ()
    step_rounds_ms: tuple = ()
    step_speedup_range: tuple | None = None


@dataclass(frozen=True)
class PrecisionComparison:
    """What :func:`compare_precisions` measured, and the conditions it measured under.

    ``parameters`` and ``tokens`` (batch x sequence length) give the model FLOPs of one training
    step (forward and backward), as PaLM counts them for model FLOPs utilisation (MFU)::

        model_flops_per_step = tokens * (6 * parameters + 12 * seq_len * dim)

    (6 per parameter and token: 2 forward, 4 backward; the second term is attention's q·kᵀ and
    its product with v, which have no parameters.) MFU is that over the step time, over a
    dense peak of the device: one peak (BF16's) for every precision, so that MFUs compare across
    precisions; divided by each precision's own peak, a faster FP8 step can show a lower MFU.
    """
    rows: tuple[PrecisionRow, ...]
    device: str
    model: str
    tf32_before: str     # the TF32 settings found on entry (restored on exit)
    threads: int         # torch's CPU threads during the measurement
    parameters: int = 0
    tokens: int = 0
    seq_len: int = 0
    dim: int = 0
    rounds: int = 1

    @property
    def model_flops_per_step(self) -> int:
        return self.tokens * (6 * self.parameters + 12 * self.seq_len * self.dim)

    def model_tflops(self, precision: str) -> float | None:
        """Model FLOPs per second of one forward and backward pass in ``precision``, in TFLOP/s."""
        row = self.row(precision)
        return None if row.step_ms is None else self.model_flops_per_step / (row.step_ms * 1e-3) / 1e12

    def row(self, precision: str) -> PrecisionRow:
        return next(r for r in self.rows if r.precision == precision_name(precision))


def compare_precisions(device=None, *, dim: int | None = None, heads: int | None = None,
                       batch: int | None = None, seq_len: int | None = None,
                       precisions=PRECISIONS, budget_ms: float = 200.0, rounds: int = 3,
                       seed: int = 0) -> PrecisionComparison:
    """Time one pre-norm transformer block (:class:`mpcourse.workloads.Block`) per precision.

    Every measurement is synchronised and warmed up (:func:`~mpcourse.bench.benchmark`); the
    TF32 settings are read on entry (``tf32_before``), set per precision and restored on exit.
    A precision the device cannot run meaningfully is skipped with the reason
    (:func:`~mpcourse.bench.precision_support`; on a CPU also an autocast dtype this PyTorch
    refuses); one that fails at run time (e.g. out of memory) is skipped with the error.

    Args:
        device: default CUDA if available, else the CPU.
        dim, heads, batch, seq_len: the block and its input (batch, seq_len, dim). Default
            ``DEFAULT_SHAPES``: dim 1024 on a GPU, 128 on a CPU.
        precisions: which rows to produce (names of ``PRECISIONS``); the speed-ups need "fp32".
        budget_ms: time budget of each measurement (one per precision, round and pass).
        rounds: how many times each precision is timed, in a fresh random order each round.
        seed: the block's initialisation and input, and the order of the rounds.

    Returns:
        A :class:`PrecisionComparison`; ``rows`` in the order of ``precisions``.
    """
    device = as_device(device)
    names = [precision_name(p) for p in precisions]
    defaults = DEFAULT_SHAPES["cuda" if device.type == "cuda" else "cpu"]
    dim, heads, batch, seq_len = (given if given is not None else default for given, default
                                  in zip((dim, heads, batch, seq_len), defaults))
    with torch.random.fork_rng(devices=[]):  # seed the block without touching the caller's RNG
        torch.manual_seed(seed)
        reference = Block(dim, heads)  # kept on the CPU: each precision gets its own copy
    x = torch.randn(batch, seq_len, dim, device=device,
                    generator=torch.Generator(device=device).manual_seed(seed))

    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    tf32_before = tf32_state()
    skipped, models = {}, {}
    for name in names:
        reason = _skip_reason(name, device, batch * seq_len, dim)
        if reason is not None:
            skipped[name] = reason
            continue
        models[name] = copy.deepcopy(reference).to(device)
        if name == "fp8":
            convert_to_fp8(models[name])
    times = {name: [] for name in models}  # each round's (forward_ms, step_ms)
    order = random.Random(seed)
    for _ in range(rounds):
        for name in order.sample(list(models), len(models)):
            if name in skipped:
                continue
            try:
                with tf32_mode(name == "tf32"):
                    times[name].append(_measure(name, models[name], x, device, budget_ms))
            except RuntimeError as error:  # e.g. out of memory, a kernel this GPU lacks
                skipped[name] = f"failed here: {str(error).splitlines()[0]}"
    measured = {}
    for name in names:
        if name in skipped:
            measured[name] = PrecisionRow(name, DESCRIPTIONS[name], skipped=skipped[name])
            continue
        forward, step = zip(*times[name])
        memory = _peak_memory(name, models[name], x, device)
        measured[name] = PrecisionRow(name, DESCRIPTIONS[name], _median(forward), _median(step), memory,
                                      note=_note(name, device), forward_rounds_ms=forward, step_rounds_ms=step)
    models.clear()
    baseline = measured.get("fp32")
    rows = tuple(_with_speedups(measured[name], baseline) for name in names)
    parameters = sum(p.numel() for p in reference.parameters())
    model_text = (f"transformer Block(dim={dim}, heads={heads}), input ({batch}, {seq_len}, "
                  f"{dim}), {parameters:,} parameters")
    return PrecisionComparison(rows, str(device), model_text, tf32_before, torch.get_num_threads(),
                               parameters, batch * seq_len, seq_len, dim, rounds)


def _median(values) -> float:
    """The median round (the upper middle one for an even count): a time that was measured."""
    return sorted(values)[len(values) // 2]


def _skip_reason(name: str, device: torch.device, tokens: int, dim: int) -> str | None:
    supported, reason = precision_support(name, device)
    if not supported:
        return reason
    dtype = _AUTOCAST_DTYPES.get(name)
    if device.type == "cpu" and dtype is not None:
        with warnings.catch_warnings():  # an old PyTorch warns and disables autocast instead
            warnings.simplefilter("ignore")
            with torch.autocast("cpu", dtype=dtype):
                probe = torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
        if probe.dtype != dtype:
            return f"this PyTorch's CPU autocast does not support {dtype}"
    if name == "fp8" and (tokens % 16 or dim % 16):
        return (f"F.scaled_mm needs sizes that are multiples of 16; batch x seq_len = "
                f"{tokens} and dim = {dim}")
    return None


_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def _autocast(name, device):
    dtype = _AUTOCAST_DTYPES.get(name)
    return (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else nullcontext


def _step(name, model, x, device):
    model.zero_grad(set_to_none=True)
    with _autocast(name, device)():
        loss = model(x).float().square().mean()
    loss.backward()


def _measure(name, model, x, device, budget_ms) -> tuple[float, float]:
    """One round: the median forward and forward + backward times, in ms."""
    def forward():
        with torch.no_grad(), _autocast(name, device)():
            model(x)

    options = dict(device=device, budget_ms=budget_ms, warmup_ms=budget_ms / 4)
    return (benchmark(forward, **options).median_ms,
            benchmark(lambda: _step(name, model, x, device), **options).median_ms)


def _peak_memory(name, model, x, device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with tf32_mode(name == "tf32"):
        _step(name, model, x, device)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def _note(name, device) -> str:
    if name == "fp8":
        return ("the course's readable Fp8Linear: quantization in separate kernels and a "
                "finiteness check (a GPU sync) per tensor; fused FP8 layers (Transformer Engine) "
                "are faster")
    if device.type == "cpu" and name in ("fp16", "bf16"):
        return precision_support(name, device)[1]
    return ""


def _with_speedups(row: PrecisionRow, baseline: PrecisionRow | None) -> PrecisionRow:
    if row.skipped or baseline is None or baseline.skipped:
        return row
    ratios = [b / r for b, r in zip(baseline.step_rounds_ms, row.step_rounds_ms)]  # round by round
    return replace(row, forward_speedup=baseline.forward_ms / row.forward_ms,
                   step_speedup=baseline.step_ms / row.step_ms, step_speedup_range=(min(ratios), max(ratios)))
