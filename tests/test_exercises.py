"""The eight graded exercises, end to end with the real nbgrader: the release is generated from the
solutions and leaks nothing, and autograding gives the marks an instructor expects to the
fabricated submissions (full, blank, partial, calling the library), without hanging.

Grading runs once per session (the `graded` fixture): each assignment in its own scratch course,
with fabricated submissions (grader/fabricate.py says how they are made), by the grader package: hidden
tests out of the student's process, one bubblewrap sandbox per student. The hostile corpus has a
module of its own (tests/test_hostile_corpus.py), so that the two gradings run side by side on
two workers; the sandbox's own rules are tested here.
"""
from html.parser import HTMLParser
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab_cells  # noqa: E402
from grader import (fabricate, feedback, hostile_corpus, notebooks, rehearsal, review_flags,  # noqa: E402
                    runs, schedule, withheld)
from grader.course import assignments, make_course  # noqa: E402

EXERCISES = ["ex1_precision_comparison", "ex2_loss_scaling", "ex3_dynamic_range",
             "ex4_softmax_stability", "ex5_mixed_precision_speedup", "ex6_fp8_quantization",
             "ex7_fp16_nan_hunt", "ex8_bitwise_resume"]
ASSIGNMENTS = assignments()
HOSTILE_TARGET = "ex4_softmax_stability" if "ex4_softmax_stability" in ASSIGNMENTS else ASSIGNMENTS[0]
STANDARD = ["full", "blank", "partial", "reference"]
HOSTILE = [*hostile_corpus.HOSTILE, *hostile_corpus.EDITS]
NO_SANDBOX = runs.sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")


