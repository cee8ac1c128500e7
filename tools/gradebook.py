"""The course's gradebook (nbgrader's): registering an assignment, writing each student's grade
and feedback notebook as soon as it is known, and the instructor's secret.

    register(course, assignment)          # the assignment, its notebook, points and cells
    record(gradebook, course, assignment, student, result, ...)  # one student, from the scheduler
"""
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader import (ENV, PLACEHOLDER_SECRET, feedback_notebook, nbgrader_command, safe_message,  # noqa: E402
                    write_private)


def registered(course: Path, assignment: str) -> bool:
    """Whether the course's gradebook knows `assignment` (grades can be written for it)."""
    from nbgrader.api import Gradebook, MissingEntry
    if not (course / "gradebook.db").exists():
        return False
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        try:
            gradebook.find_notebook(assignment, assignment)
        except MissingEntry:
            return False
    return True


def register(course: Path, assignment: str) -> None:
    """Put `assignment` (its notebook, points and cells) in the course's gradebook as `nbgrader
    generate_assignment` does, without touching exercises/ (the release goes to a scratch folder):
    `make exercises` registers nothing, it uses a scratch gradebook."""
    with tempfile.TemporaryDirectory(prefix="registration-") as scratch:
        result = subprocess.run(nbgrader_command("generate_assignment", assignment, "--force",
                                                 f"--CourseDirectory.release_directory={scratch}"),
                                cwd=course, env=ENV, capture_output=True, text=True)
    if result.returncode != 0 or not registered(course, assignment):
        raise RuntimeError(f"could not register {assignment} in {course / 'gradebook.db'}: nbgrader said\n"
                           f"{result.stdout[-1500:]}{result.stderr[-1500:]}\nFix that, then run, in {course}:\n"
                           f"  nbgrader generate_assignment {assignment} --force "
                           f"--CourseDirectory.release_directory=/tmp/{assignment}-release")


SECRET_VARIABLE = "MPCOURSE_GRADING_SECRET"
SECRET_FILE = ".grading-secret"


class SecretError(RuntimeError):
    pass


def tracked(course: Path, path: Path) -> bool:
    """Whether git tracks `path` in `course` (False outside a git repository)."""
    result = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=course,
                            capture_output=True, text=True)
    return result.returncode == 0


def instructor_secret(course: Path) -> str:
    """The secret the hidden tests' inputs are drawn from: $MPCOURSE_GRADING_SECRET, else the
    untracked file .grading-secret in the course directory, never a file git tracks (a clone of a
    public repository pushes it back one day). Neither: the public placeholder, with a warning."""
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    if not str(config.HiddenTests.get("secret", PLACEHOLDER_SECRET)).startswith(PLACEHOLDER_SECRET):
        raise SecretError(f"nbgrader_config.py sets c.HiddenTests.secret: that file is tracked by git, so the "
                          f"secret would be pushed with it. Put it in ${SECRET_VARIABLE} or in {course / SECRET_FILE} "
                          "(git-ignored), and set the line back to the placeholder.")
    secret = os.environ.get(SECRET_VARIABLE, "").strip()
    path = course / SECRET_FILE
    if not secret and path.exists():
        if tracked(course, path):
            raise SecretError(f"{path} is tracked by git, so the secret would be pushed with it: "
                              f"run `git rm --cached {SECRET_FILE}` there, then make a new secret (the old one may be public).")
        secret = path.read_text().strip()
    if not secret:
        warnings.warn(f"no grading secret (${SECRET_VARIABLE} or {SECRET_FILE}): using the public placeholder, so anyone "
                      "who reads solutions/ can compute the hidden tests' inputs. Set your own (instructor guide).")
        return PLACEHOLDER_SECRET
    return secret


def record(gradebook, course, assignment, student, result, points, release, report, *, secrets, hidden_lines):
    """Write one student's points to the gradebook, their feedback notebook to autograded/ and what
    the instructor must know to `report`."""
    verdicts, ran, problem, note, flags = result
    verdicts = verdicts or {}
    if flags:
        report.flags[student] = flags
    if problem:
        report.not_graded[student] = problem
    if note:
        report.notes[student] = note
    scores = {t: (p if verdicts.get(t, {}).get("passed") is True else 0.0) for t, p in points.items()}
    report.scores[student] = scores
    report.messages[student] = {t: str(v.get("message"))[:2000] for t, v in verdicts.items() if not v.get("passed")}
    gradebook.update_or_create_student(student)
    gradebook.update_or_create_submission(assignment, student)
    for test, score in scores.items():
        gradebook.find_grade(test, assignment, assignment, student).auto_score = score
    gradebook.db.commit()
    if ran is not None:
        shown = {t: {"passed": v.get("passed") is True,
                     "message": safe_message(v.get("message", ""), secrets=secrets, hidden_lines=hidden_lines)}
                 for t, v in verdicts.items()}
        folder = course / "autograded" / student / assignment
        for path in (course / "autograded", course / "autograded" / student, folder):
            if path.is_symlink():
                raise ValueError(f"{path} is a symbolic link: the grader writes no feedback through it")
        write_private(folder / f"{assignment}.ipynb", json.dumps(feedback_notebook(ran, release, points, shown), indent=1))
