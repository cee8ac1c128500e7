"""mpcourse: the small library behind the mixed-precision training course.

Modules:
    bench    -- benchmarking done right: benchmark (CUDA events, warm-up, budgets), GPU spec table,
                matmul/bandwidth probes, alignment, compare_precisions; python -m mpcourse bench
    fp8      -- FP8 and microscaling: quantize (tensor/channel/block/MX/NVFP4), delayed scaling,
                scaled_matmul, Fp8Linear
    formats  -- exact floating-point formats: FloatFormat, round_to, encode/decode, describe
    numerics -- careful softmax, LayerNorm, attention and cross-entropy in FP32; emulated FP16/BF16
                accumulation (sequential, pairwise, Kahan)
    optim    -- master weights: MasterWeightOptimizer; pure BF16 updates: CompensatedOptimizer
    plotting -- the figure helpers the chapters share
    communication -- gradient all-reduce between real processes (torch.distributed): FP32/FP16/BF16
                wire formats, ring emulation, FP16 overflow, FP8 error feedback
    debugging -- find where precision fails: tensor_stats, PrecisionDebugger (first inf/NaN by
                module and pass), gradient_table, compare_layer_outputs
    preflight -- preflight(model, inputs, loss_fn): before a long run, whether activations and
                gradients fit FP16/BF16/FP8, and which FP16 loss scales work
    stats    -- tensor_stats: one tensor against a format's limits (flushed, subnormal, overflow),
                shared by debugging and preflight
    display  -- computed Markdown tables, and library source shown in the book
    doctor   -- watch(model, optimizer, scaler) around real training steps: every mixed-precision
                mistake in them, with its fix
    claims   -- claim(sentence, holds): the check that keeps a sentence of the book true
    scaling  -- loss scaling: StaticLossScaler, DynamicLossScaler (step for step torch's GradScaler)
    training -- the practical recipe: MixedPrecisionTrainer (FP32/FP16/BF16/FP8, accumulation,
                clipping, bit-identical checkpoints), select_precision
    workloads -- small real models and data (digits, a tiny transformer), the pre-trained model
"""
import importlib


def _version() -> str:
    """The version in pyproject.toml: from the installed package's metadata, or, when the package is
    imported from a source tree without being installed, from that tree's pyproject.toml."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():  # a source tree (an editable install too): its file is the truth
        import re

        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    from importlib import metadata  # 0.1 s of imports: only where no source tree says it

    try:
        return metadata.version("mpcourse")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__all__ = ["bench", "claims", "communication", "debugging", "display", "doctor", "formats", "fp8", "numerics", "optim", "plotting", "preflight", "scaling", "stats", "training", "workloads"]


def __getattr__(name: str):
    """`mpcourse.formats` and the others are imported when first used, not by `import mpcourse`:
    a process that needs only the formats (a grading sandbox, a test's worker) does not pay for
    matplotlib and the benchmarks (`import mpcourse` took 2.3 s of CPU with every module, about
    as long as torch itself)."""
    if name in __all__:
        return importlib.import_module(f"mpcourse.{name}")  # which also sets the attribute
    if name == "__version__":  # read when first asked: a sandbox's or a kernel's import does not pay for it
        globals()["__version__"] = _version()
        return globals()["__version__"]
    raise AttributeError(f"module 'mpcourse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
