"""The eight graded exercises, end to end with the real nbgrader: the release is generated from the
solutions and leaks nothing, and autograding gives the marks an instructor expects, to every
kind of submission, including hostile ones, without hanging.

Grading runs once per session (the `graded` fixture): each assignment in its own scratch course,
with fabricated submissions (grader/fabricate.py says how they are made), by the grader package: hidden
tests out of the student's process, one bubblewrap sandbox per student. The hostile corpus of
issue 16 is graded in one run, with short timeouts, and only the submissions whose notebook run
matters (feedback, output, kernel) are executed.
"""
from html.parser import HTMLParser
import hashlib
import html
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab_cells  # noqa: E402
from grader import (fabricate, feedback, gradebook, hostile_corpus, notebooks, rehearsal, review_flags,  # noqa: E402
                    runs, schedule, withheld)
from grader.course import assignments, make_course, nbgrader  # noqa: E402

EXERCISES = ["ex1_precision_comparison", "ex2_loss_scaling", "ex3_dynamic_range",
             "ex4_softmax_stability", "ex5_mixed_precision_speedup", "ex6_fp8_quantization",
             "ex7_fp16_nan_hunt", "ex8_bitwise_resume"]
ASSIGNMENTS = assignments()
HOSTILE_TARGET = "ex4_softmax_stability" if "ex4_softmax_stability" in ASSIGNMENTS else ASSIGNMENTS[0]
STANDARD = ["full", "blank", "partial", "reference"]
HOSTILE = [*hostile_corpus.HOSTILE, *hostile_corpus.EDITS]
NO_SANDBOX = runs.sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")


@pytest.fixture(scope="session")
def graded_with_reports(tmp_path_factory):
    """(scratch folder, {course: scores}, {course: schedule.Report}); feedback for the hostile course."""
    if NO_SANDBOX:
        pytest.skip(f"grading refuses to run without a sandbox: {NO_SANDBOX}")
    workdir = tmp_path_factory.mktemp("grading")
    jobs = {name: (name, fabricate.submissions(name), 30, {"full"}) for name in ASSIGNMENTS}
    jobs["hostile"] = (HOSTILE_TARGET, {s: c for s, c in fabricate.submissions(HOSTILE_TARGET, hostile=True).items()
                                        if s not in ("full", "blank", "partial", "reference")}, 10, hostile_corpus.EXECUTED)
    os.environ["MPCOURSE_INSTRUCTOR_TOKEN"] = hostile_corpus.INSTRUCTOR_TOKEN  # what a sandbox must not see
    try:
        results = rehearsal.grade_many(workdir, jobs)
    finally:
        del os.environ["MPCOURSE_INSTRUCTOR_TOKEN"]
    nbgrader(workdir / "hostile", "generate_feedback", HOSTILE_TARGET, "--force")
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
            # one (ex3: a rounding primitive), the own-work check names the call
            shown = " ".join(graded_outputs(workdir, assignment, "reference", assignment, gid).replace("\\n", " ").split())
            assert ("is withheld while your work is graded" in shown if withheld.declared(
                fabricate.notebook(ROOT / "solutions", assignment)) else "calls the course library" in shown), shown
        else:
            assert scores[assignment]["reference"][gid] == p


def last_part_lost(assignment):
    test_cells = list(points(assignment))
    return {gid: (0 if gid == test_cells[-1] else p) for gid, p in points(assignment).items()}


@needs_sandbox
@pytest.mark.parametrize("student", HOSTILE)
def test_a_hostile_last_part_loses_that_part_only_and_the_grader_finishes(graded, student):
    _, scores = graded
    assert scores["hostile"][student] == last_part_lost(HOSTILE_TARGET)


@needs_sandbox
def test_every_student_is_graded_and_a_dead_kernel_is_named(graded_with_reports):
    _, _, reports = graded_with_reports
    for name, report in reports.items():
        refused = hostile_corpus.REFUSED if name == "hostile" else {}
        assert set(report.not_graded) == set(refused)
        for student, why in refused.items():
            assert why in report.not_graded[student]
    assert "os_exit" in reports["hostile"].notes  # its notebook run died: named, feedback as submitted


