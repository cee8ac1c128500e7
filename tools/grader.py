"""Grading that students cannot fool: the trusted side, which an instructor audits.

    grade(course, assignment, students=None, sandbox=True) -> Report

For each student, in a sandbox of their own (bubblewrap: own process, network and file-system
view, the course directory hidden, time and memory limits; every process in it ends with it):

1. the submitted notebook runs under nbgrader against the *release* (visible tests only), so the
   feedback shows the student's outputs and ticks. No grade depends on this run;
2. `tools/hidden_tests.py` runs each part's test cell, hidden tests included, from the
   instructor's source, on the student's answer cells only (see that file).

Then, here, outside any sandbox: the points of each passed part are written to the gradebook
with nbgrader's own API, and the feedback notebook is rebuilt from the student's run: outputs
reduced to text and checked images, Markdown and raw HTML made inert, test cells shown as
released plus the hidden tests' verdict and failure message (never their code). The Report names
every student who could not be graded, and why. Nothing a submission contains is executed here;
only its JSON is read.
"""
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
BIN = Path(sys.executable).parent
PLACEHOLDER_SECRET = "public-placeholder"
MEMORY_BYTES = 6 * 2**30          # address space per process
FILE_BYTES = 200 * 2**20          # largest file a sandboxed process may write
PARSING = threading.Lock()      # CPython 3.11's ast.parse is not safe in two threads at once
IMAGE = re.compile(r"^[A-Za-z0-9+/=\s]*$")
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader calls alembic


@dataclass
class Report:
    scores: dict = field(default_factory=dict)      # student -> {test cell: points}
    messages: dict = field(default_factory=dict)    # student -> {test cell: failure message}
    not_graded: dict = field(default_factory=dict)  # student -> why no hidden-test result (0 recorded)
    notes: dict = field(default_factory=dict)       # student -> what else went wrong (feedback run)


class NoSandbox(RuntimeError):
    pass


# --- the sandbox --------------------------------------------------------------------------

def sandbox_problem() -> str | None:
    """Why this machine cannot sandbox, or None if bubblewrap works here."""
    if not shutil.which("bwrap"):
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:300]}"
    return None


def confined(command: list[str], *, writable: Path, hide: list[Path], seconds: int, sandbox: bool) -> list[str]:
    """`command` with limits (prlimit) and, if `sandbox`, inside bubblewrap: the whole file system
    read-only, /tmp and `hide` replaced by empty folders, `writable` the only writable place, no
    network, own process namespace, no capabilities."""
    limits = ["prlimit", f"--as={MEMORY_BYTES}", f"--fsize={FILE_BYTES}", f"--cpu={seconds}", "--core=0", "--"]
    if not sandbox:
        return limits + command
    hidden = [arg for path in hide if path.exists() for arg in
              (("--tmpfs", str(path)) if path.is_dir() else ("--ro-bind", "/dev/null", str(path)))]
    # The empty /tmp would also hide the course code and its Python where they live under /tmp
    # (a fresh clone made with mktemp): put those back, read-only, before hiding what must be hidden.
    needed = {ROOT, Path(sys.prefix).resolve()}
    kept = [arg for path in sorted(needed) if path.is_relative_to("/tmp") for arg in ("--ro-bind", str(path), str(path))]
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *kept, *hidden,
            "--bind", str(writable), str(writable), "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--setenv", "HOME", str(writable), "--setenv", "MPLBACKEND", "Agg",
            "--setenv", "JUPYTER_RUNTIME_DIR", "/tmp/jupyter-runtime", "--chdir", str(writable),
            "--", *limits, *command]


def run_confined(command, *, writable, hide, seconds, sandbox) -> subprocess.CompletedProcess | None:
    """Run `command` confined; None if it ran past `seconds` (it is killed, with all it started)."""
    try:
        return subprocess.run(confined(command, writable=writable, hide=hide, seconds=seconds, sandbox=sandbox),
                              cwd=writable, env=ENV, capture_output=True, text=True, timeout=seconds,
                              start_new_session=True, errors="replace")
    except subprocess.TimeoutExpired:
        return None


