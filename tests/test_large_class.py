"""Grading a large class (issue 35): students graded side by side give the gradebook one at a time
gives; each grade is written as soon as it is known, once; a rerun grades only who has none; shards
on several machines meet in one PostgreSQL gradebook equal to the one-machine SQLite result.

The scheduler's bookkeeping is tested with a stand-in for grading one student (instant, its
finishing order chosen); then a tiny real class (one short exercise, four students, no feedback
run) is graded for real, one at a time, two at a time, and as two concurrent shards into a real
PostgreSQL server, one of them killed half-way and rerun.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
from grader import fabricate, feedback, gradebook, notebooks, rehearsal, runs, schedule  # noqa: E402
from grader.course import make_course  # noqa: E402
from tests import postgres  # noqa: E402

ASSIGNMENT = "ex4_softmax_stability"  # among the quickest to grade (about 2.5 s a student without feedback)
KINDS = ["full", "blank", "partial", "reference"]
SHARDS = 2  # machines grading at once (here: processes sharing the course folder and the cores)
NO_SANDBOX = runs.sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")
NO_POSTGRES = postgres.problem()
ENV = {**os.environ, gradebook.SECRET_VARIABLE: "a-test-secret-of-at-least-32-characters"}


def points() -> dict:
    return fabricate.test_points(ASSIGNMENT)


def cli(*args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def course_of(folder: Path, students: dict) -> Path:
    make_course(folder, [ASSIGNMENT])
    for student, cells in students.items():
        fabricate.write_submission(folder, ASSIGNMENT, student, cells)
    return folder


# --- the schedule's rules ------------------------------------------------------------------

def test_shards_split_the_class_by_sha256_of_the_id():
    import hashlib
    names = [f"student{i:03d}" for i in range(60)] + ["Ünïcode-ID", "0042"]
    for n in (1, 2, 3, 7):
        owners = {s: [k for k in range(1, n + 1) if schedule.in_shard(s, (k, n))] for s in names}
        assert all(len(k) == 1 for k in owners.values()), "a student in no shard, or in two"
        assert all(owners[s][0] - 1 == int(hashlib.sha256(s.encode()).hexdigest(), 16) % n for s in names)
    assert schedule.parse_shard("2/3") == (2, 3)
    for wrong in ("0/2", "3/2", "2", "a/b", "1/0"):
        with pytest.raises(ValueError, match="K/N"):
            schedule.parse_shard(wrong)


def test_default_jobs_is_one_per_core_as_many_as_memory_holds(monkeypatch):
    """At what each sandbox may take: students who hoard memory, graded side by side, cannot
    together ask for more than there is (red team 45h, U03: at 2 GiB a student, twice as much)."""
    from grader import sandbox
    assert schedule.JOB_MEMORY >= sandbox.Limits(seconds=1, cpu_seconds=1).memory_bytes
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(schedule, "mem_available", lambda: 64 * schedule.JOB_MEMORY)
    assert schedule.default_jobs() == cores
    monkeypatch.setattr(schedule, "mem_available", lambda: schedule.JOB_MEMORY + 1)
    assert schedule.default_jobs() == 1
    monkeypatch.setattr(schedule, "mem_available", lambda: schedule.JOB_MEMORY // 2)
    assert schedule.default_jobs() == 1
    monkeypatch.setattr(schedule, "mem_available", lambda: None)
    assert schedule.default_jobs() == cores


def test_each_sandbox_gets_as_many_maths_threads_as_cpus(tmp_path):
    from grader import sandbox
    assert runs.threads(sandbox.Limits(10, 10)) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                                      "OPENBLAS_NUM_THREADS": "1"}
    assert runs.threads(sandbox.Limits(10, 10, cpus=2.0))["OMP_NUM_THREADS"] == "2"
    if NO_SANDBOX:
        pytest.skip(f"no sandbox here: {NO_SANDBOX}")
    (tmp_path / "work").mkdir()
    run = runs.run_sandboxed(["python", "-c", "import torch; print(torch.get_num_threads())"], folder=tmp_path,
                               limits=sandbox.Limits(120, 120), sandbox=True)
    assert run.returncode == 0 and run.stdout.split() == ["1"], run.stderr[-2000:]


class StandIn:
    """grade_student's stand-in: student i passes the first i parts; each waits, if told, until
    `wait(student)` lets it finish; students in `dies` fail as a crashed worker would; `flags`:
    {student: review flags} their answers get."""

    def __init__(self, release: dict, dies=(), wait=lambda student: None, flags=None):
        self.release, self.dies, self.wait, self.calls, self.lock = release, set(dies), wait, [], threading.Lock()
        self.flags = flags or {}

    def __call__(self, course, assignment, student, template, source, release, secret, timeout, sandbox, execute,
                 reference=None, batched=None):
        with self.lock:
            self.calls.append((student, execute))
        self.wait(student)
        if student in self.dies:
            raise MemoryError("the worker died")
        rank = sorted(STUDENTS).index(student)
        verdicts = {t: {"passed": i < rank, "message": "" if i < rank else "wrong"} for i, t in enumerate(points())}
        return verdicts, self.release, None, None, self.flags.get(student)


STUDENTS = ["ada", "bob", "cy", "dee"]


def expected(student: str) -> dict:
    rank = sorted(STUDENTS).index(student)
    return {t: (p if i < rank else 0.0) for i, (t, p) in enumerate(points().items())}


def graded_by_stand_ins(course: Path, monkeypatch):
    """schedule.grade of `course` with grade_student's stand-in and no sandbox, template or
    reference run: run(stand_in, **options) -> Report."""
    for name in ("sandbox_problem", "environment_problem"):
        monkeypatch.setattr(schedule, name, lambda *args: None)
    monkeypatch.setattr(schedule, "template_course", lambda course, assignment, scratch: scratch)
    monkeypatch.setattr(schedule, "reference_records", lambda *args: {})  # the stand-in needs none
    monkeypatch.setattr(schedule, "student_records", lambda *args: {})

    def run(stand_in, **options):
        monkeypatch.setattr(schedule, "grade_student", stand_in)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return schedule.grade(course, ASSIGNMENT, workers=4, **options)
    return run


def test_grades_are_written_once_as_known_and_a_rerun_grades_only_who_has_none(tmp_path, monkeypatch):
    course = course_of(tmp_path / "course", {s: {} for s in STUDENTS})
    release = notebooks.read_notebook(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    run = graded_by_stand_ins(course, monkeypatch)
    written, recorded = [], {s: threading.Event() for s in STUDENTS}
    real_record = schedule.record

    def record(*args, **kw):
        real_record(*args, **kw)
        written.append(args[3])
        recorded[args[3]].set()

    def last_first(student):  # the first submitted finishes last, once the later ones are in the gradebook
        for later in sorted(STUDENTS)[sorted(STUDENTS).index(student) + 1:]:
            if later != "bob":
                assert recorded[later].wait(60), f"{later}'s grade was not written while {student} was graded"

    monkeypatch.setattr(schedule, "record", record)

    first = run(StandIn(release, dies={"bob"}, wait=last_first))
    assert written == ["dee", "cy", "ada"]  # each as soon as known, in the order they finished
    assert "the worker died" in first.not_graded["bob"] and first.unwritten == {"bob"}
    assert gradebook.scores(course, ASSIGNMENT) == {s: expected(s) for s in ("ada", "cy", "dee")}
    assert "bob" not in first.scores

    again = StandIn(release)
    second = run(again)  # only bob, whose grading failed
    assert [s for s, _ in again.calls] == ["bob"] and second.skipped == ["ada", "cy", "dee"]
    assert gradebook.scores(course, ASSIGNMENT) == {s: expected(s) for s in STUDENTS}

    # Instructor walkthrough 47b, B1: a re-submission collected after grading kept its old grade
    submitted = course / "submitted" / "dee" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    submitted.write_text(submitted.read_text().replace("{", "{\n", 1))  # handed in again
    resubmitted = StandIn(release)
    fourth = run(resubmitted)
    assert [s for s, _ in resubmitted.calls] == ["dee"] and fourth.again == ["dee"]
    assert fourth.skipped == ["ada", "bob", "cy"]
    assert "graded again, their submission changed since: dee" in schedule.closing_line(ASSIGNMENT, fourth)
    unchanged = StandIn(release)
    assert run(unchanged).again == [] and unchanged.calls == []  # graded from what is there now

    # Handed in again while being graded: the grade is the earlier submission's, so the next run grades again
    def hands_in_meanwhile(student):
        submitted.write_text(submitted.read_text().replace("{", "{\n", 1))
    run(StandIn(release, wait=hands_in_meanwhile), students=["dee"], regrade=True)
    meanwhile = StandIn(release)
    assert run(meanwhile).again == ["dee"] and [s for s, _ in meanwhile.calls] == ["dee"]

    page = course / "autograded" / "cy" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    page.write_text('{"earlier": "feedback"}')
    only = StandIn({"cells": [], "metadata": {}})
    third = run(only, students=["cy"], regrade=True, feedback=False)
    assert only.calls == [("cy", False)] and not third.feedback
    assert page.read_text() == '{"earlier": "feedback"}', "--no-feedback replaced the feedback notebook"

    with gradebook_of(course) as book:  # one submission and one grade per part per student, however often graded
        rows = book.db.execute(text("SELECT student_id, count(*) FROM submitted_assignment GROUP BY student_id")).all()
        assert sorted(rows) == [(s, 1) for s in STUDENTS]
        assert book.db.execute(text("SELECT count(*) FROM grade")).scalar() == len(STUDENTS) * len(points())

    feedback.feedback_for(course, ASSIGNMENT, ["ada"])  # a shard's pages: its own students' only
    assert sorted(p.name for p in (course / "feedback").iterdir()) == ["ada"]
    result = cli("grade", ASSIGNMENT, "--course", str(course), "--student", "nobody", check=False)
    assert result.returncode != 0 and "no submission of" in result.stderr and "nobody" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_rerun_lists_the_flagged_answers_of_the_students_it_skips_as_graded(tmp_path, monkeypatch, capsys):
    """Red team 45i, A09: a flagged answer's grade was written, the run stopped (Ctrl-C) before its
    report, and the rerun skipped that student as graded: nothing ever said to read the answer."""
    from grader.__main__ import grade_course
    course = course_of(tmp_path / "course", {s: {} for s in STUDENTS})
    release = notebooks.read_notebook(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    run = graded_by_stand_ins(course, monkeypatch)
    monkeypatch.setenv(gradebook.SECRET_VARIABLE, "a-test-secret-of-at-least-32-characters")
    flagged = {"p1": ["inspects frames or source"]}
    real_record = schedule.record

    def stopped_after_cy(*args, **kw):
        real_record(*args, **kw)
        if args[3] == "cy":
            raise KeyboardInterrupt  # Ctrl-C, as cy's grade has just been written
    monkeypatch.setattr(schedule, "record", stopped_after_cy)
    with pytest.raises(KeyboardInterrupt):
        run(StandIn(release, flags={"cy": flagged}))
    assert "cy" in gradebook.scores(course, ASSIGNMENT)
    monkeypatch.setattr(schedule, "record", real_record)
    capsys.readouterr()

    read_cy = "READ cy p1: its answer inspects frames or source (flagged by an earlier run"
    for _ in range(2):  # the same command again, as the guide says, and every run after it
        grade_course(course, ASSIGNMENT, 60, True, workers=4, feedback=False)
        out = capsys.readouterr().out
        assert read_cy in out, out
        assert out.count("READ ") == 1, out
    # graded again, its answer no longer flagged: no longer listed
    assert run(StandIn(release), students=["cy"], regrade=True).flags == {}
    assert run(StandIn(release)).flagged_before == {}
    # the grader's own record damaged: said, not taken as "no flags"
    with gradebook_of(course) as book:
        book.db.execute(text(f"UPDATE {gradebook.GRADED} SET flags = '{{not json' WHERE student = 'cy'"))
        book.db.commit()
    assert "cannot be read" in run(StandIn(release)).flagged_before["cy"]["?"][0]


def test_flags_are_kept_with_a_grade_whose_submission_folder_could_not_be_fingerprinted(tmp_path, monkeypatch):
    """The flags live only in the gradebook, in the grade's row: a grade written without a
    fingerprint (the folder could not be read) keeps its flags all the same."""
    course = course_of(tmp_path / "course", {s: {} for s in STUDENTS})
    release = notebooks.read_notebook(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    run = graded_by_stand_ins(course, monkeypatch)
    for module in (schedule, gradebook):
        monkeypatch.setattr(module, "submission_fingerprint", lambda *args: None)
    flagged = {"p1": ["inspects frames or source"]}
    run(StandIn(release, flags={"cy": flagged}))
    with gradebook_of(course) as book:
        assert gradebook.graded_records(book, ASSIGNMENT)["cy"][0] == ""
    later = run(StandIn(release))
    assert later.flagged_before == {"cy": flagged} and later.again == []
    assert not list((course / "autograded").rglob(".*"))  # nothing kept beside the feedback


def test_a_shard_rerun_on_another_machine_grades_a_resubmission_again_and_lists_the_flags(tmp_path, monkeypatch):
    """Red team 45i, A02: what a student was graded from was known only in the autograded/ folder of
    the machine that graded them, so shard 2's command rerun on machine 1 (the guide allows it)
    kept bob's 0 for a 10/10 re-submission, silently. Two course folders sharing one gradebook
    stand for two machines sharing a PostgreSQL server."""
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    one, two = (course_of(tmp_path / machine, {s: {} for s in STUDENTS}) for machine in ("m1", "m2"))
    release = notebooks.read_notebook(one / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    gradebook.prepare(one, ASSIGNMENT, shared)
    theirs = [s for s in STUDENTS if schedule.in_shard(s, (2, 2))]
    assert "bob" in theirs and "ada" in theirs
    flagged = {"p2": ["inspects frames or source"]}
    graded_by_stand_ins(two, monkeypatch)(StandIn(release, flags={"ada": flagged}), shard=(2, 2), url=shared)
    for machine in (one, two):  # bob hands in again; the download is collected on both machines
        submitted = machine / "submitted" / "bob" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        submitted.write_text(submitted.read_text().replace("{", "{\n", 1))
    on_one = graded_by_stand_ins(one, monkeypatch)
    again = StandIn(release)
    rerun = on_one(again, shard=(2, 2), url=shared)
    assert rerun.again == ["bob"] and [s for s, _ in again.calls] == ["bob"]
    assert rerun.flagged_before == {"ada": flagged}  # flagged on machine 2, listed on machine 1
    assert on_one(StandIn(release), shard=(2, 2), url=shared).again == []  # graded from what is there now


def test_feedback_for_one_student_of_a_class_of_50000_already_graded(tmp_path, monkeypatch):
    """Red team 45i, A06: the students whose pages stay as they are went to nbgrader in one
    command-line argument; past Linux's 128 KiB for one (6,000 ids) nbgrader never started: a
    traceback, no feedback page and no report."""
    course = course_of(tmp_path / "course", {s: {} for s in STUDENTS})
    release = notebooks.read_notebook(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    graded_by_stand_ins(course, monkeypatch)(StandIn(release))  # four feedback notebooks in autograded/
    for i in range(50_000):  # the rest of the class, graded before (all the feedback step reads of them)
        (course / "autograded" / f"studentname{i:05d}_{1_000_000 + i}" / ASSIGNMENT).mkdir(parents=True)
    assert feedback.feedback_for(course, ASSIGNMENT, ["ada"]) == {}
    assert sorted(p.name for p in (course / "feedback").iterdir()) == ["ada"]  # the others left out, all of them
    assert (course / "feedback" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()


def text(sql: str):
    from sqlalchemy import text as sql_text
    return sql_text(sql)


def gradebook_of(course: Path, url: str | None = None):
    from nbgrader.api import Gradebook
    return Gradebook(url or f"sqlite:///{course / 'gradebook.db'}")


def test_a_shard_refuses_to_start_before_prepare(tmp_path):
    course = tmp_path / "course"  # a gradebook that never heard of the assignment
    (course / "submitted" / "ada" / ASSIGNMENT).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    with pytest.raises(schedule.NotPrepared, match="python -m grader prepare"):
        schedule.grade(course, ASSIGNMENT, shard=(1, 2))
    assert not gradebook.registered(course, ASSIGNMENT)


# --- a tiny real class -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The class graded one student at a time on one machine (SQLite): {student: {part: points}}."""
    if NO_SANDBOX:
        pytest.skip(f"no sandbox here: {NO_SANDBOX}")
    folder = tmp_path_factory.mktemp("serial")
    course = course_of(folder / "course", {k: c for k, c in fabricate.submissions(ASSIGNMENT).items() if k in KINDS})
    report = rehearsal.grade_all(course, ASSIGNMENT, timeout=30, workers=1, feedback=False)
    graded = gradebook.scores(course, ASSIGNMENT)
    assert not report.not_graded and report.workers == 1
    assert graded["full"] == points() and graded["blank"] == {t: 0.0 for t in points()}
    return course, graded


