"""Fabricated submissions, made from the instructor's source so that they follow the exercises as
they change: what `make grade-demo`, `python -m grader check` and the tests grade. Never runs
student code: it writes notebooks (grader/rehearsal.py has them graded, in sandboxes).

    submissions(assignment, hostile=False) -> {student: {grade_id: cell source, or None to delete it}}
    write_submission(course, assignment, student, cells)

- full:      every solution cell as the instructor wrote it (markers removed);
- blank:     the release, untouched;
- partial:   the parts in tests/submissions/<assignment>.py PARTIAL_PARTS solved, the rest blank;
- reference: complete, except that one part just calls mpcourse's own implementation;
- hostile:   complete, except that the last part's solution cell does something nasty
             (grader/hostile_corpus.py: HOSTILE, EDITS), and the corpus of issue 16 (FOOLS,
             TARGETED, ACCIDENTS, vandal, xss_feedback); `demo` and the tests grade them for one
             assignment.
"""
import ast
import copy
import importlib.util
import json
from pathlib import Path

import nbformat

from grader.course import ROOT
from grader.hostile_corpus import (BUSY, EDITS, ENTITY_LINKS, FILLS, FOOLS, HOSTILE, HUGE_OUTPUT, IGNORES_SIGINT,
                                   IN_A_THREAD, LEAK, LIMITS, SLOW_C_CALL, STEAL, SWAP, TARGETED, VANDAL, XSS_CODE, XSS_MARKDOWN)
from grader.notebooks import grade_id, part_of

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


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
    return [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def wrong_answers(assignment: str, prefix: str = "", body: str = "", value: str = "0.0") -> dict[str, str]:
    """Every solution cell replaced by definitions of the names it asks for, all returning `value`."""
    return {gid: prefix + "".join(f"def {name}(*args, **kwargs):\n    {body or 'pass'}\n    return {value}\n\n\n"
                                  for name in function_names(src))
            for gid, src in solution_cells(assignment).items()}


def in_a_thread(source: str) -> str:
    """An answer cell whose functions run in a thread started before the tests (issue 45): the
    own-work watcher (threading.setprofile) never reaches it. Classes are left as they are."""
    tree = ast.parse(source)
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            node.name = f"_{node.name}_in_a_thread"
    wrappers = "".join(f"\n\ndef {name}(*args, **kwargs):\n"
                       f"    if _threading.current_thread() is not _threading.main_thread():  # already in it\n"
                       f"        return _{name}_in_a_thread(*args, **kwargs)\n"
                       f"    return _pool.submit(_{name}_in_a_thread, *args, **kwargs).result()\n" for name in names)
    return IN_A_THREAD + "import threading as _threading\n" + ast.unparse(tree) + "\n" + wrappers


def edit(student_cells: dict, change) -> dict:
    """`student_cells` plus a change to the notebook itself (a function of the notebook)."""
    return {**student_cells, "__edits__": [*student_cells.get("__edits__", []), change]}


def cell_index(nb, gid: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)


def hostile_corpus(assignment: str) -> dict[str, dict]:
    """The students of FOOLS, TARGETED, ACCIDENTS and the vandal and XSS submissions."""
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
    corpus["many_looping_cells"] = edit(full, lambda nb: nb.cells.extend(  # loops that wait: the run's limit, not the CPU's
        nbformat.v4.new_code_cell("import time\nwhile True:\n    time.sleep(1)") for _ in range(24)))
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
