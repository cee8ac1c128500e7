"""The course directory and nbgrader's command line. Never runs student code: nbgrader runs here
only to release assignments, register them and render feedback, never to execute a submission
(that happens in the sandboxes of grader/runs.py).

    nbgrader(course, *args) -> CompletedProcess     # the nbgrader command line in `course`
    assignments() -> ["ex1_precision_comparison", ...]
    release()                                       # `make exercises`: exercises/ from solutions/
    make_course(folder, names)                      # a scratch course with `names` released
    generate_assignment(course, name)               # `nbgrader generate_assignment name --force`, in this process
    in_process(course, call, **settings)            # any nbgrader API call in this process (feedback pages too)
    set_aside(course, name, to)                     # `python -m grader set-aside`: an assignment's files moved to `to`

The repository root is the course directory of the course itself (nbgrader_config.py there);
an instructor's private clone is one too.
"""
import functools
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader calls alembic


def nbgrader_command(*args: str) -> list[str]:
    return [str(BIN / "python"), "-m", "nbgrader", *args]


def assignments() -> list[str]:
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())


def nbgrader(course: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the nbgrader command line in `course` (nbgrader needs its venv's bin/ on PATH)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # the environment as it is now
    result = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env,
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def release() -> None:
    """Regenerate exercises/ from solutions/ in the repository (a scratch gradebook)."""
    scratch = ROOT / "_build" / "release-gradebook.db"
    scratch.parent.mkdir(exist_ok=True)
    for name in assignments():
        nbgrader(ROOT, "generate_assignment", name, "--force", f"--CourseDirectory.db_url=sqlite:///{scratch}")
        print(f"released exercises/{name}/{name}.ipynb")


def make_course(course: Path, names: list[str]) -> None:
    """A scratch course directory with the config and sources, and the assignments released (as
    `nbgrader generate_assignment` releases them, in this process)."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name, dirs_exist_ok=True)
        generate_assignment(course, name)


def generate_assignment(course: Path, assignment: str, db_url: str | None = None,
                        release_directory: str | None = None) -> None:
    """`nbgrader generate_assignment <assignment> --force` in `course`, in this process: nbgrader's own
    code (its API), with the course's nbgrader_config.py, without a second Python importing nbgrader
    and a third running `alembic heads` to stamp the new gradebook (`alembic_head`, once per process).
    `db_url`, `release_directory`: instead of the config's (a relative SQLite path in the config is
    this process's folder's: pass the course's, gradebook.db_url). nbgrader changes the working
    directory while it converts (to `course`, then back): call it before grading threads start.
    RuntimeError with nbgrader's log if it fails."""
    settings = {"db_url": db_url, "release_directory": release_directory}
    result = in_process(course, lambda api: api.generate_assignment(assignment, force=True),
                        **{k: v for k, v in settings.items() if v})
    if not result["success"]:
        raise RuntimeError(f"could not prepare the release of {assignment}:\n{result.get('log', '')[-2000:]}"
                           f"{result.get('error', '')[-2000:]}")


GENERATING = threading.Lock()  # one conversion at a time: nbgrader changes this process's directory


def in_process(course: Path, call, **course_directory) -> dict:
    """`call(api)`'s result ({"success", "log", "error"}) for an nbgrader API (`NbGraderAPI`) made with
    the course's nbgrader_config.py, `course` as its root and `course_directory`'s CourseDirectory
    settings: an nbgrader command run in this process, one at a time (GENERATING), a new gradebook
    stamped with `alembic_head`. What a command of its own does, without a Python that imports
    nbgrader (1 s of CPU) and, for a new gradebook, an `alembic heads` process (another second)."""
    from unittest import mock

    import nbgrader.api
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader
    config = (PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
              if (course / "nbgrader_config.py").is_file() else Config())
    config.CourseDirectory.root = str(course)
    for name, value in course_directory.items():
        setattr(config.CourseDirectory, name, value)
    with GENERATING, mock.patch.object(nbgrader.api, "get_alembic_version", alembic_head):
        return call(NbGraderAPI(config=config))


@functools.cache
def alembic_head() -> str:
    """What nbgrader stamps a new gradebook with (nbgrader.api.get_alembic_version, which asks a
    separate `alembic heads` process every time): the head of nbgrader's migrations, read here."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import _temp_alembic_ini
    with _temp_alembic_ini("sqlite:////tmp/gradebook.db") as ini:
        return ScriptDirectory.from_config(Config(ini)).get_current_head()


# What collecting and grading an assignment write in a course (the guide's "Starting over"):
# relative to the course folder, {} the assignment.
WRITTEN = ("submitted/*/{}", "downloaded/{}", "autograded/*/{}", "feedback/*/{}", "feedback-upload/{}*",
           "grades.csv", "grades-{}-*.csv")


def set_aside(folder: Path, assignment: str, to: Path) -> list[Path]:
    """Move what earlier collections and gradings of `assignment` wrote in the course `folder` to
    `to`, each at its path relative to the course (a student's folder left empty goes too); return
    the paths moved. `to` must be new or empty, and outside the folders grading writes (instructor
    walkthrough 47e: seven patterns moved by hand, easy to get wrong)."""
    folder, to = folder.resolve(), to.resolve()
    kept = [folder / name for name in ("submitted", "downloaded", "autograded", "feedback", "feedback-upload")]
    if any(to == place or to.is_relative_to(place) for place in kept) or folder.is_relative_to(to):
        raise ValueError(f"{to} is where grading writes: set aside to a folder outside "
                         "submitted/, downloaded/, autograded/, feedback/ and feedback-upload/")
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ValueError(f"{to} is not an empty folder: name a new one (nothing is moved over an earlier set-aside)")
    moved = []
    for pattern in WRITTEN:
        for path in sorted(folder.glob(pattern.format(assignment))):
            target = to / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(target))  # a symbolic link is moved as a link, never followed
            moved.append(path)
            if path.parent.parent in kept and not any(path.parent.iterdir()):
                path.parent.rmdir()  # submitted/<student>/ with nothing else in it
    return moved