# --- issue 16: the hostile corpus, graded in the one run above ---------------------------------

@needs_sandbox
@pytest.mark.parametrize("student", hostile_corpus.FOOLS)
def test_no_marks_without_working_code(graded_with_reports, student):
    _, scores, reports = graded_with_reports
    assert scores["hostile"][student] == {gid: 0 for gid in points(HOSTILE_TARGET)}
    assert set(reports["hostile"].messages[student]) == set(points(HOSTILE_TARGET))


@needs_sandbox
@pytest.mark.parametrize("student", hostile_corpus.TARGETED)
def test_a_targeted_attack_scores_nothing_on_the_parts_it_attacks(graded, student):
    _, scores = graded
    attacked = {notebooks.part_of(gid) for gid in hostile_corpus.TARGETED[student]}
    assert scores["hostile"][student] == {gid: (0 if notebooks.part_of(gid) in attacked else p)
                                          for gid, p in points(HOSTILE_TARGET).items()}


def test_the_targeted_attacks_are_caught_for_the_reason_they_exist(graded_with_reports):
    if NO_SANDBOX:
        pytest.skip(NO_SANDBOX)
    messages = graded_with_reports[2]["hostile"].messages
    # the watcher switched off around the library's reference: the reference is not there (issue 45)
    assert "is withheld while your work is graded" in messages["watcher_switched_off"]["p3_tests"]
    assert "torch.softmax" in messages["forbidden_softmax"]["p3_tests"]
    assert "overflow_threshold" in messages["uses_the_tests_helper"]["p2_tests"]
    assert "subclass of float" in messages["always_equal_float"]["p2_tests"]


@needs_sandbox
def test_the_library_reached_around_the_watcher_is_not_there_and_still_flagged(graded_with_reports):
    """Issue 45: an answer that calls the library's reference after rewriting the library's code
    objects (once a documented limit: the own-work check, made in its own process, was fooled), or
    through a thread started before the tests, finds the function absent from the sandbox's
    library; the review flags still name the first for the instructor."""
    _, scores, reports = graded_with_reports
    messages = reports["hostile"].messages
    for student, part in (("rewrites_library_code", "p3"), ("library_in_a_thread", "p1"), ("library_in_a_thread", "p3")):
        assert "is withheld while your work is graded" in messages[student][f"{part}_tests"], (student, part)
    flags = reports["hostile"].flags["rewrites_library_code"]["p3"]
    assert "rewrites code objects" in flags and any("course library" in flag for flag in flags)
    assert "fn=exp(2 t)" in messages["constant_table"]["p2_tests"]  # a table has no answer for another fn


@needs_sandbox
@pytest.mark.parametrize("student", hostile_corpus.ACCIDENTS)
def test_an_honest_accident_costs_at_most_the_part_it_touches(graded, student):
    _, scores = graded
    lost = hostile_corpus.ACCIDENT_COSTS.get(student)  # lost if it outlasts the timeout: a slow C call may not
    for gid, p in points(HOSTILE_TARGET).items():
        assert scores["hostile"][student][gid] in ((0, p) if notebooks.part_of(gid) == lost else (p,)), gid
    if student == "ignores_sigint":  # an endless loop always outlasts it
        assert scores["hostile"][student]["p1_tests"] == 0


@needs_sandbox
def test_a_submission_cannot_touch_other_work_or_outlive_its_sandbox(graded):
    workdir, scores = graded
    assert scores["hostile"]["vandal"] == points(HOSTILE_TARGET)
    course = workdir / "hostile"
    for path in [course / "gradebook.db", *course.glob("submitted/*/*/*.ipynb")]:
        assert not path.read_bytes().startswith(b"vandalised"), path
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            alive += [cmdline] if hostile_corpus.VANDAL_MARK.encode() in cmdline.read_bytes() else []
        except OSError:
            pass
    assert not alive, "a process the submission started outlived its sandbox"


