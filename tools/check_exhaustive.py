"""Check round_to against independent references for all 2**32 float32 inputs, every format.

Every path of round_to is checked, each against the reference on its own: the bit-level
algorithm the book teaches (method="bits", every format), torch's own cast, which round_to uses
for rounding to nearest into FP32, BF16, FP16, E4M3 and E5M2 (method="cast"), and the float
arithmetic round(|x| / gap) * gap it uses for TF32, FP6 and FP4 (method="gaps", checked for
every signed format with subnormals).

The references: ml_dtypes' casts (FP16, BF16, the FP8, FP6 and FP4 formats, E8M0), float32 itself
for FP32, and for TF32 (which ml_dtypes lacks) float64 arithmetic: rint(x / gap) * gap, with gap
the spacing of TF32 around x. Inputs where ml_dtypes is known to be wrong (tests/ml_reference.py)
are counted apart and checked against the exact scalar reference instead.

The 2**32 inputs are split into chunks, checked in parallel by one process per CPU core (each
with one torch thread), so that the NumPy work runs in parallel too.

    python tools/check_exhaustive.py [--chunk-bits 24] [--formats fp16,e4m3] [--workers N]
                                     [--limit-chunks K]
"""
import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpcourse.formats import (_FAST_PATHS, FORMATS, FP32, TF32, _applies,  # noqa: E402
                              get_format, round_scalar, round_to)
from tests.ml_reference import ML_DTYPES, ml_dtypes_deviations, ml_dtypes_round  # noqa: E402


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """Round float32 x to TF32 with float64 arithmetic, rint(x / gap) * gap (a different method
    from round_to's bit operations), gap = 2**(e - 10) the spacing of TF32 where |x| lies in
    [2**e, 2**(e+1)). e is read from float32's exponent field (1 for subnormals), and the power
    of two is written straight into a float64's exponent field: frexp and ldexp are slow."""
    field = ((x.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    exponent = np.maximum(np.maximum(field, 1) - 127, TF32.emin)
    gap = ((exponent - TF32.mantissa_bits + 1023) << 52).view(np.float64)
    with np.errstate(all="ignore"):
        rounded = np.rint(x / gap) * gap  # float64: the division by a power of two is exact;
    rounded[np.abs(rounded) > TF32.max_value] = np.inf  # rint: ties to even, like IEEE
    rounded = np.copysign(rounded.astype(np.float32), x)
    return np.where(np.isfinite(x), rounded, x)


def reference(x: np.ndarray, fmt) -> np.ndarray:
    if fmt is FP32:
        return x.copy()
    if fmt is TF32:
        return tf32_reference(x)
    return ml_dtypes_round(x, fmt)


def methods(fmt) -> tuple[str, ...]:
    """The paths of round_to to check for fmt (rounding to nearest): the bit-level one always,
    the fast ones (torch's cast, the gap arithmetic) where they apply."""
    return ("bits",) + tuple(m for m in _FAST_PATHS if _applies(m, fmt, "nearest_even"))


def differ(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Mask of differing float32 values, bit for bit (-0.0 is not 0.0), except that any NaN
    equals any NaN (payloads are not compared). One pass, plus a look at the few that differ."""
    mask = got.view(np.uint32) != expected.view(np.uint32)
    where = np.flatnonzero(mask)
    mask[where[np.isnan(got[where]) & np.isnan(expected[where])]] = False
    return mask


def check_chunk(job):
    """Check the chunk of 2**chunk_bits inputs number `index`, for every format and path.

    Returns {(format name, method): (mismatches, first examples, known ml_dtypes deviations)}."""
    index, chunk_bits, names = job
    torch.set_num_threads(1)  # one process per core does the parallel work
    chunk = 2**chunk_bits
    x = np.arange(index * chunk, (index + 1) * chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
    results = {}
    for fmt in map(get_format, names):
        expected = reference(x, fmt)
        deviant = (ml_dtypes_deviations(x, fmt) if fmt in ML_DTYPES and
                   (not fmt.has_nan or not fmt.has_subnormals) else None)
        for method in methods(fmt):
            got = round_to(x, fmt, method=method)
            wrong = differ(got, expected)
            known = 0
            if deviant is not None:  # ml_dtypes is wrong here: check these against the exact reference
                wrong &= ~deviant
                odd = x[deviant]
                sample = odd[:: max(1, odd.size // 2000)]
                exact = np.float32([round_scalar(v, fmt) for v in sample])
                wrong_exact = differ(round_to(sample, fmt, method=method), exact)
                known = int(deviant.sum())
            else:
                wrong_exact = np.zeros(0, bool)
            results[fmt.name, method] = (int(wrong.sum()) + int(wrong_exact.sum()),
                                         [float(v) for v in x[wrong][:5]], known)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-bits", type=int, default=24, help="2**N inputs per chunk")
    parser.add_argument("--formats", default=",".join(f.name for f in FORMATS))
    parser.add_argument("--limit-chunks", type=int, default=None, help="for a quick partial run")
    parser.add_argument("--first-chunk", type=int, default=0, help="start here (with --limit-chunks)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    args = parser.parse_args()
    names = [get_format(name).name for name in args.formats.split(",")]
    n_chunks = 2**32 // 2**args.chunk_bits
    first = args.first_chunk
    last = min(n_chunks, first + (args.limit_chunks or n_chunks))
    jobs = [(i, args.chunk_bits, names) for i in range(first, last)]

    totals = {}
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for results in tqdm(pool.map(check_chunk, jobs), total=len(jobs), desc="float32 inputs",
                            unit="chunk"):
            for key, (wrong, examples, known) in results.items():
                total = totals.setdefault(key, [0, [], 0])
                total[0] += wrong
                total[1] = (total[1] + examples)[:5]
                total[2] += known
    elapsed = time.perf_counter() - start

    checked = len(jobs) * 2**args.chunk_bits
    print(f"\nChecked {checked:,} float32 inputs per format and path ({checked / 2**32:.1%} of all) "
          f"in {elapsed / 60:.1f} minutes with {args.workers} processes")
    print(f"{'format':8} {'path':5} {'mismatches':>10}  {'ml_dtypes known wrong (checked exactly)':>40}")
    for (name, method), (wrong, examples, known) in totals.items():
        print(f"{name:8} {method:5} {wrong:>10,}  {known:>40,}"
              + (f"   e.g. x = {examples}" if examples else ""))
    sys.exit(1 if any(total[0] for total in totals.values()) else 0)


if __name__ == "__main__":
    main()
