"""The nbgrader workflow of the instructor guide, scripted: release, fabricate submissions, grade.

    python tools/autograde.py release           # regenerate exercises/ from solutions/
    python tools/autograde.py check ex4_softmax_stability [...]
                                                # grade fabricated submissions, print per-part scores
    python tools/autograde.py demo [--out grade-demo]
                                                # `make grade-demo`: a whole grading session

Every command runs the real `nbgrader` command line in a course directory: the repository root
for `release`, a scratch copy of it for `check` and `demo`. Submissions are fabricated from the
source notebooks, so they follow the exercises as they change:

- full:      every solution cell as the instructor wrote it (markers removed);
- blank:     the release, untouched;
- partial:   the parts in tests/submissions/<assignment>.py PARTIAL_PARTS solved, the rest blank;
- reference: complete, except that one part just calls mpcourse's own implementation;
- hostile:   complete, except that the last part's solution cell does something nasty
             (see HOSTILE); `demo` and the tests grade them for one assignment.
"""
import argparse
import csv
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")

# Each replaces the last part's solution cell (nothing later depends on the last part).
HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "sys_exit": "import sys\nsys.exit('I am done')",
    "os_exit": "import os\nos._exit(0)",
    "gigantic_output": "print('x' * 50_000_000)\nfor _ in range(100_000):\n    print('spam ' * 20)",
    "hides_errors": "get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)",
    "monkeypatch": (
        "import builtins, numpy, torch\n"
        "from mpcourse import grading\n"
        "numpy.allclose = lambda *args, **kwargs: True\n"
        "numpy.testing.assert_allclose = lambda *args, **kwargs: None\n"
        "torch.testing.assert_close = lambda *args, **kwargs: None\n"
        "torch.allclose = lambda *args, **kwargs: True\n"
        "grading.assert_close = lambda *args, **kwargs: None\n"
        "grading.own_work = lambda function, *args, **kwargs: function(*args, **kwargs)\n"),
    "snoops_for_hidden_tests": (
        "import glob, os\n"
        "found = []\n"
        "course = os.path.join(os.getcwd(), '..', '..', '..')  # autograded/<student>/<assignment>\n"
        "for path in glob.glob(os.path.join(course, '**', '*.ipynb'), recursive=True):\n"
        "    try:\n"
        "        if 'BEGIN HIDDEN TESTS' in open(path).read():\n"
        "            found.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('notebooks with hidden tests that I could read:', len(found))"),
}
# Submissions that change the last part's read-only test cell: the new source, or None to delete it.
EDITS = {
    "edited_test_cell": "print('all tests pass!')",
    "deleted_test_cell": None,
}


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


