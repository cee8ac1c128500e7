"""Observations, not verdicts (issue 32): the student's process records what its answers did, the
reference solution's process records the same tests' expected values, and grader/judge.py decides
from the two records without running student code. The attacks on the sandboxed grader are in the
hostile corpus (tests/test_exercises.py); here: the judge on forged and damaged records, the
student's copy of the tests without expected values, and the attack that copy defeats."""
import ast
import base64
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from grader import fabricate, hostile_corpus, judge, notebooks, runs
from grader.course import assignments
from mpcourse import grading
from tests import test_student_answers

ROOT = Path(__file__).resolve().parent.parent


def observed(test: str, **names) -> dict:
    """The record `test` leaves in observing mode (in this process: our own code)."""
    grading._observations = record = []
    try:
        exec(test, {"grading": grading, "torch": torch, "np": np, **names})
    finally:
        grading._observations = None
    return {"observations": record, "stopped": None}


REFERENCE_TEST = ("grading.assert_close(f(x), torch.exp(x.double()), rtol=1e-6, what='f(x)')\n"
                  "grading.assert_equal(f(x).dtype, x.dtype, what='the dtype of f(x)')\n"
                  "grading.raises(TypeError, f, [1.0])\n"
                  "grading.matches_reference(f(x).sum(), what='the sum', rtol=1e-6)\n")


def exp_checked(x):
    if not isinstance(x, torch.Tensor):
        raise TypeError("a tensor")
    return torch.exp(x)


X = torch.linspace(-3, 3, 7)


def verdict(student_function, test=REFERENCE_TEST, reference_function=exp_checked) -> dict:
    reference = observed(test, f=reference_function, x=X)
    student = observed(runs.without_expected(test), f=student_function, x=X)
    return judge.judge({"p1_tests": reference}, {"p1_tests": student})["p1_tests"]


def test_right_answers_pass_and_each_kind_of_wrong_answer_fails_with_its_reason():
    assert verdict(exp_checked) == {"passed": True, "message": ""}
    assert "f(x) differs" in verdict(lambda x: exp_checked(x) * 1.001)["message"]
    assert "the dtype of f(x): expected torch.float32, got torch.float64" in verdict(
        lambda x: exp_checked(x).double())["message"]
    assert "expected it to raise TypeError" in verdict(lambda x: torch.exp(torch.as_tensor(x)))["message"]


def test_the_students_copy_of_a_test_holds_no_expected_value():
    student = observed(runs.without_expected(REFERENCE_TEST), f=exp_checked, x=X)["observations"]
    assert [o.get("expected") for o in student if o["check"] in ("close", "equal")] == [None, None]
    reference = observed(REFERENCE_TEST, f=exp_checked, x=X)["observations"]
    assert all(o.get("expected") is not None for o in reference if o["check"] in ("close", "equal"))


def test_what_a_forged_record_says_besides_its_values_is_ignored():
    reference = observed(REFERENCE_TEST, f=exp_checked, x=X)
    wrong = observed(runs.without_expected(REFERENCE_TEST), f=lambda x: exp_checked(x) + 1, x=X)
    forged = copy.deepcopy(wrong)
    for observation in forged["observations"]:  # its own tolerances, expected values and labels
        observation.update(rtol=1e300, atol=1e300, expected=observation.get("actual"), what="anything")
    assert not judge.judge({"p": reference}, {"p": forged})["p"]["passed"]
    for record in ({"observations": [], "stopped": None}, {"passed": True}, "RESULT ok", None,
                   {"observations": reference["observations"][:2], "stopped": None},
                   {"observations": [{"check": "own_work", "calls": []}] * 4, "stopped": None},
                   {"observations": reference["observations"] * 2, "stopped": None}):
        assert not judge.judge({"p": reference}, {"p": record})["p"]["passed"], record


def test_a_damaged_or_oversized_value_fails_the_part_and_the_judge_does_not_crash():
    reference = observed(REFERENCE_TEST, f=exp_checked, x=X)
    right = observed(runs.without_expected(REFERENCE_TEST), f=exp_checked, x=X)
    assert judge.judge({"p": reference}, {"p": right})["p"]["passed"]
    damages = [lambda a: a.update(f8="not base64!"), lambda a: a.update(shape=[10**9]),
               lambda a: a.update(f8=base64.b64encode(b"\0" * 12).decode()), lambda a: a.update(shape="x"),
               lambda a: a.clear(), lambda a: [a.pop("f8"), a.update(too_large=10**9)]]
    for damage in damages:
        record = copy.deepcopy(right)
        damage(record["observations"][0]["actual"])
        result = judge.judge({"p": reference}, {"p": record})["p"]
        assert not result["passed"] and result["message"], damage


