"""The runs of one student, each in a sandbox (grader.sandbox): the side that runs
student code. Nothing of a submission runs in this process: it only prepares each run's folder and
job, starts the sandbox, and reads back what came out of it, as data.

    run_feedback(template, submission, release, assignment, timeout, sandbox, folder) -> (notebook as run or None, why not)
    hidden_test_job(source, submission, secret, timeout, reference=False) -> the job of grader/hidden_tests.py
    run_hidden_tests(folder, job, sandbox, timeout, library=None) -> (record of each part, None) or (None, why not)
    run_references(folder, job, secrets, sandbox, timeout) -> ([record of each part, per secret], None) or (None, why not)
    run_students(folder, jobs, timeout, library) -> [record of each part, or None, per student's job]
    read_records(output, job) -> (records, None) or (None, why not)   # grader/hidden_tests.py output

1. The feedback run: the submitted notebook runs under nbgrader against the *release* (visible
   tests only), in a copy of a course that holds nothing but the release (`template_course`), so
   the feedback shows the student's outputs and ticks; the notebook as run comes back over a
   pipe, as data. No grade depends on this run, and it stops after `feedback_seconds(timeout)`
   whatever the number of cells.
2. The student's hidden-test run: grader/hidden_tests.py runs each part's test cell, hidden tests
   included, in the student's copy (grader/student_copy.py: no expected value, nothing that
   computes one), on the student's answer cells only, importing a copy of the course library less
   what the parts ask students to write (grader/withheld.py); the job goes in on its stdin, the
   record comes out on the result pipe. grader/schedule.py runs up to 16 students' hidden tests in
   one sandbox, one student after another (`run_students`; grader/hidden_tests.py, `students`, says
   what keeps each student's run from the next): the imports are most of a run's cost, and a
   batch pays them once. A student whose batched run did not end well gets a run of their own.
3. The reference run: the same tests, expected values kept, on the instructor's solution cells,
   with the same secret. The reference's code is the same for every student, only the secret
   differs: one run computes the records of many students (`run_references`, each secret's parts
   in children of their own), and grader/schedule.py makes one such run per worker before the
   students' runs start.

Every sandbox sees the system's /usr, the Python environment, the course library (`mpcourse/`
only, never `grader/`; the student's hidden-test run, only its copy) and the files of its run, as an unprivileged user with a cleared
environment, RAM-backed /tmp the only writable place, limits on processes, memory, CPU and
wall-clock time (grader/sandbox.py).
"""
import ast
import functools
import json
import shutil
import symtable
import sys
import tempfile
from pathlib import Path

from grader import sandbox as sandboxing
from grader.course import ROOT, generate_assignment
from grader.notebooks import (example, grade_id, json_data, parse_notebook, part_of, source_text, student_code,
                              without_magics)
from grader.review_flags import PARSING, not_parsed  # one lock: ast.parse is not thread-safe in 3.11
from grader.student_copy import CHECKS_WITH_EXPECTED, student_copy, without_expected  # noqa: F401
from grader.withheld import declared
from mpcourse.records import record_problem

HIDDEN_TESTS = Path(__file__).resolve().parent / "hidden_tests.py"  # copied, alone, into its sandbox


class NoSandbox(RuntimeError):
    pass


# --- the sandbox --------------------------------------------------------------------------

def sandbox_problem() -> str | None:
    """Why this machine cannot sandbox, or None if it can (grader/sandbox.py)."""
    return sandboxing.problem()


def feedback_seconds(timeout: int) -> int:
    """Wall-clock limit of a whole feedback run: fixed, whatever the number of cells (each cell
    also stops after `timeout`)."""
    return 60 + 3 * timeout


def python_environment(library: bool = True) -> list[Path]:
    """What a sandbox shows of the grader's Python: the environment, its base installation and
    the course library (only `mpcourse/` of the repository; not `library`: the sandbox gets a copy)."""
    shown = {Path(sys.prefix), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent,
             *([ROOT / "mpcourse"] if library else [])}
    return sorted(p for p in shown if p.is_dir())


