"""Grading a class: every student of an assignment, `workers` at a time, each in sandboxes of their
own, their grades written to the gradebook as soon as each is known. Never runs student code
itself: the runs do, in their sandboxes (grader/runs.py).

    grade(course, assignment, students=None, sandbox=True, workers=None, shard=None) -> Report
    grade_student(course, assignment, student, ...) -> (verdicts, notebook as run, problem, note, flags)

One student's path, one way: the submission read as JSON (grader/notebooks.py; a submission that is
or holds a symbolic link is refused, with the reason), its answers flagged for review
(grader/review_flags.py), the feedback run, the student's hidden-test run and the reference's
(grader/runs.py, each in a sandbox of its own; the student's imports the course library less what the
parts ask students to write, grader/withheld.py), the judge (grader/judge.py: data, never code), then,
in the scheduler's thread, the gradebook (grader/gradebook.py), which also writes the feedback
notebook (grader/feedback.py). The reference's runs come first, for every student at once: its
code is the same for all, only the secret differs, so one sandboxed run per worker computes the
records of many students (`reference_records`); a student whose batch failed gets a reference run
of their own, as before. The students' hidden tests come next, also batched (`student_records`: up
to STUDENT_BATCH students one after another in one sandbox, runs.run_students), each student's
records those a run of their own gives; a student the batch did not grade, or whose submission
changed since it was read, gets a run of their own in grade_student.

- Every core: `workers` students at a time (default `default_jobs()`: one per core, as many as
  memory holds), each sandbox held to one CPU (grader/sandbox.py) and its maths libraries to one
  thread (runs.run_sandboxed), so a neighbour neither starves nor slows an honest part.
- One writer: the grades are written here, in this thread, one student at a time as each is done,
  whatever order they finish in (grader/gradebook.py). A stopped run keeps every grade written; a
  rerun grades only the students without one, unless `regrade`, and reports the review flags
  written with the grades of those it skips. A student whose grading failed (the grader's fault,
  not theirs) gets no grade written, so the next run grades them again.
- Many machines: `shard=(K, N)` grades the students whose `int(sha256(id), 16) % N == K - 1`, into
  one gradebook (PostgreSQL) that `gradebook.prepare` made before the shards started.
"""
import hashlib
import os
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from grader import judge
from grader.advice import with_test_cell_names
from grader import sandbox as sandboxing
from grader.feedback import hidden_test_lines, seeds_of
from grader.gradebook import (create_graded_table, db_url, graded_records, graded_students, handed_in_again,
                              instructor_secret, record, register, registered, stored_flags, submission_fingerprint,
                              submitters, without_password)
from grader.notebooks import (files_note, grade_id, normalised, part_of, read_notebook, read_submission, recovered,
                              setup_kept, source_text, student_code, submission_files, uploaded_as)
from grader.report import one_line, plural
from grader.review_flags import ANSWER_CHARS, review_flags
from grader.withheld import declared, library_copy
from grader.runs import (BrokenEnvironment, NoSandbox, defined_names, environment_problem, hidden_test_job,  # noqa: F401
                         run_feedback, run_hidden_tests, run_references, run_students, sandbox_problem,
                         template_course)

# Memory set aside per student graded at once: `default_jobs` runs no more than memory holds. An
# honest student's heaviest step, the feedback run (nbgrader and a kernel, each with torch), peaked
# at about 300 MiB (benchmarks/bench_grading.py), but each sandbox may take up to its cgroup's limit
# (sandbox.MEMORY_BYTES, 4 GiB), and a class may hold a hoarder beside another: at 2 GiB a
# student, two of them graded at once could ask for twice the memory there was, and the machine's
# out-of-memory killer picks its own victim, the grader's process among the candidates (red team
# 45h, U03). What a sandbox may take is set aside, so no students' sandboxes together can.
JOB_MEMORY = sandboxing.MEMORY_BYTES