# --- reading the source and a submission (JSON only) ------------------------------------

def grade_id(cell: dict) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
    gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return gid if isinstance(gid, str) else None  # a student may write anything there


def source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def without_magics(source: str) -> str:
    """A cell as plain Python: IPython's %magics and !shell lines become comments."""
    return "\n".join(f"# (not run by the grader) {line}" if line.lstrip().startswith(("%", "!")) else line
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


def read_notebook(path: Path) -> dict:
    if path.stat().st_size > 50 * 2**20:
        raise ValueError("the notebook is larger than 50 MB")
    try:
        nb = json.loads(path.read_text(errors="replace"))
    except RecursionError:
        raise ValueError("the file nests too deeply to be a notebook") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("the file is not a Jupyter notebook (no list of cells)")
    nb["cells"] = [c for c in nb["cells"] if isinstance(c, dict)]
    return nb


def hidden_test_job(source: dict, submission: dict, secret: str, timeout: int) -> dict:
    """What tools/hidden_tests.py needs: the instructor's set-up and test cells, and per part the
    student's answer cells it depends on (its own, and earlier parts' that define a name it uses)."""
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
                      "test": source_text(cells[test])})
    return {"secret": secret, "timeout": timeout, "setup": source_text(cells["setup"]), "parts": parts}


def normalised(submission: dict, release: dict) -> dict:
    """The submission with each released cell's nbgrader metadata as released, on the first cell
    that carries its grade_id; removed from duplicates and from cells that never had any."""
    nb = copy.deepcopy(submission)
    released = {grade_id(c): c["metadata"]["nbgrader"] for c in release["cells"] if grade_id(c)}
    seen = set()
    for cell in nb["cells"]:
        metadata = cell.setdefault("metadata", {}) if isinstance(cell.get("metadata"), dict) else {}
        cell["metadata"] = metadata
        gid = grade_id(cell)
        metadata.pop("nbgrader", None)
        if gid in released and gid not in seen:
            metadata["nbgrader"] = copy.deepcopy(released[gid])
            seen.add(gid)
    return nb


# --- feedback ------------------------------------------------------------------------------

def inert_markdown(text: str) -> str:
    """Markdown that renders as text, not HTML: tags escaped, javascript: links broken."""
    text = text.replace("<", "&lt;")
    return re.sub(r"(?i)(java|vb)script\s*:", r"\1script-blocked:", text)


def safe_outputs(outputs) -> list[dict]:
    """Text, tracebacks and PNG/JPEG images only: no HTML, JavaScript, SVG, widgets or metadata."""
    kept = []
    for out in outputs if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream":
            name = "stderr" if out.get("name") == "stderr" else "stdout"
            kept.append({"output_type": "stream", "name": name, "text": source_text({"source": out.get("text", "")})})
        elif kind == "error":
            trace = out.get("traceback", [])
            kept.append({"output_type": "error", "ename": str(out.get("ename", "")), "evalue": str(out.get("evalue", "")),
                         "traceback": [str(line) for line in trace] if isinstance(trace, list) else []})
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {}) if isinstance(out.get("data"), dict) else {}
            clean = {"text/plain": source_text({"source": data["text/plain"]})} if "text/plain" in data else {}
            for mime in ("image/png", "image/jpeg"):
                if isinstance(data.get(mime), str) and IMAGE.match(data[mime]):
                    clean[mime] = data[mime]
            kept.append({"output_type": "display_data", "data": clean, "metadata": {}})
    return kept


