"""A grading session rehearsed on fabricated submissions (grader/fabricate.py), each in a scratch
course: `make grade-demo` (`python -m grader demo`), `python -m grader check`, and the tests'
gradings. Never runs student code itself: it grades through grader/schedule.py, which runs every
submission in sandboxes.

    grade_fabricated(course, assignment, students, timeout, execute=True, **options) -> (scores, Report)
    grade_many(workdir, {name: (assignment, students, timeout[, execute])}, **options) -> {name: (scores, Report)}
    check(names, workdir)     # grade the standard submissions, print the scores
    demo(out)                 # a whole session in `out`: release, grading, feedback, grades.csv
"""
import csv
import shutil
import time
import warnings
from pathlib import Path

from grader import schedule
from grader.course import assignments, make_course
from grader.feedback import render_pages
from grader.fabricate import submissions, test_points, write_submission
from grader.gradebook import export, scores
from grader.report import plural, print_report, print_table


def grade_all(course: Path, assignment: str, timeout: int, execute=True, sandbox: bool = True, **options):
    """Grade every submission of `assignment` with grader/schedule.py (`options`: its grade()'s); return its Report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placeholder secret, SQLAlchemy's notes on nbgrader's API
        return schedule.grade(course, assignment, timeout=timeout, execute=execute, sandbox=sandbox, **options)


def grade_fabricated(course: Path, assignment: str, students: dict[str, dict], timeout: int, execute=True,
                     **options):
    """Release `assignment` into `course`, submit `students`, grade (`options`: schedule.grade()'s);
    return (scores, Report)."""
    shutil.rmtree(course, ignore_errors=True)
    make_course(course, [assignment])
    for student, cells in students.items():
        write_submission(course, assignment, student, cells)
    report = grade_all(course, assignment, timeout, execute, **options)
    return scores(course, assignment), report


def grade_many(workdir: Path, jobs: dict[str, tuple], **options) -> dict:
    """Grade several scratch courses one after the other (each one student per core at a time,
    unless `options`, schedule.grade()'s, say otherwise):
    {name: (assignment, students, timeout[, execute])} -> {name: (scores, Report)}."""
    return {name: grade_fabricated(workdir / name, *job, **options) for name, job in jobs.items()}


def check(names: list[str], workdir: Path) -> None:
    jobs = {name: (name, submissions(name), 60) for name in names}
    for name, (graded, report) in grade_many(workdir, jobs).items():
        print_table(name, graded, test_points(name))
        print_report(report)


def demo(out: Path) -> None:
    """A whole grading session: release, fabricated submissions (the hostile corpus and the honest
    accidents included), sandboxed grading, feedback, CSV."""
    shutil.rmtree(out, ignore_errors=True)
    names = assignments()
    make_course(out, names)
    hostile_target = "ex4_softmax_stability" if "ex4_softmax_stability" in names else names[0]
    for name in names:
        for student, cells in submissions(name, hostile=name == hostile_target).items():
            write_submission(out, name, student, cells)
        print(f"grading {name} ...", flush=True)
        started = time.perf_counter()
        report = grade_all(out, name, timeout=20, progress=True)  # every core, as `grade --jobs` does
        seconds = time.perf_counter() - started
        count = len(report.scores)
        print(f"  {plural(count, 'submission')} in {seconds:.0f} s ({seconds / count:.1f} s each, {report.workers} at a time)")
        said = render_pages(out, name, [])
        if said:
            raise RuntimeError(f"nbgrader generate_feedback failed:\n{said[-3000:]}")
        print_table(name, scores(out, name), test_points(name))
        print_report(report)
    export(out, out / "grades.csv")
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    print(f"\n{out / 'grades.csv'}: {plural(len(rows), 'row')} (one per student and assignment)")
    print(f"feedback HTML: {out / 'feedback'}/<student>/<assignment>/<assignment>.html")