@dataclass
class Report:
    scores: dict = field(default_factory=dict)      # student -> {test cell: points}
    messages: dict = field(default_factory=dict)    # student -> {test cell: failure message}
    not_graded: dict = field(default_factory=dict)  # student -> why no hidden-test result (0 recorded)
    notes: dict = field(default_factory=dict)       # student -> what else to know (a renamed notebook, the feedback run)
    flags: dict = field(default_factory=dict)       # student -> {part: [why to read that answer]}
    seconds: dict = field(default_factory=dict)     # student -> wall-clock seconds of their grading
    unwritten: set = field(default_factory=set)     # not graded, and no grade written: the next run grades them
    skipped: list = field(default_factory=list)     # already graded before this run (no `regrade`)
    flagged_before: dict = field(default_factory=dict)  # skipped student -> {part: [why]}, kept with their grade
    again: list = field(default_factory=list)       # graded before, handed in again since: graded again
    feedback: bool = True                           # False: feedback notebooks left as they were
    workers: int = 0                                # students graded at a time
    wall_seconds: float = 0.0                       # the grading, from the reference run on
    setup_seconds: float = 0.0                      # before it: the checks, registering, the release's course


class NotPrepared(RuntimeError):
    pass


def mem_available() -> int | None:
    """Bytes of memory available for new work (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_jobs() -> int:
    """Students graded at a time when not told: one per core this process may use, no more than
    the available memory holds at JOB_MEMORY each, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = mem_available()
    return max(1, min(cores, memory // JOB_MEMORY if memory else cores))


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), with 1 <= K <= N; anything else is refused with the reason."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: write K/N, e.g. 1/3 (this machine grades the first third)") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K/N needs 1 <= K <= N")
    return k, n


def in_shard(student: str, shard: tuple[int, int]) -> bool:
    """Whether shard K of N grades `student`: int(sha256(id), 16) % N == K - 1 (the same answer on
    every machine; Python's own hash differs between processes)."""
    k, n = shard
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n == k - 1


