"""The six graded exercises, end to end with the real nbgrader: the release is generated from the
solutions and leaks nothing, and autograding gives the marks an instructor expects, to every
kind of submission, including hostile ones, without hanging.

Grading runs once per session (the `graded` fixture): each assignment in its own scratch course,
two at a time, with fabricated submissions (tools/autograde.py says how they are made).
"""
import json
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import autograde  # noqa: E402
import sync_colab_cells  # noqa: E402

EXERCISES = ["ex1_precision_comparison", "ex2_loss_scaling", "ex3_dynamic_range",
             "ex4_softmax_stability", "ex5_mixed_precision_speedup", "ex6_fp8_quantization"]
ASSIGNMENTS = autograde.assignments()
HOSTILE_TARGET = "ex4_softmax_stability" if "ex4_softmax_stability" in ASSIGNMENTS else ASSIGNMENTS[0]
STANDARD = ["full", "blank", "partial", "reference"]
HOSTILE = [*autograde.HOSTILE, *autograde.EDITS]


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """(scratch folder, {course name: {student: {test cell: score}}})."""
    workdir = tmp_path_factory.mktemp("grading")
    jobs = {name: (name, autograde.submissions(name), 30) for name in ASSIGNMENTS}
    hostile = autograde.submissions(HOSTILE_TARGET, hostile=True)
    jobs["hostile"] = (HOSTILE_TARGET, {s: hostile[s] for s in HOSTILE}, 20)
    return workdir, autograde.grade_many(workdir, jobs)


def points(assignment):
    return autograde.test_points(assignment)


def part_points(assignment, parts):
    return sum(p for gid, p in points(assignment).items() if autograde.part_of(gid) in parts)


def source_cells(assignment):
    return autograde.notebook(ROOT / "solutions", assignment).cells


def graded_outputs(workdir, course, student, assignment, test_cell):
    nb = autograde.notebook(workdir / course / "autograded" / student, assignment)
    cell = next(c for c in nb.cells if autograde.grade_id(c) == test_cell)
    return json.dumps(cell.outputs)


# --- the source and the release -------------------------------------------------------------

