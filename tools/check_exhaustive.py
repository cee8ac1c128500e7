"""Check round_to against independent references for all 2**32 float32 inputs, every format.

The references: ml_dtypes' casts (FP16, BF16, the FP8, FP6 and FP4 formats, E8M0), float32 itself
for FP32, and for TF32 (which ml_dtypes lacks) float64 arithmetic: rint(x / gap) * gap, with gap
the spacing of TF32 around x. Inputs where ml_dtypes is known to be wrong (tests/ml_reference.py)
are counted apart and checked against the exact scalar reference instead.

    python tools/check_exhaustive.py [--chunk-bits 24] [--formats fp16,e4m3]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpcourse.formats import FORMATS, FP32, TF32, get_format, round_scalar, round_to  # noqa: E402
from tests.ml_reference import ML_DTYPES, ml_dtypes_deviations, ml_dtypes_round, same  # noqa: E402


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """Round to TF32 with float64 arithmetic (a different method from round_to's bit operations)."""
    x64 = x.astype(np.float64)
    exponent = np.frexp(x64)[1] - 1  # |x| in [2**e, 2**(e+1)), exactly
    gap = np.ldexp(1.0, np.maximum(exponent, TF32.emin) - TF32.mantissa_bits)
    with np.errstate(all="ignore"):
        rounded = np.rint(x64 / gap) * gap  # rint: ties to even, like IEEE
        rounded = np.where(np.abs(rounded) > TF32.max_value, np.copysign(np.inf, x64), rounded)
        rounded = np.where(np.isfinite(x64), rounded, x64)
    return rounded.astype(np.float32)


def reference(x: np.ndarray, fmt) -> np.ndarray:
    if fmt is FP32:
        return x.copy()
    if fmt is TF32:
        return tf32_reference(x)
    return ml_dtypes_round(x, fmt)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-bits", type=int, default=24, help="2**N inputs per chunk")
    parser.add_argument("--formats", default=",".join(f.name for f in FORMATS))
    parser.add_argument("--limit-chunks", type=int, default=None, help="for a quick partial run")
    args = parser.parse_args()
    fmts = [get_format(name) for name in args.formats.split(",")]
    chunk = 2**args.chunk_bits
    n_chunks = min(2**32 // chunk, args.limit_chunks or 2**32)

    mismatches = {f: 0 for f in fmts}
    examples = {f: [] for f in fmts}
    deviations = {f: 0 for f in fmts}
    start = time.perf_counter()
    for i in tqdm(range(n_chunks), desc="float32 inputs", unit="chunk"):
        x = np.arange(i * chunk, (i + 1) * chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        for fmt in fmts:
            got = round_to(x, fmt)
            deviant = ml_dtypes_deviations(x, fmt) if fmt in ML_DTYPES else np.zeros(x.shape, bool)
            wrong = ~same(got, reference(x, fmt)) & ~deviant
            mismatches[fmt] += int(wrong.sum())
            examples[fmt] += list(x[wrong][: 5 - len(examples[fmt])])
            if deviant.any():  # ml_dtypes is wrong here: check these against the exact reference
                odd = x[deviant]
                sample = odd[:: max(1, odd.size // 2000)]
                exact = np.float32([round_scalar(v, fmt) for v in sample])
                wrong_exact = ~same(round_to(sample, fmt), exact)
                mismatches[fmt] += int(wrong_exact.sum())
                deviations[fmt] += int(deviant.sum())
    elapsed = time.perf_counter() - start

    checked = n_chunks * chunk
    print(f"\nChecked {checked:,} float32 inputs per format ({checked / 2**32:.0%} of all) "
          f"in {elapsed / 60:.1f} minutes, torch threads: {torch.get_num_threads()}")
    print(f"{'format':8} {'mismatches':>10}  {'ml_dtypes known wrong (checked exactly)':>40}")
    for fmt in fmts:
        print(f"{fmt.name:8} {mismatches[fmt]:>10,}  {deviations[fmt]:>40,}"
              + (f"   e.g. x = {examples[fmt]}" if examples[fmt] else ""))
    sys.exit(1 if any(mismatches.values()) else 0)


if __name__ == "__main__":
    main()
