"""mpcourse: the small library behind the mixed-precision training course.

Modules:
    fp8      -- FP8 and microscaling: quantize (tensor/channel/block/MX/NVFP4), delayed scaling,
                scaled_matmul, Fp8Linear
    formats  -- exact floating-point formats: FloatFormat, round_to, encode/decode, describe
    optim    -- master weights: MasterWeightOptimizer; pure BF16 updates: CompensatedOptimizer
    plotting -- the figure helpers the chapters share
    display  -- computed Markdown tables, and library source shown in the book
    scaling  -- loss scaling: StaticLossScaler, DynamicLossScaler (step for step torch's GradScaler)
    workloads -- small real models and data (digits, a tiny transformer), the pre-trained model
"""
from mpcourse import display, formats, fp8, optim, plotting, scaling, workloads

__version__ = "0.1.0"
__all__ = ["display", "formats", "fp8", "optim", "plotting", "scaling", "workloads"]