def feedback_notebook(ran: dict, release: dict, points: dict, verdicts: dict) -> dict:
    """The notebook generate_feedback renders: inert, test cells as released plus the verdict."""
    released = {grade_id(c): c for c in release["cells"] if grade_id(c)}
    cells = []
    for cell in normalised(ran, release)["cells"]:
        kind, gid = cell.get("cell_type"), grade_id(cell)
        metadata = {"nbgrader": cell["metadata"]["nbgrader"]} if gid else {}
        if kind == "markdown":
            cells.append({"cell_type": "markdown", "metadata": metadata, "source": inert_markdown(source_text(cell))})
        elif kind == "code" and gid in points:
            verdict = verdicts.get(gid, {"passed": False, "message": "not graded"})
            note = ("\N{CHECK MARK} hidden tests passed" if verdict["passed"]
                    else f"\N{BALLOT X} hidden tests failed: {verdict['message']}")
            shown = [o for o in safe_outputs(cell.get("outputs")) if o["output_type"] == "stream"]
            cells.append({"cell_type": "code", "metadata": metadata, "execution_count": None,
                          "source": source_text(released[gid]),
                          "outputs": shown + [{"output_type": "stream", "name": "stdout", "text": f"[grader] {note}\n"}]})
        elif kind == "code":
            cells.append({"cell_type": "code", "metadata": metadata, "execution_count": None,
                          "source": source_text(cell), "outputs": safe_outputs(cell.get("outputs"))})
    return {"cells": cells, "metadata": {k: release["metadata"][k] for k in ("kernelspec", "language_info")
                                         if k in release.get("metadata", {})},
            "nbformat": 4, "nbformat_minor": 5}


# --- one student, then the whole class ---------------------------------------------------

def nbgrader_command(*args: str) -> list[str]:
    return [str(BIN / "python"), "-m", "nbgrader", *args]


# What no student's sandbox may read, in the course and in the repository that holds the grader
# (the same folder when an instructor grades from a private clone): the submissions, the hidden
# tests, the gradebook, the secret, the grade demo's copies of them, and the history of all these.
PRIVATE = ("submitted", "autograded", "feedback", "solutions", "source", "gradebook.db",
           "nbgrader_config.py", "grade-demo", ".git")


def private_paths(course: Path) -> list[Path]:
    return sorted({base / name for base in (course, ROOT) for name in PRIVATE})


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


def grade_student(course, assignment, student, template, source, release, secret, timeout, sandbox, execute):
    """(verdicts or None, the notebook as run (or as submitted), problem, note) for one student."""
    try:
        submission = read_notebook(course / "submitted" / student / assignment / f"{assignment}.ipynb")
    except (OSError, ValueError) as error:
        return None, None, f"the submission could not be read: {error}", None
    with tempfile.TemporaryDirectory(prefix=f"grading-{assignment}-", dir="/tmp") as scratch:  # under the
        # sandbox's empty /tmp: other students' scratch folders stay out of sight whatever TMPDIR says
        work = Path(scratch)
        shutil.copytree(template, work / "course")
        folder = work / "course" / "submitted" / student / assignment
        folder.mkdir(parents=True)
        (folder / f"{assignment}.ipynb").write_text(json.dumps(normalised(submission, release)))
        hide = private_paths(course)
        ran, note = submission, None
        cells = sum(c.get("cell_type") == "code" for c in submission["cells"])
        run = execute and run_confined(nbgrader_command("autograde", assignment, "--student", student, "--force",
                                                        f"--Execute.timeout={timeout}"),
                                       writable=work / "course", hide=hide, seconds=60 + cells * timeout, sandbox=sandbox)
        graded_nb = work / "course" / "autograded" / student / assignment / f"{assignment}.ipynb"
        try:
            ran = read_notebook(graded_nb) if execute else submission
        except (OSError, ValueError):
            note = ("its notebook did not finish running " + ("in time" if run is None else f"({run.stdout[-300:]}{run.stderr[-300:]})")
                    + "; the feedback shows it as submitted")
        job = work / "job"
        job.mkdir()
        tests = hidden_test_job(source, submission, secret, timeout)
        (job / "job.json").write_text(json.dumps(tests))
        run = run_confined([str(BIN / "python"), str(TOOLS / "hidden_tests.py"), str(job / "job.json")],
                           writable=job, hide=hide + [work / "course"], seconds=60 + len(tests["parts"]) * timeout,
                           sandbox=sandbox)
        line = run.stdout.strip().rsplit("\n", 1)[-1] if run is not None and run.returncode == 0 else ""
        if not line.startswith("RESULT "):
            why = "ran out of time" if run is None else f"failed: {(run.stderr or run.stdout)[-500:]}"
            return None, ran, f"the hidden-test runner {why}", note
        return json.loads(line.removeprefix("RESULT ")), ran, None, note


