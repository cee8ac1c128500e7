"""Where device-aware tests run: the CPU by default, a GPU under ``MPCOURSE_DEVICE=cuda``.

``make test-gpu`` sets ``MPCOURSE_DEVICE=cuda``. Tests that take the ``device`` fixture then run
on the GPU; every other test is unchanged (tests marked "needs a CUDA GPU" run whenever torch
sees one, whatever this says). Asking for CUDA on a machine without it stops the run at once,
rather than skipping every GPU test and passing.
"""
import os

import pytest
import torch


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
