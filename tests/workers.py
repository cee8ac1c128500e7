"""A pytest plugin (loaded with ``-p tests.workers``): one xdist worker per core, one torch thread
per worker.

``-n auto`` starts as many workers as this process may use cores (``os.sched_getaffinity``: the
share a container or ``taskset`` gives, where pytest-xdist's own count would take the machine's
physical cores), so the suite runs faster on a machine with more of them. Each worker then runs
torch, and the programs it starts, on one thread: the cores are the workers', and a second thread
per worker only waits for the others. Measured on 2 cores with 2 workers: the tiny transformer's
training test took 35.8 s of CPU time with two threads, 9.8 s with one. The book's chapters set
one thread themselves, for the same reason.
"""
import os


def pytest_xdist_auto_num_workers(config) -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pytest_configure(config):
    os.environ["MPCOURSE_STRICT_CLAIMS"] = "1"  # a book sentence that does not hold fails (mpcourse/claims.py)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[name] = "1"  # the programs tests start (notebook kernels, README examples' workers)
        import torch
        torch.set_num_threads(1)
