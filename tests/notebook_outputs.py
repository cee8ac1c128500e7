"""A pytest plugin (loaded with ``-p tests.notebook_outputs``): each book notebook runs once per
test session, not twice, and the book is built while the other tests run.

nbval runs every book notebook (the test that it runs on this device); the hooks here keep the
outputs of each notebook whose cells all passed, in a folder shared by the xdist workers, and mark
the others as failed. Once every notebook of the session is done, and if the session has tests
that need the built book, the worker that finished the last one starts the book's build in the
background (`start_book_build`): `make book`'s staging and Jupyter Book (tools/build_book.py), from
those notebooks, marked ``execution_mode: off`` for myst-nb; only notebooks that failed under nbval
are executed again. The ``built_book`` fixture (tests/conftest.py) waits for that build
(`built_book_html`).

The order of the run (pytest-xdist hands out whole files in the order they come, with
``--no-loadscope-reorder``, the first ones round-robin): the book's notebooks first, then the two
sandboxed gradings (`GRADINGS`, the longest modules: next to each other, so on two workers), then
the modules whose tests take longest (`LONG`, slowest first: grading runs, PostgreSQL servers,
LMS downloads; as the last of them they kept one worker busy for a minute while the other had
nothing left, 2026-11-30) and after them the tests that need the built book (`BOOK_TESTS`: the
browser's take half a minute; as the very last module they kept one worker busy while the other
had nothing left, 2026-12-01), then the other test modules, the largest first (as pytest-xdist
would order them): the many short ones end the run, on both workers alike. The book is built
while the gradings and the long modules run (it starts when the last notebook is done, minutes
before), and a worker that waits for it waits only for notebooks running on other workers.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK_TESTS = ("test_book.py", "test_browser.py")  # the modules that use the built book
GRADINGS = ("test_exercises.py", "test_hostile_corpus.py")  # each grades its class, sandboxed, once
LONG = ("test_large_class.py", "test_collect_again.py", "test_student_answers.py", "test_instructor.py")
EXPECTED = "expected.txt"  # the notebooks this session runs, one name a line
NEEDS_BOOK = "needs-book"  # there: the session has tests that need the built book


def executed_dir() -> Path:
    """Where this run keeps executed notebooks: one folder per run, shared by the xdist workers."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"mpcourse-executed-{run}"


def is_book_notebook(item) -> bool:
    return item.path.suffix == ".ipynb" and Path(str(item.path)).resolve().parent == ROOT / "book"


def pytest_collection_modifyitems(items):
    """Notebooks first, then the gradings, the long modules and the book's tests, then the rest, largest first."""
    sizes: dict = {}
    for item in items:
        sizes[item.path] = sizes.get(item.path, 0) + 1

    def order(item):
        name = item.path.name
        group = (0 if is_book_notebook(item) else 1 if name in GRADINGS else 2 if name in LONG + BOOK_TESTS else 3)
        return group, -sizes[item.path] if group == 3 else (LONG + BOOK_TESTS).index(name) if group == 2 else 0, str(item.path)

    items.sort(key=order)  # stable: a file's tests keep their order


def pytest_collection_finish(session):
    """Note which notebooks this session runs (after any deselection), and whether it needs the book."""
    folder = executed_dir()
    folder.mkdir(exist_ok=True)
    names = sorted({item.path.name for item in session.items if is_book_notebook(item)})
    (folder / f"{EXPECTED}.{os.getpid()}").write_text("\n".join(names))
    (folder / f"{EXPECTED}.{os.getpid()}").replace(folder / EXPECTED)  # every worker collects the same
    if any(item.path.name in BOOK_TESTS for item in session.items) and not os.environ.get("MPCOURSE_BUILT_BOOK"):
        (folder / NEEDS_BOOK).touch()


