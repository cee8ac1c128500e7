"""Grading that students cannot fool: the trusted side, which an instructor audits.

    grade_student(course, assignment, student, ...) -> (verdicts, notebook as run, problem, note, flags)

(tools/schedule.py grades a class with it; tools/gradebook.py writes the grades.)

The submission is read as JSON only, never through a symbolic link (a submission that is or
holds one is refused, with the reason). Then, for each student, three sandboxes of their own
(tools/sandbox.py: they see only the system's /usr, the Python environment, the course library
and the files of the run, as an unprivileged user with a cleared environment, RAM-backed /tmp
the only writable place, limits on processes, memory, CPU and wall-clock time):

1. the submitted notebook runs under nbgrader against the *release* (visible tests only), so the
   feedback shows the student's outputs and ticks; the notebook as run comes back over a pipe,
   as data. No grade depends on this run, and it stops after `feedback_seconds(timeout)`
   whatever the number of cells;
2. `tools/hidden_tests.py` runs each part's test cell, hidden tests included, from the
   instructor's source less its expected values (`without_expected`), on the student's answer
   cells only, and records what they did (see that file); the job goes in on its stdin, the
   record comes out on the result pipe;
3. the same tests, expected values kept, run on the instructor's solution cells, with the same
   secret: the reference record.

Then, here, outside any sandbox: tools/judge.py decides each part from the two records (data,
never code), the points of each passed part are written to the gradebook (tools/gradebook.py),
and the feedback notebook is rebuilt (tools/feedback_notebook.py) from
the data of the student's run: outputs reduced to text and checked images (a million characters
in all), Markdown made inert (no HTML, no links), test cells shown as released plus what the
visible tests printed or raised and the hidden tests' verdict and failure message (capped, the
secret, seeds and hidden-test lines withheld; never their code). The Report names every student
who could not be graded, and why, lists the failure messages and flags answers to read by hand.
Nothing a submission contains is executed here.
"""
import ast
import copy
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sandbox as sandboxing  # noqa: E402
import judge  # noqa: E402
from feedback_notebook import (OUTPUT_CHARS, MESSAGE_CHARS, IMAGE, normalised, inert_markdown,  # noqa: E402,F401
                               safe_message, hidden_test_lines, seeds_of, safe_outputs, capped,
                               feedback_notebook)
from review_flags import PARSING, review_flags  # noqa: E402  (one lock: ast.parse is not thread-safe in 3.11)

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
BIN = Path(sys.executable).parent
PLACEHOLDER_SECRET = "public-placeholder"
NOTEBOOK_BYTES = 50 * 2**20      # the largest notebook read, submitted or run
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader calls alembic


class NoSandbox(RuntimeError):
    pass


# --- the sandbox --------------------------------------------------------------------------

def sandbox_problem() -> str | None:
    """Why this machine cannot sandbox, or None if it can (tools/sandbox.py)."""
    return sandboxing.problem()


def feedback_seconds(timeout: int) -> int:
    """Wall-clock limit of a whole feedback run: fixed, whatever the number of cells (each cell
    also stops after `timeout`)."""
    return 60 + 3 * timeout


def python_environment() -> list[Path]:
    """What a sandbox shows of the grader's Python: the environment, its base installation and
    the course library (only `mpcourse/` of the repository)."""
    shown = {Path(sys.prefix), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent,
             ROOT / "mpcourse"}
    return sorted(p for p in shown if p.is_dir())


def run_sandboxed(command: list[str], *, folder: Path, limits, sandbox: bool, stdin: bytes = b""):
    """tools/sandbox.py's run, with the Python environment shown and the library importable. The
    sandbox sees what `folder` holds, read-only, as $GRADING (/grading), and writes in $WORK (/tmp)."""
    host = folder
    files = {f"/grading/{entry.name}": entry for entry in sorted(folder.iterdir())}
    return sandboxing.run(command, show=python_environment(), files=files, limits=limits, stdin=stdin,
                          env={"PYTHONPATH": str(ROOT), "GRADING": "/grading" if sandbox else str(host),
                               "WORK": "/tmp" if sandbox else str(host / "work"), **threads(limits)}, sandbox=sandbox)


