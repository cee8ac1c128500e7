"""Observations, not verdicts (issue 32): the student's process records what its answers did, the
reference solution's process records the same tests' expected values, and grader/judge.py decides
from the two records without running student code. The attacks on the sandboxed grader are in the
hostile corpus (tests/test_hostile_corpus.py); here: the judge on forged and damaged records, the
student's copy of the tests without expected values, and the attack that copy defeats."""
import ast
import base64
import copy
import inspect
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from grader import fabricate, feedback, hostile_corpus, judge, notebooks, runs, student_copy, withheld
from grader.course import assignments
from mpcourse import grading, numerics
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


def test_a_mismatch_inside_a_list_of_tensors_is_named_where_it_is_before_any_cut():
    """Issue 48's walkthrough: "expected [<tensor of shape (12, 8)...>, ...], got [<tensor of shape
    (12, 8)...>, ...]", cut at the feedback's length before anything that differed. The message
    now names the item, the first index that differs and how many do, in the notebook and graded."""
    grads = [torch.full((12, 8), 0.5, dtype=torch.float16), torch.full((12,), 0.5, dtype=torch.float16)]
    changed = [g.clone() for g in grads]
    changed[1][7] = 0.75
    test = "grading.assert_equal(f(), expected, what='.grad afterwards')\n"
    want = r"\.grad afterwards: item 1: at index \[7\]: expected 0\.5, got 0\.75 \(1 of 12 values differ\)"
    with pytest.raises(AssertionError, match=want):
        exec(test, {"grading": grading, "f": lambda: changed, "expected": grads})
    for kind in (test, "grading.matches_reference(f(), what='.grad afterwards')\n"):
        reference = observed(kind, f=lambda: grads, expected=grads)
        student = observed(runs.without_expected(kind), f=lambda: changed)
        message = judge.judge({"p1_tests": reference}, {"p1_tests": student})["p1_tests"]["message"]
        assert re.fullmatch(want, message) and len(message) < feedback.MESSAGE_CHARS, message
    # Where the shapes, dtypes or lengths differ, both sides are shown as before; in a dict, the key.
    assert grading.difference(grading.data(grads[:1]), grading.data(grads)).startswith("expected [<tensor of shape")
    assert grading.difference(grading.data({"a": 1, "b": [2, 3]}), grading.data({"a": 1, "b": [2, 4]})) == (
        "at key 'b': item 1: expected 3, got 4")
    assert grading.difference(grading.data(torch.ones(2)), grading.data(torch.ones(2).double())) == (
        "expected <tensor [1.0, 1.0], torch.float32>, got <tensor [1.0, 1.0], torch.float64>")


def test_an_int_where_the_reference_has_a_float_of_the_same_value_is_the_same_answer():
    """Red team 45g, A03 and A04: `0` for the task's `0.0` (alone, or inside a tuple) and `1` for
    `1.0` cost the part in the hidden `assert_equal`; in the notebook and graded alike they pass."""
    for expected, answer in ((1.0, 1), ((0.0, 1.0), (0, 1.0)), ({"max": 0.0}, {"max": 0}), ([2.0, 3], [2, 3.0])):
        test = "grading.assert_equal(f(), expected, what='the answer')\n"
        exec(test, {"grading": grading, "f": lambda: answer, "expected": expected})  # the visible check passes
        reference = observed(test, f=lambda: expected, expected=expected)
        student = observed(runs.without_expected(test), f=lambda: answer)
        assert judge.judge({"p1_tests": reference}, {"p1_tests": student})["p1_tests"]["passed"], (expected, answer)
    for expected, answer in ((1.0, 1.5), (1.0, True), ((0.0, 1.0), [0.0, 1.0]), (float("nan"), 0), (2, 2.5)):
        assert not grading.same_data(grading.data(expected), grading.data(answer)), (expected, answer)
    assert not grading.same_data({"int": "1" * 5000}, {"float": "0x1p+0"})  # too long an int: no crash


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


def graded_test_cells(assignment: str) -> list[str]:
    """The source of each graded test cell of `assignment`'s solution notebook."""
    source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    return [notebooks.source_text(cell) for cell in source["cells"]
            if cell["cell_type"] == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("grade")]