def pending_notebooks() -> list[str]:
    """The notebooks of this session not done yet (neither executed nor failed)."""
    folder = executed_dir()
    expected = (folder / EXPECTED).read_text().split() if (folder / EXPECTED).is_file() else []
    return [name for name in expected if not (folder / name).is_file() and not (folder / f"{name}.failed").is_file()]


def start_book_build() -> None:
    """Build the book in the background, once per session (the first caller starts it)."""
    folder = executed_dir()
    try:
        os.close(os.open(folder / "book-build.started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    subprocess.Popen([sys.executable, "-m", "tests.notebook_outputs", str(folder)], cwd=ROOT,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def built_book_html(timeout: float = 1800) -> Path:
    """The built book's HTML folder: started here if no worker has started its build yet (after
    the notebooks still running on other workers), then waited for. Fails with the build's output."""
    folder = executed_dir()
    folder.mkdir(exist_ok=True)
    wait_for_notebooks(timeout)
    start_book_build()
    log, deadline = folder / "book-build.log", time.monotonic() + timeout
    while not log.exists():
        assert time.monotonic() < deadline, f"the book's build did not end within {timeout:.0f} s"
        time.sleep(1)
    returncode, output = log.read_text().split("\n", 1)
    assert returncode == "0", output
    return folder / "book" / "_build" / "html"


def build(folder: Path) -> None:
    """The build itself (run as `python -m tests.notebook_outputs FOLDER`): `make book`'s staging of
    the notebooks executed in FOLDER, Jupyter Book, and FOLDER/book-build.log: its exit status, then
    the end of its output."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_book
    build_book.stage(folder / "book-source", {path.name: path.read_text() for path in folder.glob("*.ipynb")})
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    try:
        result = subprocess.run([str(jupyter_book), "build", "-W", "-n", "--keep-going", "--path-output",
                                 str(folder / "book"), str(folder / "book-source")],
                                capture_output=True, text=True, timeout=900)
        status, output = result.returncode, result.stdout[-5000:] + result.stderr[-5000:]
    except subprocess.TimeoutExpired as error:
        status, output = "timeout", f"the build ran past {error.timeout} s"
    (folder / "book-build.part").write_text(f"{status}\n{output}")
    (folder / "book-build.part").replace(folder / "book-build.log")


def wait_for_notebooks(timeout: float = 1800) -> list[str]:
    """Wait until every notebook this session runs is done (executed, or failed); return those not
    done when `timeout` seconds have passed (the book's build then executes them itself)."""
    deadline = time.monotonic() + timeout
    while (pending := pending_notebooks()) and time.monotonic() < deadline:
        time.sleep(1)
    return pending


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if hasattr(item, "test_outputs") and outcome.get_result().failed:
        item.parent.mpcourse_failed = True  # an nbval cell failed: the build runs it again


def pytest_runtest_teardown(item, nextitem):
    """After a notebook's last cell under nbval, save it with its outputs if every cell passed, or
    mark it failed."""
    if not (hasattr(item, "test_outputs") and hasattr(item, "cell")):
        return
    item.cell.outputs = item.test_outputs or []
    if nextitem is not None and nextitem.parent is item.parent:
        return
    notebook = Path(str(item.parent.path)).resolve()
    if notebook.parent != ROOT / "book":
        return
    folder = executed_dir()
    folder.mkdir(exist_ok=True)
    if getattr(item.parent, "mpcourse_failed", False):
        (folder / f"{notebook.name}.failed").touch()
    else:
        executed = item.parent.nb
        executed.metadata["mystnb"] = {**executed.metadata.get("mystnb", {}), "execution_mode": "off"}
        nbformat.write(executed, str(folder / f"{notebook.name}.part"))
        (folder / f"{notebook.name}.part").replace(folder / notebook.name)  # whole files only
    if (folder / NEEDS_BOOK).exists() and not pending_notebooks():
        start_book_build()  # the last notebook of the session is done: the book builds meanwhile


if __name__ == "__main__":
    build(Path(sys.argv[1]))
