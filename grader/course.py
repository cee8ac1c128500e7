"""The course directory and nbgrader's command line. Never runs student code: nbgrader runs here
only to release assignments, register them and render feedback, never to execute a submission
(that happens in the sandboxes of grader/runs.py).

    nbgrader(course, *args) -> CompletedProcess     # the nbgrader command line in `course`
    assignments() -> ["ex1_precision_comparison", ...]
    release()                                       # `make exercises`: exercises/ from solutions/
    make_course(folder, names)                      # a scratch course with `names` released

The repository root is the course directory of the course itself (nbgrader_config.py there);
an instructor's private clone is one too.
"""
import os
import shutil
import subprocess
import sys
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
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
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
    """A scratch course directory with the config and sources, and the assignments released."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name, dirs_exist_ok=True)
        nbgrader(course, "generate_assignment", name, "--force")