def grade(course: Path, assignment: str, students: list[str] | None = None, *, sandbox: bool = True,
          timeout: int = 60, workers: int | None = None, execute=True, regrade: bool = False,
          feedback: bool = True, shard: tuple[int, int] | None = None, url: str | None = None,
          progress: bool = False) -> Report:
    """Grade every submission of `assignment` in `course` (or `students`): gradebook, feedback, Report.
    `execute`: run the notebooks for the feedback (True), not (False: the feedback shows them as
    submitted), or only those of the students in a given set. `feedback=False`: no notebook runs and
    the feedback notebooks already in autograded/ stay as they are (only the grades change; the
    pages in feedback/ of the students graded are removed: grader/gradebook.py, `record`).
    `regrade`: grade the students who already have a grade too. `shard`: (K, N), see in_shard.
    `url`: the gradebook (else the course's db_url, else its gradebook.db). `progress`: a progress
    bar and a closing line with the wall time and students per minute, on stderr."""
    from nbgrader.api import Gradebook
    called = time.monotonic()
    course = Path(course).resolve()
    workers = workers or default_jobs()
    handed_in = submitters(course, assignment)
    unknown = sorted(set(students or ()) - set(handed_in))
    if unknown:
        raise ValueError(f"no submission of {assignment} from {', '.join(unknown)} "
                         f"(looked for submitted/<student>/{assignment}/)")
    url = db_url(course, url)
    if shard and not registered(course, assignment, url):  # two shards registering at once would write the same rows
        raise NotPrepared(f"{assignment} is not in the gradebook {without_password(url)}: run, once, before "
                          f"the shards start:\n  python -m grader prepare {assignment} --course {course}")
    problem = sandbox_problem() if sandbox else None
    if problem:
        raise NoSandbox(f"refusing to grade without a sandbox: {problem}. A submission could then read "
                        "and change other students' work and the gradebook. To grade anyway, on a machine "
                        "that holds nothing else of value, pass --no-sandbox.")
    if not sandbox:
        print("WARNING: grading WITHOUT a sandbox: every submission runs with your rights and can read and "
              "change other submissions, the gradebook and your files.", file=sys.stderr, flush=True)
    if workers > 1 and not sandboxing.cgroups_available():
        # Without a CPU share per sandbox, one full of busy processes would starve its neighbour
        # (measured: 17x slower beside 63 busy processes): no neighbour, then.
        print("NOTE: no cgroups here (root cannot create cgroup v1 groups): grading one student at a time, "
              "so that no sandbox can starve another.", file=sys.stderr, flush=True)
        workers = 1
    broken = environment_problem(sandbox)
    if broken:
        raise BrokenEnvironment(f"refusing to grade: {broken}.")
    outside = [s for s in (students or ()) if shard is not None and not in_shard(s, shard)]
    if outside:  # the guide's regrade command with --shard (red team 45k, A05: "0 students graded", no word)
        print(one_line(f"NOTE: {', '.join(outside)}: in another shard than {shard[0]}/{shard[1]}, not graded by this "
                       "command (name them without --shard, or with their own)"), file=sys.stderr, flush=True)
    students = [s for s in (students or handed_in) if shard is None or in_shard(s, shard)]
    source = read_notebook(course / "solutions" / assignment / f"{assignment}.ipynb")
    release = read_notebook(course / "exercises" / assignment / f"{assignment}.ipynb")
    try:  # the instructor's tests, checked once before anyone is graded: their problem is no student's grade
        hidden_test_job(source, source, "", timeout)
        declared(source)
    except (ValueError, SyntaxError) as error:
        raise ValueError(f"{assignment}: the exercise's tests cannot be graded (fix them in solutions/): {error}") from None
    points = {grade_id(c): float(c["metadata"]["nbgrader"]["points"]) for c in source["cells"]
              if grade_id(c) and c["metadata"]["nbgrader"].get("grade") and c["cell_type"] == "code"}
    secret = instructor_secret(course)
    if not registered(course, assignment, url):  # before grading anyone: the grades need somewhere to go
        print(f"registering {assignment} in {without_password(url)} (first grading of it)", file=sys.stderr, flush=True)
        register(course, assignment, url)
    from grader.results import create_table
    create_table(url)  # the report's lines, for `python -m grader results` (grader/results.py)
    hidden_lines = hidden_test_lines(source)
    report = Report(feedback=feedback, workers=workers)
    if not feedback:
        execute = False
    from sqlalchemy.exc import SAWarning
    with tempfile.TemporaryDirectory(prefix="grading-template-") as scratch, warnings.catch_warnings(), \
            Gradebook(url) as gradebook:
        # nbgrader's API adds a submission's rows in an order SQLAlchemy 2 notes three times per run
        # ("not in session, add operation ... will not proceed"): harmless, the rows are written.
        warnings.filterwarnings("ignore", category=SAWarning)
        create_graded_table(gradebook)  # a gradebook of an earlier version of the grader lacks it
        if not regrade:
            done, records = graded_students(gradebook, assignment, points), graded_records(gradebook, assignment)
            report.again = handed_in_again(course, assignment, [s for s in students if s in done], records)
            done -= set(report.again)
            report.skipped = [s for s in students if s in done]
            report.flagged_before = {s: flags for s in report.skipped
                                     if (flags := stored_flags(records, s))}
            students = [s for s in students if s not in done]
        runs = execute is True or bool(set(execute or ()) & set(students))  # a notebook run needs the release's course
        template = template_course(course, assignment, Path(scratch)) if students and runs else None
        secrets = {s: hashlib.sha256(f"{secret}:{assignment}:{s}".encode()).hexdigest() for s in students}
        began = time.monotonic()
        report.setup_seconds = began - called
        references = reference_records(Path(scratch) / "references", source, secrets, timeout, sandbox, workers,
                                       progress) if students else {}
        batched = student_records(Path(scratch) / "students", course, assignment, students, source, release, secrets,
                                  timeout, workers, progress) if sandbox else {}
        with ThreadPoolExecutor(workers) as pool, progress_bar(assignment, len(students), progress) as bar:
            started, fingerprints = {}, {}

            def timed(student):
                started[student] = time.monotonic()
                fingerprints[student] = submission_fingerprint(course, student, assignment)  # before it is read
                try:
                    return grade_student(course, assignment, student, template, source, release,
                                         secrets[student], timeout, sandbox,
                                         execute is True or student in (execute or ()), references.get(student),
                                         batched.get(student))
                finally:
                    report.seconds[student] = time.monotonic() - started[student]

            futures = {pool.submit(timed, s): s for s in students}
            try:
                for future in as_completed(futures):  # each student's grade is written as soon as it is known
                    student = futures[future]
                    try:
                        result = future.result()
                    except GraderProblem as error:  # the reference's, or the machine's: no grade written
                        failed(report, student, str(error)[:500])
                    except Exception as error:  # noqa: BLE001  the grader's failure: this student only
                        failed(report, student, f"the grader failed on this submission: {error!r}"[:500])
                    else:
                        try:
                            record(gradebook, course, assignment, student, result, points, release, report,
                                   secrets=[secret, secrets[student], *seeds_of(secrets[student])],
                                   hidden_lines=hidden_lines, feedback=feedback,
                                   fingerprint=fingerprints.get(student))
                        except Exception as error:  # noqa: BLE001  e.g. the database stayed busy
                            unrecorded(report, gradebook, assignment, points, student, error)
                    bar.set_postfix(not_graded=len(report.not_graded), refresh=False)
                    bar.update(1)
            except KeyboardInterrupt:
                sandboxing.STOP.set()  # end the sandboxes still running; what is written stays written
                pool.shutdown(wait=True, cancel_futures=True)
                sandboxing.STOP.clear()
                print(f"\nstopped: {plural(len(report.scores), 'grade')} written; run the same command again to grade "
                      f"the {plural(len(students) - len(report.scores), 'other')}", file=sys.stderr, flush=True)
                raise
        report.wall_seconds = time.monotonic() - began
    if progress:
        print(closing_line(assignment, report), file=sys.stderr, flush=True)
    return report


