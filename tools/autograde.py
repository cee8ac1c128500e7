"""The nbgrader workflow of the instructor guide, scripted: release, fabricate submissions, grade.

    python tools/autograde.py release           # regenerate exercises/ from solutions/
    python tools/autograde.py check ex4_softmax_stability [...]
                                                # grade fabricated submissions, print per-part scores
    python tools/autograde.py demo [--out grade-demo]
                                                # `make grade-demo`: a whole grading session
    python tools/autograde.py grade ex4_softmax_stability [--course DIR] [--no-sandbox]
            [--jobs N] [--student ID ...] [--regrade] [--no-feedback] [--shard K/N] [--db-url URL]
                                                # grade a real course (tools/schedule.py), then feedback
    python tools/autograde.py prepare ex4_softmax_stability [--course DIR] [--db-url URL]
                                                # once, before `grade --shard K/N` on several machines
    python tools/autograde.py collect ex4_softmax_stability --lms canvas|moodle --zip FILE [--course DIR]
                                                # an LMS download into submitted/ (nbgrader zip_collect)
    python tools/autograde.py pack-feedback ex4_softmax_stability --course DIR --out DIR
                                                # each student's feedback page, named for LMS upload

Every command runs the real `nbgrader` command line in a course directory: the repository root
for `release`, a scratch copy of it for `check` and `demo`. Submissions are fabricated from the
source notebooks, so they follow the exercises as they change:

- full:      every solution cell as the instructor wrote it (markers removed);
- blank:     the release, untouched;
- partial:   the parts in tests/submissions/<assignment>.py PARTIAL_PARTS solved, the rest blank;
- reference: complete, except that one part just calls mpcourse's own implementation;
- hostile:   complete, except that the last part's solution cell does something nasty
             (see HOSTILE), and the corpus of issue 16 (FOOLS, TARGETED, ACCIDENTS, vandal,
             xss_feedback); `demo` and the tests grade them for one assignment.
"""
import argparse
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grader  # noqa: E402
import gradebook  # noqa: E402
import schedule  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")

from hostile_corpus import (  # noqa: E402  (the corpus's texts, used here and by the tests)
    HOSTILE, EDITS, FAKE_PASS, STEAL_EXPECTED, FOOLS, TARGETED,
    LIMITS, ACCIDENTS, ACCIDENT_COSTS, SLOW_C_CALL, IGNORES_SIGINT, VANDAL_MARK,
    VANDAL, SCRIPT_MARK, XSS_MARKDOWN, XSS_CODE, INSTRUCTOR_TOKEN, STEAL,
    LEAK, SWAP, BUSY, FILLS, HUGE_OUTPUT, ENTITY_LINKS,
    ESCAPE_COSTS, REFUSED, ESCAPES, EXECUTED)


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