@needs_sandbox
def test_the_feedback_runs_no_student_html_and_shows_no_hidden_test(graded):
    workdir, scores = graded
    secret, public = set(), set()
    for cell in source_cells(HOSTILE_TARGET):
        shown, hidden = fabricate.split_cell(cell)
        if cell.metadata.get("nbgrader", {}).get("grade"):  # hidden tests (solutions: the students' own code)
            secret |= {line.strip() for line in hidden if len(line.strip()) >= 12}
        public |= {line.strip() for line in shown}
    secret -= public  # a hidden line may repeat one students are shown anyway
    assert len(secret) > 20
    pages = sorted((workdir / "hostile" / "feedback").glob(f"*/{HOSTILE_TARGET}/*.html"))
    assert len(pages) == len(set(scores["hostile"]) - set(hostile_corpus.REFUSED))  # a refused submission gets none
    for page in pages:
        html = page.read_text()
        assert not active_html(html, hostile_corpus.SCRIPT_MARK), page
        leaked = [line for line in secret if line in html]
        assert not leaked, f"{page}: {leaked[:2]}"
    xss = (workdir / "hostile" / "feedback" / "xss_feedback" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.html").read_text()
    assert hostile_corpus.SCRIPT_MARK in xss  # shown as text, not run


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


def test_gigantic_output_is_cut_in_the_graded_notebook(graded):
    workdir, _ = graded
    graded_nb = workdir / "hostile" / "autograded" / "gigantic_output" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.ipynb"
    assert graded_nb.stat().st_size < 1_000_000
    assert "[grader] stream output truncated" in graded_nb.read_text()


def test_tampering_is_named_in_the_feedback(graded):
    workdir, _ = graded
    last_test = list(points(HOSTILE_TARGET))[-1]
    assert "were replaced" in graded_outputs(workdir, "hostile", "monkeypatch", HOSTILE_TARGET, last_test)


def test_an_edited_test_cell_is_restored_before_grading(graded):
    workdir, _ = graded
    last_test = list(points(HOSTILE_TARGET))[-1]
    nb = fabricate.notebook(workdir / "hostile" / "autograded" / "edited_test_cell", HOSTILE_TARGET)
    restored = next(c for c in nb.cells if notebooks.grade_id(c) == last_test)
    assert "all tests pass!" not in restored.source and "grading.start" in restored.source


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


def test_the_template_course_holds_no_secret(tmp_path):
    template = runs.template_course(ROOT, ASSIGNMENTS[0], tmp_path)  # what each feedback sandbox gets
    assert "HiddenTests" not in (template / "nbgrader_config.py").read_text()
    assert "HiddenTests" in (ROOT / "nbgrader_config.py").read_text()


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
    limits = runs.sandboxing.Limits(seconds=25, cpu_seconds=100, processes=64)
    alone = in_sandbox(tmp_path / "alone", NEIGHBOUR, limits=limits)
    attacker = {}
    thread = threading.Thread(target=lambda: attacker.update(run=in_sandbox(tmp_path / "attacker", FORKS, 400, limits=limits)))
    thread.start()
    time.sleep(5)
    beside = in_sandbox(tmp_path / "next", NEIGHBOUR, limits=limits)
    thread.join()
    run = attacker["run"]
    assert alone.returncode == 0 and beside.returncode == 0, beside.stderr
    slowdown = float(beside.stdout.split("SECONDS")[1]) / float(alone.stdout.split("SECONDS")[1])
    print(f"neighbour's slowdown next to {run.stdout.strip()} busy processes: {slowdown:.2f}x")
    assert run.killed == "time" and int(run.stdout.split("STARTED")[1]) < limits.processes
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


def read_or_nothing(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_the_feedback_runs_time_limit_does_not_grow_with_the_number_of_cells():
    assert runs.feedback_limits(10).seconds == runs.feedback_seconds(10) < 24 * 10


@needs_sandbox
@pytest.mark.parametrize("student", hostile_corpus.ESCAPES)
def test_an_escape_gets_what_an_honest_grader_gives(graded_with_reports, student):
    _, scores, reports = graded_with_reports
    full = points(HOSTILE_TARGET)
    if student == "reads_classmates":
        expected = {gid: 0 for gid in full}
    elif student in hostile_corpus.REFUSED:
        expected = {gid: 0 for gid in full}
        assert hostile_corpus.REFUSED[student] in reports["hostile"].not_graded[student]
    elif student in hostile_corpus.ESCAPE_COSTS:
        expected = last_part_lost(HOSTILE_TARGET)
    else:
        expected = full
    assert scores["hostile"][student] == expected


def feedback_page(workdir, student):
    return (workdir / "hostile" / "feedback" / student / HOSTILE_TARGET / f"{HOSTILE_TARGET}.html").read_text()


@needs_sandbox
def test_no_feedback_page_holds_the_secret_a_seed_or_the_instructors_environment(graded):
    workdir, scores = graded
    secret = gradebook.PLACEHOLDER_SECRET
    for student in scores["hostile"]:
        page = (workdir / "hostile" / "feedback" / student / HOSTILE_TARGET / f"{HOSTILE_TARGET}.html")
        if not page.exists():
            continue
        text = page.read_text()
        mine = hashlib.sha256(f"{secret}:{HOSTILE_TARGET}:{student}".encode()).hexdigest()
        assert mine not in text and mine[:16] not in text and hostile_corpus.INSTRUCTOR_TOKEN not in text, student
        assert not [s for s in feedback.seeds_of(mine, 10) if re.search(rf"\b{s}\b", text)], student
    assert "hidden tests failed" in feedback_page(workdir, "leaks_through_message")


@needs_sandbox
def test_the_feedback_is_built_from_data_not_from_a_file_the_sandbox_could_swap(graded):
    workdir, _ = graded
    graded_nb = workdir / "hostile" / "autograded" / "symlink_swap" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.ipynb"
    assert not graded_nb.is_symlink() and "root:" not in graded_nb.read_text()
    assert not list((workdir / "hostile").rglob("filler")), "nothing a sandbox writes reaches the disk"


@needs_sandbox
def test_output_across_cells_is_capped_in_the_feedback(graded):
    workdir, _ = graded
    assert len(feedback_page(workdir, "huge_outputs")) < 4 * feedback.OUTPUT_CHARS
    assert "holds at most" in feedback_page(workdir, "huge_outputs")


@needs_sandbox
def test_many_looping_cells_stop_at_the_whole_runs_limit(graded_with_reports):
    _, _, reports = graded_with_reports
    report = reports["hostile"]
    assert "ran past" in report.notes["many_looping_cells"]
    # The whole run's limit, not 24 cells times the per-cell timeout (10 s here); the hidden tests after it.
    assert report.seconds["many_looping_cells"] < runs.feedback_seconds(10) + runs.hidden_test_limits(4, 10).seconds


def dangerous_addresses(page: str) -> list[str]:
    """Addresses in tags a browser would follow or run, with entities decoded and blanks dropped."""
    parsed = TagCollector()
    parsed.feed(page)
    addresses = [re.sub(r"[\s\x00-\x1f]", "", html.unescape(value or "")).lower()
                 for _, attrs in parsed.tags for name, value in attrs if name in ("href", "src", "action", "xlink:href")]
    return [a for a in addresses if a.startswith(("javascript:", "vbscript:", "data:"))]


@needs_sandbox
def test_entity_encoded_links_and_maths_links_are_made_inert(graded):
    workdir, _ = graded
    page = feedback_page(workdir, "entity_links")
    assert not dangerous_addresses(page) and "\\href{" not in page
    assert hostile_corpus.SCRIPT_MARK in page  # shown as text


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
    tricks = {"p1_solution": hostile_corpus.LEAK, "p2_solution": hostile_corpus.BUSY + hostile_corpus.SWAP,
              "p3_solution": "import torch\ntorch.Tensor.__eq__ = lambda a, b: True\n",
              "p4_solution": "import sqlite3, os\nos.symlink('/proc/1/fd/1', 'x')\nf = lambda: 0\nf.__code__ = f.__code__.replace()\n"}
    flags = review_flags.review_flags(notebook_of(tricks))
    assert "reads the call stack" in flags["p1"] and "starts processes" in flags["p2"]
    assert "assigns to an attribute of torch" in flags["p3"]
    assert {"opens databases", "makes symbolic links", "reads /proc", "rewrites code objects"} <= set(flags["p4"])


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
