"""Time round_to on 16M float32 values against torch's native cast round trip and ml_dtypes.

All three produce the same numbers (the tests and tools/check_exhaustive.py prove it); this
measures what exactness costs. Ratios are measured side by side in one run: round_to time / torch
time for torch input, round_to / ml_dtypes for NumPy input. round_to takes torch's cast where it
applies (rounding to nearest into FP32, BF16, FP16, E4M3, E5M2), with the fixes that keep it exact;
the bit-level algorithm (method="bits", the one the book teaches) is timed alongside.

torch 2.13's E4M3 cast saturates overflow to ±448, as round_to(..., saturate=True) does (torch
2.11's gives NaN); round_to's default (saturate=False) gives NaN there, as ml_dtypes does: each is
timed against its match (the saturating one against torch's cast; the same work in either version).

    python benchmarks/bench_round_to.py [--n 16777216] [--repeats 7] [--bits]

(--bits also times the bit-level algorithm, 10 to 100 times slower than the casts.)
"""
import argparse
import statistics
import time

import ml_dtypes
import numpy as np
import torch

from mpcourse.formats import BF16, E2M1, E3M2, E4M3, E5M2, FP16, round_to


def median_seconds(contenders: dict, repeats: int) -> dict:
    """Median wall time of each contender, timed in turn within every repeat, so that a slow
    spell of the machine hits all of them alike and the ratios stay fair."""
    for fn in contenders.values():
        fn()  # warm-up: allocations, first-call overheads, round_to's one-time check of the cast
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2**24)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bits", action="store_true", help="also time method='bits'")
    args = parser.parse_args()

    x = torch.randn(args.n, generator=torch.Generator().manual_seed(0)) * 100
    x_np = x.numpy()
    print(f"{args.n:,} float32 values, torch threads: {torch.get_num_threads()}, "
          f"median of {args.repeats}\n")

    print("torch input: round_to against torch's cast round trip x.to(dtype).float()")
    print(f"{'format':16} {'round_to':>10} {'torch cast':>11} {'ratio':>6}"
          + (f"   {'bit-level':>10} {'ratio':>6}" if args.bits else ""))
    for fmt, torch_dtype, saturate in ((E4M3, torch.float8_e4m3fn, True),
                                       (BF16, torch.bfloat16, False),
                                       (FP16, torch.float16, False),
                                       (E5M2, torch.float8_e5m2, False)):
        contenders = {"round_to": lambda: round_to(x, fmt, saturate=saturate),
                      "torch": lambda: x.to(torch_dtype).float()}
        if args.bits:
            contenders["bits"] = lambda: round_to(x, fmt, saturate=saturate, method="bits")
        t = median_seconds(contenders, args.repeats)
        label = fmt.name + (" saturate" if saturate else "")
        print(f"{label:16} {t['round_to'] * 1e3:8.1f}ms {t['torch'] * 1e3:9.1f}ms "
              f"{t['round_to'] / t['torch']:6.2f}"
              + (f"   {t['bits'] * 1e3:8.1f}ms {t['bits'] / t['torch']:6.2f}" if args.bits else ""))

    print("\nNumPy input: round_to against ml_dtypes' cast round trip x.astype(dtype).astype(float32)")
    print(f"{'format':16} {'round_to':>10} {'ml_dtypes':>11} {'ratio':>6}")
    for fmt, ml_dtype in ((E4M3, ml_dtypes.float8_e4m3fn), (BF16, ml_dtypes.bfloat16),
                          (FP16, np.float16), (E3M2, ml_dtypes.float6_e3m2fn),
                          (E2M1, ml_dtypes.float4_e2m1fn)):
        t = median_seconds({
            "round_to": lambda: round_to(x_np, fmt),
            "ml_dtypes": lambda: x_np.astype(ml_dtype).astype(np.float32),
        }, args.repeats)
        print(f"{fmt.name:16} {t['round_to'] * 1e3:8.1f}ms {t['ml_dtypes'] * 1e3:9.1f}ms "
              f"{t['round_to'] / t['ml_dtypes']:6.2f}")


if __name__ == "__main__":
    main()