def test_the_reference_must_pass_its_own_checks_and_record_something():
    wrong_reference = observed(REFERENCE_TEST, f=lambda x: exp_checked(x) + 1, x=X)
    with pytest.raises(judge.ReferenceProblem, match="fails its own check 1"):
        judge.judge({"p": wrong_reference}, {"p": wrong_reference})
    with pytest.raises(judge.ReferenceProblem, match="recorded nothing"):
        judge.judge({"p": {"observations": [], "stopped": None}}, {})
    with pytest.raises(judge.ReferenceProblem, match="stopped"):
        judge.judge({"p": {"observations": [], "stopped": "NameError"}}, {})


def test_values_are_recorded_exactly_nan_and_infinities_included():
    values = torch.tensor([1 / 3, float("nan"), float("inf"), -0.0, 5e-324], dtype=torch.float64)
    record = grading.data(values)
    assert record["tensor"] == "torch.float64" and record["shape"] == [5]
    back = grading.numbers_of(record)
    assert back[0] == 1 / 3 and np.isnan(back[1]) and back[2] == np.inf and back[4] == 5e-324
    assert np.signbit(back[3])
    assert grading.data(0.1) == {"float": (0.1).hex()} and grading.data((1, [2])) != grading.data([1, [2]])
    json.dumps(grading.data({"a": values, torch.float16: np.arange(3)}))  # JSON: data that runs no code


def test_without_expected_refuses_tests_it_cannot_strip():
    for test in ("check = grading.assert_close\ncheck(a, b)", "grading.assert_close(*pair)",
                 "from mpcourse.grading import assert_equal as same", "grading.assert_equal(a, b, 'what')"):
        with pytest.raises(ValueError):
            runs.without_expected(test)


@pytest.mark.parametrize("assignment", assignments())
def test_every_exercise_test_cell_can_be_stripped_and_every_part_records_a_value(assignment):
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    for cell in source["cells"]:
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if not (nbgrader.get("grade") and cell["cell_type"] == "code"):
            continue
        text = notebooks.source_text(cell)
        tree = ast.parse(runs.without_expected(text))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in runs.CHECKS_WITH_EXPECTED:
                expected = node.args[1] if len(node.args) > 1 else next(k.value for k in node.keywords if k.arg == "expected")
                assert isinstance(expected, ast.Constant) and expected.value is None
        # A value check in the hidden tests, or a call of a function of the cell that makes one
        checks = {"assert_close", "assert_equal", "matches_reference"}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(n, ast.Call) and getattr(n.func, "attr", None) in checks for n in ast.walk(node)):
                checks.add(node.name)
        lines = text.splitlines()
        begin = next(i for i, line in enumerate(lines, 1) if "### BEGIN HIDDEN TESTS" in line)
        end = next(i for i, line in enumerate(lines, 1) if "### END HIDDEN TESTS" in line)
        called = {getattr(n.func, "attr", getattr(n.func, "id", None)) for n in ast.walk(ast.parse(text))
                  if isinstance(n, ast.Call) and begin < n.lineno < end}
        assert called & checks, (
            f"{assignment} {nbgrader['grade_id']}: the hidden tests record no value for the judge to compare")


def test_the_attack_that_records_the_expected_value_scores_only_where_the_tests_keep_it(monkeypatch):
    """Ablation: the checker patched to record each check's expected value as the answer, around a
    wrong answer of the right shape and dtype; it passes ex4 Part 3 if the student's copy of the tests
    keeps its expected values, and fails as it runs (without them)."""
    cells = {**fabricate.solution_cells("ex4_softmax_stability"), **hostile_corpus.TARGETED["steals_expected"]}
    verdicts, _ = test_student_answers.run("ex4_softmax_stability", cells, only="p3")
    assert not verdicts["p3_tests"]["passed"]
    monkeypatch.setattr(runs, "without_expected", lambda test: test)
    verdicts, _ = test_student_answers.run("ex4_softmax_stability", cells, only="p3")
    assert verdicts["p3_tests"]["passed"]