def run_sandboxed(command: list[str], *, folder: Path, limits, sandbox: bool, stdin: bytes = b"",
                  library: Path | None = None, env: dict | None = None, stall_seconds: float | None = None):
    """grader/sandbox.py's run, with the Python environment shown and the library importable. The
    sandbox sees what `folder` holds, read-only, as $GRADING (/grading), and writes in $WORK (/tmp).
    `library`: a folder holding the copy of `mpcourse/` to import (grader/withheld.py), shown as
    /grading/library instead of the course's."""
    host = folder
    files = {f"/grading/{entry.name}": entry for entry in sorted(folder.iterdir())}
    if library is not None:
        files["/grading/library"] = library
    path = (("/grading/library" if sandbox else str(library)) if library is not None else str(ROOT))
    return sandboxing.run(command, show=python_environment(library is None), files=files, limits=limits, stdin=stdin,
                          env={"PYTHONPATH": path, "GRADING": "/grading" if sandbox else str(host),
                               "WORK": "/tmp" if sandbox else str(host / "work"), **threads(limits), **(env or {})},
                          sandbox=sandbox, stall_seconds=stall_seconds)


def threads(limits) -> dict:
    """As many maths threads as the sandbox has CPUs (`limits.cpus`, its cgroup's share): torch,
    OpenMP, MKL and OpenBLAS would otherwise start one per core of the machine, and threads beyond
    the share only wait for each other, slowing an honest part when students are graded side by side."""
    count = str(max(1, int(limits.cpus)))
    return {name: count for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def installed_library() -> Path | None:
    """A copy of `mpcourse/` inside the Python environment a sandbox shows (a non-editable
    install), or None."""
    import site
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        if (Path(folder) / "mpcourse").is_dir():
            return Path(folder) / "mpcourse"
    return None


class BrokenEnvironment(RuntimeError):
    pass


ENVIRONMENT_CHECKED: set = set()  # (sandbox, ROOT) found able to grade in this process
# The check costs a sandboxed Python importing torch and nbgrader, about 5 s of CPU, at the start of
# every `python -m grader grade` (instructor walkthrough 47b, K2): its success is kept in the
# environment, for the same repository, sandbox setting and installed packages (environment_key).
CHECKED_STAMP = ".mpcourse-grading-checked"


def environment_key(sandbox: bool) -> str:
    """What the check's success holds for: the Python, the repository, the sandbox setting, and when
    each folder of installed packages (and the course library) last changed (pip changes them)."""
    import site
    folders = [*site.getsitepackages(), ROOT / "mpcourse"]
    changed = [f"{folder}:{Path(folder).stat().st_mtime_ns if Path(folder).exists() else None}" for folder in folders]
    return "\n".join([sys.executable, str(ROOT), str(sandbox), *changed]) + "\n"


def environment_problem(sandbox: bool) -> str | None:
    """Why the course's Python cannot grade inside a sandbox (it cannot import mpcourse, torch or
    nbgrader there), or None. Checked before anyone is graded: otherwise every student comes out
    "NOT GRADED: No module named ..." after a full run."""
    check = "import mpcourse, torch, nbgrader"
    if (sandbox, ROOT) in ENVIRONMENT_CHECKED:
        return None
    installed = installed_library()
    if installed:
        return (f"the course library is installed in the Python environment itself ({installed}), which every "
                "sandbox shows: a student's sandbox could read there the functions grading withholds from it "
                "(grader/withheld.py). Install it editable (pip install -e .) or not at all")
    stamp, key = Path(sys.prefix) / CHECKED_STAMP, environment_key(sandbox)
    try:
        if stamp.read_text() == key:  # checked by an earlier command, and nothing installed since
            ENVIRONMENT_CHECKED.add((sandbox, ROOT))
            return None
    except OSError:
        pass
    with tempfile.TemporaryDirectory(prefix="grading-check-") as scratch:
        (Path(scratch) / "work").mkdir()
        run = run_sandboxed(["python", "-c", check], folder=Path(scratch), limits=sandboxing.Limits(180, 180),
                            sandbox=sandbox)
    if run.returncode == 0:
        ENVIRONMENT_CHECKED.add((sandbox, ROOT))
        try:
            stamp.write_text(key)
        except OSError:  # an environment the instructor cannot write to: checked again next time
            pass
        return None
    lines = (run.stderr or run.stdout).strip().splitlines() or [f"it was stopped ({run.killed or 'no message'})"]
    return (f"inside the sandbox, the course's Python ({sys.executable}) cannot run `{check}`: {lines[-1]}. "
            f"A sandbox shows only that Python's environment ({sys.prefix}), its base installation and "
            f"{ROOT / 'mpcourse'}: install torch and nbgrader into that environment itself (not a user "
            "site-packages folder or an editable install elsewhere), and run `python -m grader` from "
            "the repository whose mpcourse/ the course uses")


def defined_names(source: str) -> frozenset[str]:
    """Top-level names a cell defines (nothing is executed: the source is only parsed; none for a
    cell the grader's process does not parse, review_flags.not_parsed)."""
    return frozenset() if not_parsed(source) else _defined_names(source)


# Each part asks again about the same cells: parsed once. Only cells short enough to parse are
# kept, and at most 256 of them (at most 200,000 characters each).
@functools.lru_cache(maxsize=256)
def parsed(source: str) -> ast.Module | None:
    """A cell's code as the runner reads it (IPython's lines commented out), or None where it cannot
    be parsed. Only read, never changed: the tree is shared."""
    try:
        with PARSING:
            return ast.parse(without_magics(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # code that cannot be parsed
        return None


@functools.lru_cache(maxsize=256)
def _defined_names(source: str) -> frozenset[str]:
    tree = parsed(source)
    if tree is None:
        return frozenset()
    names = set()
    for node in module_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}  # `*`: every name (ALL)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            names |= {n.id for item in node.items if item.optional_vars
                      for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)}
    return frozenset(names)


