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
    display  -- computed Markdown tables, and library source shown in the book
    scaling  -- loss scaling: StaticLossScaler, DynamicLossScaler (step for step torch's GradScaler)
    workloads -- small real models and data (digits, a tiny transformer), the pre-trained model
"""
from mpcourse import bench, display, formats, fp8, numerics, optim, plotting, scaling, workloads

__version__ = "0.1.0"
__all__ = ["bench", "display", "formats", "fp8", "numerics", "optim", "plotting", "scaling", "workloads"]