def threads(limits) -> dict:
    """As many maths threads as the sandbox has CPUs (`limits.cpus`, its cgroup's share): torch,
    OpenMP, MKL and OpenBLAS would otherwise start one per core of the machine, and threads beyond
    the share only wait for each other, slowing an honest part when students are graded side by side."""
    count = str(max(1, int(limits.cpus)))
    return {name: count for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


class BrokenEnvironment(RuntimeError):
    pass


ENVIRONMENT_CHECKED: set = set()  # (sandbox, ROOT) found able to grade in this process


def environment_problem(sandbox: bool) -> str | None:
    """Why the course's Python cannot grade inside a sandbox (it cannot import mpcourse, torch or
    nbgrader there), or None. Checked before anyone is graded: otherwise every student comes out
    "NOT GRADED: No module named ..." after a full run."""
    check = "import mpcourse, torch, nbgrader"
    if (sandbox, ROOT) in ENVIRONMENT_CHECKED:
        return None
    with tempfile.TemporaryDirectory(prefix="grading-check-") as scratch:
        (Path(scratch) / "work").mkdir()
        run = run_sandboxed(["python", "-c", check], folder=Path(scratch), limits=sandboxing.Limits(180, 180),
                            sandbox=sandbox)
    if run.returncode == 0:
        ENVIRONMENT_CHECKED.add((sandbox, ROOT))
        return None
    lines = (run.stderr or run.stdout).strip().splitlines() or [f"it was stopped ({run.killed or 'no message'})"]
    return (f"inside the sandbox, the course's Python ({sys.executable}) cannot run `{check}`: {lines[-1]}. "
            f"A sandbox shows only that Python's environment ({sys.prefix}), its base installation and "
            f"{ROOT / 'mpcourse'}: install torch and nbgrader into that environment itself (not a user "
            "site-packages folder or an editable install elsewhere), and run the tools/autograde.py of "
            "the repository whose mpcourse/ the course uses")


# --- reading the source and a submission (JSON only) ------------------------------------

def grade_id(cell: dict) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
    gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return gid if isinstance(gid, str) else None  # a student may write anything there


def source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


# An IPython help line: `torch.nextafter?`, `?torch.nextafter`, `torch.nextafter??`.
HELP_LINE = re.compile(r"^\s*(\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*(#.*)?$")


def without_magics(source: str) -> str:
    """A cell as plain Python: IPython's %magics, !shell and help (`name?`) lines become comments."""
    return "\n".join(f"# (not run by the grader) {line}"
                     if line.lstrip().startswith(("%", "!")) or HELP_LINE.match(line) else line
                     for line in source.split("\n"))


def part_of(test_or_solution_id: str) -> str:
    return test_or_solution_id.split("_")[0]


def defined_names(source: str) -> set[str]:
    """Top-level names a cell defines (nothing is executed: the source is only parsed)."""
    import ast
    try:
        with PARSING:
            tree = ast.parse(without_magics(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # code that cannot be parsed
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def used_names(source: str) -> set[str]:
    import ast
    try:
        with PARSING:
            tree = ast.parse(without_magics(source))
        return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # code that cannot be parsed
        return set()


def parse_notebook(data: bytes) -> dict:
    if len(data) > NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is larger than {NOTEBOOK_BYTES // 2**20} MB")
    try:
        nb = json.loads(data.decode(errors="replace"))
    except RecursionError:
        raise ValueError("the file nests too deeply to be a notebook") from None
    except ValueError:
        raise ValueError("the file is not a Jupyter notebook (not JSON)") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("the file is not a Jupyter notebook (no list of cells)")
    nb["cells"] = [c for c in nb["cells"] if isinstance(c, dict)]
    return nb


def read_notebook(path: Path) -> dict:
    """A notebook of the instructor's (source, release) or of the grader's own making."""
    if path.stat().st_size > NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is larger than {NOTEBOOK_BYTES // 2**20} MB")
    return parse_notebook(path.read_bytes())


def submitted_name(course: Path, student: str, assignment: str) -> str:
    """The file of the submission that is graded: `<assignment>.ipynb` if there is one, else the
    folder's single notebook whatever its name (Colab's "Save a copy" gives `Copy of
    <assignment>.ipynb`; a download may add ` (1)`). Hidden files are not notebooks; two or more
    notebooks, none with the assignment's name, or none at all, are refused with the reason."""
    folder = course / "submitted" / student / assignment
    expected = f"{assignment}.ipynb"
    if os.path.lexists(folder / expected):
        return expected
    found = sorted(entry.name for entry in folder.iterdir()
                   if entry.name.endswith(".ipynb") and not entry.name.startswith("."))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"the submission holds no notebook (.ipynb file): hand in {expected}")
    raise ValueError(f"the submission holds {len(found)} notebooks ({', '.join(found[:5])}) and none is "
                     f"named {expected}: hand in one notebook")


def renamed_note(name: str, assignment: str) -> str | None:
    """What the report says when the graded notebook is not named `<assignment>.ipynb`."""
    if name == f"{assignment}.ipynb":
        return None
    return f"graded {name!r}, the submission's only notebook (not named {assignment}.ipynb)"


def read_submission(course: Path, student: str, assignment: str) -> dict:
    """The submitted notebook (`submitted_name`), read without following a symbolic link: refused
    if it is one, or a folder on its way is one, or its folder holds one (a link would make the
    grader read, and show in the feedback, whatever it points to)."""
    folder = course / "submitted"
    for name in (student, assignment):
        folder = folder / name
        if folder.is_symlink():
            raise ValueError(f"submitted/{folder.relative_to(course / 'submitted')} is a symbolic link, "
                             "not a folder: hand in the notebook itself")
    notebook = folder / submitted_name(course, student, assignment)
    if notebook.is_symlink():
        raise ValueError("the submitted notebook is a symbolic link: hand in the notebook itself")
    for where, folders, files in os.walk(folder):
        for name in folders + files:
            if os.path.islink(os.path.join(where, name)):
                raise ValueError(f"the submission contains a symbolic link ({name}): "
                                 "hand in the notebook itself, no links")
    try:
        fd = os.open(notebook, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == 40:  # ELOOP: the notebook itself is a link
            raise ValueError("the submitted notebook is a symbolic link: hand in the notebook itself") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("the submitted notebook is not a regular file")
        return parse_notebook(f.read(NOTEBOOK_BYTES + 1))


def write_private(path: Path, text: str) -> None:
    """Write a grader's file in the course, never through a symbolic link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


CHECKS_WITH_EXPECTED = {"assert_close", "assert_equal"}


def without_expected(test: str) -> str:
    """A test cell with the expected value of every `assert_close` and `assert_equal` check
    replaced by None: the student's process never holds one, so it cannot record it as its own
    answer (the reference's run keeps them; tools/judge.py compares)."""
    class Strip(ast.NodeTransformer):
        def visit_Call(self, node):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            for child in [*node.args, *node.keywords]:
                self.visit(child)
            if isinstance(node.func, ast.Attribute):
                self.visit(node.func.value)
            if name in CHECKS_WITH_EXPECTED:
                if len(node.args) > 2 or any(k.arg is None for k in node.keywords) or any(
                        isinstance(a, ast.Starred) for a in node.args):
                    raise ValueError(f"line {node.lineno}: call {name} as {name}(actual, expected, ...): "
                                     "the grader must find its expected value to remove it")
                if len(node.args) >= 2:
                    node.args[1] = ast.Constant(None)
                node.keywords = [ast.keyword("expected", ast.Constant(None)) if k.arg == "expected" else k
                                 for k in node.keywords]
            return node

        def visit_Name(self, node):  # `check = grading.assert_close` would hide a call from the grader
            if node.id in CHECKS_WITH_EXPECTED:
                raise ValueError(f"line {node.lineno}: {node.id} is used other than called")
            return node

        def visit_alias(self, node):
            if node.name in CHECKS_WITH_EXPECTED and node.asname not in (None, node.name):
                raise ValueError(f"{node.name} is imported as {node.asname}: call it by its name")
            return node

        def visit_Attribute(self, node):
            if node.attr in CHECKS_WITH_EXPECTED:
                raise ValueError(f"line {node.lineno}: {node.attr} is used other than called")
            self.generic_visit(node)
            return node
    with PARSING:
        tree = ast.parse(test)
    return ast.unparse(ast.fix_missing_locations(Strip().visit(tree)))


def hidden_test_job(source: dict, submission: dict, secret: str, timeout: int, *, reference: bool = False) -> dict:
    """What tools/hidden_tests.py needs: the instructor's set-up and test cells, and per part the
    student's answer cells it depends on (its own, and earlier parts' that define a name it uses).
    The test cells lose their expected values (`without_expected`) unless `reference` (the job of
    the instructor's solution, `submission` then being the source)."""
    cells = {grade_id(c): c for c in source["cells"] if grade_id(c)}
    solutions = [g for g, c in cells.items() if c["metadata"]["nbgrader"].get("solution")]
    tests = [g for g, c in cells.items() if c["metadata"]["nbgrader"].get("grade") and c.get("cell_type") == "code"]
    answers = [(grade_id(c), without_magics(source_text(c))) for c in submission["cells"]
               if c.get("cell_type") == "code" and grade_id(c) in solutions]
    order = [part_of(t) for t in tests]
    parts = []
    for test in tests:
        part = part_of(test)
        expected = set().union(*[defined_names(source_text(cells[g])) for g in solutions
                                 if order.index(part_of(g)) <= order.index(part)])
        needed, wanted = {part}, used_names(source_text(cells[test]))
        for g in solutions:
            if part_of(g) == part:
                wanted |= used_names(source_text(cells[g]))
        wanted |= set().union(*[used_names(src) for g, src in answers if part_of(g) == part])
        for earlier in reversed(order[:order.index(part)]):  # later parts first: they may use earlier ones
            mine = [src for g, src in answers if part_of(g) == earlier]
            theirs = [source_text(cells[g]) for g in solutions if part_of(g) == earlier]
            if wanted & set().union(*map(defined_names, mine + theirs)):
                needed.add(earlier)
                wanted |= set().union(*map(used_names, mine + theirs))
        parts.append({"test_id": test, "names": sorted(expected),
                      "cells": [[g, src] for g, src in answers if part_of(g) in needed],
                      "test": source_text(cells[test]) if reference else without_expected(source_text(cells[test]))})
    return {"secret": secret, "timeout": timeout, "setup": source_text(cells["setup"]), "parts": parts}


def recovered(submission: dict, release: dict) -> tuple[dict, int]:
    """The submission with the nbgrader metadata of each released cell put back on the cell that
    kept its id but lost the metadata (some editors strip it), and how many cells got it back."""
    nb = copy.deepcopy(submission)
    released = {c.get("id"): c for c in release["cells"] if grade_id(c) and isinstance(c.get("id"), str)}
    present = {grade_id(c) for c in nb["cells"]}
    count = 0
    for cell in nb["cells"]:
        source = released.get(cell.get("id")) if isinstance(cell.get("id"), str) else None
        if source is not None and grade_id(cell) is None and grade_id(source) not in present:
            metadata = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
            cell["metadata"] = {**metadata, "nbgrader": copy.deepcopy(source["metadata"]["nbgrader"])}
            present.add(grade_id(source))
            count += 1
    return nb, count


# --- one student, then the whole class ---------------------------------------------------

def nbgrader_command(*args: str) -> list[str]:
    return [str(BIN / "python"), "-m", "nbgrader", *args]


def template_course(course: Path, assignment: str, scratch: Path) -> Path:
    """A course holding only the release of `assignment` and a gradebook made from it: what each
    student's sandbox gets (no hidden test, no other student, not the real gradebook)."""
    template = scratch / "template"
    template.mkdir(parents=True)
    config = (ROOT / "nbgrader_config.py").read_text()  # without the secret: the sandbox gets this copy
    (template / "nbgrader_config.py").write_text("".join(line for line in config.splitlines(keepends=True)
                                                         if "HiddenTests" not in line))
    shutil.copytree(course / "exercises" / assignment, template / "solutions" / assignment)
    result = subprocess.run(nbgrader_command("generate_assignment", assignment, "--force"), cwd=template,
                            env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"could not prepare the release of {assignment}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    shutil.rmtree(template / "exercises")
    return template


# Runs in the sandbox: the release's course, the student's notebook under a neutral name, nbgrader;
# the notebook as run leaves on fd 3 (a pipe), the only way anything comes back.
FEEDBACK_RUN = r"""
mkdir -p "$WORK" && cp -r "$GRADING/template" "$WORK/course" || exit 98
mkdir -p "$WORK/course/submitted/student/$0" || exit 98
cp "$GRADING/submission.ipynb" "$WORK/course/submitted/student/$0/$0.ipynb" || exit 98
cd "$WORK/course" && python -m nbgrader autograde "$0" --student student --force "--Execute.timeout=$1" >&2
cat "autograded/student/$0/$0.ipynb" >&3
"""


def feedback_limits(timeout: int) -> "sandboxing.Limits":
    seconds = feedback_seconds(timeout)
    return sandboxing.Limits(seconds=seconds, cpu_seconds=seconds)


def hidden_test_limits(parts: int, timeout: int) -> "sandboxing.Limits":
    """Each part stops after `timeout` s of CPU time or 4x that of wall-clock time (hidden_tests.py);
    parts: the instructor's, not the student's."""
    return sandboxing.Limits(seconds=60 + 4 * parts * timeout, cpu_seconds=60 + parts * (timeout + 3))


def grade_student(course, assignment, student, template, source, release, secret, timeout, sandbox, execute):
    """(verdicts or None, the notebook as run (or as submitted), problem, note, review flags) for one
    student. The notebook as run comes from the sandbox: data to sanitise, nothing to trust."""
    try:
        submission = read_submission(course, student, assignment)
        renamed = renamed_note(submitted_name(course, student, assignment), assignment)
    except (OSError, ValueError) as error:
        return None, None, f"the submission could not be read: {error}", None, None
    submission, restored = recovered(submission, release)
    answers = {grade_id(c) for c in release["cells"] if (c["metadata"].get("nbgrader") or {}).get("solution")}
    if not answers & {grade_id(c) for c in submission["cells"]}:
        return None, submission, ("no answer cell of the notebook carries the exercise's nbgrader metadata "
                                  "(an editor removed it, and the cells' ids too): grade it by hand"), renamed, None
    if restored:
        renamed = "; ".join(filter(None, [renamed, f"{restored} cells had lost their nbgrader metadata: "
                                                   "recovered from the cells' ids"]))
    flags = review_flags(submission)
    with tempfile.TemporaryDirectory(prefix=f"grading-{assignment}-") as scratch:
        ran, note = submission, renamed
        if execute:
            folder = Path(scratch) / "feedback"
            folder.mkdir()
            shutil.copytree(template, folder / "template")
            (folder / "submission.ipynb").write_text(json.dumps(normalised(submission, release)))
            run = run_sandboxed(["/bin/sh", "-c", FEEDBACK_RUN, assignment, str(timeout)], folder=folder,
                                limits=feedback_limits(timeout), sandbox=sandbox)
            try:
                ran = parse_notebook(run.result)  # data from the pipe, never a file it could replace
            except ValueError:
                why = (f"ran past the {feedback_seconds(timeout)} s allowed for the whole notebook" if run.killed == "time"
                       else "used more than its CPU time" if run.killed else f"failed ({run.stderr[-300:]})")
                note = "; ".join(filter(None, [renamed, f"its notebook run {why}; the feedback shows it as submitted"]))
        records = {}
        try:
            jobs = (("reference", hidden_test_job(source, source, secret, timeout, reference=True)),
                    ("student", hidden_test_job(source, submission, secret, timeout)))
        except (ValueError, SyntaxError) as error:
            return None, ran, f"the exercise's tests cannot be graded (fix them in solutions/): {error}", note, flags
        for who, job in jobs:
            records[who], problem = run_hidden_tests(Path(scratch) / who, job, sandbox, timeout)
            if problem:
                return None, ran, f"the hidden-test runner ({who}) {problem}", note, flags
        try:
            return judge.judge(records["reference"], records["student"]), ran, None, note, flags
        except judge.ReferenceProblem as error:
            return None, ran, f"the instructor's reference solution fails its own tests: {error}", note, flags


def run_hidden_tests(folder: Path, job: dict, sandbox: bool, timeout: int) -> tuple[dict | None, str | None]:
    """(record of each part, None) from tools/hidden_tests.py run on `job` in a sandbox of its own, or
    (None, why not). The record leaves on the result pipe, as JSON: data, never code. Both runs hash
    strings alike (PYTHONHASHSEED=0), so a test that walks a set checks in the same order in each."""
    folder.mkdir()
    shutil.copy(TOOLS / "hidden_tests.py", folder / "hidden_tests.py")
    run = run_sandboxed(["/bin/sh", "-c", 'exec env PYTHONHASHSEED=0 python "$GRADING/hidden_tests.py" - >&3 3>&-'], folder=folder,
                        limits=hidden_test_limits(len(job["parts"]), timeout), sandbox=sandbox,
                        stdin=json.dumps({**job, "sandboxed": sandbox}).encode())
    line = run.result.decode(errors="replace").strip().rsplit("\n", 1)[-1] if run.returncode == 0 else ""
    if not line.startswith("RESULT "):
        return None, ("ran out of time" if run.killed else f"failed: {(run.stderr or run.stdout)[-500:]}")
    try:
        return json.loads(line.removeprefix("RESULT ")), None
    except (ValueError, RecursionError):
        return None, "sent back a damaged record"


# grade() and Report live in tools/schedule.py, the gradebook's writes and the secret in
# tools/gradebook.py; they stay importable from here (`grader.grade`, `grader.register`, ...),
# loaded when first asked for (those modules import this one).
MOVED = {"schedule": ("Report", "grade"),
         "gradebook": ("registered", "register", "SECRET_VARIABLE", "SECRET_FILE", "SecretError", "tracked",
                       "instructor_secret", "record")}


def __getattr__(name: str):
    import importlib
    for module, names in MOVED.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'grader' has no attribute {name!r}")
