"""ex8's hidden tests observe and the judge decides (grader/judge.py): an answer that is wrong only on
the secret inputs, or wrong in type or behaviour, loses its part; a try-out line left in an answer
cell keeps every point (issue 37: `save_checkpoint(run, 'x.pt')` once took ex8 from 10 to 3)."""
import functools
import json
import subprocess
import sys

import pytest

from grader import fabricate, judge, notebooks, runs
from tests import hidden_runs, test_student_answers
from tests.test_student_answers import ROOT, SECRET, THREADS, unchecked

ASSIGNMENT = "ex8_bitwise_resume"


def record(job: dict, folder) -> dict:
    """grader/hidden_tests.py's record of `job`, run without a sandbox in `folder` (a try-out line
    may write a file there)."""
    result = hidden_runs.run(ROOT / "grader" / "hidden_tests.py", job, cwd=folder,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **THREADS})
    records, problem = runs.read_records(result.stdout.encode(), job)
    assert problem is None and result.returncode == 0, (problem, result.stderr[-2000:])
    return records


@functools.cache
def source_and_release(assignment: str) -> tuple[dict, dict]:
    """The instructor's source and the release of `assignment`."""
    return (notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb"),
            notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb"))


def reference_record(assignment: str, folder) -> dict:
    """The reference solution's record of every part of `assignment` under the hidden tests: the
    one computed once per test run (tests/test_student_answers.py; `folder` is not needed)."""
    return test_student_answers.reference_record(assignment, visible=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return reference_record(ASSIGNMENT, tmp_path_factory.mktemp("reference"))  # once for this file


def verdicts(reference: dict, answers: dict[str, str], parts: set[str], folder, assignment: str = ASSIGNMENT) -> dict:
    """The judge's verdict on the parts `parts` of the instructor's solutions with `answers` in place."""
    source, release = source_and_release(assignment)
    cells = {**fabricate.solution_cells(assignment), **answers}
    submission = {**release, "cells": [{**c, "source": cells.get(notebooks.grade_id(c), c["source"])}
                                       for c in release["cells"]]}
    job = runs.hidden_test_job(source, submission, SECRET, 120)
    job["parts"] = [p for p in job["parts"] if notebooks.part_of(p["test_id"]) in parts]
    return judge.judge({k: v for k, v in reference.items() if notebooks.part_of(k) in parts}, record(job, folder))


def test_try_out_lines_left_in_answer_cells_keep_all_ten_points(reference, tmp_path):
    solutions = fabricate.solution_cells(ASSIGNMENT)
    answers = {
        # `run` is the notebook's (the demo cell above Part 1 makes it): the grader has none, so
        # this line raises NameError there, after save_checkpoint is defined
        "p1_solution": solutions["p1_solution"] + "\n\nsave_checkpoint(run, 'x.pt')\n",
        # a try-out that runs as well when graded: it reseeds and draws from the global RNG (Run()
        # calls torch.manual_seed, dropout draws), writes x.pt, and leaves a `run` of its own
        "p2_solution": solutions["p2_solution"] + ("\n\nrun = Run(seed=3)\nrun.train_step()\n"
                                                   "save_checkpoint(run, 'x.pt')\nload_checkpoint(Run(4), 'x.pt')\n"
                                                   "run.train_step()\n"),
        "p4_solution": solutions["p4_solution"] + "\n\nprint(what_breaks_resume(5, 2))\n",
    }
    got = verdicts(reference, answers, {"p1", "p2", "p3", "p4"}, tmp_path)
    assert all(v["passed"] for v in got.values()), got
    assert (tmp_path / "x.pt").exists()  # the try-out ran to its end


def broken(part: str, old: str, new: str, assignment: str = ASSIGNMENT) -> dict[str, str]:
    """The instructor's answer to `part` with `old` replaced by `new`."""
    solution = fabricate.solution_cells(assignment)[f"{part}_solution"]
    assert old in solution, old
    return {f"{part}_solution": solution.replace(old, new)}


# A cheap way to be wrong on the hidden inputs only (the visible tests pass each), for each part but
# the slowest (Part 4's: the same kind of check): each loses its part, with a message that names
# what differs.
BREAKS = {
    "p1: another generator's state saved for the loader, except after 0 or 12 steps": (
        "p1", '"loader": run.loader.get_state()',
        '"loader": run.loader.get_state() if run.step in (0, 12) else torch.Generator().get_state()', "saved['loader']"),
    "p2: the global RNG restored even when skipped": (
        "p2", '    if "rng" not in skip:\n        torch.set_rng_state', '    if True:\n        torch.set_rng_state',
        "skip=('rng',)): the run's rng"),
    "p3: the width ignored (the visible tests use the default)": (
        "p3", ", width)", ")", "first_divergence("),
}


@pytest.mark.parametrize("case", BREAKS)
def test_an_answer_wrong_on_the_hidden_inputs_loses_its_part(reference, tmp_path, case):
    part, old, new, named = BREAKS[case]
    verdict = verdicts(reference, broken(part, old, new), {part}, tmp_path)[f"{part}_tests"]
    assert not verdict["passed"] and named in verdict["message"], verdict


def test_an_answer_that_checks_no_input_fails_the_visible_tests_of_parts_2_and_3(tmp_path):
    """Issue 37: each part whose task asks for errors on bad input tries one in its visible tests."""
    _, release = source_and_release(ASSIGNMENT)
    parts = ("p2", "p3")
    solutions = fabricate.solution_cells(ASSIGNMENT)
    cells = {**solutions, **{f"{p}_solution": unchecked(solutions[f"{p}_solution"]) for p in parts}}
    submission = {**release, "cells": [{**c, "source": cells.get(notebooks.grade_id(c), c["source"])}
                                       for c in release["cells"]]}
    job = runs.hidden_test_job(release, submission, SECRET, 120)  # the release: visible tests only
    job["parts"] = [p for p in job["parts"] if notebooks.part_of(p["test_id"]) in parts]
    records = record(job, tmp_path)
    for part in parts:
        bad = [o for o in records[f"{part}_tests"]["observations"] if o["check"] == "raises"]
        assert bad and bad[0]["expected"] == ["ValueError"] and bad[0]["raised"] is None, (part, bad)
        assert "# a bad input: the task asks for a ValueError" in notebooks.source_text(
            next(c for c in release["cells"] if notebooks.grade_id(c) == f"{part}_tests"))
