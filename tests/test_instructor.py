"""The instructor's path from a fresh private clone to returnable feedback (issue 36): each step
the guide gives works as written, on one tiny course with few students."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import autograde  # noqa: E402
import grader  # noqa: E402

ASSIGNMENT = "ex2_loss_scaling"
NO_SANDBOX = grader.sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")


def fresh_course(course: Path) -> Path:
    """A course directory as a clone holds it: config, source and release, no gradebook."""
    course.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    for folder in ("solutions", "exercises"):
        (course / folder / ASSIGNMENT).mkdir(parents=True)
        name = f"{ASSIGNMENT}.ipynb"
        (course / folder / ASSIGNMENT / name).write_text((ROOT / folder / ASSIGNMENT / name).read_text())
    return course


@needs_sandbox
def test_grading_an_assignment_never_registered_registers_it_first(tmp_path):
    course = fresh_course(tmp_path / "course")
    release = (course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
    autograde.write_submission(course, ASSIGNMENT, "jane", {})  # the untouched release
    assert not grader.registered(course, ASSIGNMENT)
    report = grader.grade(course, ASSIGNMENT, timeout=20, execute=False)
    assert grader.registered(course, ASSIGNMENT) and not report.not_graded
    assert autograde.scores(course, ASSIGNMENT)["jane"] == {t: 0.0 for t in autograde.test_points(ASSIGNMENT)}
    assert (course / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text() == release
