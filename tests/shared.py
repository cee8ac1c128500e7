"""Results that the tests only read, computed once per test run and shared by the xdist workers.

    once_per_run(name, compute) -> compute()'s value (JSON), computed by the first worker to ask

The first worker to ask for `name` computes it and keeps it as JSON in a folder of this run's
(tests/notebook_outputs.py keeps the executed notebooks the same way); the others wait for it and
read it. A value is computed at most once per run whatever the number of workers, and never
reused by another run.
"""
import fcntl
import json
import os
import tempfile
from pathlib import Path


def run_folder() -> Path:
    """This run's folder, shared by its xdist workers (one run, one folder)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    folder = Path(tempfile.gettempdir()) / f"mpcourse-shared-{run}"
    folder.mkdir(exist_ok=True)
    return folder


def once_per_run(name: str, compute):
    """compute(), a JSON value, once per test run: `name` says what it is (a file name)."""
    path = run_folder() / f"{name}.json"
    with open(run_folder() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            value = compute()
            path.with_suffix(".part").write_text(json.dumps(value))
            path.with_suffix(".part").replace(path)
    return json.loads(path.read_text())
