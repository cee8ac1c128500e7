"""Time optimizer steps: MasterWeightOptimizer and CompensatedOptimizer around AdamW on a BF16
model, against plain AdamW on the same model in FP32.

Every contender steps the same architecture (a stack of Linear layers, ~10M parameters) with its
gradients filled in beforehand, so only ``step()`` is timed. Ratios are measured side by side in
one run: contender time / FP32 AdamW time. The last rows time the parts of a step.

    python benchmarks/bench_optim.py [--layers 10] [--width 1024] [--repeats 7] [--quick]
"""
import argparse
import statistics
import time

import torch
from torch import nn
from tqdm import tqdm

from mpcourse.optim import CompensatedOptimizer, MasterWeightOptimizer


def median_seconds(contenders: dict, repeats: int) -> dict:
    """Median wall time of each contender, timed in turn within every repeat, so that a slow
    spell of the machine hits all of them alike and the ratios stay fair."""
    for fn in contenders.values():
        fn()  # warm-up: the optimizer state is allocated at the first step
    times = {name: [] for name in contenders}
    for _ in tqdm(range(repeats), desc="repeats", leave=False):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def model_with_gradients(layers: int, width: int, dtype: torch.dtype) -> nn.Module:
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(dtype)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=generator) * 1e-3).to(dtype)
    return model


def wrapped(model: nn.Module, wrapper):
    """The wrapped AdamW, its model gradients moved onto the FP32 copies as backward would."""
    grads = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    optimizer = wrapper(torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True))
    for copy, grad in zip(optimizer.param_groups[0]["params"], grads):
        copy.grad = grad.float()
    return optimizer


def refresh(optimizer):
    """CompensatedOptimizer's first move in a step: w32 = w."""
    torch._foreach_copy_(optimizer.fp32_params, optimizer.model_params)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="4 layers of 512, 5 repeats")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.width, args.repeats = 4, 512, 5

    fp32_model = model_with_gradients(args.layers, args.width, torch.float32)
    fp32 = torch.optim.AdamW(fp32_model.parameters(), lr=1e-4, foreach=True)
    master = wrapped(model_with_gradients(args.layers, args.width, torch.bfloat16),
                     MasterWeightOptimizer)
    kahan = wrapped(model_with_gradients(args.layers, args.width, torch.bfloat16),
                    lambda opt: CompensatedOptimizer(opt, method="kahan"))
    stochastic = wrapped(model_with_gradients(args.layers, args.width, torch.bfloat16),
                         lambda opt: CompensatedOptimizer(
                             opt, method="stochastic", generator=torch.Generator().manual_seed(0)))
    n = sum(p.numel() for p in fp32_model.parameters())
    bf16_params = [p.detach().clone() for p in master.model_params]  # copies: the optimizer
    fp32_params = [p.detach().clone() for p in master.fp32_params]   # would see them changed

    steps = {
        "FP32 AdamW": fp32.step,
        "MasterWeightOptimizer(AdamW), BF16 model": master.step,
        "CompensatedOptimizer(AdamW, kahan)": kahan.step,
        "CompensatedOptimizer(AdamW, stochastic)": stochastic.step,
    }
    parts = {
        "AdamW on the FP32 masters": master.optimizer.step,
        "masters -> BF16 model (_foreach_copy_)":
            lambda: torch._foreach_copy_(bf16_params, fp32_params),
        "BF16 model -> FP32 copies (the refresh)":
            lambda: torch._foreach_copy_(fp32_params, bf16_params),
        # Refreshed first (w32 = w, u = 0) so that repeated calls see realistic values.
        "refresh + Kahan update": lambda: (refresh(kahan), kahan._kahan_sum()),
        "refresh + stochastic rounding (round_to)":
            lambda: (refresh(stochastic), stochastic._round_stochastically()),
    }
    with torch.no_grad():  # for the parts; step() turns gradients off itself
        t = median_seconds({**steps, **parts}, args.repeats)

    print(f"{n / 1e6:.1f}M parameters ({args.layers} x Linear({args.width}, {args.width})), "
          f"torch threads: {torch.get_num_threads()}, median of {args.repeats}\n")
    print(f"{'step':50} {'time':>9} {'/ FP32 AdamW':>13}")
    for name in steps:
        print(f"{name:50} {t[name] * 1e3:7.1f}ms {t[name] / t['FP32 AdamW']:13.2f}")
    print(f"\n{'where the time goes':50}")
    for name in parts:
        print(f"  {name:48} {t[name] * 1e3:7.1f}ms {t[name] / t['FP32 AdamW']:13.2f}")


if __name__ == "__main__":
    main()