ALL = "*"  # in defined_names: a star import, which may define any name


def module_level(body: list) -> list:
    """The statements that run at a cell's top level: also those inside its if/else, try, for,
    while and with blocks (a function defined in `if device == "cuda": ... else: ...` is defined;
    red team 45c, A03b), never those of a function or class body. In the order of the source,
    without recursion: a chain of 1,000 `elif`s is 1,000 nested blocks (red team 30, A02: a
    RecursionError left its student ungraded on every run)."""
    found, pending = [], [iter(body)]
    while pending:
        node = next(pending[-1], None)
        if node is None:
            pending.pop()
            continue
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            inner = [statement for field in ("body", "orelse", "finalbody")
                     if isinstance(getattr(node, field, None), list) for statement in getattr(node, field)]
            inner += [statement for handler in getattr(node, "handlers", []) for statement in handler.body]
            inner += [statement for case in getattr(node, "cases", []) for statement in case.body]
            pending.append(iter(inner))
    return found


def free_names(source: str) -> frozenset[str]:
    """Names a cell reads but binds nowhere (assignment, parameter, def, import, loop, `as`): what it
    needs from cells before it. Builtins included; none for a cell the grader does not parse."""
    return frozenset() if not_parsed(source) else _free_names(source)


@functools.lru_cache(maxsize=256)
def _free_names(source: str) -> frozenset[str]:
    tree = parsed(source)
    if tree is None:
        return frozenset()
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return frozenset(read - bound)


def used_names(source: str) -> frozenset[str]:
    return frozenset() if not_parsed(source) else _used_names(source)