def autograde(course: Path, assignment: str, timeout: int, execute=True, sandbox: bool = True, **options):
    """Grade every submission of `assignment` with tools/schedule.py (`options`: its grade()'s); return its Report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the placeholder secret, SQLAlchemy's notes on nbgrader's API
        return grader.grade(course, assignment, timeout=timeout, execute=execute, sandbox=sandbox, **options)


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


def function_names(source: str) -> list[str]:
    import ast
    return [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def wrong_answers(assignment: str, prefix: str = "", body: str = "", value: str = "0.0") -> dict[str, str]:
    """Every solution cell replaced by definitions of the names it asks for, all returning `value`."""
    return {gid: prefix + "".join(f"def {name}(*args, **kwargs):\n    {body or 'pass'}\n    return {value}\n\n\n"
                                  for name in function_names(src))
            for gid, src in solution_cells(assignment).items()}


def edit(student_cells: dict, change) -> dict:
    """`student_cells` plus a change to the notebook itself (a function of the notebook)."""
    return {**student_cells, "__edits__": [*student_cells.get("__edits__", []), change]}


def cell_index(nb, gid: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)


def hostile_corpus(assignment: str) -> dict[str, dict]:
    """The students of FOOLS, TARGETED, ACCIDENTS and the vandal and XSS submissions."""
    import copy
    full, tests = solution_cells(assignment), list(test_points(assignment))
    first, last = list(full)[0], [gid for gid in full if part_of(gid) == part_of(tests[-1])]
    corpus = {}
    for name, attack in FOOLS.items():
        cells = wrong_answers(assignment, attack.get("prefix", "") + attack.get("returns", ""),
                              attack.get("in_functions", ""), attack.get("value", "0.0"))
        if "first" in attack:
            cells[first] = attack["first"] + cells[first]
        if "colab" in attack:
            cells = edit(cells, lambda nb, code=attack["colab"]: setattr(
                next(c for c in nb.cells if "colab-setup" in c.metadata.get("tags", [])), "source", code))
        if "tag_tests" in attack:
            cells = edit(cells, lambda nb: [c.metadata.setdefault("tags", []).append("skip-execution")
                                            for c in nb.cells if grade_id(c) in tests])
        corpus[name] = cells
    for name, cells in {**TARGETED, **LIMITS}.items():
        corpus[name] = {**full, **cells}

    def duplicate(gid):
        return lambda nb: nb.cells.insert(cell_index(nb, gid) + 1, copy.deepcopy(nb.cells[cell_index(nb, gid)]))

    def move_above(gid, above):
        return lambda nb: nb.cells.insert(cell_index(nb, above), nb.cells.pop(cell_index(nb, gid)))

    p1 = [gid for gid in full if part_of(gid) == part_of(tests[0])][0]
    wrapped = function_names(full[p1])[0]
    corpus["duplicated_test_cell"] = edit(full, duplicate(tests[0]))
    corpus["duplicated_solution_cell"] = edit(full, duplicate(list(full)[1]))
    corpus["test_cell_above_solution"] = edit(full, move_above(tests[2], [g for g in full if part_of(g) == part_of(tests[2])][0]))
    corpus["test_cell_marked_solution"] = edit(full, lambda nb: nb.cells[cell_index(nb, tests[1])].metadata["nbgrader"].update(solution=True))
    corpus["slow_c_call"] = {**full, p1: SLOW_C_CALL + full[p1]}
    corpus["ignores_sigint"] = {**full, p1: full[p1] + "\n" + IGNORES_SIGINT}
    corpus["runtime_warning"] = {**full, p1: full[p1] + (
        f"\n\nimport warnings\n_{wrapped} = {wrapped}\n\n\ndef {wrapped}(*args, **kwargs):\n"
        f"    warnings.warn('overflow encountered in exp', RuntimeWarning)\n    return _{wrapped}(*args, **kwargs)\n")}
    corpus["vandal"] = {**full, last[-1]: full[last[-1]] + "\n" + VANDAL}
    corpus["reads_classmates"] = {**{gid: src + STEAL for gid, src in wrong_answers(assignment).items()},
                                  "__course__": {f"downloaded/classmate/{assignment}.ipynb": full}}
    corpus["leaks_through_message"] = {**full, **{gid: LEAK for gid in last}}
    corpus["symlink_swap"] = {**full, last[-1]: full[last[-1]] + SWAP}
    corpus["busy_processes"] = {**full, **{gid: BUSY for gid in last}}
    corpus["fills_ram_and_disk"] = {**full, **{gid: FILLS for gid in last}}
    corpus["many_looping_cells"] = edit(full, lambda nb: nb.cells.extend(
        nbformat.v4.new_code_cell("while True:\n    pass") for _ in range(24)))
    corpus["huge_outputs"] = edit(full, lambda nb: nb.cells.extend(nbformat.v4.new_code_cell(HUGE_OUTPUT) for _ in range(22)))
    corpus["entity_links"] = edit(full, lambda nb: nb.cells.insert(1, nbformat.v4.new_markdown_cell(ENTITY_LINKS)))
    corpus["symlinked_submission"] = {"__link__": f"../../../solutions/{assignment}/{assignment}.ipynb"}
    corpus["links_in_submission"] = {**full, "__extra_link__": "../../../gradebook.db"}
    corpus["xss_feedback"] = edit({**full, last[-1]: full[last[-1]] + "\n" + XSS_CODE},
                                  lambda nb: nb.cells.insert(1, nbformat.v4.new_markdown_cell(XSS_MARKDOWN)))
    return corpus


def submissions(assignment: str, hostile: bool = False) -> dict[str, dict[str, str | None]]:
    """student id -> {grade_id: cell source, or None to delete the cell}; cells not named stay
    as released. `hostile`: also HOSTILE, EDITS and the corpus of hostile_corpus."""
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
        for name, change in EDITS.items():
            unsolved = {gid: src for gid, src in full.items() if part_of(gid) != last_part}
            fabricated[name] = {**unsolved, last_test: change}
        fabricated.update(hostile_corpus(assignment))
    return fabricated


def write_submission(course: Path, assignment: str, student: str, cells: dict) -> None:
    """Write a fabricated submission. `__course__`: other notebooks to put in the course
    ({path: cells}); `__link__`: the submission is a symbolic link to that path; `__extra_link__`:
    a link to that path lies next to it."""
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    if "__link__" in cells:
        (folder / f"{assignment}.ipynb").symlink_to(cells["__link__"])
        return
    if "__extra_link__" in cells:
        (folder / "notes.txt").symlink_to(cells["__extra_link__"])
    for path, others in cells.get("__course__", {}).items():
        nb = notebook(course / "exercises", assignment)
        for cell in nb.cells:
            cell.source = others.get(grade_id(cell), cell.source)
        (course / path).parent.mkdir(parents=True, exist_ok=True)
        (course / path).write_text(json.dumps(nb, indent=1))
    nb = notebook(course / "exercises", assignment)
    nb.cells = [cell for cell in nb.cells if cells.get(grade_id(cell), "") is not None]
    for cell in nb.cells:
        if grade_id(cell) in cells:
            cell.source = cells[grade_id(cell)]
    for change in cells.get("__edits__", []):
        change(nb)
    (folder / f"{assignment}.ipynb").write_text(json.dumps(nb, indent=1))  # as a student's editor may: no validation


def make_course(course: Path, names: list[str]) -> None:
    """A scratch course directory with the config and sources, and the assignments released."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name, dirs_exist_ok=True)
        nbgrader(course, "generate_assignment", name, "--force")