@needs_sandbox
def test_two_at_a_time_gives_the_gradebook_one_at_a_time_gives(serial, tmp_path):
    import shutil
    course = tmp_path / "course"  # the same class, not graded yet
    shutil.copytree(serial[0], course, ignore=shutil.ignore_patterns("gradebook.db", "autograded", "feedback"))
    result = cli("grade", ASSIGNMENT, "--course", str(course), "--jobs", "2", "--no-feedback", "--timeout", "30")
    assert gradebook.scores(course, ASSIGNMENT) == serial[1]
    assert "4 students graded in" in result.stderr and "2 at a time" in result.stderr
    assert "students per minute" in result.stderr and "feedback NOT rebuilt" in result.stdout


def graded_in(url: str, students) -> set:
    with gradebook_of(None, url) as book:
        return gradebook.graded_students(book, ASSIGNMENT, points()) & set(students)


@needs_sandbox
@pytest.mark.skipif(NO_POSTGRES is not None, reason=f"no PostgreSQL here: {NO_POSTGRES}")
def test_two_shards_meet_in_postgresql_and_a_killed_one_reruns_without_duplicates(serial):
    course, expected_scores = serial
    with postgres.Server() as server:
        # a database that stores text as SQL_ASCII (initdb with no locale): refused in a sentence (red team 22, A02)
        ascii_url = server.database("ascii_gradebook", "ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
        for command in ("prepare", "grade", "results"):
            said = cli(command, ASSIGNMENT, "--course", str(course), "--db-url", ascii_url, check=False)
            assert said.returncode != 0 and "Traceback" not in said.stderr, said.stderr[-3000:]
            assert "stores text as SQL_ASCII" in said.stderr and "--encoding=UTF8" in said.stderr, said.stderr[-3000:]
        url = server.database("gradebook")
        refused = cli("grade", ASSIGNMENT, "--course", str(course), "--db-url", url, "--shard", "1/2", check=False)
        assert refused.returncode != 0 and "prepare" in refused.stderr and "Traceback" not in refused.stderr
        cli("prepare", ASSIGNMENT, "--course", str(course), "--db-url", url)
        shards = {k: [s for s in KINDS if schedule.in_shard(s, (k, SHARDS))] for k in range(1, SHARDS + 1)}
        victim = max(shards, key=lambda k: len(shards[k]))  # a shard with two students or more
        assert len(shards[victim]) >= 2
        line = [sys.executable, "-m", "grader", "grade", ASSIGNMENT, "--course", str(course),
                "--db-url", url, "--timeout", "30", "--jobs", "1", "--shard"]
        # The victim runs its students' notebooks (the feedback run), one at a time after their hidden
        # tests (all run first, batched): its grades are then written seconds apart, time to kill it between two.
        running = {k: subprocess.Popen([*line, f"{k}/{SHARDS}", *([] if k == victim else ["--no-feedback"])], cwd=ROOT,
                                       env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in shards}
        deadline = time.monotonic() + 300
        while not graded_in(url, shards[victim]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running[victim].poll() is None, "the shard finished before it could be killed half-way"
        running[victim].send_signal(signal.SIGKILL)
        kept = graded_in(url, shards[victim])
        assert 1 <= len(kept) < len(shards[victim]), "a killed shard keeps the grades it wrote, and only those"
        for k, process in running.items():
            output = process.communicate(timeout=300)[0]
            assert k == victim or process.returncode == 0, output[-3000:]
        rerun = subprocess.run([*line, f"{victim}/{SHARDS}", "--no-feedback"], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
        assert f"{len(kept)} already graded" in rerun.stderr
        assert gradebook.scores(None, ASSIGNMENT, url) == expected_scores  # student for student, part for part
        with gradebook_of(None, url) as book:
            rows = book.db.execute(text("SELECT student_id, count(*) FROM submitted_assignment GROUP BY student_id"))
            assert sorted(rows.all()) == [(s, 1) for s in sorted(KINDS)]
            duplicated = book.db.execute(text("SELECT notebook_id, cell_id FROM grade GROUP BY notebook_id, cell_id "
                                              "HAVING count(*) > 1")).all()
            assert duplicated == []


# A fork bomb in a notebook cell (the feedback run's kernel may fork; the hidden-test run cannot):
# children that fail to fork stop; those that did become `sleep BOMB_SECONDS`, which the test counts
# from outside; then the cell waits, so the bomb holds its processes until its shard is stopped.
BOMB_SECONDS = "147.25"  # beyond the honest shard however loaded the machine: the test's Ctrl-C ends it
BOMB = f"""import os, time
for _ in range(100_000):
    try:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{BOMB_SECONDS}"])
    except OSError:
        break
time.sleep({BOMB_SECONDS})
"""


def bombs() -> int:
    found = subprocess.run(["pgrep", "-c", "-x", "-f", f"sleep {BOMB_SECONDS}"], capture_output=True, text=True)
    return int(found.stdout.strip() or 0)


@needs_sandbox
@pytest.mark.skipif(NO_POSTGRES is not None, reason=f"no PostgreSQL here: {NO_POSTGRES}")
def test_a_fork_bomb_in_one_shard_leaves_the_other_shards_grades_as_a_lone_run_gives(serial, tmp_path):
    """Issue 46, as the instructor met it: two shards on one machine, one grading a student whose
    notebook forks until the kernel refuses, the other grading honest students at that moment. With
    shared sandbox uids the second shard's sandboxes could not fork: NOT GRADED, exported as 0. (On a
    kernel that counts the process limit per user namespace, as 6.18 does, shared uids no longer
    collide; the test holds the outcome there all the same, test_two_grading_processes_never_share_a_sandbox_uid
    the uids.)"""
    import shutil
    lone, expected = serial
    course = tmp_path / "course"
    shutil.copytree(lone, course, ignore=shutil.ignore_patterns("gradebook.db", "autograded", "feedback"))
    honest = [s for s in KINDS if schedule.in_shard(s, (2, SHARDS))]
    for student in set(KINDS) - set(honest):  # shard 1 grades the bomber alone
        shutil.rmtree(course / "submitted" / student)
    bomber = next(f"bomber{i}" for i in range(100) if schedule.in_shard(f"bomber{i}", (1, SHARDS)))
    full = fabricate.submissions(ASSIGNMENT)["full"]
    fabricate.write_submission(course, ASSIGNMENT, bomber, fabricate.edit(
        full, lambda nb: nb.cells.append(nbformat.v4.new_code_cell(BOMB))))
    assert honest and bombs() == 0
    with postgres.Server() as server:
        url = server.database("gradebook")
        cli("prepare", ASSIGNMENT, "--course", str(course), "--db-url", url)
        line = [sys.executable, "-m", "grader", "grade", ASSIGNMENT, "--course", str(course), "--db-url", url,
                "--jobs", "1", "--shard"]
        bombing = subprocess.Popen([*line, f"1/{SHARDS}", "--timeout", "200"], cwd=ROOT, env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 180
            while bombs() < 100 and bombing.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)  # at its limit (256 tasks a sandbox, the kernel's threads among them)
            assert bombs() >= 100, "the bomb never went off"
            result = subprocess.run([*line, f"2/{SHARDS}", "--no-feedback", "--timeout", "30"], cwd=ROOT, env=ENV,
                                    capture_output=True, text=True, timeout=300)
            still = bombs()
        finally:
            bombing.send_signal(signal.SIGINT)  # as Ctrl-C: its sandboxes end with it
            try:
                stopped = bombing.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:  # once, in a loaded CI run (session 16): then end it outright
                bombing.kill()
                stopped = None
                bombing.communicate()
        if stopped is not None:
            assert bombing.returncode == 130 and "stopped: 0 grades written" in stopped, stopped[-3000:]
            assert "Traceback" not in stopped, stopped[-3000:]  # Ctrl-C is no crash
        assert result.returncode == 0 and "NOT GRADED" not in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
        assert still >= 100, "the bomb was over before the honest shard finished: the test proved nothing"
        graded = gradebook.scores(None, ASSIGNMENT, url)
        assert {s: graded[s] for s in honest} == {s: expected[s] for s in honest}
    deadline = time.monotonic() + 60
    while bombs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert bombs() == 0, "the bomb outlived its shard"


@needs_sandbox
def test_two_grading_processes_never_share_a_sandbox_uid():
    """Issue 46: every grader process numbered its sandboxes' uids from the same start, and the
    kernel's process limit counts per uid across the machine: a fork bomb in one run, or two shards
    on one machine, made the other run's sandboxes fail with "Cannot fork"."""
    from grader import sandbox
    holder = subprocess.Popen([sys.executable, "-c", "from grader import sandbox; import time\n"
                               "print(sandbox._slot(), sandbox._slot(), flush=True); time.sleep(120)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        theirs = set(map(int, holder.stdout.readline().split()))
        ours = [sandbox._slot() for _ in range(3)]
        assert len(theirs) == 2 and not theirs & set(ours), (theirs, ours)
    finally:
        holder.kill()
        holder.wait()
        for slot in ours:
            sandbox._release(slot)
    freed = min(theirs)  # free again once its holder ended, however it ended
    assert freed in sandbox.CLAIMED or sandbox._claim(freed)
    sandbox._release(freed)


@needs_sandbox
def test_a_fork_bomb_in_one_grading_process_leaves_another_ones_sandboxes_working():
    """Issue 46: the same, as it happened: one run's student forks until the per-uid process limit
    is reached; the other run's sandboxes must still start processes."""
    from grader import sandbox
    limits = sandbox.Limits(seconds=20, cpu_seconds=20, processes=24)
    bomb = threading.Thread(target=sandbox.run, args=(["/bin/bash", "-c", "while true; do sleep 30 & done"],),
                            kwargs={"limits": limits})  # bash retries a fork that failed; sh would end
    bomb.start()
    time.sleep(3)  # it has reached the limit
    other = subprocess.run([sys.executable, "-c", "from grader import sandbox\n"
                            "o = sandbox.run(['/bin/sh', '-c', 'for i in 1 2 3 4; do /bin/true & done; wait; echo forked'],"
                            f" limits=sandbox.Limits(seconds=20, cpu_seconds=20, processes=24))\n"
                            "print(o.returncode, o.stdout.strip(), o.stderr.strip()[-300:])"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    sandbox.STOP.set()  # end the bomb now
    try:
        bomb.join(60)
    finally:
        sandbox.STOP.clear()
    assert other.stdout.startswith("0 forked"), other.stdout + other.stderr


@needs_sandbox
def test_stopping_the_grader_ends_the_sandboxes_still_running():
    from grader import sandbox
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(sandbox.run(["/bin/sleep", "100"], limits=sandbox.Limits(200, 200))))
    worker.start()
    try:
        time.sleep(1)
        sandbox.STOP.set()  # what grade() does on Ctrl-C
        worker.join(60)
    finally:
        sandbox.STOP.clear()
    assert outcome and outcome[0].killed == "stopped" and outcome[0].returncode is None


def test_tests_that_would_leave_a_reference_computation_to_students_stop_grading_before_anyone(tmp_path, monkeypatch):
    """Issue 45: an instructor's test cell whose helper computing an expected value stays in the
    student's copy (a plain assert uses it too) is the instructor's problem, said with its line,
    before any student is graded: no student gets a grade from it."""
    course = tmp_path / "course"  # only what grading reads before it grades anyone
    for folder in ("solutions", "exercises", "submitted/ada"):
        (course / folder / ASSIGNMENT).mkdir(parents=True)
    release = (ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
    (course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text(release)
    (course / "submitted" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text(release)
    path = course / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    source = notebooks.read_notebook(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    for cell in source["cells"]:
        if notebooks.grade_id(cell) == "p4_tests":
            cell["source"] = notebooks.source_text(cell).replace(
                "grading.raises(ValueError, nan_rows_vs_scale, as_written, [1.0], rows=0)",
                "assert expected_fractions([1.0], 4, 4, 0, torch.float16)[0] == 0\n"
                "grading.raises(ValueError, nan_rows_vs_scale, as_written, [1.0], rows=0)")
    path.write_text(json.dumps(source))
    for name in ("sandbox_problem", "environment_problem"):
        monkeypatch.setattr(schedule, name, lambda *args: None)
    monkeypatch.setattr(schedule, "grade_student", lambda *args: pytest.fail("a student was graded"))
    with pytest.raises(ValueError, match=r"cannot be graded .*p4_tests: line \d+: expected_fractions, defined in the test cell"):
        schedule.grade(course, ASSIGNMENT, workers=1)


# --- issue 52: the reference's records, computed for the class before the students' runs -------

def bare_course(course: Path, students) -> Path:
    """Only what grading one student reads: the source, the release, each student's notebook (the
    release, unanswered)."""
    for folder in ("solutions", "exercises", *(f"submitted/{s}" for s in students)):
        (course / folder / ASSIGNMENT).mkdir(parents=True)
    for folder in ("solutions", "exercises"):
        (course / folder / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text(
            (ROOT / folder / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    for student in students:
        (course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text(
            (ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    return course


def test_one_reference_run_per_worker_and_a_failed_one_leaves_its_students_runs_of_their_own(tmp_path, monkeypatch):
    source = notebooks.read_notebook(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    secrets = {s: f"secret-of-{s}" for s in STUDENTS}
    batches = []

    def run_references(folder, job, chunk, sandbox, timeout):
        batches.append(chunk)
        assert job == runs.hidden_test_job(source, source, "", timeout, reference=True)  # the reference's, whoever
        if "secret-of-bob" in chunk:
            return None, "ran out of time"
        return [{"record of": secret} for secret in chunk], None

    monkeypatch.setattr(schedule, "run_references", run_references)
    records = schedule.reference_records(tmp_path / "references", source, secrets, 30, True, workers=2)
    assert sorted(map(sorted, batches)) == [["secret-of-ada", "secret-of-cy"], ["secret-of-bob", "secret-of-dee"]]
    assert records == {"ada": {"record of": "secret-of-ada"}, "cy": {"record of": "secret-of-cy"},
                       "bob": None, "dee": None}  # each record to its own student; bob's batch failed
    batches.clear()
    three = {s: secrets[s] for s in ("ada", "cy", "dee")}
    assert schedule.reference_records(tmp_path / "one", source, three, 30, True, workers=1) == {
        s: {"record of": secret} for s, secret in three.items()} and len(batches) == 1
    monkeypatch.setattr(schedule, "REFERENCE_BATCH", 2)  # a large class: batches of at most that many
    batches.clear()
    assert schedule.reference_records(tmp_path / "small", source, three, 30, True, workers=1) == {
        s: {"record of": secret} for s, secret in three.items()} and sorted(map(len, batches)) == [1, 2]

    # grading one student: the batch's record, or (None) a reference run of their own, as before
    course = bare_course(tmp_path / "course", ["ada"])
    release = notebooks.read_notebook(course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    ran = []
    passing = {t: {"observations": [{"check": "equal", "what": "x", "expected": 1, "actual": 1}], "stopped": None} for t in points()}
    answers = {t: {"observations": [{"check": "equal", "actual": 1}], "stopped": None} for t in points()}

    def run_hidden_tests(folder, job, sandbox, timeout, library=None):
        ran.append(folder.name)
        if folder.name == "reference":
            assert job["secret"] == "secret-of-ada"
            return reference_run, None
        return answers, None

    monkeypatch.setattr(schedule, "run_hidden_tests", run_hidden_tests)

    def grade(reference):
        ran.clear()
        return schedule.grade_student(course, ASSIGNMENT, "ada", None, source, release, "secret-of-ada", 30, False,
                                      False, reference)

    reference_run = None
    verdicts, _, problem, _, _ = grade(passing)
    assert ran == ["student"] and problem is None and all(v["passed"] for v in verdicts.values())
    reference_run = passing
    verdicts, _, problem, _, _ = grade(None)
    assert ran == ["reference", "student"] and problem is None and all(v["passed"] for v in verdicts.values())
    # a reference that stopped on this student's secret: not graded, the instructor's problem
    stopped = {**passing, "p2_tests": {"observations": [], "stopped": "RuntimeError: only on this secret"}}
    with pytest.raises(schedule.GraderProblem, match="reference solution fails its own tests: .*only on this secret"):
        grade(stopped)
    reference_run = None  # and a reference run that fails

    def failing_reference(folder, job, sandbox, timeout, library=None):
        return (None, "was killed: it ran past its time") if folder.name == "reference" else (answers, None)

    monkeypatch.setattr(schedule, "run_hidden_tests", failing_reference)
    with pytest.raises(schedule.GraderProblem, match=r"hidden-test runner \(reference\) was killed"):
        grade(None)
    # graded in a class: named with the reason, no grade written (review 71: it was written as 0, kept
    # by the next runs and exported), graded again by the next run
    monkeypatch.setattr(schedule, "reference_records", lambda *args, **kwargs: {})

    def refused(*args, **kwargs):
        raise schedule.GraderProblem("the instructor's reference solution fails its own tests: only on this secret")

    monkeypatch.setattr(schedule, "grade_student", refused)
    course = course_of(tmp_path / "real", {"ada": {}})
    report = schedule.grade(course, ASSIGNMENT, sandbox=False, workers=1, feedback=False)
    assert "reference solution fails its own tests" in report.not_graded["ada"] and "ada" in report.unwritten
    assert "ada" not in report.scores and "ada" not in gradebook.scores(course, ASSIGNMENT)


@needs_sandbox
def test_a_part_whose_record_is_too_large_to_read_is_flagged_and_costs_that_part_only(tmp_path):
    """Red team 45c, A06b: an answer that inflates its part's record (900,000 nested empty lists, 20 MB)
    loses that part, with the reason in its feedback and a review flag; its other parts are graded."""
    inflate = ("\n_unit = []\nfor _ in range(9):\n    _unit = [_unit]\n_sent = []\n_own = naive_softmax\n\n\n"
               "def naive_softmax(x, dim=-1):\n    if not _sent:\n        _sent.append(1)\n"
               "        grading._observations.extend([_unit] * 900_000)\n    return _own(x, dim)\n")
    cells = fabricate.solution_cells(ASSIGNMENT)
    course = course_of(tmp_path / "course", {"inflated": {**cells, "p1_solution": cells["p1_solution"] + inflate}})
    report = rehearsal.grade_all(course, ASSIGNMENT, timeout=30, workers=1, feedback=False)
    assert not report.not_graded, report.not_graded
    graded = gradebook.scores(course, ASSIGNMENT)["inflated"]
    assert graded == {**points(), "p1_tests": 0.0}, graded
    assert report.flags["inflated"]["p1"] == ["made the part's record unreadable: wrote a record larger than the "
                                              "grader reads (16 MiB)"], report.flags