def students_at_once() -> int:
    """Students each grading of the tests grades at once: this module's and the hostile corpus's
    (tests/test_hostile_corpus.py) run side by side on two pytest workers, so each takes its
    workers' share of the cores, and no sandbox waits for a core past its short timeout."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


@pytest.fixture(scope="session")
def graded_with_reports(tmp_path_factory):
    """(scratch folder, {assignment: scores}, {assignment: schedule.Report}): the fabricated
    submissions of every exercise, graded without their notebooks run for the feedback (no test
    here reads a notebook as run: the hostile corpus, tests/test_hostile_corpus.py, and the guide's
    walkthrough, tests/test_instructor.py, run them; 5 s a notebook)."""
    if NO_SANDBOX:
        pytest.skip(f"grading refuses to run without a sandbox: {NO_SANDBOX}")
    workdir = tmp_path_factory.mktemp("grading")
    jobs = {name: (name, fabricate.submissions(name), 30, False) for name in ASSIGNMENTS}
    results = rehearsal.grade_many(workdir, jobs, workers=students_at_once())
    return workdir, {k: v[0] for k, v in results.items()}, {k: v[1] for k, v in results.items()}


@pytest.fixture(scope="session")
def graded(graded_with_reports):
    return graded_with_reports[:2]


class TagCollector(HTMLParser):
    """Every tag, its attributes and the text of each <script>, as a browser would see them."""

    def __init__(self):
        super().__init__()
        self.tags, self.scripts, self._in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def active_html(html: str, mark: str) -> list:
    """What in `html` a browser would run or load from a student: a script holding `mark`, an
    iframe, an on* handler, a javascript: address. Escaped text (&lt;script&gt;) is not HTML."""
    parsed = TagCollector()
    parsed.feed(html)
    found = [s for s in parsed.scripts if mark in s]
    for tag, attrs in parsed.tags:
        found += [tag] if tag in ("iframe", "object", "embed") else []
        found += [(tag, name) for name, value in attrs if name.startswith("on") or
                  (value or "").strip().lower().startswith("javascript:")]
    return found


def test_the_feedback_check_sees_active_html_and_not_escaped_text():
    mark = hostile_corpus.SCRIPT_MARK
    assert active_html(f"<p><script>alert('{mark}')</script></p>", mark)
    assert active_html('<img src=x onerror="alert(1)">', mark) and active_html("<iframe src=x></iframe>", mark)
    assert active_html('<a href="javascript:alert(1)">x</a>', mark)
    assert not active_html(f"<p>&lt;script&gt;alert('{mark}')&lt;/script&gt; &lt;img onerror=x&gt;</p>", mark)


def dangerous_addresses(page: str) -> list[str]:
    """Addresses in tags a browser would follow or run, with entities decoded and blanks dropped."""
    parsed = TagCollector()
    parsed.feed(page)
    addresses = [(tag, name, re.sub(r"[\s\x00-\x1f]", "", html.unescape(value or "")).lower())
                 for tag, attrs in parsed.tags for name, value in attrs if name in ("href", "src", "action", "xlink:href")]
    figure = ("data:image/png;base64,", "data:image/jpeg;base64,")  # a notebook's figure, drawn by the run
    return [a for tag, name, a in addresses if a.startswith(("javascript:", "vbscript:", "data:"))
            and not (tag == "img" and name == "src" and a.startswith(figure))]


def points(assignment):
    return fabricate.test_points(assignment)


def part_points(assignment, parts):
    return sum(p for gid, p in points(assignment).items() if notebooks.part_of(gid) in parts)


def source_cells(assignment):
    return fabricate.notebook(ROOT / "solutions", assignment).cells


def graded_outputs(workdir, course, student, assignment, test_cell):
    nb = fabricate.notebook(workdir / course / "autograded" / student, assignment)
    cell = next(c for c in nb.cells if notebooks.grade_id(c) == test_cell)
    return json.dumps(cell.outputs)


# --- the source and the release -------------------------------------------------------------

def test_the_eight_exercises_are_there():
    assert ASSIGNMENTS == EXERCISES


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_each_part_has_solution_cells_and_one_graded_test_cell(assignment):
    cells = source_cells(assignment)
    solutions = {notebooks.part_of(notebooks.grade_id(c)) for c in cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    tests = [notebooks.part_of(gid) for gid in points(assignment)]
    assert len(tests) == len(set(tests)) >= 3, "one graded test cell per part, at least three parts"
    assert solutions == set(tests), "every part needs solution cells and a graded test cell"
    for cell in cells:
        if notebooks.grade_id(cell) in points(assignment):
            assert cell.metadata["nbgrader"]["locked"], f"{notebooks.grade_id(cell)} must be read-only"
            assert fabricate.HIDDEN_MARKERS[0] in cell.source, f"{notebooks.grade_id(cell)} has no hidden tests"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_checker_is_imported_in_a_locked_cell_before_any_student_code(assignment):
    cells = [c for c in source_cells(assignment) if c.cell_type == "code"]
    assert "".join(cells[0].source) == sync_colab_cells.setup_cell_source(), "stale Colab cell: make sync-notebooks"
    setup = cells[1]
    assert setup.metadata["nbgrader"]["locked"] and "from mpcourse import grading" in setup.source


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_committed_release_is_what_nbgrader_generates(graded, assignment):
    workdir, _ = graded
    generated = (workdir / assignment / "exercises" / assignment / f"{assignment}.ipynb").read_text()
    committed = ROOT / "exercises" / assignment / f"{assignment}.ipynb"
    assert committed.exists() and json.loads(committed.read_text()) == json.loads(generated), (
        f"exercises/{assignment} is stale: run `make exercises`")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_release_contains_no_solution_code_and_no_hidden_test(assignment):
    released = (ROOT / "exercises" / assignment / f"{assignment}.ipynb").read_text()
    for marker in (*fabricate.SOLUTION_MARKERS, *fabricate.HIDDEN_MARKERS):
        assert marker not in released
    released_lines = {line.strip() for c in fabricate.notebook(ROOT / "exercises", assignment).cells
                      for line in c.source.split("\n")}
    secret, public = set(), set()
    for cell in source_cells(assignment):
        shown, hidden = fabricate.split_cell(cell)
        secret |= {line.strip() for line in hidden if len(line.strip()) >= 12}
        public |= {line.strip() for line in shown}
    # A secret line may repeat a line students are shown anyway (a hint, a visible test).
    leaked = (secret - public) & released_lines
    assert not leaked, f"{assignment}: the release contains {sorted(leaked)[:3]}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_notebooks_are_in_the_book_without_outputs(assignment):
    toc = (ROOT / "_toc.yml").read_text()
    assert f"exercises/{assignment}/{assignment}" in toc
    for cell in fabricate.notebook(ROOT / "exercises", assignment).cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_an_exercise_states_no_run_time_that_no_test_measures(assignment):
    """Issue 48: ex1 said it ran "in a few seconds" on a CPU; a student's Run All took 45-61 s (its
    16-bit products are slow on a CPU). A time a student is told is measured by a test, or not said."""
    said = [c.source for c in fabricate.notebook(ROOT / "solutions", assignment).cells if c.cell_type == "markdown"]
    claims = re.findall(r"(?i)\b(?:a few|several|\d+) (?:seconds?|minutes?)\b(?! (?:per|each|of))", "\n".join(said))
    assert not claims, f"{assignment} tells students a run time: {claims}"


# --- autograding ---------------------------------------------------------------------------

@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solutions_get_full_marks(graded, assignment):
    _, scores = graded
    assert scores[assignment]["full"] == points(assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_untouched_release_gets_zero_on_every_part(graded, assignment):
    _, scores = graded
    assert scores[assignment]["blank"] == {gid: 0 for gid in points(assignment)}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_partial_submission_gets_exactly_the_points_of_the_parts_it_solved(graded, assignment):
    _, scores = graded
    solved = fabricate.submission_data(assignment).PARTIAL_PARTS
    expected = {gid: (p if notebooks.part_of(gid) in solved else 0) for gid, p in points(assignment).items()}
    assert 0 < sum(expected.values()) < sum(points(assignment).values())
    assert scores[assignment]["partial"] == expected


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_calling_the_library_instead_of_implementing_scores_nothing_for_that_part(graded, assignment):
    workdir, scores = graded
    copied = {notebooks.part_of(gid) for gid in fabricate.submission_data(assignment).REFERENCE_CALLER}
    for gid, p in points(assignment).items():
        if notebooks.part_of(gid) in copied:
            assert scores[assignment]["reference"][gid] == 0
            # the library's function is not there to call (issue 45), or, where no part withholds
            # one, the own-work check names the call
            shown = " ".join(graded_outputs(workdir, assignment, "reference", assignment, gid).replace("\\n", " ").split())
            assert ("is withheld while your work is graded" in shown if withheld.declared(
                fabricate.notebook(ROOT / "solutions", assignment)) else "calls the course library" in shown), shown
        else:
            assert scores[assignment]["reference"][gid] == p


@needs_sandbox
def test_every_student_is_graded(graded_with_reports):
    _, _, reports = graded_with_reports
    assert {name: report.not_graded for name, report in reports.items()} == {name: {} for name in ASSIGNMENTS}


# --- the grader's own rules ------------------------------------------------------------------

def test_grading_refuses_without_a_sandbox_unless_told(monkeypatch, tmp_path):
    monkeypatch.setattr(schedule, "sandbox_problem", lambda: "no bubblewrap on this machine")
    with pytest.raises(runs.NoSandbox, match="no bubblewrap.*--no-sandbox"):
        schedule.grade(tmp_path, HOSTILE_TARGET)


def test_hidden_tests_get_their_answer_cells_and_the_instructors_tests_only():
    source = json.loads((ROOT / "solutions" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.ipynb").read_text())
    release = json.loads((ROOT / "exercises" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.ipynb").read_text())
    for cell in release["cells"]:
        if notebooks.grade_id(cell) in points(HOSTILE_TARGET):
            cell["source"] = "grading.passed('Part 1')"  # a student's own "test"
    job = runs.hidden_test_job(source, release, "s3cret", 5)
    tests = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in source["cells"]
             if c["metadata"].get("nbgrader", {}).get("grade_id") in points(HOSTILE_TARGET)}
    assert [part["test_id"] for part in job["parts"]] == list(points(HOSTILE_TARGET))
    reference = runs.hidden_test_job(source, source, "s3cret", 5, reference=True)
    for part, theirs in zip(job["parts"], reference["parts"]):
        # the instructor's, less expected values and what computes them (the student's copy)
        assert part["test"] == runs.student_copy(tests[part["test_id"]], part["names"], withheld.declared(source))
        assert theirs["test"] == tests[part["test_id"]]
        assert all(notebooks.part_of(cell) <= notebooks.part_of(part["test_id"]) for cell, _ in part["cells"])
    assert job["secret"] == "s3cret"


def test_the_course_config_sets_a_timeout_and_bounds_output():
    config = (ROOT / "nbgrader_config.py").read_text()
    assert "c.Execute.timeout = " in config and "BoundedOutputExecute" in config
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["exclude_patterns"] == ["exercises/*/*.ipynb"]


def test_malformed_submissions_are_refused_clearly_not_with_a_crash(tmp_path):
    # A grade_id that is not a string is no grade_id (it used to stop the whole class's grading).
    assert notebooks.grade_id({"metadata": {"nbgrader": {"grade_id": ["p1_solution"]}}}) is None
    assert notebooks.grade_id({"metadata": {"nbgrader": {"grade_id": "p1_solution"}}}) == "p1_solution"
    deep = tmp_path / "deep.ipynb"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nests too deeply"):
        notebooks.read_notebook(deep)
    # Red team 45b, A04: JSON that no Jupyter writes is refused with the cell and the reason (it made
    # the grader fail on the submission, retried every run, instead)
    cell = {"cell_type": "code", "source": "x = 1", "metadata": {"nbgrader": {"grade_id": "p1_solution"}},
            "outputs": []}
    good = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    assert notebooks.parse_notebook(json.dumps(good).encode())["cells"] == [cell]
    # Issue 46: a byte-order mark, CRLF line ends, an older nbformat (no cell ids) are read alike
    older = {**good, "nbformat_minor": 2}
    for data in (b"\xef\xbb\xbf" + json.dumps(good).encode(), json.dumps(good, indent=1).replace("\n", "\r\n").encode(),
                 json.dumps(older).encode()):
        assert notebooks.parse_notebook(data)["cells"] == [cell]
    with pytest.raises(ValueError, match="UTF-16 text, which Jupyter does not open"):  # red team 45h, A03
        notebooks.parse_notebook(json.dumps(good).encode("utf-16"))
    for change, reason in ((("metadata", []), "cell 1's metadata is not an object"),
                           (("metadata", None), "cell 1's metadata is not an object"),
                           (("metadata", {"nbgrader": "x"}), "cell 1's nbgrader metadata is not an object"),
                           (("source", 12345), "cell 1's source is not text"),
                           (("source", ["a", 1]), "cell 1's source is not text"),
                           (("cell_type", "python"), "cell 1's kind"),
                           (("outputs", {}), "cell 1's outputs are not a list")):
        bad = json.loads(json.dumps(good))
        bad["cells"][0][change[0]] = change[1]
        with pytest.raises(ValueError, match=re.escape(reason)):
            notebooks.parse_notebook(json.dumps(bad).encode())
    # Red team 45d, A07: millions of empty lists in a cell's metadata are refused before parsing (they
    # took the grader's own process to 1.7 GB); a million printed lines of output are read
    bomb = json.dumps(good)[:-1] + ', "x": [' + "[]," * 2_100_000 + "[]]}"
    with pytest.raises(ValueError, match=re.escape("more than 2,000,000 of the characters [ { , : (printed outputs")):
        notebooks.parse_notebook(bomb.encode())
    # red team 31: valid JSON with a number Python's json (and so Jupyter) refuses to read
    with pytest.raises(ValueError, match="a number of more than 4,300 digits"):
        notebooks.parse_notebook((json.dumps(good)[:-1] + ', "n": ' + "7" * 5000 + "}").encode())
    printed = {**cell, "outputs": [{"output_type": "stream", "name": "stdout", "text": ["x\n"] * 1_000_000}]}
    assert len(notebooks.parse_notebook(json.dumps({**good, "cells": [printed]}).encode())["cells"][0]["outputs"][0]["text"]) == 1_000_000



def test_a_notebook_of_more_cells_than_the_cap_is_refused_and_one_at_the_cap_is_read():
    """Red team 45g, A05: 50,000 empty Markdown cells (3.5 MB, under every other cap) held the
    feedback rendering, in the grader's own process, at 168 s instead of 40 s."""
    empty = {"cell_type": "markdown", "metadata": {}, "source": ""}
    at_cap = {"cells": [empty] * notebooks.NOTEBOOK_CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    assert len(notebooks.parse_notebook(json.dumps(at_cap).encode())["cells"]) == notebooks.NOTEBOOK_CELLS
    over = {**at_cap, "cells": [empty] * (notebooks.NOTEBOOK_CELLS + 1)}
    with pytest.raises(ValueError, match=f"holds {notebooks.NOTEBOOK_CELLS + 1:,} cells, more than the "
                                         f"{notebooks.NOTEBOOK_CELLS:,}.*delete the empty"):
        notebooks.parse_notebook(json.dumps(over).encode())
    attack = {**at_cap, "cells": [empty] * 50_000}
    with pytest.raises(ValueError, match="holds 50,000 cells"):
        notebooks.parse_notebook(json.dumps(attack).encode())
    # a wide margin over every notebook of the course, released or solved
    largest = max(len(notebooks.read_notebook(p)["cells"]) for folder in ("exercises", "solutions")
                  for p in (ROOT / folder).glob("*/*.ipynb"))
    assert largest * 10 < notebooks.NOTEBOOK_CELLS, largest

def test_a_feedback_sandbox_gets_only_the_notebook_run_settings_of_the_course_config():
    """Red team 24, A04: the template course's config was nbgrader_config.py less its secret line, and
    a student's notebook printed it into the feedback page: the instructor's comments, an exchange
    path, a gradebook address (with a password if it held one)."""
    private = ROOT.joinpath("nbgrader_config.py").read_text() + (
        "\n# office hours moved; ask Alice for the regrade key\n"
        'c.CourseDirectory.db_url = "postgresql://grader:hunter2@db.example.edu/fall"\n'
        'c.Exchange.root = "/srv/private/exchange-fall"\nSECRET_NOTE = "hunter2"\n')
    config = runs.notebook_run_config(private)
    for gone in ("Alice", "hunter2", "db.example.edu", "exchange-fall", "HiddenTests", "public-placeholder", "db_url"):
        assert gone not in config, gone
    for kept in ("class BoundedOutputExecute(Execute)", "c.Autograde.autograde_preprocessors", "c.Execute.timeout = 60",
                 "c.CourseDirectory.release_directory = 'exercises'", "c = get_config()"):
        assert kept in config, kept
    with pytest.raises(ValueError, match=r"nbgrader_config.py does not parse \(line 2"):
        runs.notebook_run_config("c = get_config()\nc.Execute.timeout = (\n")


def test_the_template_course_holds_no_secret(tmp_path):
    directory = os.getcwd()
    template = runs.template_course(ROOT, ASSIGNMENTS[0], tmp_path)  # what each feedback sandbox gets
    assert os.getcwd() == directory  # nbgrader's change of directory was undone
    assert "HiddenTests" not in (template / "nbgrader_config.py").read_text()
    assert "HiddenTests" in (ROOT / "nbgrader_config.py").read_text()
    # Issue 52: made in the grader's process, it is what the nbgrader command makes, file for file
    # and row for row (the gradebook's random ids aside)
    from grader.course import ENV, nbgrader_command
    made = tmp_path / "by the command"
    made.mkdir()
    shutil.copy(template / "nbgrader_config.py", made)
    shutil.copytree(template / "solutions", made / "solutions")
    result = subprocess.run(nbgrader_command("generate_assignment", ASSIGNMENTS[0], "--force"), cwd=made, env=ENV,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    shutil.rmtree(made / "exercises")
    files = [sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) for folder in (template, made)]
    assert files[0] == files[1] and "gradebook.db" in files[0]
    for name in files[0]:
        if not (template / name).is_dir() and name != "gradebook.db":
            assert (template / name).read_bytes() == (made / name).read_bytes(), name
    assert gradebook_rows(template / "gradebook.db") == gradebook_rows(made / "gradebook.db")


def gradebook_rows(path: Path) -> dict:
    """{table: sorted rows} of an SQLite gradebook, each random id replaced by the name of what it is."""
    import sqlite3
    with sqlite3.connect(path) as db:
        tables = {}
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            tables[table] = [dict(zip(columns, row)) for row in db.execute(f"SELECT * FROM {table}")]
    names = {row["id"]: f"{table}:{row['name']}" for table, rows in tables.items() for row in rows
             if "id" in row and "name" in row}
    return {table: sorted(json.dumps({k: names.get(v, v) for k, v in row.items()}, sort_keys=True) for row in rows)
            for table, rows in tables.items()}


# --- issue 31: what a sandbox shows, what it may use, what comes back ------------------------

SEES = r"""
import json, os, sys
course = sys.argv[1]
def readable(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False
found = {"uid": os.getuid(), "environ": sorted(os.environ),
         "readable": [p for p in sys.argv[2:] if readable(p) or os.path.isdir(p)]}
for place in ("/work", os.path.dirname(course), "/root", "/home"):
    try:
        found[place] = sorted(os.listdir(place))
    except OSError:
        found[place] = None
try:
    open(os.path.join(os.path.dirname(sys.argv[0]) or "/", "written"), "w").write("x")
    found["wrote next to the script"] = True
except OSError:
    found["wrote next to the script"] = False
import ctypes, errno, platform  # the kernel's keyrings (red team 16): the session's, and a key of its own
libc = ctypes.CDLL(None, use_errno=True)
calls = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
session = libc.syscall(calls[1], 0, -3, 0)  # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING)
found["session keyring"] = errno.errorcode.get(ctypes.get_errno()) if session < 0 else session
added = libc.syscall(calls[0], b"user", b"left-by-a-student", b"x", 1, -4)  # add_key(..., KEY_SPEC_USER_KEYRING)
found["add_key"] = errno.errorcode.get(ctypes.get_errno()) if added < 0 else added
try:  # red team 16d: the keys listed, a crypto socket that loads a key by its number, a message queue
    found["/proc/keys"] = open("/proc/keys").read()
except OSError as error:
    found["/proc/keys"] = errno.errorcode.get(error.errno)
import socket
try:
    socket.socket(38, socket.SOCK_SEQPACKET, 0).close()  # AF_ALG
    found["AF_ALG"] = "opened"
except OSError as error:
    found["AF_ALG"] = errno.errorcode.get(error.errno)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
queue = rt.mq_open(b"/left-for-the-next-student", os.O_CREAT | os.O_RDWR, 0o600, None)
found["mq_open"] = errno.errorcode.get(ctypes.get_errno()) if queue < 0 else queue
print("SEEN " + json.dumps(found))
"""


def in_sandbox(tmp_path, script, *arguments, limits=None, sandbox=True):
    folder = tmp_path / "shown"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script.py").write_text(script)
    limits = limits or runs.sandboxing.Limits(seconds=60, cpu_seconds=60)
    return runs.run_sandboxed(["/bin/sh", "-c", 'exec python "$GRADING/script.py" "$@"', "sh", *map(str, arguments)],
                                folder=folder, limits=limits, sandbox=sandbox)


@needs_sandbox
def test_a_sandbox_shows_only_what_grading_needs_as_an_unprivileged_user(tmp_path, monkeypatch):
    course = tmp_path / "course"
    private = [course / "downloaded" / "classmate" / "ex.ipynb", course / "grades.csv", course / "gradebook.db",
               course / "_build" / "release-gradebook.db", course / "solutions" / "ex" / "ex.ipynb",
               ROOT / ".git", ROOT / "solutions", ROOT / "grader" / "runs.py", ROOT / "nbgrader_config.py",
               Path("/etc/shadow")]
    for path in private[:5]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("private")
    monkeypatch.setenv("MPCOURSE_INSTRUCTOR_TOKEN", hostile_corpus.INSTRUCTOR_TOKEN)
    run = in_sandbox(tmp_path, SEES, course, *private, ROOT / "mpcourse" / "grading.py")
    seen = json.loads(run.stdout.split("SEEN ", 1)[1])
    assert seen["uid"] >= runs.sandboxing.UID_BASE
    assert seen["readable"] == [str(ROOT / "mpcourse" / "grading.py")], "only the library, of all these"
    assert "MPCOURSE_INSTRUCTOR_TOKEN" not in seen["environ"] and len(seen["environ"]) < 15
    assert seen[str(course.parent)] is None and seen["/home"] is None
    shown = runs.python_environment()  # the folders on the way to these are empty but for them
    assert set(seen["/root"] or []) <= {p.relative_to("/root").parts[0] for p in shown if p.is_relative_to("/root")}
    assert not seen["wrote next to the script"]
    assert Path("/etc/shadow").exists() and not (tmp_path / "shown" / "written").exists()
    assert seen["session keyring"] == seen["add_key"] == "EPERM", "the grader's keyrings, or a key for the next sandbox"
    assert seen["/proc/keys"] in ("", "EACCES") and seen["AF_ALG"] == "EPERM" and seen["mq_open"] == "EMFILE", seen


FORKS = r"""
import os, sys, time
started = 0
for _ in range(int(sys.argv[1])):
    try:
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
        started += 1
    except OSError:
        break
print("STARTED", started, flush=True)
time.sleep(600)
"""
NEIGHBOUR = r"""
import time
started = time.perf_counter()
total = 0
for i in range(20_000_000):
    total += i
print("SECONDS", time.perf_counter() - started)
"""


@needs_sandbox
def test_busy_processes_in_new_sessions_do_not_starve_a_neighbour(tmp_path):
    """Two sandboxes side by side: one starts as many busy processes as it can, in new sessions;
    the other does a fixed amount of work. The busy one holds at most its CPU share (cgroup), the
    number of processes it may start is capped, and the neighbour's slowdown is measured."""
    limits = runs.sandboxing.Limits(seconds=12, cpu_seconds=100, processes=64)  # the neighbour: a few seconds
    busy = runs.sandboxing.Limits(seconds=8, cpu_seconds=100, processes=64)  # ends at its wall-clock limit
    alone = in_sandbox(tmp_path / "alone", NEIGHBOUR, limits=limits)
    attacker = {}
    thread = threading.Thread(target=lambda: attacker.update(run=in_sandbox(tmp_path / "attacker", FORKS, 400, limits=busy)))
    thread.start()
    time.sleep(3)
    beside = in_sandbox(tmp_path / "next", NEIGHBOUR, limits=limits)
    thread.join()
    run = attacker["run"]
    assert alone.returncode == 0 and beside.returncode == 0, beside.stderr
    slowdown = float(beside.stdout.split("SECONDS")[1]) / float(alone.stdout.split("SECONDS")[1])
    print(f"neighbour's slowdown next to {run.stdout.strip()} busy processes: {slowdown:.2f}x")
    assert run.killed == "time" and int(run.stdout.split("STARTED")[1]) < busy.processes
    if run.cpu_seconds is not None:  # cgroups here: the busy sandbox got at most its share of the CPU
        assert run.cpu_seconds <= limits.cpus * run.wall_seconds * 1.05 + 1


FILLER = r"""
import os
written = 0
try:
    with open("/tmp/filler", "wb") as f:
        for _ in range(4096):
            f.write(b"x" * 2**20)
            written += 1
except OSError:
    pass
print("WRITTEN", written, flush=True)
"""


@needs_sandbox
def test_the_only_writable_place_is_small_and_in_ram(tmp_path):
    limits = runs.sandboxing.Limits(seconds=60, cpu_seconds=60, tmpfs_bytes=64 * 2**20)
    run = in_sandbox(tmp_path, FILLER, limits=limits)
    assert 0 < int(run.stdout.split("WRITTEN")[1]) <= 64


@needs_sandbox
def test_a_sandbox_ends_at_its_wall_clock_limit_with_everything_it_started(tmp_path):
    mark = f"mpcourse-sandbox-test-{os.getpid()}"
    run = in_sandbox(tmp_path, FORKS, 3, mark, limits=runs.sandboxing.Limits(seconds=5, cpu_seconds=100))
    assert run.killed == "time" and run.returncode is None and "STARTED 3" in run.stdout
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if mark.encode() in read_or_nothing(p)]