@functools.lru_cache(maxsize=256)
def cell_table(source: str) -> symtable.SymbolTable | None:
    """The symbol table of a cell as the runner reads it, or None where it cannot be built. Only read,
    never changed: the table is shared (used_names and bound_names ask about the same cells)."""
    tree = parsed(source)
    if tree is None:
        return None
    try:
        with PARSING:
            return symtable.symtable(ast.unparse(tree), "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


@functools.lru_cache(maxsize=256)
def _used_names(source: str) -> frozenset[str]:
    """The names a cell may read from the notebook's globals: every name at the top level, and in a
    function, class, lambda or comprehension only the names it reads as globals, not its parameters
    and locals (red team 45h, A04: Part 3's `matmul_cost(m, n, k, ...)` has a parameter `n`, so a
    heavy try-out cell of Part 2 that set `n` was run with Part 3's tests, past their time)."""
    tree = parsed(source)
    if tree is None:
        return frozenset()
    everything = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    top = cell_table(source)
    if top is None:
        return everything  # read it all, as before
    used, tables = {s.get_name() for s in top.get_symbols()}, list(top.get_children())
    while tables:
        table = tables.pop()
        tables += table.get_children()
        used |= {s.get_name() for s in table.get_symbols() if s.is_global() or s.is_declared_global()}
    return frozenset(used & everything)


def bound_names(source: str) -> frozenset[str]:
    """The names a cell binds at its top level (assigned, imported, defined, loop targets): a test cell's
    own `seed = ...` needs no earlier cell that sets `seed` (walkthrough 4: ex7 Part 4's test cell
    sets `seed`, so a student's slow Part 2 try-out that also set `seed` ran with Part 4's tests)."""
    top = None if not_parsed(source) else cell_table(source)
    if top is None:
        return frozenset()
    return frozenset(s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace())


def hidden_test_job(source: dict, submission: dict, secret: str, timeout: int, *, reference: bool = False) -> dict:
    """What grader/hidden_tests.py needs: the instructor's set-up and test cells, and per part the
    student's cells it depends on (grader/notebooks.py's `student_code`), in the notebook's order: its
    own answer cells and the cells added above its test cell; earlier parts' cells when they define a
    name it uses (again and again, until nothing new is needed); and the notebook's own example cells
    (and the set-up cell, if the student changed it) above the test cell that define a name it uses.
    The test cells are the student's copy (grader/student_copy.py) unless `reference` (the job of
    the instructor's solution, `submission` then being the source). ValueError: the instructor's
    tests would leave a reference computation in the student's copy, or use a library function
    they withhold (grader/withheld.py)."""
    withheld = [] if reference else declared(source)
    cells = {grade_id(c): c for c in source["cells"] if grade_id(c)}
    solutions = [g for g, c in cells.items() if c["metadata"]["nbgrader"].get("solution")]
    tests = [g for g, c in cells.items() if c["metadata"]["nbgrader"].get("grade") and c.get("cell_type") == "code"]
    answers = student_code(submission, source)
    order = [part_of(t) for t in tests]
    parts = []
    for test in tests:
        part = part_of(test)
        expected = set().union(*[defined_names(source_text(cells[g])) for g in solutions
                                 if order.index(part_of(g)) <= order.index(part)])
        needed, wanted = {part}, used_names(source_text(cells[test])) - bound_names(source_text(cells[test]))
        for g in solutions:
            if part_of(g) == part:
                wanted |= used_names(source_text(cells[g]))
        wanted |= set().union(*[used_names(src) for g, src in answers if part_of(g) == part and not example(g)])
        # What the student's own code reads without binding it: the notebook's example cells are run
        # only for such a name (the tests' names and a function's locals do not count).
        free = set().union(*[free_names(src) for g, src in answers if part_of(g) == part and not example(g)])
        examples, grew = set(), True
        while grew:  # until nothing new is needed: a part taken in may use a part passed over before (issue 48)
            grew = False
            for earlier in reversed(order[:order.index(part)]):  # later parts first: they may use earlier ones
                if earlier in needed:
                    continue
                mine = [src for g, src in answers if part_of(g) == earlier and not example(g)]
                theirs = [source_text(cells[g]) for g in solutions if part_of(g) == earlier]
                defines = set().union(*map(defined_names, mine + theirs))
                if wanted & defines or ALL in defines:  # a star import may define what this part uses (A03a)
                    needed.add(earlier)
                    wanted |= set().union(*map(used_names, mine + theirs))
                    free |= set().union(*map(free_names, mine))
                    grew = True
            for g, src in answers:  # the notebook's own cells above the test cell: only for a name they define
                if example(g) and g not in examples and order.index(part_of(g)) <= order.index(part) \
                        and free & defined_names(src):
                    examples.add(g)
                    wanted |= used_names(src)
                    free |= free_names(src)
                    grew = True
        try:
            copy = source_text(cells[test]) if reference else student_copy(source_text(cells[test]), expected, withheld)
        except ValueError as error:
            raise ValueError(f"{test}: {error}") from None
        parts.append({"test_id": test, "names": sorted(expected),
                      "cells": [[g, src] for g, src in answers
                                if (part_of(g) in needed and not example(g)) or g in examples], "test": copy})
    return {"secret": secret, "timeout": timeout, "setup": source_text(cells["setup"]), "parts": parts}


# What of nbgrader_config.py a notebook run for the feedback uses: the settings of these classes
# (`c.<class>.<name> = ...`), and of CourseDirectory only its folders' names.
RUN_SETTINGS = ("Execute", "BoundedOutputExecute", "LimitOutput", "Autograde", "IgnorePattern",
                "ClearMetadataPreprocessor", "CheckCellMetadata", "SaveAutoGrades", "AssignLatePenalties")
COURSE_FOLDERS = ("course_id", "source_directory", "release_directory")


def notebook_run_config(text: str) -> str:
    """The config a feedback sandbox gets, made from the course's nbgrader_config.py (`text`): its
    imports, its classes (a preprocessor of the course's own) and its RUN_SETTINGS, rewritten from
    the syntax tree; nothing else. Every sandbox can read its config, and a student's notebook can
    print it into the feedback page (red team 24, A04: the instructor's comments, an exchange path,
    and the gradebook's address, which the guide puts there, with its password if it holds one).
    The grading secret's setting is no run setting either. ValueError, in a sentence: the file does
    not parse (a grading then stops before anyone is graded, as for nbgrader's own error)."""
    def setting(node) -> bool:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name):
            return target.id == "c"  # c = get_config()
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                and isinstance(target.value.value, ast.Name) and target.value.value.id == "c"):
            return False
        owner, name = target.value.attr, target.attr
        return owner in RUN_SETTINGS or (owner == "CourseDirectory" and name in COURSE_FOLDERS)
    try:
        with PARSING:
            tree = ast.parse(text)
    except SyntaxError as error:
        raise ValueError(f"nbgrader_config.py does not parse (line {error.lineno}: {error.msg}): fix it, "
                         "then grade again") from None
    kept = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef)) or setting(node)]
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n"


