"""ex1's grade comes from the judge: an answer that is right on the visible inputs only, or that
skips one input check the hidden tests grade, loses its part; an answer that checks no input fails
the visible tests already, saying which bad input it let through."""
import pytest

from grader import fabricate
from tests.test_student_answers import run, unchecked

EX = "ex1_precision_comparison"


def judged(assignment: str, answers: dict, only: str | None = None, visible: bool = False) -> dict:
    """The judge's verdicts on the solutions with `answers` in their place (the part `only`, or
    all), against the reference's record, which is run once per test run, assignment and test set."""
    return run(assignment, answers, visible=visible, only=only)[0]


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


def test_an_honest_fit_computed_in_float32_keeps_part_3():
    """Red team 32: a fit by np.linalg.lstsq on float32 logs (exponent 0.49999997 for 0.5) lost its
    part at rtol=1e-9; the part grades the method, not the precision it was computed in, and an
    answer off by 1e-4 still loses it (BROKEN above)."""
    answer = '''def fit_power_law(sizes, errors):
    n, e = np.asarray(sizes, dtype=np.float64), np.asarray(errors, dtype=np.float64)
    if n.ndim != 1 or n.shape != e.shape or n.size < 2:
        raise ValueError("two sequences of the same length, two points at least")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(e)) and np.all(n > 0) and np.all(e > 0)):
        raise ValueError("finite and positive")
    if np.all(n == n[0]):
        raise ValueError("all sizes are equal")
    x, y = np.log(n.astype(np.float32)), np.log(e.astype(np.float32))
    (slope, intercept), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)
    return float(slope), float(np.exp(intercept))
'''
    for visible in (True, False):
        assert judged(EX, {"p3_solution": answer}, only="p3", visible=visible)["p3_tests"]["passed"]
