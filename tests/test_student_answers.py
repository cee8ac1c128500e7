"""Students' answers through the hidden-test runner (grader/hidden_tests.py, run here without a
sandbox: these answers are ours): the visible tests try the bad inputs the hidden tests grade, a
failure message shows the real call and the exception expected, and a tolerance fits the task."""
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from grader import fabricate, feedback, judge, no_threads, notebooks, review_flags, runs, withheld
from tests import hidden_runs
from grader.course import assignments
from mpcourse import grading
from tests.shared import once_per_run, run_folder

ROOT = Path(__file__).resolve().parent.parent
SECRET = "a-test-secret"


def unchecked(source: str) -> str:
    """An answer that computes right but checks no input: every `if ...: raise ...` removed (and a
    loop left empty by that)."""
    class Strip(ast.NodeTransformer):
        def generic_visit(self, node):
            super().generic_visit(node)
            for name in ("body", "orelse"):
                block = getattr(node, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    kept = [s for s in block if not (isinstance(s, ast.If) and not s.orelse
                                                     and all(isinstance(b, ast.Raise) for b in s.body))]
                    kept = [s for s in kept if not (isinstance(s, ast.For) and not s.body)]
                    setattr(node, name, kept or [ast.Pass()])
            return node
    return ast.unparse(Strip().visit(ast.parse(source)))


def jobs(assignment: str, answers: dict, visible: bool) -> tuple[dict, dict]:
    """The reference's job and the student's (the instructor's solutions with `answers` in their
    place), under the hidden tests, or the visible tests only (`visible`: the released test cells,
    as the student's notebook runs them)."""
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


def reference_record(assignment: str, visible: bool) -> dict:
    """The reference solution's record of every part, run once per test run (tests/shared.py) and
    assignment and test set: the tests only read it. Each part runs in a child of its own, so a
    part's record is the same whether the job held the other parts or not."""
    return once_per_run(f"reference-{assignment}-{'visible' if visible else 'hidden'}",
                        lambda: runner(jobs(assignment, {}, visible)[0]))


def run(assignment: str, answers: dict[str, str] | None = None, visible: bool = False,
        only: str | None = None) -> tuple[dict, dict]:
    """Verdicts of every part (or part `only`) for the instructor's solutions with `answers` in their
    place, under the hidden tests (or the visible tests only, as the student's notebook runs them);
    and the source."""
    student = jobs(assignment, answers or {}, visible)[1]
    student["parts"] = [p for p in student["parts"] if only in (None, notebooks.part_of(p["test_id"]))]
    reference = {k: v for k, v in reference_record(assignment, visible).items()
                 if only in (None, notebooks.part_of(k))}
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    return judge.judge(reference, runner(student, library(assignment))), source


def library(assignment: str) -> Path:
    """The course library as a student's hidden-test sandbox imports it (grader/withheld.py): made
    once per test run and assignment."""
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    return Path(once_per_run(f"library-{assignment}", lambda: str(withheld.library_copy(
        withheld.declared(source), run_folder() / f"library-{assignment}"))))


# What a sandbox's environment holds besides its paths: one maths thread (grader.runs.threads).
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def runner(job: dict, library: Path | None = None) -> dict:
    """grader/hidden_tests.py's record of `job`, run here without a sandbox, importing the course
    library from `library` (a copy made by grader/withheld.py) or, by default, the course's."""
    result = hidden_runs.run(ROOT / "grader" / "hidden_tests.py", job, cwd=tempfile.gettempdir(),
                             env={"PYTHONPATH": str(library or ROOT), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", **THREADS})
    records, problem = runs.read_records(result.stdout.encode(), job)
    assert problem is None and result.returncode == 0, (problem, result.stderr[-2000:])
    return records


# Every part whose task asks for errors on bad input (ex7's parts 2 and 3 ask for none).
CHECKED_PARTS = [("ex2_loss_scaling", p) for p in ("p1", "p2", "p3", "p4")] + [
    ("ex5_mixed_precision_speedup", p) for p in ("p1", "p2", "p3", "p4")] + [
    ("ex7_fp16_nan_hunt", p) for p in ("p1", "p4")]


@pytest.mark.parametrize("assignment, part", CHECKED_PARTS)
def test_an_answer_that_checks_no_input_fails_the_visible_tests_and_says_why(assignment, part):
    answers = {gid: unchecked(src) for gid, src in fabricate.solution_cells(assignment).items()
               if notebooks.part_of(gid) == part}
    assert any("raise" in src for src in fabricate.solution_cells(assignment).values())
    verdicts, _ = run(assignment, answers, visible=True, only=part)
    verdict = verdicts[f"{part}_tests"]
    assert not verdict["passed"], f"{assignment} {part}: the visible tests try no bad input"
    assert "for this bad input" in verdict["message"] and "expected" in verdict["message"], verdict


@pytest.mark.parametrize("assignment", sorted({a for a, _ in CHECKED_PARTS}))
def test_the_instructors_solutions_pass_the_visible_bad_input_checks(assignment):
    verdicts, _ = run(assignment, visible=True)  # (the hidden tests: tests/test_exercises.py, full marks)
    assert all(v["passed"] for v in verdicts.values()), verdicts


def is_check(statement) -> bool:
    """`if ...: raise ...` with no else: one input check of a solution."""
    return isinstance(statement, ast.If) and not statement.orelse and all(isinstance(b, ast.Raise) for b in statement.body)


def without_check(source: str, k: int) -> str:
    """`source` without its k-th input check (in the order of ast.walk), the rest unchanged."""
    tree = ast.parse(source)
    target = [n for n in ast.walk(tree) if is_check(n)][k]
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and any(s is target for s in block):
                block[:] = [s for s in block if s is not target] or [ast.Pass()]
    return ast.unparse(tree)


def weakenings(source: str) -> list[tuple[str, str]]:
    """[(what was taken out, the source without it)]: each input check removed, and each of its
    conditions (`A or B`, `not (A and B)`) removed in turn, as a student who checks only part of
    what the task lists (the second new-student walkthrough: `error_sweep([])`, an infinite `high`)."""
    checks = [ast.unparse(n.test) for n in ast.walk(ast.parse(source)) if is_check(n)]
    out = []
    for k, condition in enumerate(checks):
        out.append((f"if {condition}: raise", without_check(source, k)))
        for j in range(100):
            tree = ast.parse(source)
            target = [n for n in ast.walk(tree) if is_check(n)][k]
            negated = (isinstance(target.test, ast.UnaryOp) and isinstance(target.test.op, ast.Not)
                       and isinstance(target.test.operand, ast.BoolOp) and isinstance(target.test.operand.op, ast.And))
            holder = target.test.operand if negated else target.test
            if not (isinstance(holder, ast.BoolOp) and (negated or isinstance(holder.op, ast.Or))) or j >= len(holder.values):
                break
            dropped = ast.unparse(holder.values.pop(j))
            if len(holder.values) == 1 and negated:
                target.test.operand = holder.values[0]
            elif len(holder.values) == 1:
                target.test = holder.values[0]
            out.append((f"if {condition}: raise, without `{dropped}`", ast.unparse(tree)))
    return out


def without_each_check(assignment: str, visible: bool) -> dict:
    """For each weakening of each solution cell's input checks (`weakenings`), whether its part
    passes: {(cell, what was taken out): passed}. One run of the hidden-test runner in all: each
    variant is a part of its own."""
    cells = fabricate.solution_cells(assignment)
    variants = [(gid, what, code) for gid, src in cells.items() for what, code in weakenings(src)]
    parts, student = [], None
    for i, (gid, _, code) in enumerate(variants):
        student = jobs(assignment, {gid: code}, visible)[1]
        part = next(p for p in student["parts"] if notebooks.part_of(p["test_id"]) == notebooks.part_of(gid))
        parts.append({**part, "test_id": f"variant {i}"})
    if not parts:
        return {}
    records = runner({**student, "parts": parts}, library(assignment))
    reference = reference_record(assignment, visible)
    return {(gid, what): judge.judge_part(reference[f"{notebooks.part_of(gid)}_tests"], records[f"variant {i}"])["passed"]
            for i, (gid, what, _) in enumerate(variants)}


@pytest.mark.parametrize("assignment", assignments())
def test_every_input_check_the_hidden_tests_grade_is_tried_by_a_visible_test(assignment):
    """Issue 48, item 2: the ticks predict the grade. For each input check of the solution (`if
    ...: raise ...`), the solution without it, and without each of its conditions: where the hidden
    tests then take the part's points, the visible tests must fail too (ex1 Part 1 lost all its
    points to an empty-input check that no visible test tried)."""
    hidden, visible = without_each_check(assignment, False), without_each_check(assignment, True)
    assert hidden  # every exercise checks some input
    missed = [f"{gid}: {what}" for (gid, what), passed in hidden.items() if not passed and visible[gid, what]]
    assert not missed, missed


def test_a_bad_file_is_named_by_its_name_and_a_master_after_the_first_is_checked_too():
    """Student walkthrough 48h. D2: ex8 Part 2's message said `load_checkpoint(<Run>, <PosixPath>,
    skip=())` for three different bad files. D4: an ex2 Part 4 answer that checked only the first
    master's dtype got the tick and 2/2 (the task: a ValueError "if a master is not FP32")."""
    solution = fabricate.solution_cells("ex8_bitwise_resume")["p2_solution"]
    loose = solution.replace("set(state) != set(PIECES)", "not set(PIECES) <= set(state)")
    assert loose != solution
    message = run("ex8_bitwise_resume", {"p2_solution": loose}, only="p2")[0]["p2_tests"]["message"]
    assert "<the file an_extra_key.pt>" in message and "expected it to raise ValueError" in message, message
    solution = fabricate.solution_cells("ex2_loss_scaling")["p4_solution"]
    first_only = solution.replace("    for master, grad in zip(masters, grads16):\n        if master.dtype != torch.float32:",
                                  "    for master, grad in zip(masters, grads16):\n        if masters[0].dtype != torch.float32:")
    assert first_only != solution
    for visible in (True, False):
        verdict = run("ex2_loss_scaling", {"p4_solution": first_only}, visible=visible, only="p4")[0]["p4_tests"]
        assert not verdict["passed"], verdict  # the tick and the grade agree
        assert "sgd_step([tensor([0., 0.]), tensor([0., 0.], dtype=torch.float16)]" in verdict["message"], verdict


def test_ex1_part3_a_check_of_infinities_alone_fails_the_visible_tests_as_it_fails_the_hidden_ones():
    """Student walkthrough 48i: `np.isinf` where the task asks for a ValueError on any value that is
    not finite: the tick, and 0/2 graded (`fit_power_law([1, 2], [nan, 1.0])` returned (nan, nan))."""
    solution = fabricate.solution_cells("ex1_precision_comparison")["p3_solution"]
    old = "if not (np.all(np.isfinite(n)) and np.all(np.isfinite(e)) and np.all(n > 0) and np.all(e > 0)):"
    infinities_only = solution.replace(old, "if np.any(np.isinf(n)) or np.any(np.isinf(e)) or np.any(n <= 0) or np.any(e <= 0):")
    assert infinities_only != solution
    for visible in (True, False):
        verdict = run("ex1_precision_comparison", {"p3_solution": infinities_only}, visible=visible, only="p3")[0]["p3_tests"]
        assert not verdict["passed"] and "nan" in verdict["message"], (visible, verdict)


def test_ex7_a_non_module_says_a_type_error_was_expected_not_only_what_went_wrong():
    answers = {gid: unchecked(src) for gid, src in fabricate.solution_cells("ex7_fp16_nan_hunt").items()
               if notebooks.part_of(gid) == "p1"}
    verdicts, source = run("ex7_fp16_nan_hunt", answers, only="p1")
    message = verdicts["p1_tests"]["message"]
    assert "first_nonfinite(" in message and "raised AttributeError" in message and "expected TypeError" in message
    shown = feedback.safe_message(message, secrets=[SECRET], hidden_lines=feedback.hidden_test_lines(source))
    assert shown == message.removeprefix("AssertionError: ") or shown == message  # not withheld, not cut


def test_ex5_matmul_cost_shows_the_real_call_with_its_torch_dtype_and_the_expected_exception():
    cells = fabricate.solution_cells("ex5_mixed_precision_speedup")
    # Checks m only: the visible tests try k = 2.0, with a torch.float32, which a check of m alone lets through
    only_m = cells["p3_solution"].replace('for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch)):',
                                          'for name, value in (("m", m),):')
    assert only_m != cells["p3_solution"]
    verdicts, source = run("ex5_mixed_precision_speedup", {"p3_solution": only_m}, only="p3")
    message = verdicts["p3_tests"]["message"]
    assert "matmul_cost(4, 4, 2.0, torch.float32) returned" in message, message  # the visible test tries k = 2.0 first
    assert "expected it to raise ValueError" in message and "'float32'" not in message
    shown = feedback.safe_message(message, secrets=[SECRET], hidden_lines=feedback.hidden_test_lines(source))
    assert "matmul_cost(4, 4, 2.0, torch.float32)" in shown


def test_ex7_part3_a_grad_kept_by_reference_fails_the_visible_tests_as_it_fails_the_hidden_ones():
    """The second new-student walkthrough: `.grad` saved by reference and put back without clearing
    it first (backward adds into that same tensor) passed the visible test, which only had `.grad`
    None, and scored 0/2."""
    solution = fabricate.solution_cells("ex7_fp16_nan_hunt")["p3_solution"]
    by_reference = solution.replace("        for p in parameters:\n            p.grad = None\n", "")
    assert by_reference != solution
    for visible in (True, False):
        verdicts, _ = run("ex7_fp16_nan_hunt", {"p3_solution": by_reference}, visible=visible, only="p3")
        assert not verdicts["p3_tests"]["passed"], (visible, verdicts)
    verdicts, _ = run("ex7_fp16_nan_hunt", {"p3_solution": by_reference}, visible=True, only="p3")
    assert "leave .grad as it was" in verdicts["p3_tests"]["message"]


def test_ex2_part1_accepts_a_float32_mean_and_still_rejects_one_element_counted_wrong():
    solution = fabricate.solution_cells("ex2_loss_scaling")["p1_solution"]
    float32_mean = solution.replace("survived.double().mean().item()", "survived.float().mean().item()")
    assert float32_mean != solution
    verdicts, _ = run("ex2_loss_scaling", {"p1_solution": float32_mean}, only="p1")
    assert verdicts["p1_tests"]["passed"], verdicts["p1_tests"]
    one_more = solution.replace("survived.double().mean().item()",
                                "(survived.sum().item() + 1) / survived.numel() if survived.numel() > 100 "
                                "else survived.double().mean().item()")
    verdicts, _ = run("ex2_loss_scaling", {"p1_solution": one_more}, only="p1")
    assert not verdicts["p1_tests"]["passed"] and "fp16_survivors of 20000" in verdicts["p1_tests"]["message"]


def test_ex4_part4_accepts_a_float32_mean_and_still_rejects_one_row_counted_wrong():
    """Issue 48, item 3: the fractions were compared with rtol=0, so an honest float32 mean
    (0.0975 as 0.097499996...) lost Part 4."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p4_solution"]
    float32_mean = solution.replace("torch.isnan(p).any(dim=-1).double().mean().item()",
                                    "torch.isnan(p).any(dim=-1).float().mean().item()")
    assert float32_mean != solution
    verdicts, _ = run("ex4_softmax_stability", {"p4_solution": float32_mean}, only="p4")
    assert verdicts["p4_tests"]["passed"], verdicts["p4_tests"]
    one_more = solution.replace("torch.isnan(p).any(dim=-1).double().mean().item()",
                                "(torch.isnan(p).any(dim=-1).sum().item() + 1) / rows")
    verdicts, _ = run("ex4_softmax_stability", {"p4_solution": one_more}, only="p4")
    assert not verdicts["p4_tests"]["passed"] and "fraction of rows with NaN" in verdicts["p4_tests"]["message"]


def in_float32(source: str) -> str:
    """The same answer computed in float32 where it computed in float64 (an honest habit)."""
    return (source.replace(".double()", ".float()").replace("torch.float64", "torch.float32")
            .replace("dtype=torch.double", "dtype=torch.float"))


# Parts whose task asks for float64 itself (the float32 version is then not the task), with the
# words of the task that ask.
FLOAT64_TASKS = {
    ("ex1_precision_comparison", "p1"): "measured against float64",
    ("ex1_precision_comparison", "p2"): "measured against float64",  # Part 2 calls Part 1's function
    ("ex1_precision_comparison", "p4"): "compare in float64",
    ("ex3_dynamic_range", "p1"): "computing in float64",
    ("ex3_dynamic_range", "p3"): "(computed in float64;",
    ("ex4_softmax_stability", "p3"): "(in FP64 if `x` is FP64)",
}
FLOAT32_PARTS = sorted({(a, notebooks.part_of(gid)) for a in assignments()
                        for gid, src in fabricate.solution_cells(a).items() if in_float32(src) != src}
                       - set(FLOAT64_TASKS))


def test_every_part_excused_from_float32_asks_for_float64_in_its_task():
    for (assignment, part), words in FLOAT64_TASKS.items():
        text = (ROOT / "exercises" / assignment / f"{assignment}.ipynb").read_text()
        assert words in text, (assignment, part, words)
    assert ("ex4_softmax_stability", "p4") in FLOAT32_PARTS and ("ex2_loss_scaling", "p1") in FLOAT32_PARTS


def test_ex4_part3_fp64_logits_computed_in_fp32_fail_the_visible_tests_as_they_fail_the_hidden_ones():
    """Issue 48, the third new-student walkthrough: FP64 input computed in FP32 (the task asks for FP64)
    passed the visible tests, which had no FP64 input, and scored 0/3."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    fp32_only = in_float32(solution)
    assert fp32_only != solution and "torch.float64" not in fp32_only
    for visible in (True, False):
        verdicts, _ = run("ex4_softmax_stability", {"p3_solution": fp32_only}, visible=visible, only="p3")
        assert not verdicts["p3_tests"]["passed"], (visible, verdicts)
        assert "FP64 logits" in verdicts["p3_tests"]["message"], (visible, verdicts)


@pytest.mark.parametrize("assignment, part", FLOAT32_PARTS)
def test_a_float32_version_of_the_solution_keeps_its_points(assignment, part):
    """Issue 48, item 3: every part whose task leaves the dtype free, handed in computed in float32."""
    answers = {gid: in_float32(src) for gid, src in fabricate.solution_cells(assignment).items()}
    verdicts, _ = run(assignment, answers, only=part)
    assert verdicts[f"{part}_tests"]["passed"], verdicts[f"{part}_tests"]


def with_cells(assignment: str, answers: dict, added: list[tuple[str, str, str]]) -> dict:
    """The release with the instructor's solutions, `answers` in their place, and code cells the
    student added: (where: "before"/"after", the grade_id of the cell they go next to, code)."""
    release = notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    cells = {**fabricate.solution_cells(assignment), **answers}
    out = []
    for cell in release["cells"]:
        cell = {**cell, "source": cells.get(notebooks.grade_id(cell), cell["source"])}
        for where in ("before", "after"):
            mine = [{"cell_type": "code", "id": f"mine-{len(out)}-{i}", "metadata": {}, "source": code,
                     "outputs": [], "execution_count": None}
                    for i, (w, gid, code) in enumerate(added) if w == where and gid == notebooks.grade_id(cell)]
            out += mine + [cell] if where == "before" else mine
    return {**release, "cells": out}


def hidden_verdicts(assignment: str, submission: dict) -> dict:
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    student = runs.hidden_test_job(source, submission, SECRET, 120)
    return judge.judge(reference_record(assignment, False), runner(student, library(assignment)))


def test_cells_a_student_adds_run_before_the_tests_as_in_the_notebook():
    """Issue 48, item 1: a helper in a cell of its own, an import in its own cell, an answer split
    over two cells, and `get_ipython()` (a notebook exported to Python) keep their points; a try-out
    cell that raises costs nothing; a cell below the last test cell runs after every test, as in the
    notebook. Before, only answer cells ran: NameError, ex4 from 10 to 5."""
    solution = fabricate.solution_cells("ex4_softmax_stability")
    p1 = solution["p1_solution"].replace("e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)",
                                         "return divide_by_sum(torch.exp(x), dim)")
    p4 = solution["p4_solution"].replace("fractions.append(", "get_ipython().run_line_magic('time', 'pass')\n        fractions.append(")
    assert p1 != solution["p1_solution"] and p4 != solution["p4_solution"]
    submission = with_cells("ex4_softmax_stability", {
        "p1_solution": p1, "p2_solution": "", "p4_solution": p4}, [
        ("before", "p1_solution", "import torch.nn.functional as functional\n"),
        ("before", "p1_solution", "def divide_by_sum(e, dim):\n    return e / e.sum(dim=dim, keepdim=True)\n"),
        ("after", "p1_solution", "naive_softmax([1.0, 2.0])  # a try-out that raises TypeError, as it should\n"),
        ("after", "p2_solution", solution["p2_solution"]),  # the answer in a cell of its own below the answer cell
        ("after", "p4_tests", "def naive_softmax(x, dim=-1):\n    return x  # below every test: runs after them\n")])
    verdicts = hidden_verdicts("ex4_softmax_stability", submission)
    assert all(v["passed"] for v in verdicts.values()), verdicts
    source = notebooks.read_notebook(ROOT / "solutions" / "ex4_softmax_stability" / "ex4_softmax_stability.ipynb")
    assert [name for name, _ in notebooks.student_code(submission, source) if not notebooks.example(name)][:4] == [
        "p1_added (code cell 3)", "p1_added (code cell 4)", "p1_solution", "p1_added (code cell 6)"]


def wrapped(function: str, line: str) -> str:
    """An answer's function wrapped so that `line` runs at each call, as the tests call it."""
    return (f"\n\n_{function} = {function}\n\n\ndef {function}(*args, **kwargs):\n    {line}\n"
            f"    return _{function}(*args, **kwargs)\n")


def test_names_from_the_notebooks_cells_a_later_part_or_a_changed_set_up_cell_reach_the_answers():
    """Issue 48, the new-student walkthrough: (D1) a helper reading `fp16`, which the notebook's own
    example cell defines; (D3) `import numbers` put in the set-up cell; (D2) a Part 1 helper reading a
    Part 2 constant, called in Part 3 (one pass over the earlier parts passed Part 2 over before it
    knew Part 2 was needed). Each passed its visible tests and scored 0 for the part."""
    solution = fabricate.solution_cells("ex2_loss_scaling")
    release = notebooks.read_notebook(ROOT / "exercises" / "ex2_loss_scaling" / "ex2_loss_scaling.ipynb")
    setup = next(notebooks.source_text(c) for c in release["cells"] if notebooks.grade_id(c) == "setup")
    submission = with_cells("ex2_loss_scaling", {
        "setup": setup.rstrip("\n") + "\nimport numbers\n",
        "p2_solution": solution["p2_solution"] + wrapped("min_loss_scale", "assert fp16.max == 65504"),
        "p4_solution": solution["p4_solution"] + wrapped("sgd_step", "assert isinstance(args[3], numbers.Real)")}, [])
    verdicts = hidden_verdicts("ex2_loss_scaling", submission)
    assert all(v["passed"] for v in verdicts.values()), verdicts
    untouched = runs.hidden_test_job(notebooks.read_notebook(ROOT / "solutions" / "ex2_loss_scaling" / "ex2_loss_scaling.ipynb"),
                                     with_cells("ex2_loss_scaling", {}, []), SECRET, 120)
    assert not any(notebooks.example(name) for part in untouched["parts"] for name, _ in part["cells"])  # only when needed
    softmax = fabricate.solution_cells("ex4_softmax_stability")
    submission = with_cells("ex4_softmax_stability", {
        "p1_solution": softmax["p1_solution"] + "\n\ndef ensure(x):\n    return CHECKED\n",
        "p2_solution": "CHECKED = True\n" + softmax["p2_solution"],
        "p3_solution": softmax["p3_solution"] + wrapped("stable_softmax", "assert ensure(args[0])")}, [])
    verdicts = hidden_verdicts("ex4_softmax_stability", submission)
    assert all(v["passed"] for v in verdicts.values()), verdicts


def test_a_later_parts_parameter_named_as_an_earlier_try_out_global_does_not_take_that_cell_in():
    """Red team 45h, A04: ex5's Part 3 answer `matmul_cost(m, n, k, ...)` has a parameter `n`; a
    student's heavy try-out cell in Part 2 (8192 x 8192 products, seconds on Colab's GPU) sets a
    global `n`, so Part 3's tests ran Part 2's cells with it, past their time: 0 of Part 3's points.
    A name a function binds itself is not one it reads from the notebook; a global it reads is."""
    name = "ex5_mixed_precision_speedup"
    source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
    assert "n" in runs.defined_names("n = 8192\n") and "def matmul_cost(m, n, k" in fabricate.solution_cells(name)["p3_solution"]
    try_out = "n = 8192\nslow = time_it(lambda: torch.ones(n, n) @ torch.ones(n, n))  # explore\n"
    job = runs.hidden_test_job(source, with_cells(name, {}, [("after", "p2_solution", try_out)]), SECRET, 120)
    cells = {part["test_id"]: [src for _, src in part["cells"]] for part in job["parts"]}
    assert try_out in cells["p2_tests"], "above Part 2's test cell: it runs with Part 2's tests, as in the notebook"
    assert try_out not in cells["p3_tests"] and try_out not in cells["p4_tests"]
    reads = "def matmul_cost(m, k, dtype):\n    return 2 * m * n * k\n"  # reads the global n: needs the cell
    job = runs.hidden_test_job(source, with_cells(name, {"p3_solution": reads}, [("after", "p2_solution", try_out)]), SECRET, 120)
    assert try_out in [src for _, src in job["parts"][2]["cells"]]
    assert {"n", "k", "m"} - runs.used_names("def f(m, n, k):\n    return [m * n for _ in range(k)]\n") == {"n", "k", "m"}
    assert {"G", "range"} <= runs.used_names("def f(m):\n    return [m * G for _ in range(3)]\n")


def test_a_name_a_test_cell_sets_itself_takes_no_earlier_cell_in():
    """Walkthrough 4 (D2): ex7 Part 4's test cell sets `seed` itself; a student's slow try-out in
    Part 2 that also set `seed` ran with Part 4's tests, past their time: 0 for Part 4."""
    name = "ex7_fp16_nan_hunt"
    source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
    test = next(notebooks.source_text(c) for c in source["cells"] if notebooks.grade_id(c) == "p4_tests")
    assert "seed" in runs.bound_names(test) and "seed" in runs.used_names(test)
    try_out = "seed = 7\nsweep = [seed * k for k in range(3)]  # a slow sweep, in the notebook\n"
    job = runs.hidden_test_job(source, with_cells(name, {}, [("after", "p2_solution", try_out)]), SECRET, 120)
    cells = {part["test_id"]: [src for _, src in part["cells"]] for part in job["parts"]}
    assert try_out in cells["p2_tests"] and try_out not in cells["p4_tests"]


def test_an_answer_that_reads_a_name_a_test_cell_sets_is_told_so():
    """Walkthrough 4 (D1): an ex2 Part 2 answer that reads `OVERFLOW_FROM`, which only a test cell
    sets, ticks in the notebook (one namespace) and fails graded (the tests run apart): NameError,
    and the message blamed "other inputs". It now says where the name comes from."""
    from grader import schedule
    name = "ex2_loss_scaling"
    source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
    setters = [notebooks.grade_id(c) for c in source["cells"] if "OVERFLOW_FROM" in runs.defined_names(notebooks.source_text(c))]
    assert setters and all("_tests" in (g or "") for g in setters), setters
    answer = fabricate.solution_cells(name)["p2_solution"] + wrapped("min_loss_scale", "assert OVERFLOW_FROM > 0")
    verdicts = noted(name, with_cells(name, {"p2_solution": answer}, []))
    assert not verdicts["p2_tests"]["passed"] and verdicts["p1_tests"]["passed"]
    message = verdicts["p2_tests"]["message"]
    assert "Grader's note: your code reads OVERFLOW_FROM, which the test cells of Parts 1 and 2 set" in message, message
    assert "OVERFLOW_FROM was not defined. Set it in a cell of your own" in message, message


def noted(assignment: str, submission: dict) -> dict:
    """The verdicts of `submission` under the hidden tests, with the grader's notes (grader/advice.py)."""
    from grader import advice
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    release = notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    job = runs.hidden_test_job(source, submission, SECRET, 120)
    verdicts = judge.judge(reference_record(assignment, False), runner(job, library(assignment)))
    return advice.with_test_cell_names(verdicts, release, job)


# Student walkthrough 48f, A: sgd_step unscales by the global S, not scaler.scale. Graded, the test
# cells' S is not there; the notebook's example cell `S = min_loss_scale(g)` (8192) is: 0 of 2.
GLOBAL_S = ("inv_scale = 1.0 / scaler.scale", "inv_scale = 1.0 / S  # the S of the task")


def test_an_answer_that_reads_a_test_cells_name_set_by_an_example_cell_too_is_told_where_it_came_from():
    """Student walkthrough 48f, A: the value came silently from the notebook's example cell, and the
    message named a check that passed in the notebook. The note names S, the test cells that set
    it, the cell it came from when graded, and what to do."""
    name = "ex2_loss_scaling"
    solution = fabricate.solution_cells(name)["p4_solution"]
    assert GLOBAL_S[0] in solution
    verdicts = noted(name, with_cells(name, {"p4_solution": solution.replace(*GLOBAL_S)}, []))
    assert [t for t, v in verdicts.items() if not v["passed"]] == ["p4_tests"], verdicts
    message = verdicts["p4_tests"]["message"]
    assert "Grader's note: your code reads S, which Part 2's test cell sets: graded, the test cells run apart from " \
           "your code, and S came from the notebook's cell p3_example (code cell 8), not from a test cell. Set it in " \
           "a cell of your own, or use your function's arguments instead" in message, message
    assert "Grader's note" not in noted(name, with_cells(name, {}, []))["p4_tests"]["message"]  # passed: no note


def test_the_note_names_the_failing_parts_own_name_and_the_part_fails_first():
    """Student walkthrough 48f, C: Part 2 reads FP16 (a test cell's), Part 4 the global S. Part 4's
    message began with two other cells' errors (the page cut the rest), called the notebook's
    example cell "your cell", and its hint named FP16, not S."""
    name = "ex2_loss_scaling"
    solution = fabricate.solution_cells(name)
    p2 = solution["p2_solution"].replace("torch.finfo(torch.float16).tiny", "FP16.tiny") + \
        "\n\nprint(min_loss_scale(torch.tensor([1e-6, 1e-8])))  # a try-out\n"
    assert p2.count("FP16.tiny") == 1
    verdicts = noted(name, with_cells(name, {"p2_solution": p2, "p4_solution": solution["p4_solution"].replace(*GLOBAL_S)}, []))
    message = verdicts["p4_tests"]["message"]
    assert message.startswith("sgd_step(") and "raised NameError: name 'S' is not defined; before it, " in message, message
    assert "the notebook's cell p3_example (code cell 8) raised" in message and "your cell p3_example" not in message
    note = message.split("Grader's note: ", 1)[1]
    assert note.startswith("your code reads S, which Part 2's test cell sets") and "FP16" not in note, note
    assert "S was not defined (the notebook's cell p3_example (code cell 8) sets it, but did not get to" in note
    assert "FP16, which the test cells of Parts 1 and 2 set" in verdicts["p2_tests"]["message"]
    shown = feedback.safe_message(message, secrets=[SECRET], hidden_lines=set())
    assert "name 'S' is not defined" in shown and shown.endswith(note), shown  # the page keeps both


def test_a_part_that_ran_past_its_time_with_cells_the_student_added_is_flagged_for_review():
    """Red team 45h, A04: a GPU-sized try-out above Part 2's test cell (seconds on Colab's GPU) ran
    Part 2's tests past their time on the grading CPU: 0 for the part, and nothing told the
    instructor. The grade stands; the report asks them to read those cells."""
    from grader import schedule
    name = "ex5_mixed_precision_speedup"
    source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
    job = runs.hidden_test_job(source, with_cells(name, {}, [("after", "p2_solution", "n = 8192\n")]), SECRET, 120)
    late = {"observations": [], "stopped": "the tests of this part did not finish within 60 s of CPU time"}
    records = {"p1_tests": late, "p2_tests": late, "p3_tests": {"observations": []},
               "p4_tests": {"observations": [], "stopped": "x", "refused": "wrote a record larger than the grader reads"}}
    flags = schedule.record_flags(job, records)
    assert flags["p2"] == [schedule.TIMED_OUT_WITH_ADDED.format("code cell 6")]  # the try-out is the 6th code cell
    assert "p1" not in flags and "p3" not in flags  # Part 1 ran past its time with its own answer only
    assert flags["p4"] == ["made the part's record unreadable: wrote a record larger than the grader reads"]


def test_an_added_cell_that_breaks_a_name_costs_what_it_costs_in_the_notebook():
    """The ticks predict the grade: an added cell that redefines an answer wrongly above the test
    cell fails the part in the notebook, so it fails it when graded; the other parts keep theirs."""
    submission = with_cells("ex4_softmax_stability", {}, [
        ("after", "p1_solution", "def naive_softmax(x, dim=-1):\n    return x  # an old attempt, run after the answer\n")])
    verdicts = hidden_verdicts("ex4_softmax_stability", submission)
    assert not verdicts["p1_tests"]["passed"] and verdicts["p3_tests"]["passed"], verdicts


def test_review_flags_read_the_cells_a_student_adds():
    source = notebooks.read_notebook(ROOT / "solutions" / "ex4_softmax_stability" / "ex4_softmax_stability.ipynb")
    submission = with_cells("ex4_softmax_stability", {}, [
        ("before", "p3_solution", "import inspect\nframe = inspect.currentframe()\n")])
    assert review_flags.review_flags(submission) == {}  # answer cells alone: nothing to read
    assert "reads the call stack" in review_flags.review_flags(submission, source)["p3"]

    def windows(notebook):  # saved by an editor that ends lines in \r\n (red team 45h, A06)
        return {**notebook, "cells": [{**c, "source": [line.replace("\n", "\r\n") for line in c["source"]]}
                                      if isinstance(c["source"], list) else {**c, "source": c["source"].replace("\n", "\r\n")}
                                      for c in notebook["cells"]]}
    assert review_flags.review_flags(windows(with_cells("ex1_precision_comparison", {}, [])), notebooks.read_notebook(
        ROOT / "solutions" / "ex1_precision_comparison" / "ex1_precision_comparison.ipynb")) == {}
    assert "reads the call stack" in review_flags.review_flags(windows(submission), source)["p3"]


def test_a_changed_set_up_cell_is_read_for_what_the_student_added_only():
    """Student walkthrough 48g, D3: `import math` added to ex1's set-up cell flagged Part 1 "uses
    the course library", for the set-up cell's own `from mpcourse import ...` lines."""
    name = "ex1_precision_comparison"
    source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
    setup = next(notebooks.source_text(c) for c in source["cells"] if notebooks.grade_id(c) == "setup")
    assert "from mpcourse" in setup
    assert review_flags.review_flags(with_cells(name, {"setup": "import math\n" + setup}, []), source) == {}
    stack = with_cells(name, {"setup": setup + "\nimport inspect\nframe = inspect.currentframe()\n"}, [])
    assert "reads the call stack" in review_flags.review_flags(stack, source)["p1"]


def test_a_changed_set_up_cell_is_read_for_all_but_the_released_set_up_and_example_statements():
    """Red team 16d: the statements "released" came from every cell of the instructor's source, tests
    and solutions too: a test's statement pasted into the set-up cell went unread (B1: ex7's
    `module.__class__ = foreign` loop; B2: a hidden test's `from mpcourse.numerics import ...`); a
    statement 500 levels deep made `ast.unparse` raise RecursionError, and the student was never
    graded (B3); the cell was parsed with no size or brace limit (B4)."""
    def setup_of(name):
        source = notebooks.read_notebook(ROOT / "solutions" / name / f"{name}.ipynb")
        return source, next(notebooks.source_text(c) for c in source["cells"] if notebooks.grade_id(c) == "setup")

    name = "ex7_fp16_nan_hunt"
    source, setup = setup_of(name)
    swap = ("model = [1]\nNaiveSoftmax = int\nforeign = bool\n"
            "for module in model.modules():\n    if type(module) is NaiveSoftmax:\n        module.__class__ = foreign\n")
    assert "changes an object's class" in review_flags.review_flags(with_cells(name, {"setup": setup + "\n" + swap}, []), source)["p1"]
    name = "ex4_softmax_stability"
    source, setup = setup_of(name)
    hidden = "from mpcourse.numerics import naive_softmax as reference_naive\n"
    assert hidden in "".join(notebooks.source_text(c) for c in source["cells"])  # a hidden test's line
    flags = review_flags.review_flags(with_cells(name, {"setup": hidden + setup}, []), source)
    assert any(why.startswith("uses the course library") for why in flags["p1"])
    deep = "x = " + "+".join(["1"] * 500) + "\n"  # ast.parse copes; ast.unparse raised RecursionError
    flags = review_flags.review_flags(with_cells(name, {"setup": setup + "\n" + deep}, []), source)
    assert any(why.startswith("uses the course library") for why in flags["p1"])  # read whole
    statements = review_flags.released_statements(source)
    assert review_flags.own_statements(setup + "\n" + deep, statements) == setup + "\n" + deep
    fields = "s = [" + ",".join('f"{a}"' for _ in range(review_flags.BRACES + 1)) + "]\n"
    assert review_flags.own_statements(setup + "\n" + fields, statements) == setup + "\n" + fields  # not parsed: read whole
    assert review_flags.review_flags(with_cells(name, {"setup": setup + fields}, []), source)["p1"] == [
        f"holds more than {review_flags.BRACES:,} braces: not read here"]
    assert review_flags.own_statements(setup + "\nimport statistics\n", statements) == "import statistics"


def test_honest_notebook_habits_in_an_answer_cell_keep_their_points():
    solution = fabricate.solution_cells("ex2_loss_scaling")["p1_solution"]
    habits = solution + ("\n\ntorch.nextafter?\n?torch.finfo\ntorch.float16??  # the docs\n"
                         "display(fp16_survivors(torch.ones(3)))\n"
                         "from IPython.display import display as show\nshow('done')\n"
                         "answer = input('Ready? ')\n%time fp16_survivors(torch.ones(3))\n")
    verdicts, _ = run("ex2_loss_scaling", {"p1_solution": habits}, only="p1")
    assert verdicts["p1_tests"]["passed"], verdicts["p1_tests"]


def test_an_answer_cell_that_sets_torchs_default_dtype_does_not_change_the_tests_inputs():
    """Red team A8c: float64 as the default made the tests' "float32 x" float64, and a right
    naive_softmax lost Part 1 for returning it in float64."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p1_solution"]
    answer = "torch.set_default_dtype(torch.float64)  # accurate references\n" + solution
    verdicts, _ = run("ex4_softmax_stability", {"p1_solution": answer}, only="p1")
    assert verdicts["p1_tests"]["passed"], verdicts["p1_tests"]


def test_an_answer_cell_that_flushes_subnormals_or_lowers_matmul_precision_does_not_change_the_tests():
    """Red team 45f, A03 and A08: `torch.set_flush_denormal(True)` (chapter 1 shows it) or
    `torch.set_float32_matmul_precision("medium")` in an answer cell passed the visible tests in the
    student's kernel and cost points when graded (the reference's process never set them): the
    tests set torch's defaults back, in the notebook and when graded alike."""
    solution = fabricate.solution_cells("ex3_dynamic_range")["p2_solution"]
    answer = "torch.set_flush_denormal(True)  # as chapter 1 shows\n" + solution
    verdicts, _ = run("ex3_dynamic_range", {"p2_solution": answer}, only="p2")
    assert verdicts["p2_tests"]["passed"], verdicts["p2_tests"]
    try:
        torch.set_float32_matmul_precision("medium")
        torch.set_flush_denormal(True)
        grading.start("Part 1")
        assert torch.get_float32_matmul_precision() == "highest" and (torch.tensor([2.0**-140]) * 1.0).item() > 0
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.set_flush_denormal(False)


def test_an_answer_cell_ending_in_a_timeit_capture_keeps_its_part():
    """Red team 45b, A12: `t = %timeit -o ...` (valid in Jupyter) made the whole cell a SyntaxError."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p1_solution"]
    answer = solution + "\nmeasured = %timeit -o -n 1 -r 1 naive_softmax(torch.randn(4, 5))\nfiles = !ls\n"
    verdicts, _ = run("ex4_softmax_stability", {"p1_solution": answer}, only="p1")
    assert verdicts["p1_tests"]["passed"], verdicts["p1_tests"]


def test_names_an_earlier_cell_defines_in_blocks_or_by_a_star_import_reach_a_later_part():
    """Red team 45c, A03a and A03b: `from math import *` in Part 1's cell, a helper defined in an
    if/else there: Part 3 and Part 4 used them and lost their points (NameError): only top-level
    definitions made an earlier cell run before a later part."""
    assert runs.defined_names("if cuda:\n    def wide(x):\n        return x\nelse:\n    def wide(x):\n        return 2 * x\n"
                              "try:\n    import scipy as sp\nexcept ImportError:\n    sp = None\n"
                              "with open('f') as handle:\n    pass\nfor k in range(2):\n    last = k\n"
                              "def f():\n    inner = 1\n") == {"wide", "sp", "handle", "k", "last", "f"}
    assert runs.ALL in runs.defined_names("from math import *\n")
    source = notebooks.read_notebook(ROOT / "solutions" / "ex4_softmax_stability" / "ex4_softmax_stability.ipynb")
    submission = json.loads(json.dumps(source))
    for cell in submission["cells"]:
        if notebooks.grade_id(cell) == "p1_solution":
            cell["source"] = "from math import *\nif False:\n    pass\nelse:\n    def helper_from_part_one(x):\n        return x\n" + \
                notebooks.source_text(cell)
        if notebooks.grade_id(cell) == "p3_solution":
            cell["source"] = notebooks.source_text(cell) + "\nhelper_from_part_one(isfinite(1.0))\n"
    job = runs.hidden_test_job(source, submission, SECRET, 60)
    part3 = next(p for p in job["parts"] if p["test_id"] == "p3_tests")
    assert "p1_solution" in [cell_id for cell_id, _ in part3["cells"]]


def test_a_scratch_copy_below_the_test_cell_is_not_graded_and_a_moved_test_cell_keeps_its_answer():
    """Red team 45d, A05(iii): the right answer above Part 3's test cell (what the visible test
    checked), an old wrong attempt pasted as a copy below it: the copy above is graded. Every copy
    below (the test cell moved above its answer): those copies are graded, as before."""
    source = notebooks.read_notebook(ROOT / "solutions" / "ex4_softmax_stability" / "ex4_softmax_stability.ipynb")

    def part3_cells(cells):
        job = runs.hidden_test_job(source, {**source, "cells": cells}, SECRET, 60)
        return [src for gid, src in next(p for p in job["parts"] if p["test_id"] == "p3_tests")["cells"] if gid == "p3_solution"]

    cells = json.loads(json.dumps(source["cells"]))
    answer = next(i for i, c in enumerate(cells) if notebooks.grade_id(c) == "p3_solution")
    test = next(i for i, c in enumerate(cells) if notebooks.grade_id(c) == "p3_tests")
    scratch = {**cells[answer], "source": "# old attempt\nstable_softmax = None\n"}
    assert part3_cells(cells[:test + 1] + [scratch] + cells[test + 1:]) == [notebooks.source_text(cells[answer])]
    assert len(part3_cells(cells[:test] + [scratch] + cells[test:])) == 2  # above the test: both run, in order
    moved = cells[:answer] + [cells[test], cells[answer]] + [c for c in cells[answer + 1:] if c is not cells[test]]
    assert part3_cells(moved) == [notebooks.source_text(cells[answer])]


def test_ipython_lines_are_read_only_where_ipython_reads_them_and_leave_no_block_empty():
    """Red team 45e, A02: three honest ex4 answers that run in Jupyter lost a part each: a `%`
    continuation line and black's `!= p` line inside brackets were commented out, and an indented
    `!nvidia-smi`, the only line of its block, left the block empty."""
    import ast
    continued = 'message = ("... got %s"\n           % type(x).__name__)'
    black = "bad = (\n    p\n    != p\n).any(dim=-1)"
    shell = 'if device == "cuda":\n    !nvidia-smi\nx = 1'
    for cell in (continued, black):
        assert notebooks.without_magics(cell) == cell
    assert notebooks.without_magics(shell) == 'if device == "cuda":\n    pass  # (not run by the grader) !nvidia-smi\nx = 1'
    inside = "def f(x):\n    %time y = g(x)\n    return x"
    assert "    pass  # (not run by the grader) %time y = g(x)" in notebooks.without_magics(inside)
    strings = 's = """\n%not a magic\n"""\nt = 1 + \\\n    2'
    assert notebooks.without_magics(strings) == strings
    for cell in (continued, black, shell, inside, strings):
        ast.parse(notebooks.without_magics(cell))
    # The review's flags read the answer as the runner does (A05: one %timeit line hid them all)
    flagged = review_flags.review_flags({"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "p1_solution"}},
                                                    "source": "import sys\nt = %timeit -o f(x)\nframe = sys._getframe(1)\n"}]})
    assert "reads the call stack" in flagged["p1"] and "cannot be parsed" not in flagged["p1"]


def test_an_answer_too_long_in_all_is_not_graded_and_the_report_stays_one_line_per_fact(tmp_path, capsys):
    """Red team 45e: A04, 100 answer cells just under the one-cell cap took a grading from about 60 s
    to 1,154 s (the grader's own process parses each); A03, a feedback run's stderr quoted with its
    newlines forged READ and NOT GRADED lines about classmates."""
    from grader import report as reports
    from grader import schedule
    assignment = "ex4_softmax_stability"
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    release = notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    submission = json.loads(json.dumps(source))
    at = next(i for i, c in enumerate(submission["cells"]) if notebooks.grade_id(c) == "p1_solution") + 1
    submission["cells"][at:at] = [{"cell_type": "code", "metadata": {}, "source": "x = 1\n" * 30_000, "outputs": [],
                                   "execution_count": None} for _ in range(3)]  # cells added above Part 1's tests
    folder = tmp_path / "submitted" / "mallory" / assignment
    folder.mkdir(parents=True)
    (folder / f"{assignment}.ipynb").write_text(json.dumps(submission))
    verdicts, _, problem, _, _ = schedule.grade_student(tmp_path, assignment, "mallory", None, source, release, SECRET,
                                                        60, False, False)
    assert verdicts is None and "characters in all, more than the 400,000 the grader reads" in problem
    forged = schedule.Report(notes={"eve": "its notebook run failed (x\n  READ alice p1: its answer reads the call stack)"},
                            not_graded={"bob": "a\nNOT GRADED carol: x"})
    reports.print_report(forged)
    printed = capsys.readouterr().out.splitlines()
    assert not any(line.startswith(("  READ alice", "NOT GRADED carol")) for line in printed) and len(printed) == 2


def test_help_lines_are_comments_and_a_question_mark_elsewhere_is_not_touched():
    assert notebooks.without_magics("torch.nextafter?\n  ?np.log\nx = '?'\ny = a if b else c") == (
        "# (not run by the grader) torch.nextafter?\n# (not run by the grader)   ?np.log\nx = '?'\ny = a if b else c")
    # Red team 45b, A09 and A12: assignments from IPython's magics and shell, nothing else
    cell = "t = %timeit -o -n 1 f(x)\nfiles = !ls\na, b = %who_ls\nok = a != b\nz = 7 % 3\nw = '%d' % 2\nv=!pwd"
    assert notebooks.without_magics(cell).split("\n") == [
        "# (not run by the grader) t = %timeit -o -n 1 f(x)", "# (not run by the grader) files = !ls",
        "# (not run by the grader) a, b = %who_ls", "ok = a != b", "z = 7 % 3", "w = '%d' % 2",
        "# (not run by the grader) v=!pwd"]


def run_job(setup: str, cells: list[list[str]], test: str, names: list[str]) -> dict:
    """Whether `test` (plain asserts, no grading check) ran to its end after the answer `cells`,
    and the runner's message if not."""
    job = {"secret": SECRET, "timeout": 60, "setup": setup,
           "parts": [{"test_id": "p2_tests", "cells": cells, "names": names, "test": test}]}
    record = runner(job)["p2_tests"]
    return {"passed": record["stopped"] is None, "message": record["stopped"] or ""}


SETUP = "import torch\nimport numpy as np\ntorch.manual_seed(0)\nnp.random.seed(0)\n"


def test_the_tests_draw_the_same_random_numbers_whatever_the_answer_cells_drew():
    expected = torch_first_draws()
    test = f"assert torch.rand(3).tolist() == {expected[0]!r}\nassert np.random.rand(2).tolist() == {expected[1]!r}\n"
    quiet = "def f():\n    return 1\n"
    busy = quiet + "torch.rand(1000)\nnp.random.rand(7)\ntorch.manual_seed(123)\n"
    assert run_job(SETUP, [["p2_solution", quiet]], test, ["f"])["passed"]
    assert run_job(SETUP, [["p2_solution", busy]], test, ["f"])["passed"]


def torch_first_draws():
    import numpy as np
    import torch
    torch.manual_seed(0)
    np.random.seed(0)
    return torch.rand(3).tolist(), np.random.rand(2).tolist()


def test_a_try_out_line_that_fails_outside_the_notebook_does_not_cost_a_later_part():
    earlier = "def save(run, path):\n    return path\n\nsave(run, 'x.pt')  # `run` came from a cell of the notebook\n"
    mine = "def load(path):\n    return path\n"
    test = "assert load(save(None, 'y')) == 'y'\n"
    verdict = run_job(SETUP, [["p1_solution", earlier], ["p2_solution", mine]], test, ["save", "load"])
    assert verdict["passed"], verdict
    # When the tests fail, the message says where the answer cell stopped
    verdict = run_job(SETUP, [["p1_solution", "print(run)\n"], ["p2_solution", mine]], test, ["save", "load"])
    assert not verdict["passed"]
    assert verdict["message"].startswith("NameError: name 'save' is not defined; before it, your cell p1_solution "
                                         "raised NameError: name 'run' is not defined"), verdict
    # Red team 45c, A03d: a try-out line at the TOP of a cell leaves the functions below it defined
    verdict = run_job(SETUP, [["p1_solution", "print(run)\n" + earlier], ["p2_solution", mine]], test, ["save", "load"])
    assert verdict["passed"], verdict
    # Exiting is no try-out: the part fails
    verdict = run_job(SETUP, [["p1_solution", earlier.replace("save(run, 'x.pt')", "raise SystemExit")],
                              ["p2_solution", mine]], test, ["save", "load"])
    assert not verdict["passed"]


def test_a_graded_function_that_raises_is_named_with_the_call_the_tests_made():
    """Walkthrough 5, D1: a hidden test's valid input made the student's function raise, and the
    message said only `ValueError: n must be ...`, not which call; the students' page promises the call."""
    setup = SETUP + "from mpcourse import grading\n"
    answer = "def draws(n, low):\n    if not isinstance(n, int):\n        raise ValueError(f'n must be an int, got {n!r}')\n    return [low] * n\n"
    test = "assert grading.own_work(draws, 2, 1.0) == [1.0, 1.0]\ngrading.own_work(draws, np.int64(3), 1.0)\n"
    verdict = run_job(setup, [["p2_solution", answer]], test, ["draws"])
    assert verdict["message"] == "draws(np.int64(3), 1.0) raised ValueError: n must be an int, got np.int64(3)", verdict
    # an error the tests raise themselves, after a call that raised and was caught, names no call
    caught = "try:\n    grading.own_work(draws, 2.5, 1.0)\nexcept ValueError:\n    pass\nassert False, 'the tests said so'\n"
    assert run_job(setup, [["p2_solution", answer]], caught, ["draws"])["message"] == "AssertionError: the tests said so"


def test_a_future_import_holds_for_the_statements_and_cells_after_it_as_in_a_notebook():
    """Red team 45g, A06: each statement is compiled on its own, so `from __future__ import
    annotations` at the top of an answer cell no longer held for the class below it; a method
    annotated with its own class raised NameError: 0/3 for an honest answer."""
    scaler = ("from __future__ import annotations\n\nclass Scaler:\n    @classmethod\n"
              "    def make(cls) -> Scaler:\n        return cls()\n")
    later = "def twice(s: Scaler) -> list[Scaler]:\n    return [s, s]\n"  # a later cell: the notebook keeps it
    test = "assert len(twice(Scaler.make())) == 2 and Scaler.make.__annotations__['return'] == 'Scaler'\n"
    verdict = run_job(SETUP, [["p1_solution", scaler], ["p2_solution", later]], test, ["Scaler", "twice"])
    assert verdict["passed"], verdict
    without = run_job(SETUP, [["p1_solution", scaler.split("\n", 1)[1]], ["p2_solution", later]], test, ["Scaler", "twice"])
    assert not without["passed"] and "NameError" in without["message"]  # the control: the import is what matters


def test_an_answer_that_changes_a_modules_class_fails_the_part_and_says_why():
    """Red team 16d, A: a subclass of the module type given to mpcourse.grading decided, caller by
    caller, what `grading.own_work` was: an unwatched one for the tests (a forbidden torch.softmax
    scored full marks), the real one for the tamper check."""
    setup = "import torch\nfrom mpcourse import grading\n"
    swap = ("class Checker(type(grading)):\n    pass\n"
            "setattr(grading, ''.join(reversed('__ssalc__')), Checker)\ndef f():\n    return 1\n")
    verdict = run_job(setup, [["p2_solution", swap]], "assert f() == 1\n", ["f"])
    assert not verdict["passed"] and "replaced the module mpcourse.grading or changed its class" in verdict["message"]
    assert run_job(setup, [["p2_solution", "import torch.nn\ndef f():\n    return 1\n"]], "assert f() == 1\n",
                   ["f"])["passed"]  # importing more of a library changes no module's class
    # Red team 16e: without a class change, each let ex4 Part 3's forbidden torch.softmax pass unseen
    tricks = {"A2": 'vars(grading)["_is_forbidden"] = lambda name: False\n',
              "A1": "import types as _t\n_copy = _t.ModuleType('sys')\n_copy.__dict__.update(vars(grading.sys))\n"
                    "vars(grading)['sys'] = _copy\n",
              "A3": "import sys as s\nimport types as _t\n_g = _t.ModuleType('mpcourse.grading')\n"
                    "_g.__dict__.update(vars(grading))\ns.modules['mpcourse.grading'] = _g\n"}
    said = {"A2": "replaced mpcourse.grading._is_forbidden", "A1": "replaced mpcourse.grading.sys",
            "A3": "replaced the module mpcourse.grading"}
    for name, trick in tricks.items():
        job = {"secret": SECRET, "timeout": 60, "setup": setup,
               "parts": [{"test_id": "p2_tests", "cells": [["p2_solution", trick + "def f():\n    return 1\n"]],
                          "names": ["f"], "test": "assert f() == 1\n"}]}
        record = runner(job)["p2_tests"]
        assert said[name] in str(record["stopped"]) and said[name] in record.get("refused", ""), (name, record)


def test_red_team_16f_a_forbidden_call_from_c_code_or_a_replaced_reader_fails_ex4_part_3():
    """Red team 16f, each 3/3 unflagged under `python -m grader grade`: torch.softmax called by C
    code (`map`, which no Python profiler sees), Tensor.detach replaced so that the record was the
    softmax of an answer that never normalises, and the part's forbidden set emptied in place."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    last = "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)"
    assert last in solution
    unnormalised = solution.replace(last, "    return e.to(x.dtype)")
    answers = {
        "map": solution.replace(last, "    return next(map(torch.softmax, [z], [dim])).to(x.dtype)"),
        "detach": "def _detach(self):\n    return torch.softmax(self.double(), -1) if self.dim() else self\n"
                  "type(torch.zeros(1)).detach = _detach\n" + unnormalised,
        "forbidden set": "from mpcourse import grading as _g\n"
                         "class _Deaf(set):\n    def update(self, *names):\n        pass\n"
                         "vars(_g)['_forbidden'] = _Deaf()\n"
                         + solution.replace(last, "    return torch.softmax(z, dim).to(x.dtype)"),
    }
    for name, answer in answers.items():
        verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"], (name, verdict)
    assert run("ex4_softmax_stability", {"p3_solution": solution}, only="p3")[0]["p3_tests"]["passed"]  # the control
    said = run("ex4_softmax_stability", {"p3_solution": answers["map"]}, only="p3")[0]["p3_tests"]["message"]
    assert "softmax" in said and "asks you not to use" in said, said


def test_red_team_17a_a_softmax_kernel_by_another_name_or_a_name_added_to_the_checker_fails_the_part():
    """Red team 17a, each full marks unflagged: torch's sparse softmax kernel (`aten::_sparse_softmax`),
    ex2's fused unscale kernel in its out-of-place spelling (no trailing `_`), `frozenset` and
    `sorted` added to mpcourse.grading's namespace (they shadow the built-ins its checks call), and
    records' tensor readers replaced by a tuple that recorded the softmax of an unnormalised answer."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    last = "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)"
    forbidden = solution.replace(last, "    return torch.softmax(z, dim).to(x.dtype)") + "\n"
    answers = {
        "sparse": solution.replace(last, "    s = torch.sparse_coo_tensor(torch.ones_like(z, dtype=torch.bool).nonzero().T, "
                                         "z.reshape(-1), z.shape)\n"
                                         "    return torch.sparse.softmax(s, dim).to_dense().to(x.dtype)"),
        "frozenset": forbidden + "class _Names(frozenset):\n    def __contains__(self, name):\n        return False\n"
                                 "vars(grading)['frozenset'] = _Names\n",
        "sorted": forbidden + "_sorted = sorted\nvars(grading)['sorted'] = lambda items, *a, **k: "
                              "[c for c in _sorted(items, *a, **k) if not str(c).startswith('torch')]\n",
        "readers": solution.replace(last, "    return e.to(x.dtype)") + "\n" +
                   "import contextlib as _cl\nclass _Readers:\n    @staticmethod\n    def detach(t):\n"
                   "        return torch.Tensor.detach(torch.softmax(t.double(), -1) if t.dim() else t)\n"
                   "    dtype, device, cpu, abs, is_complex, to, numpy = (torch.Tensor.dtype, torch.Tensor.device, "
                   "torch.Tensor.cpu, torch.Tensor.abs, torch.Tensor.is_complex, torch.Tensor.to, torch.Tensor.numpy)\n"
                   "vars(grading._records)['_TORCH_READERS'] = (_Readers, _cl.nullcontext, _cl.nullcontext, torch.float64)\n",
    }
    said = {"sparse": "torch.ops.aten._sparse_softmax", "frozenset": "added mpcourse.grading.frozenset",
            "sorted": "added mpcourse.grading.sorted", "readers": "replaced mpcourse.records._TORCH_READERS"}
    for name, answer in answers.items():
        verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"] and said[name] in verdict["message"], (name, verdict)
    fused = fabricate.solution_cells("ex2_loss_scaling")["p4_solution"].replace(
        "    found_inf = not all(bool(torch.isfinite(grad).all()) for grad in grads16)\n",
        "    _, found = torch.ops.aten._amp_foreach_non_finite_check_and_unscale([g.float() for g in grads16], "
        "torch.zeros(1), torch.tensor([1.0]))\n    found_inf = bool(found.item())\n")
    assert "_unscale(" in fused
    verdict = run("ex2_loss_scaling", {"p4_solution": fused}, only="p4")[0]["p4_tests"]
    assert not verdict["passed"] and "aten._amp_foreach_non_finite_check_and_unscale," in verdict["message"], verdict


def test_red_team_17b_code_the_dispatcher_runs_unwatched_and_the_checkers_lists_fail_the_part():
    """Red team 17b, each full marks unflagged: a tensor subclass whose __torch_dispatch__ computes
    the softmax (B1) and an operator of the answer's own (torch.library, B6), both run while torch
    has the grader's dispatch mode off its stack; grading._observations swapped for a list that
    drops own_work's calls (B4); scipy.special.softmax (B3). And an honest torch.compile(backend=
    "eager") no longer fails its part for the names torch's compiler adds to a module (H1)."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    last = "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)"
    subclass = ("class _Lazy(torch.Tensor):\n    @staticmethod\n    def __new__(cls, elem, how):\n"
                "        made = torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)\n"
                "        made.elem, made.how = elem, how\n        return made\n    @classmethod\n"
                "    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):\n        return args[0].how(args[0].elem)\n")
    answers = {
        "subclass": subclass + solution.replace(last, "    return torch.neg(_Lazy(z, lambda t: next(map(torch.softmax, [t], [dim])))).neg().to(x.dtype)"),
        "operator": "@torch.library.custom_op('answer17b::lazy', mutates_args=())\n"
                    "def _lazy(t: torch.Tensor, dim: int) -> torch.Tensor:\n    return next(map(torch.softmax, [t], [dim]))\n"
                    + solution.replace(last, "    return _lazy(z, dim).to(x.dtype)"),
        "observations": solution.replace(last, "    notes = vars(grading)['_observations']\n"
                                               "    if type(notes) is list:\n"
                                               "        class _Notes(list):\n"
                                               "            def append(self, item):\n"
                                               "                notes.append({**item, 'calls': []} if item.get('check') == 'own_work' else item)\n"
                                               "        vars(grading)['_observations'] = _Notes()\n"
                                               "    return torch.softmax(z, dim).to(x.dtype)"),
        "scipy": solution.replace(last, "    from scipy.special import softmax as _sm\n"
                                        "    return torch.from_numpy(_sm(z.double().numpy(), axis=dim)).to(x.dtype)"),
    }
    # red team 17c: the same subclass defined under a module name of torch's (C1), an operator in a
    # namespace of torch's (C2)
    answers["subclass named torch's"] = "__name__ = 'torch.answer17c'\n" + answers["subclass"]
    answers["operator in torch's namespace"] = answers["operator"].replace("answer17b::lazy", "quantized::answer17c_lazy")
    said = {"subclass": "a tensor subclass of the answer's own", "operator": "an operator of the answer's own",
            "observations": "replaced mpcourse.grading._observations", "scipy": "softmax (in special)",
            "subclass named torch's": "a tensor subclass of the answer's own",
            "operator in torch's namespace": "an operator of the answer's own"}
    for name, answer in answers.items():
        verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"] and said[name] in verdict["message"], (name, verdict)
    compiled = solution.replace("def stable_softmax(", "def _stable_softmax(") + \
        "\nstable_softmax = torch.compile(_stable_softmax, backend='eager')\n"
    assert run("ex4_softmax_stability", {"p3_solution": compiled}, only="p3")[0]["p3_tests"]["passed"]


def test_a_module_reaches_the_answer_cells_where_a_cell_imports_it_as_in_the_notebook():
    """Student walkthrough 48g, D4: grading gave `math`, `np`, `torch`, ... to every answer cell, so
    a forgotten import that failed the part in the notebook (no tick) scored full marks. (Red team
    45c, A05a, had asked for them when a student's own `import math` cell did not run; it runs now.)"""
    answer = "def f(x):\n    return math.sqrt(x)\n"
    without = run_job("import torch\n", [["p2_solution", answer]], "assert f(4.0) == 2.0\n", ["f"])
    assert not without["passed"] and "name 'math' is not defined" in without["message"]
    assert run_job("import torch\n", [["p2_added (code cell 3)", "import math\n"], ["p2_solution", answer]],
                   "assert f(4.0) == 2.0\n", ["f"])["passed"]
    # ex1 end to end: the set-up cell imports no math; the student's own cell above Part 3 does
    solution = fabricate.solution_cells("ex1_precision_comparison")["p3_solution"]
    answer = solution.replace("np.all(np.isfinite(n)) and np.all(np.isfinite(e))",
                              "all(math.isfinite(v) for v in n) and all(math.isfinite(v) for v in e)").replace("np.exp(", "math.exp(")
    assert "math.isfinite" in answer and "math.exp(" in answer
    verdicts, _ = run("ex1_precision_comparison", {"p3_solution": answer}, only="p3")
    assert not verdicts["p3_tests"]["passed"] and "math" in verdicts["p3_tests"]["message"]
    verdicts, _ = run("ex1_precision_comparison", {"p3_solution": "import math\n" + answer}, only="p3")
    assert verdicts["p3_tests"]["passed"], verdicts["p3_tests"]
    # A cell the student added above Part 1's test cell now runs with Part 1 (issue 48, item 1), and
    # the runner still gives no answer a name that no cell of the job defines
    source = notebooks.read_notebook(ROOT / "solutions" / "ex1_precision_comparison" / "ex1_precision_comparison.ipynb")
    submission = json.loads(json.dumps(source))
    own = "import math\nimport os\ndef helper(x):\n    return x\n"
    submission["cells"].insert(1, {"cell_type": "code", "metadata": {}, "source": own, "outputs": [], "execution_count": None})
    job = runs.hidden_test_job(source, submission, SECRET, 60)
    p1 = next(part for part in job["parts"] if part["test_id"] == "p1_tests")
    assert [name for name, text in p1["cells"] if text == own] == ["p1_added (code cell 1)"]
    verdict = run_job("import torch\n", [["p2_solution", "def f(x):\n    return helper(x)\n"]], "assert f(1) == 1\n", ["f"])
    assert not verdict["passed"] and "name 'helper' is not defined" in verdict["message"]


# --- red team 45c, A06b: a record inflated to be parsed in the grader's own process -----------------

NESTED = "[[[[[[[[[[]]]]]]]]]]"  # 20 bytes of JSON, ten lists once parsed: ~30 bytes of memory a byte
INFLATE = ("_unit = []\nfor _ in range(9):\n    _unit = [_unit]\n"
           "grading._observations.extend([_unit] * {count})\n")


def inflated_job(count: int) -> dict:
    """A part whose tests add `count` nested empty lists to the record (as an answer can: red team
    45c, A06b), beside an honest part."""
    test = "grading.assert_close(f(), 1.0, what='f()')\n"
    return {"secret": SECRET, "timeout": 60, "setup": SETUP + "from mpcourse import grading\n",
            "parts": [{"test_id": "p1_tests", "cells": [["p1_solution", "def f():\n    return 1.0\n"]], "names": ["f"],
                       "test": test + INFLATE.format(count=count)},
                      {"test_id": "p2_tests", "cells": [["p2_solution", "def f():\n    return 1.0\n"]], "names": ["f"],
                       "test": test}]}


def peak_of(call):
    """(what `call()` returns, the peak of Python's allocations during it, in bytes: tracemalloc)."""
    import tracemalloc
    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_record_inflated_past_what_the_tests_need_is_refused_for_its_part_only(tmp_path):
    """900,000 nested empty lists (20 MB of JSON: under the sandbox's limits) took the grader's own
    process to 2 GB as it parsed the record. Now each part's record is a line of its own, refused
    unread past mpcourse.grading.RECORD_BYTES or RECORD_VALUES (what the solutions write, with a wide
    margin): that part fails, says why, and is flagged; the other parts are graded; the grader's
    memory stays in proportion to what it reads."""
    from grader import sandbox
    job = inflated_job(900_000)
    records, peak = peak_of(lambda: runs.run_hidden_tests(tmp_path / "run", job, sandbox.problem() is None, 60))
    records, problem = records
    assert problem is None, problem
    assert records["p1_tests"]["stopped"] == "the tests of this part wrote a record larger than the grader reads (16 MiB)"
    assert records["p1_tests"]["refused"] and records["p1_tests"]["observations"] == []
    assert records["p2_tests"]["stopped"] is None and len(records["p2_tests"]["observations"]) == 1
    assert peak < 8 * 2**20, peak  # parsed, the 20 MB took ~600 MB of Python objects
    verdicts = judge.judge({"p1_tests": records["p2_tests"], "p2_tests": records["p2_tests"]}, records)
    assert verdicts["p1_tests"] == {"passed": False, "message": records["p1_tests"]["stopped"]}
    assert verdicts["p2_tests"]["passed"]
    # Under the bytes, past the values: 600,000 lists of 10 (11 marks each) in 12 MB
    records = runs.run_hidden_tests(tmp_path / "run2", inflated_job(600_000), sandbox.problem() is None, 60)[0]
    assert records["p1_tests"]["stopped"] == "the tests of this part wrote a record of more values than the grader reads (250,000)"


def test_a_students_records_together_stop_before_the_result_pipe_is_full():
    """Records each under the bounds, together past the 60 MB the sandbox reads of its result pipe,
    would lose every part (no RESULT line): the part that takes them past 48 MB is refused instead."""
    test = "grading._observations.append('x' * 14_000_000)\n"
    job = {"secret": SECRET, "timeout": 60, "setup": SETUP + "from mpcourse import grading\n",
           "parts": [{"test_id": f"p{n}_tests", "cells": [], "names": [], "test": test} for n in (1, 2, 3, 4)]}
    records = runner(job)
    assert [len(records[f"p{n}_tests"]["observations"]) for n in (1, 2, 3, 4)] == [1, 1, 1, 0]
    assert records["p4_tests"]["stopped"] == ("the tests of this part wrote a record that took the parts' records "
                                              "past what the grader reads (48 MiB in all)")


def test_the_grader_reads_no_record_past_its_bounds_whatever_the_runner_sent():
    """The sandbox's runner refuses such a record itself; a runner that did not (its output is data,
    not trusted) gets the same answer from the grader's own process, part by part, and the grader's
    memory stays bounded."""
    job = {"secret": SECRET, "parts": [{"test_id": f"p{n}_tests"} for n in (1, 2, 3, 4)]}
    honest = json.dumps({"observations": [{"check": "close", "actual": {"float": "0x1.0p+0"}}], "stopped": None})
    bombs = {"p1_tests": '{"observations": [' + ",".join([NESTED] * 900_000) + '], "stopped": null}',
             "p2_tests": '{"observations": [' + ",".join(["[]"] * 300_000) + '], "stopped": null}',
             "p3_tests": '{"observations": [' + "[" * 100_000 + "]" * 100_000 + '], "stopped": null}'}
    output = "".join(f"RECORD\t{json.dumps([0, t])}\t{bombs.get(t, honest)}\n"
                     for t in ("p1_tests", "p2_tests", "p3_tests", "p4_tests")) + "RESULT 1\n"
    output = output.encode()
    (records, problem), peak = peak_of(lambda: runs.read_records(output, job))
    assert problem is None
    assert records["p1_tests"]["stopped"].endswith("wrote a record larger than the grader reads (16 MiB)")
    assert records["p2_tests"]["stopped"].endswith("wrote a record of more values than the grader reads (250,000)")
    assert records["p3_tests"]["stopped"] == "the tests of this part sent back a damaged record"  # too deep
    assert all(records[t]["refused"] for t in ("p1_tests", "p2_tests"))
    assert records["p4_tests"] == json.loads(honest)
    assert peak < 3 * len(output), (peak, len(output))  # its lines, not their objects (parsed: ~30x)
    # a line the job did not ask for, a second record of a part, a missing part
    extra = f"RECORD\t{json.dumps([1, 'p1_tests'])}\t{NESTED}\nRECORD\t[0, \"p4_tests\"]\t{{}}\n".encode()
    assert runs.read_records(extra + output, job)[0]["p4_tests"] == {
        "observations": [], "stopped": "the tests of this part sent back a damaged record"}
    assert runs.read_records(output.replace(b"p4_tests", b"p5_tests"), job) == (None, "sent back a damaged record")
    for damaged in (b"RESULT 2\n", b"", output.replace(b"RESULT 1", b"1")):
        assert runs.read_records(damaged, job) == (None, "sent back a damaged record")


# --- issue 45: the course library, reached where the own-work watcher does not look -------------

def withheld_parts(assignment: str) -> dict[str, list[str]]:
    """part -> the library functions its test cell declares withheld (grader/withheld.py)."""
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    return {notebooks.part_of(notebooks.grade_id(c)): withheld.declared_in(notebooks.source_text(c))
            for c in source["cells"] if (c["metadata"].get("nbgrader") or {}).get("grade") and c["cell_type"] == "code"}


# Parts whose reference-calling answer (tests/submissions/) calls the library for a primitive that
# torch's own casts equal, not for the part's answer, so that the part cannot withhold it.
NOT_AN_ANSWER: dict = {}  # (assignment, part): why; none since ex3 withholds round_to
THREADED = [(a, notebooks.part_of(gid)) for a in assignments()
            for gid in fabricate.submission_data(a).REFERENCE_CALLER
            if (a, notebooks.part_of(gid)) not in NOT_AN_ANSWER]


def test_every_part_answered_by_a_library_call_withholds_it():
    for assignment, part in THREADED:
        caller = fabricate.submission_data(assignment).REFERENCE_CALLER[f"{part}_solution"]
        declared = withheld_parts(assignment)
        if not declared[part]:  # it calls an earlier part's answer, which calls the library (ex8's Part 4)
            assert any(declared[p] and f"{p}_solution" in fabricate.submission_data(assignment).REFERENCE_CALLER
                       for p in declared if p < part), (assignment, part)
            continue
        assert any(name.rpartition(".")[2] in caller for name in declared[part]), (assignment, part, declared[part])


@pytest.mark.parametrize("assignment", sorted({a for a, _ in THREADED}))
def test_the_library_through_a_thread_started_before_the_tests_scores_nothing(assignment):
    """The reference-calling answers, run by a thread the answer cell started before the tests:
    the kernel refuses the thread (grader/no_threads.py), so each such part stops (a part that
    stops scores 0: grader/judge.py) saying why; the library the sandbox imports lacks what they
    call anyway."""
    answers = {gid: fabricate.in_a_thread(src) for gid, src in fabricate.submission_data(assignment).REFERENCE_CALLER.items()}
    student = jobs(assignment, answers, visible=False)[1]
    parts = {part for a, part in THREADED if a == assignment}
    student["parts"] = [p for p in student["parts"] if notebooks.part_of(p["test_id"]) in parts]
    record = runner(student, library(assignment))
    for part in parts:
        assert no_threads.THREADS_REFUSED in (record[f"{part}_tests"]["stopped"] or ""), (part, record)


# Red team 45 (A4a, A12, and their process variants): answers that computed what their parts may
# not call, in a thread started before the tests or in a child process, scored 10 of 10 on ex3 and
# ex7. The kernel refuses both in the hidden-test run (grader/no_threads.py): each attacked part
# stops saying why, and so does a part that needs what the stopped cell did not define (ex3's
# Part 3 uses Part 2's classify); every other part keeps its grade.
THREAD_ATTACKS = [
    ("ex3_dynamic_range", "EX3_LIBRARY_IN_A_THREAD", {"p2": no_threads.THREADS_REFUSED, "p3": no_threads.THREADS_REFUSED,
                                                      "p4": no_threads.THREADS_REFUSED}),
    ("ex7_fp16_nan_hunt", "EX7_IN_A_THREAD", {"p1": no_threads.THREADS_REFUSED, "p4": no_threads.THREADS_REFUSED}),
    ("ex7_fp16_nan_hunt", "EX7_IN_A_CHILD", {"p4": no_threads.PROCESSES_REFUSED}),
]


@pytest.mark.parametrize("assignment, attack, lost", THREAD_ATTACKS, ids=[a for _, a, _ in THREAD_ATTACKS])
def test_threads_and_processes_started_by_an_answer_are_refused_and_cost_their_parts_only(assignment, attack, lost):
    from grader import hostile_corpus
    only = next(iter(lost)) if len(lost) == 1 else None  # one part: the others run the solutions
    verdicts, _ = run(assignment, getattr(hostile_corpus, attack), only=only)
    for test_id, verdict in verdicts.items():
        part = notebooks.part_of(test_id)
        if part in lost:
            assert not verdict["passed"] and lost[part] in verdict["message"], (part, verdict)
        else:
            assert verdict["passed"], (part, verdict)


def test_ex7_the_library_helpers_that_answer_its_parts_are_withheld_not_only_watched():
    """Red team 45, A12 without the thread: ex7 Part 1 from the library's `layer_outputs`, Part 4's
    softmax from its `stable_softmax` (modules found by strings). With the whole library, only the
    own-work watcher stops them (a check in the student's process); in the sandbox's copy the
    functions are absent, and each part stops at the call."""
    from grader import hostile_corpus
    student = jobs("ex7_fp16_nan_hunt", hostile_corpus.EX7_LIBRARY_HELPERS, visible=False)[1]
    student["parts"] = [p for p in student["parts"] if p["test_id"] in ("p1_tests", "p4_tests")]
    reference = {k: v for k, v in reference_record("ex7_fp16_nan_hunt", visible=False).items() if k in student_ids(student)}
    watched = judge.judge(reference, runner(student))
    withheld_copy = judge.judge(reference, runner(student, library("ex7_fp16_nan_hunt")))
    for test_id in ("p1_tests", "p4_tests"):
        assert not watched[test_id]["passed"] and "calls the course library" in watched[test_id]["message"], watched
        assert not withheld_copy[test_id]["passed"], withheld_copy
        assert "is withheld while your work is graded" in withheld_copy[test_id]["message"], withheld_copy


def student_ids(job: dict) -> set[str]:
    return {p["test_id"] for p in job["parts"]}


@pytest.mark.parametrize("stub", ["def problem():\n    return 'no seccomp here'\n",
                                  "def problem():\n    return None\n\n\ndef forbid():\n    raise OSError('refused')\n"])
def test_where_threads_cannot_be_forbidden_the_run_fails_instead_of_grading(tmp_path, stub):
    """A machine or kernel where grader/no_threads.py cannot work: the hidden-test run exits with
    the reason (a grader failure: the student is not graded, grader/schedule.py), no record."""
    shutil.copy(ROOT / "grader" / "hidden_tests.py", tmp_path / "hidden_tests.py")
    (tmp_path / "no_threads.py").write_text(stub)
    student = jobs("ex4_softmax_stability", {}, visible=False)[1]
    student["parts"] = student["parts"][:1]
    result = subprocess.run([sys.executable, str(tmp_path / "hidden_tests.py"), "-"], input=json.dumps(student),
                            capture_output=True, text=True, cwd=tempfile.gettempdir(),
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", **THREADS})
    assert result.returncode != 0 and "RESULT" not in result.stdout
    why = "no seccomp here" if "no seccomp" in stub else "threads could not be forbidden: OSError: refused"
    assert f"grading refused: {why}" in result.stderr, result.stderr[-2000:]


# --- issue 52: one reference run for many students -------------------------------------------

def test_one_reference_run_for_many_secrets_gives_each_the_record_of_a_run_of_its_own():
    """grader/hidden_tests.py's batch (runs.run_references): the reference's records on several
    secrets from one process are the records of one run per secret."""
    job = jobs("ex2_loss_scaling", {}, visible=False)[0]
    other = "another-test-secret"
    batch = runner({**job, "secrets": [SECRET, other, SECRET]})
    assert batch[0] == batch[2] == reference_record("ex2_loss_scaling", visible=False)
    assert batch[1] == runner({**job, "secret": other})
    assert batch[1] != batch[0]  # the secret inputs differ, and so do the expected values


def test_a_secret_starts_from_a_fresh_state_and_its_failure_stays_its_own():
    """What one secret's run changes (torch's default dtype and random generator, the library's
    modules) does not reach the next secret's; a reference that fails on one secret fails there
    only, and the judge says it is the reference's problem (that student is not graded)."""
    test = ("draws = torch.rand(3)\n"
            "grading.assert_close(draws, draws, what='the first draws')\n"
            "import mpcourse.formats as formats\n"
            "fresh = torch.get_default_dtype() == torch.float32 and not hasattr(formats, 'touched')\n"
            "grading.assert_close(float(fresh), 1.0, what='a fresh state')\n"
            "torch.set_default_dtype(torch.float64)\nformats.touched = True\ntorch.manual_seed(99)\n"
            "if grading._secret == 'unlucky':\n    raise RuntimeError('only on this secret')\n")
    job = {"secret": "", "timeout": 60, "setup": SETUP + "from mpcourse import grading\n",
           "parts": [{"test_id": "p1_tests", "cells": [["p1_solution", "def f():\n    return 1\n"]],
                      "names": [], "test": test}]}
    first, unlucky, last = runner({**job, "secrets": ["lucky", "unlucky", "lucky-too"]})
    assert first == last and first["p1_tests"]["stopped"] is None and len(first["p1_tests"]["observations"]) == 2
    assert unlucky["p1_tests"]["observations"] == first["p1_tests"]["observations"]
    assert unlucky["p1_tests"]["stopped"] == "RuntimeError: only on this secret"
    assert judge.judge(first, first)["p1_tests"]["passed"]
    with pytest.raises(judge.ReferenceProblem, match="only on this secret"):
        judge.judge(unlucky, first)
    # Issue 52: a batch stops after the record that takes it past its bytes (ex4's reference records,
    # 3 MB a secret, overflowed the result pipe at 45 students: everyone then ran a reference of their
    # own), and run_references runs the rest in another process, the records in order
    assert runner({**job, "secrets": ["lucky", "unlucky", "lucky-too"], "batch_bytes": 1}) == [first]
    from grader import runs
    folder = Path(tempfile.mkdtemp())
    records, problem = runs.run_references(folder / "batch", {**job, "batch_bytes": 1}, ["lucky", "unlucky", "lucky-too"],
                                           sandbox=False, timeout=60)
    assert problem is None and records == [first, unlucky, last]
    assert sorted(p.name for p in folder.iterdir()) == ["batch", "batch-1", "batch-2"]  # three runs


def test_red_team_18_an_answer_cell_draws_no_hidden_input_and_its_library_calls_flag_the_part():
    """Red team 18, each full marks unflagged: answer cells that, before the tests and their watchers,
    drew the hidden inputs with grading.seed (the secret was already set) and stored torch.softmax's
    (A3) or the library's (A2) answers for the function to look up; and a table built with the
    library's get_format when the function is defined (A1: ex3 Part 4's inputs are fixed dtypes).
    The seed an answer cell gets is now the visible tests', not the hidden tests', so a table drawn
    there misses; a library or forbidden call made there flags the part for the instructor."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    drawn_early = "_EARLY = grading.seed(7)\n" + solution.replace(
        "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)",
        "    assert grading.seed(7) == _EARLY, 'the table drawn early misses'\n"
        "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)")
    verdict = run("ex4_softmax_stability", {"p3_solution": drawn_early}, only="p3")[0]["p3_tests"]
    assert not verdict["passed"] and "the table drawn early misses" in verdict["message"], verdict

    softmax_early = solution + "\n_TABLE = torch.softmax(torch.zeros(3), -1)\n"
    student = jobs("ex4_softmax_stability", {"p3_solution": softmax_early}, False)[1]
    student["parts"] = [p for p in student["parts"] if notebooks.part_of(p["test_id"]) == "p3"]
    flagged = runner(student, library("ex4_softmax_stability"))["p3_tests"].get("flagged", "")
    assert "an answer cell called" in flagged and "softmax" in flagged, flagged

    table = fabricate.solution_cells("ex3_dynamic_range")["p4_solution"] + (
        "\nfrom mpcourse.formats import get_format\n_EDGES = {name: get_format(name).max_value for name in ('fp16', 'bf16')}\n")
    student = jobs("ex3_dynamic_range", {"p4_solution": table}, False)[1]
    records = runner(student, library("ex3_dynamic_range"))
    assert "formats.get_format" in records["p4_tests"].get("flagged", ""), records["p4_tests"]
    from grader import schedule  # and the report's READ line for the part says so
    assert any("formats.get_format" in why for why in schedule.record_flags(student, records).get("p4", [])), records
    assert not any("flagged" in records[p] for p in records if p != "p4_tests"), records  # the other parts: not asked
    honest = runner(jobs("ex3_dynamic_range", {}, False)[1], library("ex3_dynamic_range"))
    assert not any("flagged" in record for record in honest.values()), honest


def test_red_team_19_an_answer_whose_name_is_a_property_runs_nothing_after_the_watchers():
    """Red team 19 (A1), 3/3 unflagged: a callable object whose `__name__` property, read by
    own_work after its watchers were off, filled the returned tensor with the forbidden
    torch.softmax. Nothing of the answer's now runs there: its name is read without running it."""
    answer = ("class _Answer:\n    def __init__(self):\n        self.pending, self.reads = [], 0\n"
              "    @property\n    def __name__(self):\n        self.reads += 1\n"
              "        if self.reads % 2 == 0:  # the read after the watchers\n"
              "            for p, x, dim in self.pending:\n"
              "                p.copy_(torch.softmax(x.double(), dim=dim).to(x.dtype))\n"
              "            self.pending.clear()\n        return 'stable_softmax'\n"
              "    def __call__(self, x, dim=-1):\n"
              "        if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
              "            raise TypeError('stable_softmax takes a floating-point tensor')\n"
              "        p = torch.empty_like(x)\n        self.pending.append((p, x, dim))\n        return p\n"
              "stable_softmax = _Answer()\n")
    verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
    assert not verdict["passed"], verdict


def test_a_call_that_raises_is_watched_as_own_work_watches():
    """The same window on the raises side: a call the tests expect to raise ran unwatched, so it
    could compute the answers (torch.softmax on inputs drawn with grading.seed) for own_work's later
    calls to look up. What it calls is now reported by the part's next own_work check."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    answer = solution.replace("def stable_softmax(x, dim=-1):\n",
                              "def stable_softmax(x, dim=-1):\n"
                              "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
                              "        torch.softmax(torch.zeros(2), 0)  # a table could be made here\n", 1)
    assert answer != solution
    verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
    assert not verdict["passed"] and "torch.softmax" in verdict["message"], verdict


def test_red_team_20_a_subclass_that_says_it_is_torchs_is_judged_by_where_its_code_is():
    """Red team 20 (A1), 3/3 unflagged: an answer cell set `__name__ = "torch.lazy"` while it
    defined a tensor subclass, so the result check took the class for torch's; the function
    returned an empty tensor of it, filled with the forbidden torch.softmax when the tests first
    touched it, after the watchers. A class is now torch's or numpy's only where its code is."""
    answer = ("_keep = __name__\n__name__ = 'torch.lazy'\n"
              "class _Result(torch.Tensor):\n    @classmethod\n"
              "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
              "        for plain, x, dim in _pending:\n"
              "            plain.copy_(torch.softmax(x.double(), dim).to(x.dtype))\n"
              "        _pending.clear()\n        return super().__torch_function__(func, types, args, kwargs or {})\n"
              "__name__ = _keep\n_pending = []\n"
              "def stable_softmax(x, dim=-1):\n"
              "    if not isinstance(x, torch.Tensor) or not x.is_floating_point():\n"
              "        raise TypeError('x must be a floating-point tensor')\n"
              "    plain = torch.empty_like(x)\n    _pending.append((plain, x, dim % x.dim() if x.dim() else 0))\n"
              "    return plain.as_subclass(_Result)\n")
    verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
    assert not verdict["passed"] and "a subclass of Tensor" in verdict["message"], verdict


AUDIT_SOFTMAX = """import sys
from scipy.special import softmax as _sp_softmax


def _hook(event, args):
    if event == "softmax.step" and args and not args[0].get("done"):
        args[0]["out"], args[0]["done"] = _sp_softmax(args[0]["z"], axis=args[0]["dim"]), True


sys.addaudithook(_hook)
"""
AUDIT_LIBRARY = """import sys, runpy


def _hook(event, args):
    if event == "cost.step" and args and not args[0].get("done"):
        library = runpy.run_module("mpcourse.bench.probes", alter_sys=True)
        args[0]["out"], args[0]["done"] = library["matmul_bytes"](*args[0]["args"]), True


sys.addaudithook(_hook)
"""


def test_red_team_21_an_audit_hook_is_never_added_so_nothing_computes_unwatched_in_one():
    """Red team 21 (A03, A04), full marks unflagged: CPython runs audit hooks with profilers off, so
    an answer that raised its own audit event had its hook compute the answer unseen: the forbidden
    scipy softmax (ex4 Part 3), the library's matmul_bytes loaded with runpy (ex5 Part 3). No hook is
    now added while a part is graded: each fails its part, and the record and the review flag it."""
    softmax = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    last = "    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)"
    softmax = AUDIT_SOFTMAX + softmax.replace(last, '    job = {"z": z.numpy(), "dim": dim}\n'
                                                    '    sys.audit("softmax.step", job)\n'
                                                    '    return torch.from_numpy(job["out"]).to(x.dtype)')
    cost = fabricate.solution_cells("ex5_mixed_precision_speedup")["p3_solution"]
    formula = "batch * (m * k + k * n + m * n) * dtype.itemsize"
    assert formula in cost  # the solution's byte count, computed by the library in the hook instead
    cost = AUDIT_LIBRARY + cost.replace(formula, "_bytes(m, n, k, dtype, batch)") + (
        "\n\ndef _bytes(m, n, k, dtype, batch):\n"
        "    name = {torch.float32: 'fp32', torch.float16: 'fp16', torch.bfloat16: 'bf16'}.get(dtype)\n"
        "    if name is None:\n"
        f"        return {formula}\n"
        "    job = {'args': (m, n, k, name)}\n    sys.audit('cost.step', job)\n    return batch * job['out']\n")
    for assignment, part, answer in (("ex4_softmax_stability", "p3", softmax),
                                     ("ex5_mixed_precision_speedup", "p3", cost)):
        student = jobs(assignment, {f"{part}_solution": answer}, False)[1]
        student["parts"] = [p for p in student["parts"] if notebooks.part_of(p["test_id"]) == part]
        records = runner(student, library(assignment))
        assert "tried to add an audit hook" in records[f"{part}_tests"].get("flagged", ""), records
        reference = {k: v for k, v in reference_record(assignment, False).items() if notebooks.part_of(k) == part}
        assert not judge.judge(reference, records)[f"{part}_tests"]["passed"], (assignment, records)
        from grader import schedule
        assert any("audit hook" in why for why in schedule.record_flags(student, records)[part])
        submission = {"cells": [{"cell_type": "code", "source": answer,
                                 "metadata": {"nbgrader": {"grade_id": f"{part}_solution", "solution": True}}}]}
        assert any("audit hook" in why for why in review_flags.review_flags(submission)[part])
    # the same code called directly, without an audit event: the checks see it (the controls)
    for assignment, answer in (("ex4_softmax_stability", softmax), ("ex5_mixed_precision_speedup", cost)):
        direct = answer.replace('sys.audit("softmax.step", job)', '_hook("softmax.step", (job,))').replace(
            "sys.audit('cost.step', job)", "_hook('cost.step', (job,))")
        assert "sys.audit" not in direct
        verdict = run(assignment, {"p3_solution": direct}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"], (assignment, verdict)


def newer_python() -> str | None:
    """A Python of 3.12 or later on this machine (sys.monitoring's), or None."""
    import glob
    import shutil
    found = [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    return next((p for p in found if p and subprocess.run([p, "-c", "import sys; sys.monitoring"],
                                                          capture_output=True).returncode == 0), None)


@pytest.mark.skipif(newer_python() is None, reason="needs a Python 3.12 or later (sys.monitoring)")
def test_on_python_3_12_no_monitoring_callback_can_be_added_either():
    """sys.monitoring's callbacks, like audit hooks, run with profilers off (Python 3.12 and later):
    after refuse_unwatched_callbacks, every tool id is taken and no callback or event can be set,
    and the functions that could are nowhere to be found; sys.setprofile still works."""
    tree = ast.parse((ROOT / "grader" / "hidden_tests.py").read_text())
    wanted = {"refuse_unwatched_callbacks", "MONITORING"}
    code = "\n".join(ast.get_source_segment((ROOT / "grader" / "hidden_tests.py").read_text(), node) for node in tree.body
                     if getattr(node, "name", None) in wanted
                     or (isinstance(node, ast.Assign) and {getattr(t, "id", "") for t in node.targets} & wanted))
    script = "import sys, gc\n" + code + """
tried = []
refuse_unwatched_callbacks(tried)
M = sys.monitoring
for call in (lambda: M.use_tool_id(3, "x"), lambda: M.free_tool_id(2), lambda: M.register_callback(0, 1, print),
             lambda: M.set_events(1, M.events.CALL)):
    try:
        call()
    except RuntimeError as error:
        print("refused:", error)
    else:
        print("NOT REFUSED")
heard = []
sys.addaudithook(lambda event, args: heard.append(event))  # dropped without a word, as CPython does
sys.audit("answer.event")
print("hook added:", bool(heard))
print("taken:", all(M.get_tool(i) == "grader" for i in range(6)))
print("originals:", [o for o in gc.get_objects() if getattr(o, "__name__", "") in ("free_tool_id", "set_events")])
seen = []
sys.setprofile(lambda frame, event, arg: seen.append(event))
len([])
sys.setprofile(None)
print("profiled:", "c_call" in seen, "tried:", len(tried))
"""
    out = subprocess.run([newer_python(), "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "NOT REFUSED" not in out.stdout and out.stdout.count("refused:") == 4, out.stdout
    assert "hook added: False" in out.stdout, out.stdout
    assert "taken: True" in out.stdout and "originals: []" in out.stdout and "profiled: True" in out.stdout, out.stdout
    assert "tried: 5" in out.stdout, out.stdout


UNSEEN = '''
class _Path(str):
    job = None

    def startswith(self, *args):
        if _Path.job is not None and "out" not in _Path.job:
            _Path.job["out"] = _Path.job["fn"]()
        return False


def _probe():
    yield None


_count = [0]


def _unseen(fn):
    _Path.job = job = {"fn": fn}
    _count[0] += 1  # a new code object each call (an equal one was looked up, not read again)
    code = _probe().gi_code.replace(co_filename=_Path("<cell>"), co_firstlineno=1000 + _count[0])
    for _ in type(_probe)(code, {})():
        pass
    _Path.job = None
    return job["out"] if "out" in job else fn()
'''


def test_red_team_22_no_method_of_the_answers_runs_inside_the_watchers_callback():
    """Red team 22 (A04), full marks unflagged: the own-work watcher read a code object's file name
    with `startswith`, and CodeType.replace keeps a str subclass there, so the answer's own
    `startswith` ran inside the profiler's callback, where nothing is profiled: SciPy's softmax in
    ex4 Part 3 (forbidden), the library's matmul_bytes, imported by pickle, in ex5 Part 3. Such code
    is now itself a forbidden call, and no name or constant of a code object is hashed."""
    softmax = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    head = softmax.split("    z = x.to(")[0]
    softmax = "import scipy.special\n" + UNSEEN + "\n\n" + head + (
        "    return _unseen(lambda: torch.from_numpy(scipy.special.softmax(x.double().numpy(), axis=dim)).to(x.dtype))\n")
    cost = fabricate.solution_cells("ex5_mixed_precision_speedup")["p3_solution"]
    formula = "batch * (m * k + k * n + m * n) * dtype.itemsize"
    cost = "import pickle\n" + UNSEEN + cost.replace(formula, "_bytes(m, n, k, dtype, batch)") + (
        "\n\ndef _bytes(m, n, k, dtype, batch):\n"
        "    name = {torch.float32: 'fp32', torch.float16: 'fp16', torch.bfloat16: 'bf16'}.get(dtype)\n"
        "    if name is None:\n"
        f"        return {formula}\n"
        "    return batch * _unseen(lambda: pickle.loads(b'cmpcourse.bench.probes\\nmatmul_bytes\\n.')(m, n, k, name))\n")
    for assignment, answer in (("ex4_softmax_stability", softmax), ("ex5_mixed_precision_speedup", cost)):
        verdict = run(assignment, {"p3_solution": answer}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"] and "not plain text" in verdict["message"], (assignment, verdict)
    # the same functions without the odd file name: the watcher sees the calls (the controls)
    for assignment, answer in (("ex4_softmax_stability", softmax), ("ex5_mixed_precision_speedup", cost)):
        plain = answer.replace('co_filename=_Path("<cell>"), ', "")
        verdict = run(assignment, {"p3_solution": plain}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"] and "not plain text" not in verdict["message"], (assignment, verdict)


def test_a_cell_whose_magic_jupyter_does_not_run_as_python_is_not_run_by_the_grader_either():
    """Red team 22 (A05), an honest 7 of 10: an old answer kept in a `%%script false` cell (which
    Jupyter skips) between Part 3's answer and its test was run as Python by the grader and replaced
    the right answer. Cells under %%script, %%bash, %%writefile, %%html, ... now run as comments;
    %%time and %%capture cells still run their Python."""
    solution = fabricate.solution_cells("ex4_softmax_stability")
    old = "def stable_softmax(x, dim=-1):\n    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)\n"
    for magic in ("%%script false --no-raise-error", "%%bash", "%%writefile old_attempt.py", "%%html"):
        submission = with_cells("ex4_softmax_stability", {}, [("after", "p3_solution", f"{magic}\n{old}")])
        assert all(v["passed"] for v in hidden_verdicts("ex4_softmax_stability", submission).values()), magic
    timed = with_cells("ex4_softmax_stability", {"p3_solution": ""}, [("after", "p3_solution", "%%time\n" + solution["p3_solution"])])
    assert hidden_verdicts("ex4_softmax_stability", timed)["p3_tests"]["passed"]
    assert notebooks.without_magics("%%capture out\nx = 1\n") == "# (not run by the grader) %%capture out\nx = 1\n"


FINALIZER = '''
import logging
_log = logging.getLogger("mine")
_state = {"job": None, "out": None, "bin": False}


class _Bin:
    def __init__(self):
        self.me = self  # a cycle: only the garbage collector frees it
        _state["bin"] = True

    def __del__(self):
        _state["bin"] = False
        if _state["job"] is not None and _state["out"] is None:
            where = [_log.findCaller(False, level) for level in range(1, 13)]
            if any(w[0].endswith("grading.py") or w[2] == "__torch_dispatch__" for w in where):
                _state["out"] = _state["job"]()
'''
DEFS = "".join(f"def _f{i}(): pass\n" for i in range(3000))


def test_red_team_23_no_finalizer_of_the_answers_runs_inside_a_watchers_callback():
    """Red team 23 (A01, A05), full marks unflagged: a cyclic object's `__del__`, run by a collection
    that an allocation inside the profiler's callback (3000 functions it had not seen) or the
    dispatch watcher's handler (a loop of torch.add) started, computed SciPy's softmax or
    torch.softmax there, unseen. The collector is now off while the watchers are on."""
    solution = fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]
    head = solution.split("    z = x.to(")[0]
    wrong = "    e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)  # overflows: the part's tests fail it\n"
    in_profiler = "import scipy.special\n" + DEFS + FINALIZER + "\n_FS = [globals()[f'_f{i}'] for i in range(3000)]\n\n\n" + \
        head + ("    _state['job'], _state['out'] = (lambda: torch.from_numpy(scipy.special.softmax(x.double().numpy(), "
                "axis=dim)).to(x.dtype)), None\n"
                "    for f in _FS:\n        if not _state['bin']:\n            _Bin()\n        f()\n"
                "        if _state['out'] is not None:\n            return _state['out']\n") + wrong
    in_dispatch = FINALIZER + "\n\n" + head + (
        "    _state['job'], _state['out'] = (lambda: next(map(torch.softmax, [x.double()], [dim])).to(x.dtype)), None\n"
        "    t, keep = torch.zeros(1), []\n    for _ in range(3000):\n        if not _state['bin']:\n            _Bin()\n"
        "        keep.append(torch.add(t, 1))\n        if _state['out'] is not None:\n            return _state['out']\n") + wrong
    for name, answer in (("profiler", in_profiler), ("dispatch", in_dispatch)):
        verdict = run("ex4_softmax_stability", {"p3_solution": answer}, only="p3")[0]["p3_tests"]
        assert not verdict["passed"], (name, verdict)
    switched = solution.replace("def stable_softmax(", "import gc\n\n\ndef stable_softmax(", 1).replace(
        "    z = x.to(", "    gc.enable()\n    z = x.to(", 1)
    verdict = run("ex4_softmax_stability", {"p3_solution": switched}, only="p3")[0]["p3_tests"]
    assert not verdict["passed"] and "garbage collector was switched on" in verdict["message"], verdict


def test_red_team_23_padding_or_a_finalizer_hides_nothing_from_the_review_flags():
    """Red team 23 (A08): 55 empty strings in front of "get" + "pro" + "file" took the sum past the
    depth the flags' folding read, and the known bypass that empties the own-work check's list went
    unflagged (10 of 10); so did 10,000 characters of padding. A finalizer is flagged too (A01)."""
    def flags(code):
        return review_flags.review_flags({"cells": [{"cell_type": "code", "source": code, "metadata": {
            "nbgrader": {"grade_id": "p3_solution", "solution": True}}}]}).get("p3", [])
    padded = '""+' * 55 + '"get"+"pro"+"file"'
    for code in (f"import sys\n_m = [sys]\n_w = getattr(_m[0], {padded})()\n",
                 'import sys\n_m = [sys]\n_w = getattr(_m[0], "' + "x" * 10_001 + '" + "getprofile")()\n',
                 'import sys\n_m = [sys]\n_k = _m[0]\n_w = getattr(_k, _k.__name__ + "get" + "profile")()\n'):
        assert any("profilers" in why for why in flags(code)), code[:80]
    assert any("finalizer" in why for why in flags("class _Bin:\n    def __del__(self):\n        pass\n"))
    assert any("finalizer" in why for why in flags("import weakref\nweakref.finalize(object(), print)\n"))
    assert flags(fabricate.solution_cells("ex4_softmax_stability")["p3_solution"]) == []


def test_a_long_elif_chain_in_an_answer_cell_is_graded_as_earned():
    """Red team 30, A02: 1,000 `elif`s (20,000 characters, under every limit) raised RecursionError
    in the grader's own process while it read which names the cell defines: the student stayed
    ungraded on every run, and a re-submission of a graded student blocked the class's export."""
    chain = "if __name__ == '':\n    pass\n" + "".join(f"elif __name__ == '{i}':\n    pass\n" for i in range(1, 1000))
    solution = fabricate.solution_cells("ex4_softmax_stability")["p1_solution"]
    verdicts = run("ex4_softmax_stability", {"p1_solution": solution + "\n" + chain}, only="p1")[0]
    assert verdicts["p1_tests"]["passed"], verdicts["p1_tests"]
