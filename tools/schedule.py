"""Grading a class: every student of an assignment, each in sandboxes of their own
(tools/grader.py grades one), their grades written to the gradebook as soon as each is known.

    grade(course, assignment, students=None, sandbox=True) -> Report
"""
import hashlib
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sandbox as sandboxing  # noqa: E402
from grader import (BrokenEnvironment, NoSandbox, environment_problem, grade_id, grade_student,  # noqa: E402
                    hidden_test_lines, read_notebook, sandbox_problem, seeds_of, template_course)
from gradebook import instructor_secret, record, register, registered  # noqa: E402


@dataclass
class Report:
    scores: dict = field(default_factory=dict)      # student -> {test cell: points}
    messages: dict = field(default_factory=dict)    # student -> {test cell: failure message}
    not_graded: dict = field(default_factory=dict)  # student -> why no hidden-test result (0 recorded)
    notes: dict = field(default_factory=dict)       # student -> what else to know (a renamed notebook, the feedback run)
    flags: dict = field(default_factory=dict)       # student -> {part: [why to read that answer]}
    seconds: dict = field(default_factory=dict)     # student -> wall-clock seconds of their grading


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
    if workers > 1 and not sandboxing.cgroups_available():
        # Without a CPU share per sandbox, one full of busy processes would starve its neighbour
        # (measured: 17x slower beside 63 busy processes): no neighbour, then.
        print("NOTE: no cgroups here (root cannot create cgroup v1 groups): grading one student at a time, "
              "so that no sandbox can starve another.", file=sys.stderr, flush=True)
        workers = 1
    broken = environment_problem(sandbox)
    if broken:
        raise BrokenEnvironment(f"refusing to grade: {broken}.")
    students = students or sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    source = read_notebook(course / "solutions" / assignment / f"{assignment}.ipynb")
    release = read_notebook(course / "exercises" / assignment / f"{assignment}.ipynb")
    points = {grade_id(c): float(c["metadata"]["nbgrader"]["points"]) for c in source["cells"]
              if grade_id(c) and c["metadata"]["nbgrader"].get("grade") and c["cell_type"] == "code"}
    secret = instructor_secret(course)
    if not registered(course, assignment):  # before grading anyone: the grades need somewhere to go
        print(f"registering {assignment} in {course / 'gradebook.db'} (first grading of it)", file=sys.stderr, flush=True)
        register(course, assignment)
    hidden_lines = hidden_test_lines(source)
    report = Report()
    from sqlalchemy.exc import SAWarning
    with tempfile.TemporaryDirectory(prefix="grading-template-") as scratch, warnings.catch_warnings(), \
            Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        # nbgrader's API adds a submission's rows in an order SQLAlchemy 2 notes three times per run
        # ("not in session, add operation ... will not proceed"): harmless, the rows are written.
        warnings.filterwarnings("ignore", category=SAWarning)
        template = template_course(course, assignment, Path(scratch))
        with ThreadPoolExecutor(workers) as pool:
            started = {}
            secrets = {s: hashlib.sha256(f"{secret}:{assignment}:{s}".encode()).hexdigest() for s in students}

            def timed(student):
                started[student] = time.monotonic()
                try:
                    return grade_student(course, assignment, student, template, source, release, secrets[student],
                                         timeout, sandbox, execute is True or student in (execute or ()))
                finally:
                    report.seconds[student] = time.monotonic() - started[student]

            futures = {pool.submit(timed, s): s for s in students}
            for future in as_completed(futures):  # each student's grade is written as soon as it is known
                student = futures[future]
                try:
                    result = future.result()
                except Exception as error:  # noqa: BLE001  one broken submission must not stop the class
                    result = (None, None, f"the grader failed on this submission: {error!r}"[:500], None, None)
                record(gradebook, course, assignment, student, result, points, release, report,
                       secrets=[secret, secrets[student], *seeds_of(secrets[student])], hidden_lines=hidden_lines)
    return report