def gradable(course, assignment, student, source, release) -> tuple[dict | None, str | None, str | None]:
    """(the submission as graded, None, note) or (the submission or None, why it is not graded, note)."""
    try:
        submission = read_submission(course, student, assignment, release)
        files = submission_files(course, student, assignment, release)
        renamed = files_note(*files, assignment, uploaded_as(course, student, assignment, files[0]))
    except (OSError, ValueError) as error:
        return None, f"the submission could not be read: {error}", None
    submission, restored = recovered(submission, release)
    answers = {grade_id(c) for c in release["cells"] if (c["metadata"].get("nbgrader") or {}).get("solution")}
    if not answers & {grade_id(c) for c in submission["cells"]}:
        return submission, ("no answer cell of the notebook carries the exercise's nbgrader metadata "
                            "(an editor removed it, and the cells' ids too): grade it by hand"), renamed
    if restored:
        renamed = "; ".join(filter(None, [renamed, f"{plural(restored, 'cell')} had lost their nbgrader metadata: "
                                                   "recovered from the cells' ids"]))
    size = sum(len(code) for _, code in student_code(submission, source))
    if size > ANSWER_CHARS:
        return submission, (f"its answer cells and the cells it added hold {size:,} characters in all, more "
                            f"than the {ANSWER_CHARS:,} the grader reads: read it by hand"), renamed
    return submission, None, renamed


class GraderProblem(Exception):
    """Grading one student failed on the instructor's side (the reference solution fails its own
    tests on their inputs, or its run failed): not graded, no grade written, graded again by the next
    run (review 71: it was recorded as 0, kept by later runs and exported)."""


def grade_student(course, assignment, student, template, source, release, secret, timeout, sandbox, execute,
                  reference=None, batched=None):
    """(verdicts or None, the notebook as run (or as submitted), problem, note, review flags) for one
    student. The notebook as run comes from the sandbox: data to sanitise, nothing to trust.
    `reference`: the reference's record on this student's secret (reference_records), or None: the
    reference then runs here, for this student alone. `batched`: (the job a batch ran for this
    student, its records) from student_records, or None; used only where the job built here from
    the submission as read now is that job, else the student's hidden tests run here."""
    submission, problem, renamed = gradable(course, assignment, student, source, release)
    if problem:
        return None, submission, problem, renamed, None
    flags = review_flags(submission, source)
    with tempfile.TemporaryDirectory(prefix=f"grading-{assignment}-") as scratch:
        ran, note = submission, renamed
        if execute:
            run, why = run_feedback(Path(scratch) / "feedback", template, setup_kept(normalised(submission, release), release),
                                    assignment, timeout, sandbox)
            if why:
                note = "; ".join(filter(None, [renamed, f"its notebook run {why}; the feedback shows it as submitted"]))
            else:
                ran = run
        records = {}
        try:
            jobs = (("reference", hidden_test_job(source, source, secret, timeout, reference=True)),
                    ("student", hidden_test_job(source, submission, secret, timeout)))
            library = {"reference": None, "student": library_copy(declared(source), Path(scratch) / "library")}
        except (ValueError, SyntaxError) as error:
            return None, ran, f"the exercise's tests cannot be graded (fix them in solutions/): {error}", note, flags
        except RecursionError:  # the student's code, nested past what the grader reads (red team 30, A02)
            return None, ran, ("its code nests blocks deeper than the grader reads (a long elif chain, say): "
                               "read it by hand"), note, flags
        for who, job in jobs:
            if who == "reference" and reference is not None:  # computed before the students' runs
                records[who] = reference
                continue
            if who == "student" and batched is not None and batched[0] == job:  # the submission as the batch read it
                records[who] = batched[1]
                continue
            records[who], problem = run_hidden_tests(Path(scratch) / who, job, sandbox, timeout, library[who])
            if problem and who == "reference":
                raise GraderProblem(f"the hidden-test runner (reference) {problem}")
            if problem:
                return None, ran, f"the hidden-test runner ({who}) {problem}", note, flags
        for part, why in record_flags(jobs[1][1], records["student"]).items():
            flags[part] = sorted({*flags.get(part, []), *why})
        try:
            verdicts = judge.judge(records["reference"], records["student"])
            return with_test_cell_names(verdicts, release, jobs[1][1]), ran, None, note, flags
        except judge.ReferenceProblem as error:
            raise GraderProblem(f"the instructor's reference solution fails its own tests: {error}") from None


