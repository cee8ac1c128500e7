"""Time round_to on 16M float32 values against torch's native cast round trip and ml_dtypes.

All three produce the same numbers (the tests prove it); this measures what exactness costs.
Ratios are measured side by side in one run: round_to time / torch time, round_to / ml_dtypes.

    python benchmarks/bench_round_to.py [--n 16777216] [--repeats 7]
"""
import argparse
import statistics
import time

import ml_dtypes
import numpy as np
import torch

from mpcourse.formats import BF16, E4M3, round_to


def median_seconds(contenders: dict, repeats: int) -> dict:
    """Median wall time of each contender, timed in turn within every repeat, so that a slow
    spell of the machine hits all of them alike and the ratios stay fair."""
    for fn in contenders.values():
        fn()  # warm-up: allocations, first-call overheads
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
    args = parser.parse_args()

    x = torch.randn(args.n, generator=torch.Generator().manual_seed(0)) * 100
    x_np = x.numpy()
    cases = [
        (E4M3, torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
        (BF16, torch.bfloat16, ml_dtypes.bfloat16),
    ]
    print(f"{args.n:,} float32 values, torch threads: {torch.get_num_threads()}, "
          f"median of {args.repeats}\n")
    print(f"{'format':6} {'round_to':>10} {'torch cast':>11} {'ml_dtypes':>10}   "
          f"{'round_to/torch':>14} {'round_to/ml_dtypes':>18}")
    for fmt, torch_dtype, ml_dtype in cases:
        t = median_seconds({
            "round_to": lambda: round_to(x, fmt, saturate=True),
            "torch": lambda: x.to(torch_dtype).float(),
            "ml_dtypes": lambda: x_np.astype(ml_dtype).astype(np.float32),
        }, args.repeats)
        ours, native, ml = t["round_to"], t["torch"], t["ml_dtypes"]
        print(f"{fmt.name:6} {ours * 1e3:8.1f}ms {native * 1e3:9.1f}ms {ml * 1e3:8.1f}ms   "
              f"{ours / native:14.2f} {ours / ml:18.2f}")


if __name__ == "__main__":
    main()
