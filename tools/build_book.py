"""`make book`: execute the book's notebooks in parallel, one per core, then build the HTML.

    python tools/build_book.py [--jobs N] [--out DIR]

Jupyter Book executes the notebooks one after another, on one core, while it builds the pages.
This executes them first, `--jobs` at a time (default: one per core this process may use), the
slowest first (as the last build measured them, in _build/notebook-seconds.json; the table of
contents' order the first time), each exactly as Jupyter Book would: nbclient, in the notebook's
folder, with _config.yml's timeout, stopping at the first error; each kernel gets its share of
the cores (OMP_NUM_THREADS and its kin: cores / jobs, unless already set). Then Jupyter Book builds the HTML
into _build/html from a staged copy of the repository (_build/source: links to every file, the
executed notebooks in book/, marked `execution_mode: off` for myst-nb), warnings as errors,
exactly as `jupyter-book build -W -n --keep-going .` does. The book is the same book, computed
on the same machine.

Exits 1 naming the notebook and the cell that failed, with its error, before any HTML is built.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
TIMES = "notebook-seconds.json"


def executed_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks the book executes: those of _toc.yml under book/ (the released exercises are
    shown unexecuted, _config.yml's execute.exclude_patterns)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    return [root / f"{name}.ipynb" for name in files
            if name.startswith("book/") and (root / f"{name}.ipynb").is_file()]


def execute(path: str, timeout: int) -> tuple[str, float, str | None]:
    """Run one notebook as myst-nb does (nbclient, its own folder as the working directory):
    (where the executed copy is, seconds, None) or (path, seconds, what failed)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    started = time.monotonic()
    notebook = Path(path)
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=timeout, allow_errors=False, record_timing=False,
                            resources={"metadata": {"path": str(notebook.parent)}})
    try:
        client.execute()
    except CellExecutionError as error:
        return path, time.monotonic() - started, str(error)
    except Exception as error:  # noqa: BLE001  a kernel that died, a timeout: said, not a traceback of ours
        return path, time.monotonic() - started, f"{type(error).__name__}: {error}"
    nb.metadata["mystnb"] = {**nb.metadata.get("mystnb", {}), "execution_mode": "off"}
    return nbformat.writes(nb), time.monotonic() - started, None


def stage(source: Path, executed: dict[str, str]) -> None:
    """The repository, as links, with the executed notebooks in book/ (tests/conftest.py stages
    the test run's build the same way)."""
    shutil.rmtree(source, ignore_errors=True)
    (source / "book").mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", ".venv-student", "_build", "book"):
            (source / entry.name).symlink_to(entry)
    for entry in (ROOT / "book").iterdir():
        if entry.name in executed:
            (source / "book" / entry.name).write_text(executed[entry.name])
        else:
            (source / "book" / entry.name).symlink_to(entry)


def main() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=cores, help=f"notebooks at a time (default: the cores, {cores})")
    parser.add_argument("--out", type=Path, default=ROOT, help="where _build/ goes (default: the repository)")
    args = parser.parse_args()
    build = args.out.resolve() / "_build"
    build.mkdir(parents=True, exist_ok=True)
    timeout = int(yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["timeout"])
    known = json.loads((build / TIMES).read_text()) if (build / TIMES).is_file() else {}
    notebooks = sorted(executed_notebooks(), key=lambda p: -known.get(p.name, 0))  # stable: toc order without times

    # The kernels share the cores: each gets its share of threads (as tests/workers.py gives nbval's).
    # With torch's default, one thread per core in every kernel, two kernels on two cores waited on
    # each other: the two notebooks that do not set one thread themselves took 31 s and 19 s, against
    # 6 s and 7 s with one (2026-11-30).
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, str(max(1, cores // max(1, args.jobs))))
    os.environ["MPCOURSE_STRICT_CLAIMS"] = "1"  # a sentence that does not hold fails the build (mpcourse/claims.py)
    began = time.monotonic()
    executed, seconds, failed = {}, {}, []
    print(f"executing {len(notebooks)} notebooks, {args.jobs} at a time", flush=True)
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(execute, str(p), timeout): p for p in notebooks}
        for future in as_completed(futures):
            notebook = futures[future]
            text, took, error = future.result()
            seconds[notebook.name] = round(took, 1)
            if error:
                failed.append((notebook, error))
                print(f"  FAILED {notebook.relative_to(ROOT)} after {took:.0f} s", flush=True)
            else:
                executed[notebook.name] = text
                print(f"  {notebook.relative_to(ROOT)}: {took:.0f} s", flush=True)
    (build / TIMES).write_text(json.dumps({**known, **seconds}, indent=1, sort_keys=True))
    print(f"executed in {time.monotonic() - began:.0f} s", flush=True)
    for notebook, error in failed:
        print(f"\n{notebook.relative_to(ROOT)} failed:\n{error[-5000:]}", file=sys.stderr)
    if failed:
        return 1

    stage(build / "source", executed)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run([str(jupyter_book), "build", "-W", "-n", "--keep-going",
                             "--path-output", str(args.out.resolve()), str(build / "source")])
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