@pytest.mark.parametrize("assignment", assignments())
def test_every_exercise_test_cell_can_be_stripped_and_every_part_records_a_value(assignment):
    for text in graded_test_cells(assignment):
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
    wrong answer of the right shape and dtype. The student's copy of the tests holds no expected
    value to steal; with that layer taken away (the copy keeping them), the part still fails, now
    because the runner sees the checker's functions replaced (red team 16e's layer), and says so."""
    cells = {**fabricate.solution_cells("ex4_softmax_stability"), **hostile_corpus.TARGETED["steals_expected"]}
    verdicts, _ = test_student_answers.run("ex4_softmax_stability", cells, only="p3")
    assert not verdicts["p3_tests"]["passed"]
    monkeypatch.setattr(runs, "student_copy", lambda test, names=(), withheld=(): test)
    verdicts, _ = test_student_answers.run("ex4_softmax_stability", cells, only="p3")
    assert not verdicts["p3_tests"]["passed"] and "replaced mpcourse.grading." in verdicts["p3_tests"]["message"], verdicts


# --- issue 45: nothing in the student's sandbox computes an answer but the student's code --------

HELPERS = """grading.start("Part 1")


def expected_of(x):  # the tests' own answer
    return torch.exp(x.double())


def inputs(n):
    return torch.linspace(-1, 1, n)


x = inputs(5)
grading.assert_close(f(x), expected_of(x), rtol=1e-6, what="f(x)")
expected = expected_of(x)
largest = expected.abs().max().item()
grading.assert_close(f(x), expected, rtol=1e-6, atol=1e-9 * largest, what="f(x) again")
"""


def test_the_students_copy_keeps_no_function_or_value_that_computes_an_expected_value():
    copy = runs.student_copy(HELPERS, names=["f"])
    tree = ast.parse(copy)
    assert {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} == {"inputs"}  # an input's helper stays
    assert {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets} == {"x"}
    reference, student = observed(HELPERS, f=exp_checked), observed(copy, f=exp_checked)
    assert [o.get("atol") for o in student["observations"]] == [0.0, 0.0]  # the judge takes the reference's
    assert judge.judge({"p1_tests": reference}, {"p1_tests": student})["p1_tests"]["passed"]
    wrong = observed(copy, f=lambda x: exp_checked(x) * 1.01)
    assert not judge.judge({"p1_tests": reference}, {"p1_tests": wrong})["p1_tests"]["passed"]


@pytest.mark.parametrize("test, line, name", [
    ("def ref(x):\n    return x + 1\n\n\ngrading.assert_equal(f(1), ref(1))\nassert f(2) == ref(2)\n", 1, "ref"),
    ("y = 2\n\n\nclass Ref:\n    def of(self, x):\n        return x + 1\n\n\nwant = Ref().of(y)\n"
     "grading.assert_equal(f(y), want)\nprint(want)\n", 4, "Ref"),
    ("def ref(x):\n    return x + 1\n\n\ngot, want = grading.own_work(f, 1), ref(1)\ngrading.assert_equal(got, want)\n",
     1, "ref"),  # kept for the student's call beside it
    ("refs = {'one': lambda x: x + 1}\ngrading.assert_equal(f(1), refs['one'](1))\nprint(sorted(refs))\n", 1,
     "a function assigned there"),
])
def test_the_students_copy_refuses_a_reference_computation_it_cannot_remove(test, line, name):
    with pytest.raises(ValueError, match=f"line {line}: {name}.* computes an expected value"):
        runs.student_copy(test, names=["f"])


def test_the_students_copy_refuses_to_use_a_withheld_library_function():
    withheld = ["mpcourse.numerics.naive_softmax"]
    kept = ("from mpcourse.numerics import naive_softmax as reference\n"
            "x = torch.ones(3)\n"
            "grading.assert_close(f(x), reference(x), rtol=1e-6)\n")
    assert "reference" not in runs.student_copy(kept, names=["f"], withheld=withheld)  # only in an expected value: gone
    for used in (kept + "grading.assert_close(f(2 * x), reference(2 * x).double())\nprint(reference(x))\n",
                 "import mpcourse.numerics\ngrading.assert_close(f(mpcourse.numerics.naive_softmax(x)), None)\n"):
        with pytest.raises(ValueError, match=r"line \d+: .*mpcourse.numerics.naive_softmax, which grading withholds"):
            runs.student_copy(used, names=["f"], withheld=withheld)


@pytest.mark.parametrize("assignment", assignments())
def test_every_parts_hidden_tests_draw_their_inputs_from_the_secret(assignment):
    """A part whose hidden tests draw nothing from grading.seed has the same answers for every
    student, every year: a table of them passes (ex4 Part 2 did)."""
    for text in graded_test_cells(assignment):
        lines = text.splitlines()
        begin = next(i for i, line in enumerate(lines, 1) if "### BEGIN HIDDEN TESTS" in line)
        end = next(i for i, line in enumerate(lines, 1) if "### END HIDDEN TESTS" in line)
        seeded = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and begin < n.lineno < end
                  and ast.unparse(n.func) == "grading.seed"]
        assert seeded, f"{assignment} {nbgrader['grade_id']}: the hidden tests draw no input from grading.seed"


def expected_removed_only(test: str, names=(), withheld=()) -> str:
    """The student's copy of a test cell as it was before issue 45: expected values removed, the
    functions that compute them kept."""
    tree = ast.parse(test)
    student_copy.strip_expected(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def test_the_stack_walk_into_the_tests_helpers_scores_only_where_the_copy_keeps_them(monkeypatch):
    """Ablation (issue 45): ex8's answers that find the tests' own first_divergence and
    what_breaks_resume on the call stack got Parts 3 and 4 while the student's copy of the tests
    defined them; it defines them no more."""
    cells = {**fabricate.solution_cells("ex8_bitwise_resume"), **hostile_corpus.EX8_WALKS_THE_STACK}
    for part in ("p3", "p4"):
        verdicts, _ = test_student_answers.run("ex8_bitwise_resume", cells, only=part)
        assert not verdicts[f"{part}_tests"]["passed"], part
    monkeypatch.setattr(runs, "student_copy", expected_removed_only)
    for part in ("p3", "p4"):
        verdicts, _ = test_student_answers.run("ex8_bitwise_resume", cells, only=part)
        assert verdicts[f"{part}_tests"]["passed"], (part, verdicts)


WITHHELD = ["mpcourse.numerics.naive_softmax", "mpcourse.scaling.DynamicLossScaler"]
# In the student's copy of the library, through a thread started before anything else, directly,
# and as a base class: each raises the rule; what is not withheld still works.
REACH = """
import concurrent.futures, os, sys, torch
pool = concurrent.futures.ThreadPoolExecutor(1)
pool.submit(int).result()
from mpcourse import grading, numerics, scaling
found = []
for attempt in (lambda: pool.submit(numerics.naive_softmax, torch.ones(2)).result(), lambda: scaling.DynamicLossScaler(),
                lambda: type("Mine", (scaling.DynamicLossScaler,), {})()):
    try:
        attempt()
        found.append("ran")
    except AttributeError as error:
        found.append(str(error))
