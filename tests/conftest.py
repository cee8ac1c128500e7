"""Where device-aware tests run: the CPU by default, a GPU under ``MPCOURSE_DEVICE=cuda``.

``make test-gpu`` sets ``MPCOURSE_DEVICE=cuda``. Tests that take the ``device`` fixture then run
on the GPU; every other test is unchanged (tests marked "needs a CUDA GPU" run whenever torch
sees one, whatever this says). Asking for CUDA on a machine without it stops the run at once,
rather than skipping every GPU test and passing.

The ``built_book`` fixture gives the whole book, built once per test session (warnings as errors)
and shared among the book tests (tests/test_book.py, tests/test_browser.py), across the
pytest-xdist workers too. It is built from the notebooks nbval has already executed in this
session, in the background while the other tests run (tests/notebook_outputs.py), so each
notebook runs once.
"""
import os
from pathlib import Path

import pytest
import torch

from tests.notebook_outputs import built_book_html



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


@pytest.fixture
def device() -> torch.device:
    """The device that device-aware tests run on (``MPCOURSE_DEVICE``, default ``cpu``)."""
    return _requested_device()


@pytest.fixture(scope="session")
def built_book() -> Path:
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
    # The build started in the background when the last notebook was done (tests/notebook_outputs.py),
    # or here, by the first worker to get here; every worker waits for it and reads the result.
    return built_book_html()
