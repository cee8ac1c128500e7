"""A pytest plugin (loaded with ``-p tests.notebook_outputs``): each book notebook runs once per
test session, not twice.

nbval runs every book notebook (the test that it runs on this device); the hooks here keep the
outputs of each notebook whose cells all passed, in a folder shared by the xdist workers. The
``built_book`` fixture (tests/conftest.py) then builds the book from those notebooks, marked
``execution_mode: off`` for myst-nb, and executes only the notebooks nbval has not finished. The
tests that need the built book are scheduled last, so that is rarely more than one.
"""
import os
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK_TESTS = ("test_book.py", "test_browser.py")  # the modules that use the built book


def executed_dir() -> Path:
    """Where this run keeps executed notebooks: one folder per run, shared by the xdist workers."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"mpcourse-executed-{run}"


def pytest_collection_modifyitems(items):
    """Run the tests that need the built book last, after nbval has run the notebooks."""
    items.sort(key=lambda item: item.path.name in BOOK_TESTS)  # stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if hasattr(item, "test_outputs") and outcome.get_result().failed:
        item.parent.mpcourse_failed = True  # an nbval cell failed: the build runs it again


def pytest_runtest_teardown(item, nextitem):
    """After a notebook's last cell under nbval, save it with its outputs if every cell passed."""
    if not (hasattr(item, "test_outputs") and hasattr(item, "cell")):
        return
    item.cell.outputs = item.test_outputs or []
    if nextitem is not None and nextitem.parent is item.parent:
        return
    notebook = Path(str(item.parent.path)).resolve()
    if getattr(item.parent, "mpcourse_failed", False) or notebook.parent != ROOT / "book":
        return
    executed = item.parent.nb
    executed.metadata["mystnb"] = {**executed.metadata.get("mystnb", {}), "execution_mode": "off"}
    folder = executed_dir()
    folder.mkdir(exist_ok=True)
    nbformat.write(executed, str(folder / f"{notebook.name}.part"))
    (folder / f"{notebook.name}.part").replace(folder / notebook.name)  # whole files only