def instructor_secret(course: Path) -> str:
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    secret = str(config.HiddenTests.get("secret", PLACEHOLDER_SECRET))
    if secret.startswith(PLACEHOLDER_SECRET):
        warnings.warn("c.HiddenTests.secret is the public placeholder: anyone who reads solutions/ can "
                      "compute the hidden tests' inputs. Set your own in your private course directory.")
    return secret


def grade(course: Path, assignment: str, students: list[str] | None = None, *, sandbox: bool = True,
          timeout: int = 60, workers: int = 2, execute=True) -> Report:
    """Grade every submission of `assignment` in `course` (or `students`): gradebook, feedback, Report.
    `execute`: run the notebooks for the feedback (True), not (False: the feedback shows them as
    submitted), or only those of the students in a given set."""
    from nbgrader.api import Gradebook
    course = Path(course).resolve()
    problem = sandbox_problem() if sandbox else None
    if problem:
        raise NoSandbox(f"refusing to grade without a sandbox: {problem}. A submission could then read "
                        "and change other students' work and the gradebook. To grade anyway, on a machine "
                        "that holds nothing else of value, pass --no-sandbox.")
    if not sandbox:
        print("WARNING: grading WITHOUT a sandbox: every submission runs with your rights and can read and "
              "change other submissions, the gradebook and your files.", file=sys.stderr, flush=True)
    students = students or sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    source = read_notebook(course / "solutions" / assignment / f"{assignment}.ipynb")
    release = read_notebook(course / "exercises" / assignment / f"{assignment}.ipynb")
    points = {grade_id(c): float(c["metadata"]["nbgrader"]["points"]) for c in source["cells"]
              if grade_id(c) and c["metadata"]["nbgrader"].get("grade") and c["cell_type"] == "code"}
    secret = instructor_secret(course)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="grading-template-", dir="/tmp") as scratch:
        template = template_course(course, assignment, Path(scratch))
        with ThreadPoolExecutor(workers) as pool:
            futures = {s: pool.submit(grade_student, course, assignment, s, template, source, release,
                                      hashlib.sha256(f"{secret}:{assignment}:{s}".encode()).hexdigest(),
                                      timeout, sandbox, execute is True or s in (execute or ()))
                       for s in students}
            results = {}
            for student, future in futures.items():
                try:
                    results[student] = future.result()
                except Exception as error:  # noqa: BLE001  one broken submission must not stop the class
                    results[student] = (None, None, f"the grader failed on this submission: {error!r}"[:500], None)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student, (verdicts, ran, problem, note) in results.items():
            verdicts = verdicts or {}
            if problem:
                report.not_graded[student] = problem
            if note:
                report.notes[student] = note
            scores = {t: (p if verdicts.get(t, {}).get("passed") is True else 0.0) for t, p in points.items()}
            report.scores[student] = scores
            report.messages[student] = {t: v["message"] for t, v in verdicts.items() if not v["passed"]}
            gradebook.update_or_create_student(student)
            gradebook.update_or_create_submission(assignment, student)
            for test, score in scores.items():
                gradebook.find_grade(test, assignment, assignment, student).auto_score = score
            gradebook.db.commit()
            if ran is not None:
                folder = course / "autograded" / student / assignment
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{assignment}.ipynb").write_text(
                    json.dumps(feedback_notebook(ran, release, points, verdicts), indent=1))
    return report
