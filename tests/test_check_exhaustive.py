"""tools/check_exhaustive.py checks what it says: its TF32 reference is exact, a chunk of inputs
gives zero mismatches on every path, and a planted error is found (so the full run's zeros mean
something). The full run over all 2**32 inputs is `make check-exhaustive`, not part of the tests."""
import sys
from pathlib import Path

import numpy as np
import pytest

from mpcourse.formats import FORMATS, TF32, round_scalar
from tests.test_formats import random_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import check_exhaustive  # noqa: E402

NAMES = [f.name for f in FORMATS]


def test_tf32_reference_is_the_exact_rounding():
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    bits = random_inputs(20_000).view(np.uint32) & ~np.uint32(0x1FFF)  # TF32 drops 13 bits
    ties = np.concatenate([bits | 0x1000, bits | 0x0FFF, bits | 0x1001]).view(np.float32)
    x = np.concatenate([ties, random_inputs(20_000), powers,
                        np.nextafter(powers, np.float32(0)), np.nextafter(powers, np.float32(np.inf)),
                        np.float32([0.0, -0.0, np.inf, -np.inf, 3.4e38, TF32.max_value])])
    x = np.concatenate([x, -x])
    expected = np.float32([round_scalar(float(v), TF32) for v in x])
    assert not check_exhaustive.differ(check_exhaustive.tf32_reference(x), expected).any()
    nan = np.uint32([0x7FC00000, 0xFF800001]).view(np.float32)
    assert np.isnan(check_exhaustive.tf32_reference(nan)).all()


# Chunks of 2**12 bit patterns starting at: subnormals, 1.0, FP16's largest value, float32's
# largest, NaNs, -1.0.
@pytest.mark.parametrize("index", [0, 0x3F800, 0x477FE, 0x7F7FF, 0x7FFFF, 0xBF800])
def test_a_chunk_has_no_mismatch_on_any_path(index):
    results = check_exhaustive.check_chunk((index, 12, NAMES))
    assert {name for name, _ in results} == set(NAMES)
    assert all(wrong == 0 for wrong, _, _ in results.values()), results


def test_a_planted_error_is_found(monkeypatch):
    real = check_exhaustive.round_to

    def off_by_one_ulp(x, fmt, method="auto", **kwargs):
        y = real(x, fmt, method=method, **kwargs)
        if fmt.name == "fp16" and method == "bits":
            y = y.copy()
            y[1] = np.nextafter(y[1], np.float32(np.inf))
        return y

    monkeypatch.setattr(check_exhaustive, "round_to", off_by_one_ulp)
    results = check_exhaustive.check_chunk((0x3F800, 12, ["fp16", "bf16"]))
    assert results["fp16", "bits"][0] == 1 and results["fp16", "cast"][0] == 0
    assert results["bf16", "bits"][0] == 0
