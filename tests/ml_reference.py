"""The production casts round_to is checked against, and where they are known to be wrong.

ml_dtypes and torch disagree with each other in places, and ml_dtypes is not always the nearest
value. Each known deviation is written down here, with the reason, so that a test or the
exhaustive check can set exactly those inputs aside (and check them against round_scalar, the
exact reference, instead).
"""
import ml_dtypes
import numpy as np
import torch

from mpcourse.formats import BF16, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0, FP16

ML_DTYPES = {
    FP16: np.float16,
    BF16: ml_dtypes.bfloat16,
    E4M3: ml_dtypes.float8_e4m3fn,
    E5M2: ml_dtypes.float8_e5m2,
    E3M2: ml_dtypes.float6_e3m2fn,
    E2M3: ml_dtypes.float6_e2m3fn,
    E2M1: ml_dtypes.float4_e2m1fn,
    E8M0: ml_dtypes.float8_e8m0fnu,
}

TORCH_DTYPES = {
    FP16: torch.float16,
    BF16: torch.bfloat16,
    E4M3: torch.float8_e4m3fn,
    E5M2: torch.float8_e5m2,
}

TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def torch_e4m3_saturates() -> bool:
    """Whether this torch's cast to float8_e4m3fn turns an overflow (|x| > 464, inf) into ±448.

    torch 2.13 does (checked on CPU; pytorch/pytorch#178817, April 2026, made the C++ conversion
    saturate); torch 2.11 gives NaN, on CPU and on CUDA (an H200) alike. torch 2.12 was not
    checked: a test that needs the answer is skipped there."""
    import pytest
    if TORCH_VERSION >= (2, 13):
        return True
    if TORCH_VERSION <= (2, 11):
        return False
    pytest.skip(f"torch {torch.__version__}: whether its E4M3 cast saturates was checked for 2.11 "
                "(NaN) and 2.13 (±448) only")


def ml_dtypes_round(x: np.ndarray, fmt) -> np.ndarray:
    """x cast to fmt by ml_dtypes (non-saturating) and back to float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(ML_DTYPES[fmt]).astype(np.float32)


def ml_dtypes_deviations(x32: np.ndarray, fmt) -> np.ndarray:
    """Mask of float32 inputs where ml_dtypes' cast is known not to be round_to's answer.

    - NaN into a format without NaN (FP6, FP4): ml_dtypes stores -0; round_to says NaN, because
      there is nothing to store (and encode() refuses).
    - E8M0 from float32 subnormals in (2**-127, 1.5 * 2**-127): ml_dtypes returns 2**-126,
      although 2**-127 is nearer (it rounds these inputs up instead of to nearest).
    """
    mask = np.isnan(x32) & (not fmt.has_nan)
    if not fmt.has_subnormals and fmt.min_normal < 2.0**-126:
        with np.errstate(invalid="ignore"):
            mask |= (x32 > fmt.min_normal) & (x32 < 1.5 * fmt.min_normal)
    return mask


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality where NaN equals NaN (NaN payloads and signs are not compared)."""
    return (a == b) | (np.isnan(a) & np.isnan(b))
