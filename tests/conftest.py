"""Where device-aware tests run: the CPU by default, a GPU under ``MPCOURSE_DEVICE=cuda``.

``make test-gpu`` sets ``MPCOURSE_DEVICE=cuda``. Tests that take the ``device`` fixture then run
on the GPU; every other test is unchanged (tests marked "needs a CUDA GPU" run whenever torch
sees one, whatever this says). Asking for CUDA on a machine without it stops the run at once,
rather than skipping every GPU test and passing.

The ``built_book`` fixture builds the whole book once per test session (warnings as errors) and
shares the HTML among the book tests (tests/test_book.py, tests/test_browser.py), across the
pytest-xdist workers too. It builds from the notebooks nbval has already executed in this session
(tests/notebook_outputs.py), so each notebook runs once.
"""
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.notebook_outputs import executed_dir

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _requested_device() -> torch.device:
    name = os.environ.get("MPCOURSE_DEVICE", "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"MPCOURSE_DEVICE={name!r} is not a torch device "
                                "(use cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise pytest.UsageError(f"MPCOURSE_DEVICE={name!r}: the tests know cpu and cuda only")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"MPCOURSE_DEVICE={name!r}, but torch sees no CUDA GPU here")
    return device


def pytest_configure(config):
    _requested_device()  # fail fast on a bad setting


def _stage_book(stage: Path) -> Path:
    """A tree that is the repository, except that book notebooks nbval has executed come with
    their outputs (symbolic links for everything else)."""
    executed = executed_dir()
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "book").mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", ".venv-student", "_build", "book"):
            (stage / entry.name).symlink_to(entry)
    for entry in (ROOT / "book").iterdir():
        if (executed / entry.name).is_file() and entry.suffix == ".ipynb":
            shutil.copy(executed / entry.name, stage / "book" / entry.name)
        else:
            (stage / "book" / entry.name).symlink_to(entry)
    return stage


@pytest.fixture
def device() -> torch.device:
    """The device that device-aware tests run on (``MPCOURSE_DEVICE``, default ``cpu``)."""
    return _requested_device()


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """The book's HTML folder, built once per session exactly as ``make book`` builds it.

    ``MPCOURSE_BUILT_BOOK=<folder>`` reuses an earlier build instead (the ``_build/html`` folder of
    ``jupyter-book build -W -n --keep-going --path-output <dir> .``, for instance), which keeps a
    test-writing loop fast; the tests then check that build, not the current sources.
    """
    if reuse := os.environ.get("MPCOURSE_BUILT_BOOK"):
        html = Path(reuse).resolve()
        if not (html / "index.html").is_file():
            raise pytest.UsageError(f"MPCOURSE_BUILT_BOOK={reuse!r} holds no built book (no index.html)")
        return html
    # Under pytest-xdist (`make test` runs two workers) the first worker to get here builds the
    # book in the folder the workers share; the other waits on the lock and reads the result.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    out, log = shared / "book", shared / "book-build.log"
    with open(shared / "book-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not log.exists():
            jupyter_book = Path(sys.executable).parent / "jupyter-book"
            source = _stage_book(shared / "book-source")
            result = subprocess.run(
                [str(jupyter_book), "build", "-W", "-n", "--keep-going", "--path-output", str(out), str(source)],
                capture_output=True, text=True, timeout=900)
            log.write_text(f"{result.returncode}\n{result.stdout[-5000:]}{result.stderr[-5000:]}")
    returncode, output = log.read_text().split("\n", 1)
    assert returncode == "0", output
    return out / "_build" / "html"
