"""FP8 (and MX, NVFP4) from end to end: encode, scale, multiply with FP32 accumulation, decode.

The two 8-bit formats of training (OCP FP8, in torch as ``float8_e4m3fn`` and ``float8_e5m2``)::

    format  largest  smallest normal  smallest subnormal  mantissa bits  unit roundoff  inf/NaN
    E4M3    448      2**-6            2**-9               3              2**-4          NaN only
    E5M2    57344    2**-14           2**-16              2              2**-3          both

E4M3 has the precision, E5M2 the range. With one scale per tensor, the HYBRID format (the
default format of Transformer Engine's per-tensor recipes) stores activations and weights in E4M3
and gradients, which span more binades, in E5M2; block-scaled recipes (MXFP8, DeepSeek-V3's
blocks) store all three in E4M3.

Neither range is wide enough for raw tensors, so every tensor is *scaled* first, and here the
scale multiplies (the convention of Transformer Engine and torchao)::

    data = round_to(x * scale, fmt, saturate=True)       x ≈ data / scale
    scale = fmt.max_value / amax                          (amax: the group's largest |x|)

**Why one scale per tensor is not enough.** The scale puts the tensor's single largest magnitude
at 448; the window of normal E4M3 numbers reaches 448 · 2**6 = 28,672 times below it. Values
further down are subnormal (fewer significant bits), and values more than 448 · 2**10 =
458,752 times below the maximum round to zero. One outlier (large language models have a few
activations thousands of times the median) pushes the whole tensor down this window. Finer
groups (per channel, per 1×128 block, per 32 elements) give each group its own window:
:func:`quantize`'s ``granularity``.

The chain, one module per step:

- :mod:`~mpcourse.fp8.quantization`: :func:`quantize` → :class:`QuantizedTensor` (``data``,
  ``scale``, ``dequantize()``), per tensor, channel, block, MX, NVFP4; :func:`amax_to_scale`.
- :mod:`~mpcourse.fp8.microscaling`: the MX shared exponent (E8M0) and NVFP4's two scales.
- :mod:`~mpcourse.fp8.scaling`: :class:`DelayedScaling` (amax history), :class:`CurrentScaling`,
  :class:`Fp8Recipe`.
- :mod:`~mpcourse.fp8.matmul`: :func:`scaled_matmul` (PyTorch's FP8 product,
  ``torch.nn.functional.scaled_mm``, or an exact emulation, FP32 or a narrow accumulator,
  DeepSeek-V3's promotion), :func:`accumulator_format`, :func:`native_scaled_mm`.
- :mod:`~mpcourse.fp8.recipes`: :class:`BlockRecipe`, the block-scaled recipes (MXFP8, NVFP4,
  DeepSeek-V3's blockwise) and the recipe names :data:`RECIPES`.
- :mod:`~mpcourse.fp8.linear`: :class:`Fp8Linear` and :func:`convert_to_fp8`, trainable on CPU.

Example::

    import torch
    from mpcourse.fp8 import quantize, scaled_matmul
    a = quantize(torch.randn(64, 256), "e4m3", granularity="block", block_size=128)
    w = quantize(torch.randn(32, 256), "e4m3", granularity="block", block_size=(32, 128))
    y = scaled_matmul(a, w.t())                 # ≈ a_original @ w_original.T, shape (64, 32)
"""
from mpcourse.fp8.linear import Fp8Linear, convert_to_fp8
from mpcourse.fp8.matmul import accumulator_format, native_fp8_support, native_scaled_mm, scaled_matmul
from mpcourse.fp8.microscaling import mx_shared_exponent, nvfp4_scales
from mpcourse.fp8.quantization import GRANULARITIES, QuantizedTensor, amax_to_scale, quantize
from mpcourse.fp8.recipes import RECIPES, BlockRecipe, get_recipe
from mpcourse.fp8.scaling import CurrentScaling, DelayedScaling, Fp8Recipe

__all__ = [
    "BlockRecipe", "RECIPES", "get_recipe", "CurrentScaling", "DelayedScaling", "Fp8Linear", "Fp8Recipe", "GRANULARITIES",
    "QuantizedTensor", "accumulator_format", "amax_to_scale", "convert_to_fp8",
    "mx_shared_exponent", "native_fp8_support", "native_scaled_mm", "nvfp4_scales", "quantize", "scaled_matmul",
]
