"""What watching costs: a training step inside ``doctor.watch`` against the same step unwatched.

Each loop (AMP FP16 with a GradScaler, BF16 with master weights) runs on an MLP of a few sizes.
Within every repeat the unwatched steps and the watched steps (a fresh session, entered once, the
timer inside it) run in turn, so a slow spell of the machine hits both alike; the ratio is the
median watched step time / the median unwatched step time, measured side by side in one run.

    python benchmarks/bench_doctor.py [--device cpu] [--repeats 7] [--steps 5] [--quick]

On a CPU shared with other work, ``OMP_NUM_THREADS=1`` steadies the timings: with torch's
threads contending for the cores, single steps there varied from 1 to 200 ms.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from mpcourse import doctor
from mpcourse.optim import MasterWeightOptimizer


def mlp(depth: int, width: int, device, dtype=torch.float32) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)).to(device, dtype)


def amp_fp16(depth, width, batch, device):
    model = mlp(depth, width, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type)
    x, y = torch.randn(batch, width, device=device), torch.randint(0, 10, (batch,), device=device)

    def step():
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    return model, optimizer, scaler, step


def bf16_masters(depth, width, batch, device):
    model = mlp(depth, width, device, torch.bfloat16)
    optimizer = MasterWeightOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randn(batch, width, device=device, dtype=torch.bfloat16)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
    return model, optimizer, None, step


def timed(step, steps: int, device) -> float:
    """The median seconds of one step over ``steps`` steps."""
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ratio(loop, shape, device, repeats: int, steps: int) -> tuple[float, float]:
    model, optimizer, scaler, step = loop(*shape, device)
    step()  # warm-up: optimizer state, scaler state, kernels
    plain, watched = [], []
    for _ in range(repeats):
        plain.append(timed(step, steps, device))
        with doctor.watch(model, optimizer, scaler):
            watched.append(timed(step, steps, device))
    return statistics.median(plain), statistics.median(watched)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one small model, 3 repeats")
    args = parser.parse_args()
    device = torch.device(args.device)
    shapes = {"cpu": [(2, 128, 64), (4, 256, 128)], "cuda": [(2, 128, 64), (4, 1024, 512),
                                                            (8, 4096, 2048)]}[device.type]
    shapes = shapes[:1] if args.quick else shapes
    repeats = 3 if args.quick else args.repeats
    loops = {"AMP FP16 + GradScaler": amp_fp16, "BF16 + MasterWeightOptimizer": bf16_masters}
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device} ({card}), torch {torch.__version__}, "
          f"median of {repeats} repeats x {args.steps} steps")
    print(f"{'loop':30} {'depth x width, batch':>22} {'unwatched ms':>13} {'watched ms':>11} "
          f"{'ratio':>6}")
    for (name, loop), shape in tqdm([(item, s) for item in loops.items() for s in shapes],
                                    desc="cases", leave=False):
        plain, watched = ratio(loop, shape, device, repeats, args.steps)
        print(f"{name:30} {f'{shape[0]} x {shape[1]}, {shape[2]}':>22} {plain * 1e3:13.2f} "
              f"{watched * 1e3:11.2f} {watched / plain:6.2f}", flush=True)


if __name__ == "__main__":
    main()