def autograde(course: Path, assignment: str, timeout: int) -> list[str]:
    """Autograde every submission of `assignment`; return the students nbgrader could not grade
    (their kernel died: the gradebook keeps 0 for them and nbgrader exits non-zero)."""
    result = nbgrader(course, "autograde", assignment, "--force", f"--Execute.timeout={timeout}", check=False)
    failed = re.findall(r"error processing assignment '[^']+' for student '([^']+)'", result.stdout + result.stderr)
    if result.returncode != 0 and not failed:
        raise RuntimeError(f"nbgrader autograde failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return failed


def grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def part_of(gid: str) -> str:
    return gid.split("_")[0]


def student_code(source: str) -> str:
    """A solution cell as a student would have written it: the markers' lines removed."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in SOLUTION_MARKERS)


def split_cell(cell) -> tuple[list[str], list[str]]:
    """(public lines, secret lines) of a source cell. Secret: what students must never see, the
    lines between the solution or hidden-test markers, or all of a solution cell without markers
    (nbgrader replaces it whole). The marker lines themselves are in neither list."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    lines = "".join(cell["source"]).splitlines()
    if not (nbgrader.get("solution") or nbgrader.get("grade")):
        return lines, []
    inside = nbgrader.get("solution") and not any(SOLUTION_MARKERS[0] in line for line in lines)
    public, secret = [], []
    for line in lines:
        if SOLUTION_MARKERS[0] in line or HIDDEN_MARKERS[0] in line:
            inside = True
        elif SOLUTION_MARKERS[1] in line or HIDDEN_MARKERS[1] in line:
            inside = False
        else:
            (secret if inside else public).append(line)
    return public, secret


def notebook(folder: Path, assignment: str):
    return nbformat.read(folder / assignment / f"{assignment}.ipynb", as_version=4)


def solution_cells(assignment: str) -> dict[str, str]:
    source = notebook(ROOT / "solutions", assignment)
    return {grade_id(c): student_code(c.source) for c in source.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def test_points(assignment: str) -> dict[str, float]:
    """grade_id -> points of each autograded test cell, in notebook order."""
    source = notebook(ROOT / "solutions", assignment)
    return {grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in source.cells
            if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"}


def submission_data(assignment: str):
    path = ROOT / "tests" / "submissions" / f"{assignment}.py"
    spec = importlib.util.spec_from_file_location(f"submissions_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def submissions(assignment: str, hostile: bool = False) -> dict[str, dict[str, str | None]]:
    """student id -> {grade_id: cell source, or None to delete the cell}; cells not named stay
    as released."""
    full = solution_cells(assignment)
    data = submission_data(assignment)
    fabricated = {
        "full": full,
        "blank": {},
        "partial": {gid: src for gid, src in full.items() if part_of(gid) in data.PARTIAL_PARTS},
        "reference": {**full, **data.REFERENCE_CALLER},
    }
    if hostile:
        last_part = part_of(list(test_points(assignment))[-1])
        last_cells = [gid for gid in full if part_of(gid) == last_part]
        for name, code in HOSTILE.items():
            fabricated[name] = {**full, **{gid: code for gid in last_cells}}
        last_test = list(test_points(assignment))[-1]
        for name, edit in EDITS.items():
            unsolved = {gid: src for gid, src in full.items() if part_of(gid) != last_part}
            fabricated[name] = {**unsolved, last_test: edit}
    return fabricated


def write_submission(course: Path, assignment: str, student: str, cells: dict[str, str | None]) -> None:
    nb = notebook(course / "exercises", assignment)
    nb.cells = [cell for cell in nb.cells if cells.get(grade_id(cell), "") is not None]
    for cell in nb.cells:
        if grade_id(cell) in cells:
            cell.source = cells[grade_id(cell)]
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{assignment}.ipynb")


def make_course(course: Path, names: list[str]) -> None:
    """A scratch course directory with the config and sources, and the assignments released."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name, dirs_exist_ok=True)
        nbgrader(course, "generate_assignment", name, "--force")


def scores(course: Path, assignment: str) -> dict[str, dict[str, float]]:
    """student -> {test grade_id: score} from the gradebook (the real record of grades)."""
    from nbgrader.api import Gradebook, MissingEntry
    result = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student in gradebook.students:
            try:
                graded = gradebook.find_submission_notebook(assignment, assignment, student.id)
            except MissingEntry:
                continue
            result[student.id] = {g.name: g.score for g in graded.grades}
    return result


def grade(course: Path, assignment: str, students: dict[str, dict[str, str]], timeout: int) -> dict:
    """Release `assignment` into `course`, submit `students`, autograde; return the scores."""
    shutil.rmtree(course, ignore_errors=True)
    make_course(course, [assignment])
    for student, cells in students.items():
        write_submission(course, assignment, student, cells)
    autograde(course, assignment, timeout)
    return scores(course, assignment)


def grade_many(workdir: Path, jobs: dict[str, tuple[str, dict, int]], workers: int = 2) -> dict:
    """Grade several scratch courses side by side: {name: (assignment, students, timeout)}."""
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(grade, workdir / name, a, s, t) for name, (a, s, t) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def release() -> None:
    """Regenerate exercises/ from solutions/ in the repository (a scratch gradebook)."""
    scratch = ROOT / "_build" / "release-gradebook.db"
    scratch.parent.mkdir(exist_ok=True)
    for name in assignments():
        nbgrader(ROOT, "generate_assignment", name, "--force", f"--CourseDirectory.db_url=sqlite:///{scratch}")
        print(f"released exercises/{name}/{name}.ipynb")


def print_table(assignment: str, graded: dict[str, dict[str, float]]) -> None:
    points = test_points(assignment)
    print(f"\n{assignment}  (max {sum(points.values()):g})")
    print(f"{'student':26}" + "".join(f"{gid:>10}" for gid in points) + f"{'total':>8}")
    for student, by_cell in sorted(graded.items()):
        cells = "".join(f"{by_cell.get(gid, 0):>10g}" for gid in points)
        print(f"{student:26}{cells}{sum(by_cell.values()):>8g}")


def check(names: list[str], workdir: Path) -> None:
    jobs = {name: (name, submissions(name), 60) for name in names}
    for name, graded in grade_many(workdir, jobs).items():
        print_table(name, graded)


def demo(out: Path) -> None:
    """A whole grading session: release, fabricated submissions, autograde, feedback, CSV."""
    shutil.rmtree(out, ignore_errors=True)
    names = assignments()
    make_course(out, names)
    hostile_target = "ex4_softmax_stability" if "ex4_softmax_stability" in names else names[0]
    for name in names:
        for student, cells in submissions(name, hostile=name == hostile_target).items():
            write_submission(out, name, student, cells)
        print(f"autograding {name} ...", flush=True)
        started = time.perf_counter()
        failed = autograde(out, name, timeout=30)
        seconds = time.perf_counter() - started
        count = len(list((out / "submitted").glob(f"*/{name}")))
        print(f"  {count} submissions in {seconds:.0f} s ({seconds / count:.1f} s each, nbgrader's start-up included)")
        nbgrader(out, "generate_feedback", name, "--force")
        print_table(name, scores(out, name))
        for student in failed:
            print(f"  nbgrader could not grade {student} (its kernel died): recorded as 0")
    nbgrader(out, "export", "--to", "grades.csv")
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    print(f"\n{out / 'grades.csv'}: {len(rows)} rows (one per student and assignment)")
    print(f"feedback HTML: {out / 'feedback'}/<student>/<assignment>/<assignment>.html")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["release", "check", "demo"])
    parser.add_argument("assignments", nargs="*")
    parser.add_argument("--out", type=Path, default=ROOT / "grade-demo")
    args = parser.parse_args()
    if args.command == "release":
        release()
    elif args.command == "check":
        check(args.assignments or assignments(), Path(os.environ.get("TMPDIR", "/tmp")) / "mpcourse-check")
    else:
        demo(args.out)