def scores(course: Path, assignment: str, url: str | None = None) -> dict[str, dict[str, float]]:
    """student -> {test grade_id: score} from the gradebook (the real record of grades)."""
    from nbgrader.api import Gradebook, MissingEntry
    result = {}
    with Gradebook(url or f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student in gradebook.students:
            try:
                graded = gradebook.find_submission_notebook(assignment, assignment, student.id)
            except MissingEntry:
                continue
            result[student.id] = {g.name: g.score for g in graded.grades}
    return result


def grade(course: Path, assignment: str, students: dict[str, dict], timeout: int, execute=True):
    """Release `assignment` into `course`, submit `students`, grade; return (scores, Report)."""
    shutil.rmtree(course, ignore_errors=True)
    make_course(course, [assignment])
    for student, cells in students.items():
        write_submission(course, assignment, student, cells)
    report = autograde(course, assignment, timeout, execute)
    return scores(course, assignment), report


def grade_many(workdir: Path, jobs: dict[str, tuple], workers: int = 1) -> dict:
    """Grade several scratch courses one after the other (each grades one student per core at a time):
    {name: (assignment, students, timeout[, execute])} -> {name: (scores, Report)}."""
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(grade, workdir / name, *job) for name, job in jobs.items()}
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


def print_report(report, messages: bool = True) -> None:
    """What the instructor must read: who was not graded, notes, per student and part the failure
    message (as the runner gave it: never shown to students as is) and answers to read by hand."""
    for student, why in sorted(report.not_graded.items()):
        fate = "no grade written: the next run grades them" if student in report.unwritten else "recorded as 0"
        print(f"  NOT GRADED {student}: {why} ({fate})")
    for student, note in sorted(report.notes.items()):
        print(f"  note on {student}: {note}")
    for student, failed in sorted(report.messages.items()) if messages else ():
        for test, message in failed.items():
            print(f"  {student} {test} failed: {' '.join(str(message).split())[:300]}")
    for student, parts in sorted(report.flags.items()):
        for part, why in parts.items():
            print(f"  READ {student} {part}: its answer {', '.join(why)}")