# A part's tests that ran past their time with cells the student added: a try-out a GPU runs in
# seconds (8192 x 8192 products) may take minutes on the grading CPU (red team 45h, A04). The grade
# stands (the students' page says so); the instructor is asked to look.
TIMED_OUT_WITH_ADDED = ("ran past its time with cells the student added ({}): a try-out a GPU runs in seconds "
                        "may take minutes here: read them")


def record_flags(job: dict, records: dict) -> dict[str, list[str]]:
    """{part: [why to read it]} from the student's records of their hidden-test `job`: a record too
    large to read (runs.read_records), tests that ran past their time with cells the student
    added (TIMED_OUT_WITH_ADDED), and answer cells that called what the part's functions may not
    (hidden_tests.watched_early)."""
    added = {part["test_id"]: [name.split("_added ", 1)[1].strip("()") for name, _ in part["cells"]
                               if "_added (" in name] for part in job["parts"]}
    flags: dict[str, list[str]] = {}
    for test_id, record in records.items():
        if record.get("refused"):
            why = str(record["refused"])
            flags.setdefault(part_of(test_id), []).append(why if why.startswith("replaced") else
                                                          "made the part's record unreadable: " + why)
        elif "did not finish" in str(record.get("stopped")) and added.get(test_id):
            flags.setdefault(part_of(test_id), []).append(TIMED_OUT_WITH_ADDED.format(", ".join(added[test_id])))
        if record.get("flagged"):  # the answer cells called what the part's functions may not (red team 18)
            flags.setdefault(part_of(test_id), []).append(str(record["flagged"]))
    return flags


REFERENCE_BATCH = 64  # the most students' secrets in one reference run (large records: fewer, runs.run_references)


def reference_records(folder: Path, source: dict, secrets: dict, timeout: int, sandbox: bool, workers: int,
                      progress: bool = False) -> dict:
    """{student: the reference's record on their secret, or None}: the reference solution run on
    every student's secret inputs before any student's runs, in `workers` sandboxed runs side by side
    (runs.run_references; more, `workers` at a time, for more than REFERENCE_BATCH students each),
    not one per student. A student whose batch failed as a whole gets None:
    their grading runs the reference on its own, as for one student, and its failure, if any, is
    theirs alone (not graded, the grader's failure). A reference that fails its own tests on one
    secret fails there only (judge.self_check: that student is not graded)."""
    students = list(secrets)
    try:
        job = hidden_test_job(source, source, "", timeout, reference=True)
    except (ValueError, SyntaxError):  # each student's grading says why
        return {}
    chunks = chunked(students, workers, REFERENCE_BATCH)
    folder.mkdir()
    if progress:
        whose = plural(len(students), "student's", "students'")
        print(f"the reference solution on {whose} secret inputs: "
              f"{plural(len(chunks), 'sandboxed run')}, "
              f"{min(workers, len(chunks))} at a time", file=sys.stderr, flush=True)

    def batch(number, chunk):
        try:
            return run_references(folder / str(number), job, [secrets[s] for s in chunk], sandbox, timeout)
        except Exception as error:  # noqa: BLE001  the grader's failure: these students' own runs follow
            return None, repr(error)[:300]

    records = {}
    for chunk, (found, problem) in zip(chunks, side_by_side(batch, chunks, workers)):
        if problem:
            print(f"NOTE: the reference run of {plural(len(chunk), 'student')} {problem}: each of them gets a reference "
                  "run of their own", file=sys.stderr, flush=True)
        records.update(zip(chunk, found or [None] * len(chunk)))
    return records


