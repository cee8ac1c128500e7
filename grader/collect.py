"""Collection: an LMS download (Canvas, Moodle) into submitted/, one notebook per student, the
latest. Never runs student code: it names and copies files.

    collect(course, assignment, lms, download)   # `python -m grader collect ASSIGNMENT --lms canvas --zip FILE`

which puts the download in downloaded/ASSIGNMENT/archive/ and runs, in the course directory,

    nbgrader zip_collect ASSIGNMENT --force --collector=grader.collect.CanvasCollector
    nbgrader zip_collect ASSIGNMENT --force --collector=grader.collect.MoodleCollector

(which an instructor may also run by hand, with the repository on PYTHONPATH).

The names the two systems give a submitted file:

- Canvas: `doejane_123456_7890123_ex2_loss_scaling.ipynb` (login, user id, submission id, the
  file's name), with `_late` after the login when handed in late, and the file's name suffixed
  `-1`, `-2`, ... when the student uploaded it again;
- Moodle: `Jane Doe_12345_assignsubmission_file_ex2_loss_scaling.ipynb`, or a folder
  `Jane Doe_12345_assignsubmission_file_/` holding the file ("download submissions in folders"),
  the file's name suffixed ` (1)`, ` (2)`, ... when uploaded again.

Each student's latest notebook (highest submission id, then highest suffix) is collected as
submitted/<student>/ASSIGNMENT/ASSIGNMENT.ipynb, whatever the student named it (the assignment is
one notebook); the others are skipped with a note, so two files from one student do not stop the
collection. Student ids: Canvas's login (`doejane`), Moodle's name and participant number
(`jane_doe_12345`). Late hand-ins are named in the log (`LATE`); no grade depends on it.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from nbgrader.plugins import FileNameCollectorPlugin

from grader.course import BIN, ROOT

CANVAS = re.compile(r"^(?P<login>[A-Za-z0-9.\-]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<submission>\d+)_(?P<name>.+)$",
                    re.I)
MOODLE = re.compile(r"^(?P<person>.+?)_(?P<user>\d+)_assign(?:submission|feedback)_[a-z]+_(?P<name>.*)$")
AGAIN = re.compile(r"(?:-(\d+)| \((\d+)\))$")  # name-2.ipynb (Canvas), name (2).ipynb (Moodle)


def upload_number(name: str) -> int:
    match = AGAIN.search(Path(name).stem)
    return int(match.group(1) or match.group(2)) if match else 0


def canvas(relative: Path) -> dict | None:
    match = CANVAS.match(relative.name)
    if not match:
        return None
    return {"student_id": match["login"].lower(), "late": bool(match["late"]),
            "order": (int(match["submission"]), upload_number(match["name"]))}


def moodle(relative: Path) -> dict | None:
    match = MOODLE.match(relative.name)  # a flat download; else "download in folders"
    if not match and len(relative.parts) > 1 and relative.parts[-2].endswith("_"):
        match = MOODLE.match(relative.parts[-2] + relative.name)
    if not match or not match["name"]:
        return None
    person = re.sub(r"[^a-z0-9]+", "_", match["person"].lower()).strip("_")
    return {"student_id": f"{person}_{match['user']}", "late": False, "order": (0, upload_number(match["name"]))}


class LatestNotebookCollector(FileNameCollectorPlugin):
    """Collects each student's latest notebook under the assignment's own name; `parse` reads a
    file's path (relative to the extracted folder)."""
    parse = staticmethod(canvas)

    def collect(self, submitted_file: str) -> dict | None:
        path = Path(submitted_file)
        extracted = next(p for p in path.parents if p.name == "extracted")  # downloaded/<assignment>/extracted
        assignment = extracted.parent.name
        info = self.parse(path.relative_to(extracted))
        if path.suffix != ".ipynb" or info is None:
            self.log.warning("Not a %s submission of a notebook, skipped: %s", type(self).__name__, path.name)
            return None
        rivals = []
        for other in extracted.rglob("*.ipynb"):
            theirs = self.parse(other.relative_to(extracted))
            if theirs and theirs["student_id"] == info["student_id"]:
                rivals.append((theirs["order"], str(other)))
        latest = max(rivals)[1]
        if latest != str(path):
            self.log.warning("%s: skipped %s, an earlier upload than %s", info["student_id"], path.name, Path(latest).name)
            return None
        if info["late"]:
            self.log.warning("LATE: %s handed in %s late", info["student_id"], assignment)
        return {"student_id": info["student_id"], "file_id": f"{assignment}.ipynb"}


class CanvasCollector(LatestNotebookCollector):
    parse = staticmethod(canvas)


class MoodleCollector(LatestNotebookCollector):
    parse = staticmethod(moodle)


def collect(course: Path, assignment: str, lms: str, download: Path) -> None:
    """Put an LMS download (a zip, or a folder of files) in downloaded/<assignment>/archive/ and
    run `nbgrader zip_collect` with this module's collector for that LMS: each student's latest
    notebook lands in submitted/<student>/<assignment>/<assignment>.ipynb."""
    archive = course / "downloaded" / assignment / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    if download.is_dir():
        shutil.copytree(download, archive / download.name, dirs_exist_ok=True)
    else:
        shutil.copy(download, archive)
    collector = {"canvas": "CanvasCollector", "moodle": "MoodleCollector"}[lms]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(BIN / "nbgrader"), "zip_collect", assignment, "--force",
                             f"--collector=grader.collect.{collector}"], cwd=course, env=env,
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(f"nbgrader zip_collect failed:\n{log[-3000:]}")
    for line in log.splitlines():
        if "LATE:" in line or "skipped" in line.lower() or "Skipped" in line:
            print(" ", line.split("] ", 1)[-1])
    students = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    print(f"{len(students)} submissions of {assignment} in {course / 'submitted'}: {', '.join(students)}")