def test_the_six_exercises_are_there():
    assert ASSIGNMENTS == EXERCISES


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_each_part_has_solution_cells_and_one_graded_test_cell(assignment):
    cells = source_cells(assignment)
    solutions = {autograde.part_of(autograde.grade_id(c)) for c in cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    tests = [autograde.part_of(gid) for gid in points(assignment)]
    assert len(tests) == len(set(tests)) >= 3, "one graded test cell per part, at least three parts"
    assert solutions == set(tests), "every part needs solution cells and a graded test cell"
    for cell in cells:
        if autograde.grade_id(cell) in points(assignment):
            assert cell.metadata["nbgrader"]["locked"], f"{autograde.grade_id(cell)} must be read-only"
            assert autograde.HIDDEN_MARKERS[0] in cell.source, f"{autograde.grade_id(cell)} has no hidden tests"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_checker_is_imported_in_a_locked_cell_before_any_student_code(assignment):
    cells = [c for c in source_cells(assignment) if c.cell_type == "code"]
    assert "".join(cells[0].source) == sync_colab_cells.setup_cell_source(), "stale Colab cell: make sync-notebooks"
    setup = cells[1]
    assert setup.metadata["nbgrader"]["locked"] and "from mpcourse import grading" in setup.source


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_committed_release_is_what_nbgrader_generates(graded, assignment):
    workdir, _ = graded
    generated = (workdir / assignment / "exercises" / assignment / f"{assignment}.ipynb").read_text()
    committed = ROOT / "exercises" / assignment / f"{assignment}.ipynb"
    assert committed.exists() and json.loads(committed.read_text()) == json.loads(generated), (
        f"exercises/{assignment} is stale: run `make exercises`")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_release_contains_no_solution_code_and_no_hidden_test(assignment):
    released = (ROOT / "exercises" / assignment / f"{assignment}.ipynb").read_text()
    for marker in (*autograde.SOLUTION_MARKERS, *autograde.HIDDEN_MARKERS):
        assert marker not in released
    released_lines = {line.strip() for c in autograde.notebook(ROOT / "exercises", assignment).cells
                      for line in c.source.split("\n")}
    secret, public = set(), set()
    for cell in source_cells(assignment):
        shown, hidden = autograde.split_cell(cell)
        secret |= {line.strip() for line in hidden if len(line.strip()) >= 12}
        public |= {line.strip() for line in shown}
    # A secret line may repeat a line students are shown anyway (a hint, a visible test).
    leaked = (secret - public) & released_lines
    assert not leaked, f"{assignment}: the release contains {sorted(leaked)[:3]}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_notebooks_are_in_the_book_without_outputs(assignment):
    toc = (ROOT / "_toc.yml").read_text()
    assert f"exercises/{assignment}/{assignment}" in toc
    for cell in autograde.notebook(ROOT / "exercises", assignment).cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


# --- autograding ---------------------------------------------------------------------------

@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solutions_get_full_marks(graded, assignment):
    _, scores = graded
    assert scores[assignment]["full"] == points(assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_untouched_release_gets_zero_on_every_part(graded, assignment):
    _, scores = graded
    assert scores[assignment]["blank"] == {gid: 0 for gid in points(assignment)}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_partial_submission_gets_exactly_the_points_of_the_parts_it_solved(graded, assignment):
    _, scores = graded
    solved = autograde.submission_data(assignment).PARTIAL_PARTS
    expected = {gid: (p if autograde.part_of(gid) in solved else 0) for gid, p in points(assignment).items()}
    assert 0 < sum(expected.values()) < sum(points(assignment).values())
    assert scores[assignment]["partial"] == expected


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_calling_the_library_instead_of_implementing_scores_nothing_for_that_part(graded, assignment):
    workdir, scores = graded
    copied = {autograde.part_of(gid) for gid in autograde.submission_data(assignment).REFERENCE_CALLER}
    for gid, p in points(assignment).items():
        if autograde.part_of(gid) in copied:
            assert scores[assignment]["reference"][gid] == 0
            assert "calls the course library" in graded_outputs(workdir, assignment, "reference", assignment, gid)
        else:
            assert scores[assignment]["reference"][gid] == p


def last_part_lost(assignment):
    test_cells = list(points(assignment))
    return {gid: (0 if gid == test_cells[-1] else p) for gid, p in points(assignment).items()}


@pytest.mark.parametrize("student", [s for s in HOSTILE if s != "os_exit"])
def test_a_hostile_last_part_loses_that_part_only_and_the_grader_finishes(graded, student):
    _, scores = graded
    assert scores["hostile"][student] == last_part_lost(HOSTILE_TARGET)


def test_a_submission_that_kills_its_kernel_scores_zero_and_the_grader_finishes(graded):
    workdir, scores = graded
    assert sum(scores["hostile"]["os_exit"].values()) == 0
    assert not (workdir / "hostile" / "autograded" / "os_exit" / HOSTILE_TARGET).exists()


def test_gigantic_output_is_cut_in_the_graded_notebook(graded):
    workdir, _ = graded
    graded_nb = workdir / "hostile" / "autograded" / "gigantic_output" / HOSTILE_TARGET / f"{HOSTILE_TARGET}.ipynb"
    assert graded_nb.stat().st_size < 1_000_000
    assert "[grader] stream output truncated" in graded_nb.read_text()


def test_tampering_is_named_in_the_feedback(graded):
    workdir, _ = graded
    last_test = list(points(HOSTILE_TARGET))[-1]
    assert "were replaced" in graded_outputs(workdir, "hostile", "monkeypatch", HOSTILE_TARGET, last_test)


def test_an_edited_test_cell_is_restored_before_grading(graded):
    workdir, _ = graded
    last_test = list(points(HOSTILE_TARGET))[-1]
    nb = autograde.notebook(workdir / "hostile" / "autograded" / "edited_test_cell", HOSTILE_TARGET)
    restored = next(c for c in nb.cells if autograde.grade_id(c) == last_test)
    assert "all tests pass!" not in restored.source and "grading.start" in restored.source


def test_the_course_config_sets_a_timeout_and_bounds_output():
    config = (ROOT / "nbgrader_config.py").read_text()
    assert "c.Execute.timeout = " in config and "BoundedOutputExecute" in config
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["exclude_patterns"] == ["exercises/*/*.ipynb"]