def template_course(course: Path, assignment: str, scratch: Path) -> Path:
    """A course holding only the release of `assignment` and a gradebook made from it: what each
    student's sandbox gets (no hidden test, no other student, not the real gradebook, and of
    nbgrader_config.py only what a notebook run uses: notebook_run_config)."""
    template = scratch / "template"
    template.mkdir(parents=True)
    config = notebook_run_config((ROOT / "nbgrader_config.py").read_text())
    # The template's gradebook is its own, whatever gradebook the course names (a PostgreSQL one,
    # which no sandbox reaches: the feedback run failed and every page lost its outputs, issue 47).
    (template / "nbgrader_config.py").write_text(config + 'c.CourseDirectory.db_url = "sqlite:///gradebook.db"\n')
    shutil.copytree(course / "exercises" / assignment, template / "solutions" / assignment)
    generate_assignment(template, assignment, db_url=f"sqlite:///{template / 'gradebook.db'}")
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


# The feedback run draws figures as a notebook does (inline, PNG in the page); the sandbox's default
# backend, Agg, draws nowhere: every feedback page came back without its figures (issue 48 walkthrough).
NOTEBOOK_FIGURES = {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}


# Why a run ended when one of its processes was found stopped (sandbox.stopped_in): the answer
# stopped a process of the grader's, or its own; the run ends there, not at its limit (red team 24).
SUSPENDED = "was ended: a process of its run was stopped (SIGSTOP), which no honest notebook does"