def chunked(students: list, workers: int, most: int) -> list[list]:
    """`students` dealt into `workers` batches, more where a batch would hold more than `most`."""
    count = max(min(workers, len(students)), -(-len(students) // most))
    return [students[k::count] for k in range(count)]


def side_by_side(batch, chunks: list, workers: int) -> list:
    """[batch(number, chunk) for each of `chunks`], `workers` at a time; Ctrl-C ends the sandboxes
    still running, then stops."""
    pool = ThreadPoolExecutor(min(workers, len(chunks)))
    try:
        return list(pool.map(batch, range(len(chunks)), chunks))
    except KeyboardInterrupt:
        sandboxing.STOP.set()  # end the sandboxes still running
        pool.shutdown(wait=True, cancel_futures=True)
        sandboxing.STOP.clear()
        raise
    finally:
        pool.shutdown()


STUDENT_BATCH = 16  # students whose hidden tests one sandboxed run grades (runs.run_students)


def student_records(folder: Path, course: Path, assignment: str, students: list[str], source: dict, release: dict,
                    secrets: dict, timeout: int, workers: int, progress: bool = False) -> dict:
    """{student: (their hidden-test job, its records)} for the gradable students, from sandboxed runs
    of up to STUDENT_BATCH students each, `workers` at a time (runs.run_students): each student's
    records are those a run of their own gives, without the imports each such run pays. A student
    not here (their run or one before it in the batch did not end well, or the submission changed
    since: grade_student compares the job) gets a run of their own, as before."""
    jobs = {}
    for student in students:
        try:
            submission, problem, _ = gradable(course, assignment, student, source, release)
            if not problem:
                jobs[student] = hidden_test_job(source, submission, secrets[student], timeout)
        except Exception:  # noqa: BLE001  (ValueError, SyntaxError, ...): grade_student says why
            pass
    if len(jobs) < 2:
        return {}
    names = list(jobs)
    chunks = chunked(names, workers, STUDENT_BATCH)
    folder.mkdir()
    library = library_copy(declared(source), folder / "library")
    if progress:
        print(f"the hidden tests of {plural(len(names), 'student')}: {plural(len(chunks), 'sandboxed run')}, "
              f"{min(workers, len(chunks))} at a time", file=sys.stderr, flush=True)

    def batch(number, chunk):
        try:
            return run_students(folder / str(number), [jobs[s] for s in chunk], timeout, library)
        except Exception:  # noqa: BLE001  the grader's failure: these students' own runs follow
            return [None] * len(chunk)

    found = {}
    for chunk, records in zip(chunks, side_by_side(batch, chunks, workers)):
        found.update({s: (jobs[s], r) for s, r in zip(chunk, records) if r is not None})
    return found


def failed(report: Report, student: str, why: str) -> None:
    """`student` not graded through no fault of theirs: named with the reason, no grade written,
    graded again by the next run."""
    report.not_graded[student] = why
    report.unwritten.add(student)
    report.scores.pop(student, None)


def unrecorded(report: Report, gradebook, assignment: str, points: dict, student: str, error: Exception) -> None:
    """Recording `student` failed: say whether their grade was written before it did."""
    try:
        written = student in graded_students(gradebook, assignment, points)
    except Exception:  # noqa: BLE001  the database is gone
        gradebook.db.rollback()
        written = False
    if written:  # graded: a note, never "NOT GRADED ... recorded as 0" beside a grade that is not 0
        why = f"its grade is written, its feedback notebook is not: building it failed: {error!r}"[:500]
        report.notes[student] = "; ".join(filter(None, [report.notes.get(student), why]))
    else:
        failed(report, student, f"recording it failed (no grade was written): {error!r}"[:500])


def progress_bar(assignment: str, total: int, shown: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=f"grading {assignment}", unit="student", file=sys.stderr, disable=not shown,
                smoothing=0.1, dynamic_ncols=True)


def closing_line(assignment: str, report: Report) -> str:
    """`N students graded in S s, W at a time: R students per minute` (and who was skipped)."""
    count, seconds = len(report.seconds), report.wall_seconds
    rate = f": {60 * count / seconds:.1f} students per minute" if count and seconds else ""
    skipped = (f"; {len(report.skipped)} already graded, left as they are (--regrade grades them again)"
               if report.skipped else "")
    skipped += (f"; {len(report.again)} graded again, their submission changed since: {', '.join(report.again)}"
                if report.again else "")
    setup = (f" (after {report.setup_seconds:.0f} s of set-up: the checks, the gradebook, the release's course)"
             if report.setup_seconds >= 1 else "")
    return (f"{assignment}: {plural(count, 'student')} graded in {seconds:.0f} s{setup}, {report.workers} at a "
            f"time{rate}{skipped}")