def grade_course(course: Path, assignment: str, timeout: int, sandbox: bool, **options) -> None:
    """Grade a real course's submissions (the instructor guide's command), then write feedback for
    the students graded (`options`: schedule.grade()'s: workers, students, regrade, feedback, shard, url)."""
    report = grader.grade(course, assignment, timeout=timeout, sandbox=sandbox, progress=True, **options)
    graded = sorted(set(report.scores) - report.unwritten)
    if report.feedback and graded:
        feedback_for(course, assignment, graded, options.get("url"))
    if report.scores:
        print_table(assignment, report.scores)
    print_report(report)
    if not report.feedback and graded:
        print(f"  feedback NOT rebuilt (--no-feedback): the pages in {course / 'feedback'} are those of an earlier "
              "run, and may show earlier scores; grade without --no-feedback to rebuild them")
    elif graded:
        print(f"  feedback in {course / 'feedback'}/<student>/{assignment}/")


def feedback_for(course: Path, assignment: str, students: list[str], url: str | None = None) -> None:
    """nbgrader's feedback pages for `students` only (a shard writes its own students' pages)."""
    others = sorted({p.parent.name for p in (course / "autograded").glob(f"*/{assignment}")} - set(students))
    args = ["generate_feedback", assignment, "--force"] + (
        [f"--CourseDirectory.student_id_exclude={','.join(others)}"] if others else []) + (
        [f"--CourseDirectory.db_url={url}"] if url else [])
    nbgrader(course, *args)


def prepare(course: Path, assignment: str, url: str | None) -> None:
    """Before shards start: the gradebook's schema, the assignment and its students, once."""
    students = gradebook.prepare(course, assignment, url)
    print(f"{assignment} and {len(students)} students in {gradebook.without_password(gradebook.db_url(course, url))}: "
          f"start the shards (python tools/autograde.py grade {assignment} --shard K/N ...)")


def collect(course: Path, assignment: str, lms: str, download: Path) -> None:
    """Put an LMS download (a zip, or a folder of files) in downloaded/<assignment>/archive/ and
    run `nbgrader zip_collect` with tools/lms_collect.py's collector for that LMS: each student's
    latest notebook lands in submitted/<student>/<assignment>/<assignment>.ipynb."""
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
                             f"--collector=tools.lms_collect.{collector}"], cwd=course, env=env,
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    if result.returncode != 0:
        sys.exit(f"nbgrader zip_collect failed:\n{log[-3000:]}")
    for line in log.splitlines():
        if "LATE:" in line or "skipped" in line.lower() or "Skipped" in line:
            print(" ", line.split("] ", 1)[-1])
    students = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
    print(f"{len(students)} submissions of {assignment} in {course / 'submitted'}: {', '.join(students)}")