def run_feedback(folder: Path, template: Path, notebook: dict, assignment: str, timeout: int,
                 sandbox: bool) -> tuple[dict | None, str | None]:
    """(the notebook as run, None) from `nbgrader autograde` of `notebook` against the release
    (`template`) in a sandbox of its own, or (None, why not). The notebook comes back over the
    result pipe: data to sanitise, nothing to trust."""
    folder.mkdir()
    shutil.copytree(template, folder / "template")
    (folder / "submission.ipynb").write_text(json.dumps(notebook))
    run = run_sandboxed(["/bin/sh", "-c", FEEDBACK_RUN, assignment, str(timeout)], folder=folder,
                        limits=feedback_limits(timeout), sandbox=sandbox, env=NOTEBOOK_FIGURES)
    try:
        return parse_notebook(run.result), None  # data from the pipe, never a file it could replace
    except ValueError:
        return None, (f"ran past the {feedback_seconds(timeout)} s allowed for the whole notebook" if run.killed == "time"
                      else SUSPENDED if run.killed == "suspended"
                      else "used more than its CPU time" if run.killed else f"failed ({run.stderr[-300:]})")


def hidden_test_limits(parts: int, timeout: int) -> "sandboxing.Limits":
    """Each part stops after `timeout` s of CPU time or 4x that of wall-clock time (hidden_tests.py);
    parts: the instructor's, not the student's."""
    return sandboxing.Limits(seconds=60 + 4 * parts * timeout, cpu_seconds=60 + parts * (timeout + 3))


def runner_folder(folder: Path) -> None:
    """`folder`, made to hold grader/hidden_tests.py and the one module it imports (issue 45)."""
    folder.mkdir()
    shutil.copy(HIDDEN_TESTS, folder / "hidden_tests.py")
    shutil.copy(HIDDEN_TESTS.with_name("no_threads.py"), folder / "no_threads.py")


def run_hidden_tests(folder: Path, job: dict, sandbox: bool, timeout: int,
                     library: Path | None = None) -> tuple[dict | None, str | None]:
    """(record of each part, None) from grader/hidden_tests.py run on `job` in a sandbox of its own, or
    (None, why not). The record leaves on the result pipe, as JSON: data, never code. Both runs hash
    strings alike (PYTHONHASHSEED=0), so a test that walks a set checks in the same order in each.
    `library`: the copy of the course library the run imports (the student's: grader/withheld.py)."""
    runner_folder(folder)
    parts = len(job["parts"]) * len(job.get("secrets") or [job["secret"]])  # a batch: every secret's parts
    run = run_sandboxed(["/bin/sh", "-c", 'exec env PYTHONHASHSEED=0 python "$GRADING/hidden_tests.py" - >&3 3>&-'], folder=folder,
                        limits=hidden_test_limits(parts, timeout), sandbox=sandbox, library=library,
                        stdin=json.dumps({**job, "sandboxed": sandbox}).encode())
    if run.returncode != 0 or not run.result[-200:].rstrip().rsplit(b"\n", 1)[-1].startswith(b"RESULT "):
        return None, (SUSPENDED if run.killed == "suspended" else "ran out of time" if run.killed
                      else f"failed: {(run.stderr or run.stdout)[-500:]}")
    return read_records(run.result, job)


def run_students(folder: Path, jobs: list[dict], timeout: int, library: Path) -> list[dict | None]:
    """[each job's records ({test_id: record}), or None] from one sandboxed run of
    grader/hidden_tests.py that grades the students' `jobs` one after another (hidden_tests.py,
    `students`, says how no student's run reaches the next one's): what a run of each alone gives,
    without importing torch and the rest once per student. None: that student, and every one after
    a student whose run did not end well, gets a run of their own (run_hidden_tests). Sandboxed
    only. The run ends as soon as one student's tests take longer than a run of their own may
    (hidden_test_limits): no student holds the others up for longer than that."""
    runner_folder(folder)
    each = [hidden_test_limits(len(job["parts"]), timeout) for job in jobs]
    frames = [json.dumps({**job, "sandboxed": True}).encode() for job in jobs]
    stdin = json.dumps({"students": len(jobs), "sandboxed": True}).encode() + b"\n" + \
        b"".join(b"%d\n" % len(frame) + frame for frame in frames)
    limits = sandboxing.Limits(seconds=sum(limit.seconds for limit in each),
                               cpu_seconds=sum(limit.cpu_seconds for limit in each))
    run = run_sandboxed(["/bin/sh", "-c", 'exec env PYTHONHASHSEED=0 python "$GRADING/hidden_tests.py" --students >&3 3>&-'],
                        folder=folder, limits=limits, sandbox=True, library=library, stdin=stdin,
                        stall_seconds=max(limit.seconds for limit in each))
    found: list[dict | None] = [None] * len(jobs)
    number, segment = 0, []
    for line in run.result.split(b"\n"):
        if not line.startswith(b"END "):
            segment.append(line)
            continue
        if number == len(jobs) or line != b"END %d 0" % number:
            break
        found[number], problem = read_records(b"\n".join(segment), jobs[number])
        if problem:
            break
        number, segment = number + 1, []
    return found