found.append(numerics.stable_softmax(torch.zeros(2)).tolist())
found.append(os.path.exists(sys.argv[1]))
print(found)
"""


def test_the_students_library_lacks_the_code_of_what_the_parts_ask_for(tmp_path):
    library = withheld.library_copy(WITHHELD, tmp_path)
    copied = "\n".join(p.read_text() for p in (library / "mpcourse").rglob("*.py"))
    body = '_check_floating(x, "naive_softmax")'  # a line of the withheld function's code, and of no other
    assert body in inspect.getsource(numerics.naive_softmax) and body.replace('"', "'") not in copied
    assert "Kept to show what" not in copied and not list(library.rglob("*.pyc"))
    result = subprocess.run([sys.executable, "-c", REACH, str(ROOT / "mpcourse" / "numerics.py")], capture_output=True,
                            text=True, env={"PYTHONPATH": str(library), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    for error, name in zip(found[:3], [WITHHELD[0], WITHHELD[1], WITHHELD[1]]):
        assert error.startswith(f"{name} is withheld while your work is graded"), error
    assert found[3] == [0.5, 0.5]


def test_the_private_helpers_only_withheld_code_uses_are_withheld_with_it(tmp_path):
    """Red team 45g, A02b: ex3 Part 2 withholds `round_to`; its private core `_round_bit_level`,
    reached by a name built at run time, computed the answer (10/10, unflagged). Helpers that other
    code of the library uses stay: the library still imports and its other functions work."""
    ex3 = withheld.declared(notebooks.read_notebook(ROOT / "solutions" / "ex3_dynamic_range" / "ex3_dynamic_range.ipynb"))
    library = withheld.library_copy(ex3, tmp_path)
    reach = ("import importlib, torch\nf = importlib.import_module('mpcourse.' + 'formats')\n"
             "for name in ('_round_bit_level', '_round_tensor', '_round_by_gaps'):\n"
             "    try:\n        getattr(f, name)(torch.ones(2), f.FP16, 'nearest', False, None)\n        print('ran')\n"
             "    except AttributeError as error:\n        print(error)\n"
             "print(f.decode(torch.tensor([15360], dtype=torch.int32), f.FP16).tolist())\n")
    result = subprocess.run([sys.executable, "-c", reach], capture_output=True, text=True, cwd=tmp_path,
                            env={"PYTHONPATH": str(library), "PATH": "/usr/bin:/bin"})
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4, result.stderr[-2000:]
    for line, name in zip(lines, ("_round_bit_level", "_round_tensor", "_round_by_gaps")):
        assert line.startswith(f"mpcourse.formats.{name} is withheld while your work is graded: it computes part of "
                               "what mpcourse.formats.round_to"), line
    assert lines[3] == "[1.0]"  # decode, not withheld, and its helpers work
    kept = withheld.private_helpers(ast.parse("def _shared(): pass\ndef _mine(): pass\ndef f(): _mine(); _shared()\n"
                                              "def g(): _shared()\nX = _top = 1\n"), {"f"}, elsewhere="")
    assert kept == ["_mine"]
    assert withheld.private_helpers(ast.parse("def _mine(): pass\ndef f(): _mine()\n"), {"f"}, elsewhere="_mine") == []


@pytest.mark.skipif(runs.sandbox_problem() is not None, reason="no sandbox here")
def test_a_students_hidden_test_sandbox_sees_only_the_copy_of_the_library(tmp_path):
    library = withheld.library_copy(WITHHELD, tmp_path / "library")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "reach.py").write_text(REACH)
    run = runs.run_sandboxed(["/bin/sh", "-c", f'exec python "$GRADING/reach.py" {ROOT / "mpcourse" / "numerics.py"}'],
                             folder=tmp_path / "run", limits=runs.sandboxing.Limits(120, 120), sandbox=True,
                             library=library)
    found = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert all("is withheld while your work is graded" in error for error in found[:3]), found
    assert found[3:] == [[0.5, 0.5], False]  # the course's own library is not there to be read


@pytest.mark.parametrize("declaration, problem", [
    ('withheld=("mpcourse.numerics.nothing_here",)', "the course library has no mpcourse.numerics.nothing_here"),
    ('withheld=("numpy.exp",)', "is not a name in the course library"),
    ("withheld=NAMES", "write withheld= as a tuple of strings"),
    ('withheld="mpcourse.numerics.naive_softmax"', "withheld= takes a tuple of strings"),
    ('withheld=("mpcourse.numerics.FP16",)', "is not a function or class"),
])
def test_a_part_that_withholds_something_the_library_lacks_is_refused_with_the_line(declaration, problem):
    with pytest.raises(ValueError, match=problem):
        withheld.declared_in(f'x = 1\ngrading.start("Part 1", {declaration})\n')
    assert withheld.declared_in('grading.start("Part 1", withheld=("mpcourse.fp8.quantize",))') == ["mpcourse.fp8.quantize"]


def test_what_a_part_withholds_is_read_from_the_librarys_source_without_importing_it():
    """withheld.resolve follows re-exports in the source (`mpcourse.fp8.quantize` is defined in
    mpcourse/fp8/quantization.py) and imports nothing of the library: a `grade` process had imported
    torch for it (1.8 s)."""
    code = ("import sys\nfrom grader import withheld, notebooks\nfrom grader.course import ROOT, assignments\n"
            "names = [n for a in assignments() for n in withheld.declared(notebooks.read_notebook("
            "ROOT / 'solutions' / a / f'{a}.ipynb'))]\n"
            "print(len(names), 'torch' in sys.modules, withheld.resolve('mpcourse.fp8.quantize')[1].name)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    count, torch_imported, file = run.stdout.split()
    assert int(count) >= 8 and torch_imported == "False" and file == "quantization.py", run.stderr[-2000:]
    with pytest.raises(ValueError, match="is defined outside the course library"):
        withheld.resolve("mpcourse.formats.Fraction")  # `from fractions import Fraction` in the module


def test_grading_refuses_an_environment_that_holds_a_copy_of_the_whole_library(tmp_path, monkeypatch):
    """A non-editable install puts mpcourse/ in site-packages, which every sandbox shows: the
    student's sandbox could read there what its own copy withholds."""
    import site
    (tmp_path / "mpcourse").mkdir()
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    monkeypatch.setattr(runs, "ENVIRONMENT_CHECKED", set())
    assert "installed in the Python environment itself" in runs.environment_problem(True)


def test_the_environment_is_checked_once_until_something_is_installed(tmp_path, monkeypatch):
    """Instructor walkthrough 47b, K2: every `python -m grader grade` ran the sandboxed import check
    again (about 5 s of CPU); its success is kept, for as long as the installed packages are the same."""
    import site
    packages = tmp_path / "site-packages"
    packages.mkdir()
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(packages)])
    monkeypatch.setattr(runs, "CHECKED_STAMP", str(tmp_path / "checked"))  # absolute: not in the real environment
    checks = []
    monkeypatch.setattr(runs, "run_sandboxed", lambda command, **kw: checks.append(command) or
                        types.SimpleNamespace(returncode=0, stdout="", stderr="", killed=""))

    def fresh_process():
        monkeypatch.setattr(runs, "ENVIRONMENT_CHECKED", set())
        return runs.environment_problem(True)

    assert fresh_process() is None and fresh_process() is None and len(checks) == 1
    (packages / "newly_installed").mkdir()  # pip changes the folder
    assert fresh_process() is None and len(checks) == 2
    assert runs.environment_problem(False) is None and len(checks) == 3  # another setting: its own check