# Red team 24, A02: an answer that stops (SIGSTOP) the grader's processes in its sandbox, which run as
# its user: the batch runner that enforces each part's deadline stopped, and every run lasted its
# whole limit (1253 s for one student at --timeout 30, instead of a minute).
STOPS_ITS_PARENT = r"""
import os, signal, time
parent = os.getpid()
if os.fork() == 0:
    os.kill(parent, signal.SIGSTOP)
time.sleep(60)
"""


@needs_sandbox
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroups", "no cgroups"])
def test_a_run_whose_process_is_stopped_ends_then_not_at_its_limit(tmp_path, monkeypatch, cgroups):
    """Without cgroups (a machine with cgroup v2 only) the sandbox's processes are found by its uid
    (review 69: there the run lasted its whole limit)."""
    if not cgroups:
        monkeypatch.setattr(runs.sandboxing, "make_cgroups", lambda limits: {})
    run = in_sandbox(tmp_path, STOPS_ITS_PARENT, limits=runs.sandboxing.Limits(seconds=40, cpu_seconds=40))
    assert run.killed == "suspended" and run.returncode is None, run  # not "time": at its 40 s limit
    assert "SIGSTOP" in runs.SUSPENDED


def read_or_nothing(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_the_feedback_runs_time_limit_does_not_grow_with_the_number_of_cells():
    assert runs.feedback_limits(10).seconds == runs.feedback_seconds(10) < 24 * 10


def test_the_link_check_sees_entity_encoded_javascript():
    assert dangerous_addresses('<a href="&#106;avascript:alert(1)">x</a>')
    assert dangerous_addresses('<a href="java&#x09;script:alert(1)">x</a>')
    assert not dangerous_addresses('<a href="https://example.org">x</a>')


def test_markdown_is_made_inert_against_entities_and_maths_links():
    for text in ("[a](&#106;avascript:alert(1))", "[a](java\tscript:alert(1))", "[a](JaVaScRiPt:x)",
                 "[a](data:text/html,x)", "<a href='javascript:x'>", "$\\href{javascript:x}{y}$",
                 "[a][r]\n\n[r]: &#106;avascript:x", "![i](&#106;avascript:x)"):
        inert = feedback.inert_markdown(text)
        assert "<a" not in inert and not re.search(r"(?i)j\s*a\s*v\s*a\s*s\s*c\s*r\s*i\s*p\s*t\s*:", inert), inert
        assert "&#106;" not in inert and "\\href" not in inert and "data:" not in inert
        assert "](" not in inert and "]:" not in inert and "][" not in inert  # no link syntax left


def test_markdown_links_no_bare_address_and_renders_emphasis_runs_as_text():
    """Red team 26: a bare `https://...` became a live link in the page (A04); runs of 45-80 `*` before a
    letter took the renderer time quadratic in their length, in the grader's own process (A08: five
    such cells, 20-30 s a student). Ordinary emphasis still renders."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    for text in ("see https://evil.example/login", "[a] (https://x.y)", "[1]: https://x.y", "HTTPS://x.y",
                 "x" * 40 + "://a.b", "a." * 10_000 + "http://x.y"):  # red team 27: a pattern was quadratic in a.a.
        html = markdown2html_mistune(feedback.inert_markdown(text))
        assert "<a " not in html and "//" in html.replace("\u200b", ""), html[-200:]
    with feedback.plain_fences():  # red team 28: a fence's info string chose any of pygments' lexers
        for info in ("easytrieve", "python", "mermaid"):
            html = markdown2html_mistune(feedback.inert_markdown(f"notes\n\n```{info}\nx = 1\t\t\n```\n"))
            assert "<pre><code>x = 1" in html and "highlight" not in html and "mermaid" not in html, html
    assert "highlight" in markdown2html_mistune("```python\nx = 1\n```\n")  # the patch is undone
    assert feedback.feedback_notebook({"cells": []}, {"cells": [], "metadata": {"language_info": {
        "name": "python", "pygments_lexer": "ipython3"}}}, {}, {})["metadata"]["language_info"] == feedback.LANGUAGE_INFO
    stars = "*" * 60 + "a"
    assert feedback.inert_markdown(stars) == "\\*" * 60 + "a"
    assert markdown2html_mistune(feedback.inert_markdown(stars)).count("*") == 60  # shown as written
    assert "<strong>bold</strong>" in markdown2html_mistune(feedback.inert_markdown("**bold** and *it*"))


def test_a_failure_message_leaks_no_secret_seed_or_hidden_test():
    secret = "ab" * 32
    hidden = {"assert stable_softmax(secret_input).max() < 2"}
    seeds = feedback.seeds_of(secret, 5)
    assert feedback.safe_message(f"got {secret} and {seeds[3]}", secrets=[secret, *seeds], hidden_lines=hidden) == \
        "got (withheld) and (withheld)"
    assert "withheld" in feedback.safe_message("x = 1\nassert stable_softmax(secret_input).max() < 2", secrets=[],
                                             hidden_lines=hidden)
    assert len(feedback.safe_message("y" * 100_000, secrets=[], hidden_lines=set())) < 2 * feedback.MESSAGE_CHARS


def test_a_symbolic_link_in_a_submission_is_refused_with_the_reason(tmp_path):
    folder = tmp_path / "submitted" / "s" / "ex"
    folder.mkdir(parents=True)
    (tmp_path / "secret.ipynb").write_text(json.dumps({"cells": []}))
    (folder / "ex.ipynb").symlink_to(tmp_path / "secret.ipynb")
    with pytest.raises(ValueError, match="symbolic link"):
        notebooks.read_submission(tmp_path, "s", "ex")
    (folder / "ex.ipynb").unlink()
    (folder / "ex.ipynb").write_text(json.dumps({"cells": []}))
    assert notebooks.read_submission(tmp_path, "s", "ex") == {"cells": []}
    (folder / "data").symlink_to("/etc")
    with pytest.raises(ValueError, match="symbolic link"):
        notebooks.read_submission(tmp_path, "s", "ex")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_honest_solutions_are_not_flagged_and_runner_tricks_are(assignment):
    def notebook_of(cells):
        return {"cells": [{"cell_type": "code", "source": src, "metadata": {"nbgrader": {"grade_id": gid}}}
                          for gid, src in cells.items()]}
    assert review_flags.review_flags(notebook_of(fabricate.solution_cells(assignment))) == {}
    chatty = {gid: f"{src}\n%timeit 1 + 1\nprint?\nlen??\n" for gid, src in fabricate.solution_cells(assignment).items()}
    assert review_flags.review_flags(notebook_of(chatty)) == {}  # IPython's help lines parse (red team 45: A3f)
    tricks = {"p1_solution": hostile_corpus.LEAK, "p2_solution": hostile_corpus.BUSY + hostile_corpus.SWAP,
              "p3_solution": "import torch\ntorch.Tensor.__eq__ = lambda a, b: True\n"
                             "from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(1)\n",
              "p4_solution": "import sqlite3, os\nos.symlink('/proc/1/fd/1', 'x')\nf = lambda: 0\nf.__code__ = f.__code__.replace()\n"}
    flags = review_flags.review_flags(notebook_of(tricks))
    assert "reads the call stack" in flags["p1"] and "starts processes" in flags["p2"]
    assert "assigns to an attribute of torch" in flags["p3"]
    assert any(why.startswith("starts threads") for why in flags["p3"])  # unseen by `forbidden=` (red team A3a)
    assert {"opens databases", "makes symbolic links", "reads /proc", "rewrites code objects"} <= set(flags["p4"])
    # red team 45: a copy of a library module imported under another name (A05); a 4 MB cell (A02)
    copy = ("import importlib, os, shutil, sys, tempfile\n_d = tempfile.mkdtemp()\n"
            "shutil.copyfile(importlib.import_module('mp' + 'course.formats').__file__, os.path.join(_d, 'notes.py'))\n"
            "sys.path.insert(0, _d)\nLIB = importlib.import_module('notes')\n")
    bomb = "_notes = [" + "1," * 150_000 + "]\n"
    flags = review_flags.review_flags(notebook_of({"p1_solution": copy, "p2_solution": bomb}))
    assert {"imports modules by name", "reads where a module's file is",
            "changes where modules are imported from"} <= set(flags["p1"])
    assert flags["p2"] == [f"is longer than {review_flags.PARSED_CHARS:,} characters: not read here"]
    assert runs.defined_names(bomb) == set() and runs.used_names(bomb) == set()  # not parsed either
    # red team 45c, A04: f-string fields parse in quadratic time (66,000 of them: 3.8 s a parse)
    fields = "if False:\n    _ = f\"" + "{a}" * 6_000 + "\"\ndef naive_softmax(x):\n    return x\n"
    assert review_flags.review_flags(notebook_of({"p1_solution": fields}))["p1"] == [
        f"holds more than {review_flags.BRACES:,} braces: not read here"]
    assert runs.defined_names(fields) == set()
    assert runs.defined_names("_ = f'{a}{b}'\ndef naive_softmax(x):\n    return x\n") == {"_", "naive_softmax"}


def test_attributes_reached_by_a_name_built_at_run_time_and_sys_modules_are_flagged():
    """Red team 45h: A01 cleared the own-work check's record through `getattr(sys, "get" + "profile")`
    and `getattr(c, "cell_" + "contents")` (a forbidden torch.softmax, 10 of 10); A05 read the
    checker's secret and the runner's frames through `sys.modules["mp" + "course.grading"]` and
    `getattr(f, "f_lo" + "cals")`. Neither was flagged: every flag matched names as written."""
    def flags_of(code):
        return review_flags.review_flags({"cells": [{"cell_type": "code", "source": code,
                                                     "metadata": {"nbgrader": {"grade_id": "p1_solution"}}}]}).get("p1", [])
    profiler = "reads or switches profilers (the own-work check is one)"
    closure = "reads functions' closures (where the own-work check keeps its record)"
    for code in ('w = getattr(_s, "get" + "pro" + "file")()\n', 'w = getattr(sys, "getprofile")()\n',
                 'k = "get" + "pro" + "file"\nw = getattr(_s, k)()\n', 'k = "".join(["getpro", "file"])\n',
                 'k = f"{\'getpro\'}file"\n'):
        assert profiler in flags_of(code), code
    assert closure in flags_of('v = getattr(c, "cell_" + "contents", None)\n')
    assert profiler in flags_of('k = "getprofile"\nw = getattr(_s, k)()\n')  # the name in a variable
    assert closure in flags_of('k = "__closure__"\n')
    assert "reads the call stack" in flags_of('f = getattr(sys, "_get" + "frame")()\nl = getattr(f, "f_lo" + "cals")\n')
    library = flags_of('g = sys.modules["mp" + "course.grad" + "ing"]\n')
    assert any("sys.modules" in why for why in library) and any(why.startswith("uses the course library") for why in library)
    assert "reads /proc" in flags_of('p = "/pr" + "oc/self/maps"\n')
    for honest in ('d = getattr(r, "dtype", None)\n', "m = [p for p in model.modules()]\n", "n = len(x.shape)\n",
                   "setattr(parent, name, StableSoftmax())\n", 'print("loss: " + str(x) + " at step " + f"{i}")\n',
                   'label = "FP" + "16 " + "gradient"\n', 'print("the signal, the link and mpcourse\'s system")\n'):
        assert flags_of(honest) == [], honest


def test_the_red_team_45g_evasions_and_missing_packages_are_flagged():
    """Red team 45g: TorchScript (A01b, A01c), the watcher's closure and profiler, and a module name
    built at run time (A02b) got full marks unflagged; an import of a package the grading
    environment lacks (A07: pandas, which Colab has) cost a part with no word to the instructor."""
    def flags_of(code):
        return review_flags.review_flags({"cells": [{"cell_type": "code", "source": code,
                                                     "metadata": {"nbgrader": {"grade_id": "p1_solution"}}}]}).get("p1", [])
    torchscript = "compiles TorchScript, which runs unseen by the check of own work (the course library's functions)"
    for code in ('_s = torch.jit.CompilationUnit("""def f(x: Tensor) -> Tensor:\n    return torch.softmax(x, 0)\n""")\n',
                 "from torch.jit import script\nf = script(g)\n", "f = torch.jit.trace(g, x)\n",
                 "from torch import jit\n", "import torch.jit as j\n"):
        assert torchscript in flags_of(code), code
    assert "calls torch's C internals, which runs unseen" in " ".join(flags_of("y = torch._C._nn.softmax(x)\n"))
    # Red team 17c, C3 and C8: the checker's namespace changed for a moment and put back; defaults rewritten
    assert "reaches into the namespace of grading" in flags_of("names = vars(grading._records)\n")
    assert "rewrites functions' default arguments" in flags_of("f.__kwdefaults__ = {}\n")
    # Red team 17b, B5: the dispatch watcher reached through a module attribute named at run time
    assert "reaches an attribute of torch by a name built at run time" in flags_of(
        'mode = getattr(torch.utils, "hctapsid_nohtyp_"[::-1])._get_current_dispatch_mode()\n')
    # Red team 16f: the check of forbidden calls is a torch dispatch mode; what switches modes off is flagged
    dispatch = "switches torch's dispatch modes (the check of forbidden calls is one)"
    for code in ("from torch.utils._python_dispatch import _disable_current_modes\n",
                 "with torch.utils._python_dispatch._disable_current_modes():\n    pass\n",
                 "class M(TorchDispatchMode):\n    pass\n"):
        assert dispatch in flags_of(code), code
    closure = "reads functions' closures (where the own-work check keeps its record)"
    profiler = "reads or switches profilers (the own-work check is one)"
    assert closure in flags_of("for c in f.__closure__:\n    c.cell_contents.clear()\n")
    assert closure in flags_of("x = getattr(c, 'cell_contents')\nc.cell_contents\n")
    for code in ("hook = sys.getprofile()\n", "from sys import getprofile\n", "import threading as t\nt.setprofile(None)\n",
                 "g = sys.gettrace\n"):
        assert profiler in flags_of(code), code
    built = "imports a module whose name is built at run time"
    for code in ('import pkgutil\nf = pkgutil.resolve_name("mp" + "course.formats:round_to")\n',
                 'f = importlib.import_module(name)\n', 'm = __import__(f"{a}course")\n'):
        assert built in flags_of(code), code
    assert "imports modules by name" in flags_of("from pkgutil import resolve_name\n")
    # red team 18: pydoc.locate imports by name too, and its string names the library
    assert "imports modules by name" in flags_of('import pydoc\nf = pydoc.locate("mpcourse.formats.get_format")\n')
    assert any(why.startswith("uses the course library") for why in flags_of('f = pydoc.locate("mpcourse.formats.get_format")\n'))
    assert built in flags_of('from pydoc import locate\nf = locate("mp" + "course.formats.get_format")\n')
    assert built not in flags_of('f = pkgutil.resolve_name("mpcourse.formats:round_to")\n')
    assert any(why.startswith("uses the course library") for why in flags_of('f = pkgutil.resolve_name("mpcourse.formats:round_to")\n'))
    # A07: a package the grading environment cannot import, however it is imported
    missing = "pandas" if importlib.util.find_spec("pandas") is None else "no_such_package_45g"
    why = f"imports {missing}, which is not installed where grading runs (the part fails with ModuleNotFoundError)"
    for code in ("import pandas as pd\n", "import numpy, pandas\n", "from pandas import Series\n",
                 "def f(s):\n    import pandas\n    return pandas.Series(s).median()\n", 'pd = __import__("pandas")\n'):
        assert why in flags_of(code.replace("pandas", missing)), code
    assert flags_of("import torch, numpy as np, math, statistics\nimport matplotlib.pyplot as plt\n"
                    "from mpcourse.formats import get_format\n") == [
        "uses the course library, whose reference implementations the own-work check watches for "
        "(an observation the answer's process could forge)"]
    assert flags_of("from . import x\n") == []  # no module to find
    assert review_flags.installed("torch") and review_flags.installed("sys") and not review_flags.installed(missing)


def test_a_module_class_of_the_answers_and_the_call_stack_read_through_traceback_are_flagged():
    """Red team 16d, A: the answer set the shared `grading` module's class to a `type(grading)`
    subclass whose `__getattribute__` (the caller told by `traceback.extract_stack`) handed the tests
    an unwatched own_work: a forbidden torch.softmax, full marks, unflagged."""
    def flags_of(code):
        return review_flags.review_flags({"cells": [{"cell_type": "code", "source": code,
                                                     "metadata": {"nbgrader": {"grade_id": "p1_solution"}}}]}).get("p1", [])
    attack = ("import traceback\n\nclass Checker(type(grading)):\n    def __getattribute__(self, name):\n"
              "        real = super().__getattribute__(name)\n"
              "        if name != 'own_work' or traceback.extract_stack(limit=2)[0].name == '_check_untampered':\n"
              "            return real\n        return lambda f, *a, **k: f(*a, **k)\n\n"
              "checker = grading\nsetattr(checker, ''.join(reversed('__ssalc__')), Checker)\n")
    stack, lookup, module = ("reads the call stack", review_flags.LOOKUP, review_flags.MODULE_CLASS)
    assert {stack, lookup, module} <= set(flags_of(attack))
    for code in ("import traceback\nwho = traceback.extract_stack()[-2].name\n", "from traceback import walk_stack\n",
                 "import traceback as t\nt.print_stack()\n", "s = traceback.format_stack(limit=3)\n",
                 "g = sys._getframe\n", "s = traceback.StackSummary.extract(frames)\n",
                 "f = getattr(traceback, 'extract' + '_stack')\n"):
        assert stack in flags_of(code), code
    for code in ("class Box:\n    def __getattr__(self, name):\n        return 0\n",
                 "class Box(object):\n    def __getattribute__(self, name):\n        return 0\n",
                 "Box = type('Box', (), {'__getattribute__': f})\n"):
        assert lookup in flags_of(code), code
    for code in ("import types\nclass M(types.ModuleType):\n    pass\n", "from types import ModuleType\nclass M(ModuleType): pass\n",
                 "class M(type(grading)):\n    pass\n", "M = type('M', (type(grading),), {})\n",
                 "M = types.new_class('M', (types.ModuleType,))\n"):
        assert module in flags_of(code), code
    for honest in ("import traceback\ntry:\n    f()\nexcept ValueError:\n    traceback.print_exc()\n",
                   "y = torch.stack([a, b])\n", "kind = type(x)\nif type(m) is nn.Linear:\n    pass\n",
                   "class StableSoftmax(nn.Module):\n    def forward(self, x):\n        return x\n",
                   "class Scaler(object):\n    def __init__(self, s):\n        self.s = s\n"):
        assert flags_of(honest) == [], honest


def test_without_cgroups_students_are_graded_one_at_a_time(monkeypatch, tmp_path):
    """Where no sandbox can get its own CPU share, none gets a neighbour to starve."""
    from concurrent.futures import ThreadPoolExecutor
    pools = []

    class Pool(ThreadPoolExecutor):
        def __init__(self, workers):
            pools.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(schedule, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(schedule, "sandbox_problem", lambda: None)
    make_course(tmp_path, [HOSTILE_TARGET])
    for available, expected in ((True, 2), (False, 1)):
        monkeypatch.setattr(schedule.sandboxing, "cgroups_available", lambda: available)
        with pytest.warns(UserWarning, match="placeholder"):
            schedule.grade(tmp_path, HOSTILE_TARGET, workers=2)
        assert pools[-1] == expected