def read_records(output: bytes, job: dict) -> tuple[dict | list | None, str | None]:
    """(the records grader/hidden_tests.py wrote for `job`, None), or (None, "sent back a damaged
    record"): {test_id: record} (a batch: one such per secret run, in their order). Each part's record
    is a line of its own, and its size is checked before it is parsed (mpcourse.records.record_problem):
    one too large to read costs that part only (red team 45c, A06b), as the sandbox's runner also does,
    and the grader's own memory stays bounded whatever the sandbox sent."""
    lines = output.split(b"\n")  # copies the output once; each line is then read alone
    while lines and not lines[-1].strip():
        lines.pop()
    try:
        count = int(lines[-1][7:19]) if lines and lines[-1].startswith(b"RESULT ") else 0
    except ValueError:
        return None, "sent back a damaged record"
    wanted = [part["test_id"] for part in job["parts"]]
    if not 1 <= count <= len(job.get("secrets") or [job["secret"]]):
        return None, "sent back a damaged record"
    found: list[dict] = [{} for _ in range(count)]
    for line in lines[:-1]:
        tab = line.find(b"\t", 7, 1000)
        if not line.startswith(b"RECORD\t") or tab < 0:
            continue
        try:
            number, test_id = json.loads(line[7:tab])
        except (ValueError, TypeError):
            continue
        if isinstance(number, int) and 0 <= number < count and isinstance(test_id, str) and test_id in wanted \
                and test_id not in found[number]:
            found[number][test_id] = part_record(line[tab + 1:])
    if any(len(records) != len(wanted) for records in found):
        return None, "sent back a damaged record"
    return (found if "secrets" in job else found[0]), None


def part_record(text: bytes) -> dict:
    """One part's record from its JSON `text`, read only if its size allows (record_problem)."""
    problem = record_problem(text)
    if problem:
        return {"observations": [], "stopped": f"the tests of this part {problem}", "refused": problem}
    try:
        record = json_data(text.decode(errors="replace"))
    except (ValueError, RecursionError):
        record = None
    if not (isinstance(record, dict) and isinstance(record.get("observations"), list)):
        return {"observations": [], "stopped": "the tests of this part sent back a damaged record"}
    flags = {key: str(record[key])[:300] for key in ("refused", "flagged") if record.get(key)}
    return {"observations": record["observations"], "stopped": record.get("stopped"), **flags}


def run_references(folder: Path, job: dict, secrets: list[str], sandbox: bool,
                   timeout: int) -> tuple[list | None, str | None]:
    """([the reference's record on each of `secrets`, in their order], None) from one run of
    grader/hidden_tests.py in a sandbox of its own (more, one after another, where the records
    outgrow a run's share of the result pipe: hidden_tests.batched), or (None, why not). `job`: the reference's
    (hidden_test_job(..., reference=True)). One process instead of one per student: each part of
    each secret still runs in a child of its own, forked from a process that runs nothing of the
    job, so each record is the one a run of that secret alone gives; the limits grow with the
    secrets (hidden_test_limits of every secret's parts)."""
    found = []
    while len(found) < len(secrets):  # a run may stop early (hidden_tests.batched): the rest in another
        rest = list(secrets[len(found):])
        records, problem = run_hidden_tests(folder if not found else folder.with_name(f"{folder.name}-{len(found)}"),
                                            {**job, "secrets": rest}, sandbox, timeout)
        if not problem and not (isinstance(records, list) and 1 <= len(records) <= len(rest)
                                and all(isinstance(r, dict) for r in records)):
            problem = "sent back a damaged record"
        if problem:
            return None, problem
        found += records
    return found, None
