"""ex1's grade comes from the judge: an answer that is right on the visible inputs only, or that
skips one input check the hidden tests grade, loses its part; an answer that checks no input fails
the visible tests already, saying which bad input it let through."""
import functools

import pytest

from grader import fabricate, judge, notebooks, runs
from tests.test_student_answers import ROOT, SECRET, runner, unchecked

EX = "ex1_precision_comparison"


@functools.cache
def reference_record(assignment: str, visible: bool) -> dict:
    return runner(jobs(assignment, {}, visible)[0])


def jobs(assignment: str, answers: dict, visible: bool) -> tuple[dict, dict]:
    """The reference's job and the student's (the solutions with `answers` in their place), as
    tests/test_student_answers.py's `run` builds them; `visible`: the released test cells only."""
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    release = notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    cells = {**fabricate.solution_cells(assignment), **answers}
    submission = {**release, "cells": [{**c, "source": cells.get(notebooks.grade_id(c), c["source"])}
                                       for c in release["cells"]]}
    reference = runs.hidden_test_job(source, source, SECRET, 120, reference=True)
    student = runs.hidden_test_job(source, submission, SECRET, 120)
    if visible:
        tests = {notebooks.grade_id(c): notebooks.source_text(c) for c in release["cells"] if notebooks.grade_id(c)}
        for job in (reference, student):
            for part in job["parts"]:
                test = tests[part["test_id"]]
                part["test"] = test if job is reference else runs.without_expected(test)
    return reference, student


def judged(assignment: str, answers: dict, only: str | None = None, visible: bool = False) -> dict:
    """The judge's verdicts on the solutions with `answers` in their place (the part `only`, or
    all), against the reference's record, which is run once per assignment and test set."""
    student = jobs(assignment, answers, visible)[1]
    student["parts"] = [p for p in student["parts"] if only in (None, notebooks.part_of(p["test_id"]))]
    reference = {k: v for k, v in reference_record(assignment, visible).items()
                 if only in (None, notebooks.part_of(k))}
    return judge.judge(reference, runner(student))


# (part, what is wrong, the solution's line, the broken line): each passes the visible tests
# (checked when they were written; not here, to keep this file fast).
BROKEN = [
    ("p1", "rounds float64 inputs to float32 for the reference product",
     "exact = a.double() @ b.double()", "exact = a.float().double() @ b.float().double()"),
    ("p1", "lets an empty matrix through", "if a.numel() == 0 or b.numel() == 0:", "if False:"),
    ("p2", "ignores the seed", "manual_seed(seed)", "manual_seed(0)"),
    ("p3", "is off by 1e-4 except on the visible inputs", "return float(exponent), float(np.exp(",
     "return float(exponent), (1 if n.size == 4 else 1.0001) * float(np.exp("),
    ("p4", "counts rounded once against fl(C) instead of fl(A_r B_r)",
     "(computed == exact_of_rounded.to(dtype).double())", "(computed == exact.to(dtype).double())"),
]


@pytest.mark.parametrize("part, wrong, line, broken", BROKEN, ids=[f"{p}-{w[:30]}" for p, w, _, _ in BROKEN])
def test_a_wrong_answer_that_passes_the_visible_tests_loses_its_part(part, wrong, line, broken):
    solution = fabricate.solution_cells(EX)[f"{part}_solution"]
    assert line in solution
    answers = {f"{part}_solution": solution.replace(line, broken)}
    assert not judged(EX, answers, only=part)[f"{part}_tests"]["passed"], f"{part}: an answer that {wrong} passed"


def test_an_answer_that_checks_no_input_fails_the_visible_tests_of_each_part_that_asks_for_checks():
    cells = fabricate.solution_cells(EX)
    answers = {f"{p}_solution": unchecked(cells[f"{p}_solution"]) for p in ("p1", "p2", "p3")}
    verdicts = judged(EX, answers, visible=True)
    for part in ("p1", "p2", "p3"):
        message = verdicts[f"{part}_tests"]["message"]
        assert not verdicts[f"{part}_tests"]["passed"] and "for this bad input" in message, (part, message)
    assert verdicts["p4_tests"]["passed"], "Part 4 asks for no input check"
