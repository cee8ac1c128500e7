"""Print the size of the GPU kit (.gpu-kit/) and of what travels with it to the GPU machine.

What travels is the working tree as git sees it (tracked files, and untracked files git does not
ignore) plus the kit; the GPU machine takes 64 MiB at most, and we keep to 50 MiB. Exits non-zero
above that, naming the largest wheels.
"""
import subprocess
import sys
from pathlib import Path

LIMIT_MIB = 50
ROOT = Path(__file__).resolve().parent.parent


def tree_bytes() -> int:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed
               if name and (ROOT / name.decode()).is_file())


def main() -> int:
    wheels = sorted((ROOT / ".gpu-kit").glob("*.whl"), key=lambda p: p.stat().st_size)
    kit, tree = sum(p.stat().st_size for p in wheels), tree_bytes()
    total = (kit + tree) / 2**20
    print(f".gpu-kit/: {len(wheels)} wheels, {kit / 2**20:.1f} MiB; working tree "
          f"{tree / 2**20:.1f} MiB; together {total:.1f} MiB (limit {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB:
        print("Too large. Largest wheels:", *(f"  {p.name}: {p.stat().st_size / 2**20:.1f} MiB"
                                              for p in wheels[-5:]), sep="\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
