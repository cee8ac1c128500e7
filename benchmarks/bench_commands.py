"""How long the README's two commands take here: `make test` and `make book`, with the core count,
as ratios of their budgets and of the last run on this machine.

    python benchmarks/bench_commands.py [--only test|book]

Each command runs as a new user runs it, in this working tree, set-up excluded (the .venv is made
first, untimed, by `make venv`) and from a fresh clone's state for what it builds: _build/ is
removed first (a clone has none). For each: the wall time, the CPU time of everything it started
(user + system, its children's included: pytest's workers, notebook kernels, sandboxes), the cores
this process may use and the load average before and after (on a machine shared with other work,
the wall time grows with the load; the CPU time much less). Two ratios say whether a change made
a command slower: to its budget (README: `make test` within 10 minutes and `make book` within 4 on
2 cores; the budget for N cores is taken as the same), and to the last run here with as many
cores (benchmarks/results/commands.jsonl, git-ignored: each run is appended to it).

`make test` has taken 629 to 857 s on 2 cores of machines of one kind, with little change to the
tests between (2026-11-30 to 2026-12-02), and one notebook cell 21.6 to 31.2 s in runs an hour apart:
a machine's speed moves more than a change does. So each
command is also measured against a fixed workload run just before and just after it (`calibrate`:
importing torch, numpy and matplotlib in a new process, a pure-Python loop, small single-threaded
matrix products; the suite's own kinds of work, a few seconds in all), and the ratio of the two is
compared with the last run's: that ratio moves with the commands' work, much less with the machine.
"""
import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = {"test": 600, "book": 240}  # seconds, on 2 cores (README, "Two commands")
HISTORY = ROOT / "benchmarks" / "results" / "commands.jsonl"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CALIBRATION = """
import time
started = time.perf_counter()
import numpy, torch, matplotlib.pyplot  # noqa: F401,E401
total = 0
for i in range(5_000_000):
    total += i
torch.set_num_threads(1)
a = torch.randn(256, 256)
for _ in range(400):
    a = torch.tanh(a @ a)
print(time.perf_counter() - started)
"""


def calibrate(repeats: int = 3) -> float:
    """Seconds of the fixed workload (CALIBRATION) in a new process, the fastest of `repeats`."""
    runs = [float(subprocess.run([sys.executable, "-c", CALIBRATION], capture_output=True, text=True, check=True,
                                 cwd=ROOT).stdout) for _ in range(repeats)]
    return min(runs)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def measure(target: str) -> dict:
    """Run `make TARGET` from a fresh clone's state; its wall and CPU time and the load around it."""
    shutil.rmtree(ROOT / "_build", ignore_errors=True)
    calibration = calibrate()
    load_before = os.getloadavg()[0]
    cpu, started = children_cpu(), time.monotonic()
    result = subprocess.run(["make", "--no-print-directory", target], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wall, cpu = time.monotonic() - started, children_cpu() - cpu
    if result.returncode != 0:
        sys.exit(f"make {target} failed (exit {result.returncode}): {result.stderr[-2000:]}")
    load_after = os.getloadavg()[0]
    calibration = min(calibration, calibrate())  # the machine at its best around the command
    return {"command": f"make {target}", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores": cores(),
            "load_before": round(load_before, 2), "load_after": round(load_after, 2),
            "calibration_s": round(calibration, 3), "wall_per_calibration": round(wall / calibration, 1)}


def last_run(command: str, count: int) -> dict | None:
    if not HISTORY.is_file():
        return None
    runs = [json.loads(line) for line in HISTORY.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(runs) if r["command"] == command and r["cores"] == count), None)


def commit() -> str:
    result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(BUDGETS), help="one command only")
    args = parser.parse_args()
    subprocess.run(["make", "--no-print-directory", "venv"], cwd=ROOT, check=True)  # set-up: not timed
    print(f"{cores()} cores; set-up done (not timed)")
    for target in [args.only] if args.only else ["test", "book"]:
        print(f"make {target} ...", flush=True)
        run = measure(target)
        before = last_run(run["command"], run["cores"])
        line = (f"make {target}: {minutes(run['wall_s'])} wall, {minutes(run['cpu_s'])} CPU on {run['cores']} cores "
                f"(load {run['load_before']:.1f} -> {run['load_after']:.1f}); "
                f"{run['wall_s'] / BUDGETS[target]:.2f}x its budget of {minutes(BUDGETS[target])} on 2 cores")
        line += f"; the fixed workload took {run['calibration_s']:.2f} s ({run['wall_per_calibration']:.0f} of it)"
        if before:
            line += (f"; {run['wall_s'] / before['wall_s']:.2f}x the wall time and {run['cpu_s'] / before['cpu_s']:.2f}x "
                     f"the CPU time of the last run here ({before['date']}, {before['commit']})")
            if "wall_per_calibration" in before:
                line += f", {run['wall_per_calibration'] / before['wall_per_calibration']:.2f}x its wall time in fixed workloads"
        print(line, flush=True)
        HISTORY.parent.mkdir(exist_ok=True)
        with HISTORY.open("a") as history:
            history.write(json.dumps({**run, "date": datetime.date.today().isoformat(), "commit": commit()}) + "\n")


if __name__ == "__main__":
    main()
