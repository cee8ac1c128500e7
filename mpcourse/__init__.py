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
    display  -- computed Markdown tables, and library source shown in the book
    claims   -- claim(sentence, holds): the check that keeps a sentence of the book true
    scaling  -- loss scaling: StaticLossScaler, DynamicLossScaler (step for step torch's GradScaler)
    training -- the practical recipe: MixedPrecisionTrainer (FP32/FP16/BF16/FP8, accumulation,
                clipping, bit-identical checkpoints), select_precision
    workloads -- small real models and data (digits, a tiny transformer), the pre-trained model
"""
from mpcourse import bench, claims, communication, debugging, display, formats, fp8, numerics, optim, plotting, scaling, training, workloads

__version__ = "0.1.0"
__all__ = ["bench", "claims", "communication", "debugging", "display", "formats", "fp8", "numerics", "optim", "plotting", "scaling", "training", "workloads"]