def pack_feedback(course: Path, assignment: str, out: Path) -> list[Path]:
    """Each student's feedback page, for upload to an LMS without nbgrader's exchange: copied to
    OUT/<assignment>/<student>_<assignment>.html, and all of them in OUT/<assignment>-feedback.zip.
    Returns the pages; names the students who handed in but have no feedback page."""
    import zipfile
    pages, missing = [], []
    folder = out / assignment
    folder.mkdir(parents=True, exist_ok=True)
    students = sorted({p.parent.name for p in (course / "submitted").glob(f"*/{assignment}")} |
                      {p.parent.name for p in (course / "feedback").glob(f"*/{assignment}")})
    for student in students:
        page = course / "feedback" / student / assignment / f"{assignment}.html"
        if not page.is_file() or any(p.is_symlink() for p in (page, page.parent, page.parent.parent)):
            missing.append(student)
            continue
        target = folder / f"{student}_{assignment}.html"
        shutil.copyfile(page, target)
        pages.append(target)
    with zipfile.ZipFile(out / f"{assignment}-feedback.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for page in pages:
            archive.write(page, page.name)
    print(f"{len(pages)} feedback pages in {folder}/ and {out / f'{assignment}-feedback.zip'}")
    for student in missing:
        print(f"  NO FEEDBACK for {student}: grade the assignment first (python tools/autograde.py grade {assignment})")
    return pages


def check(names: list[str], workdir: Path) -> None:
    jobs = {name: (name, submissions(name), 60) for name in names}
    for name, (graded, report) in grade_many(workdir, jobs).items():
        print_table(name, graded)
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
        report = autograde(out, name, timeout=20, progress=True)  # every core, as `grade --jobs` does
        seconds = time.perf_counter() - started
        count = len(report.scores)
        print(f"  {count} submissions in {seconds:.0f} s ({seconds / count:.1f} s each, {report.workers} at a time)")
        nbgrader(out, "generate_feedback", name, "--force")
        print_table(name, scores(out, name))
        print_report(report)
    nbgrader(out, "export", "--to", "grades.csv")
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    print(f"\n{out / 'grades.csv'}: {len(rows)} rows (one per student and assignment)")
    print(f"feedback HTML: {out / 'feedback'}/<student>/<assignment>/<assignment>.html")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["release", "check", "demo", "grade", "prepare", "collect", "pack-feedback"])
    parser.add_argument("assignments", nargs="*")
    parser.add_argument("--out", type=Path, default=None,
                        help="demo: the folder (grade-demo); pack-feedback: where the pages go (feedback-upload)")
    parser.add_argument("--course", type=Path, default=Path.cwd(), help="grade: the course directory")
    parser.add_argument("--lms", choices=["canvas", "moodle"], help="collect: where the download comes from")
    parser.add_argument("--zip", type=Path, help="collect: the LMS download (a zip, or a folder of files)")
    parser.add_argument("--timeout", type=int, default=60, help="grade: seconds per cell and per part")
    parser.add_argument("--jobs", type=int, default=None,
                        help="grade: students at a time (default: one per core, as many as memory holds at "
                             f"{schedule.JOB_MEMORY // 2**30} GiB each; here {schedule.default_jobs()})")
    parser.add_argument("--student", action="append", default=None, metavar="ID",
                        help="grade: only this student (repeat for several)")
    parser.add_argument("--regrade", action="store_true",
                        help="grade: the students who already have a grade too (otherwise a rerun grades only the others)")
    parser.add_argument("--no-feedback", action="store_true",
                        help="grade: skip the notebook run for the feedback (grades only, quick); the feedback "
                             "pages of an earlier run stay as they are")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="grade: this machine's share of N (the students whose int(sha256(id), 16) %% N == K-1), "
                             "into a shared gradebook that `prepare` made")
    parser.add_argument("--db-url", default=None,
                        help="grade, prepare: the gradebook (e.g. postgresql+psycopg://grader@host/course); default: "
                             "the course's c.CourseDirectory.db_url, else its gradebook.db")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap: DANGEROUS, a submission can then change other "
                             "students' work and the gradebook")
    args = parser.parse_args()
    from sqlalchemy.exc import OperationalError
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs: at least 1")
    if args.command == "release":
        release()
    elif args.command == "check":
        check(args.assignments or assignments(), Path(os.environ.get("TMPDIR", "/tmp")) / "mpcourse-check")
    elif args.command == "grade":
        try:
            shard = schedule.parse_shard(args.shard) if args.shard else None
        except ValueError as error:
            parser.error(str(error))
        for name in args.assignments or parser.error("grade: name the assignments"):
            try:
                grade_course(args.course.resolve(), name, args.timeout, not args.no_sandbox, workers=args.jobs,
                             students=args.student, regrade=args.regrade, feedback=not args.no_feedback,
                             shard=shard, url=args.db_url)
            except (grader.NoSandbox, grader.BrokenEnvironment, grader.SecretError, schedule.NotPrepared,
                    ValueError) as error:
                sys.exit(f"autograde.py grade {name}: {error}")  # a sentence, not a traceback
            except OperationalError as error:
                sys.exit(f"autograde.py grade {name}: the gradebook cannot be reached: {error.orig}")
    elif args.command == "prepare":
        for name in args.assignments or parser.error("prepare: name the assignments"):
            try:
                prepare(args.course.resolve(), name, args.db_url)
            except OperationalError as error:
                sys.exit(f"autograde.py prepare {name}: the gradebook cannot be reached: {error.orig}")
    elif args.command == "collect":
        if not (args.lms and args.zip and len(args.assignments) == 1):
            parser.error("collect: one assignment, --lms canvas|moodle and --zip FILE")
        collect(args.course.resolve(), args.assignments[0], args.lms, args.zip.resolve())
    elif args.command == "pack-feedback":
        for name in args.assignments or parser.error("pack-feedback: name the assignments"):
            pack_feedback(args.course.resolve(), name, (args.out or args.course / "feedback-upload").resolve())
    else:
        demo(args.out or ROOT / "grade-demo")
