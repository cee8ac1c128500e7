"""ex3's grade comes from the judge: an answer that is right on the visible inputs only, or that
skips one input check the hidden tests grade, loses its part; an answer that checks no input fails
the visible tests already, saying which bad input it let through."""
import pytest

from grader import fabricate, notebooks
from tests.test_observed_ex1_precision_comparison import judged
from tests.test_student_answers import unchecked

EX = "ex3_dynamic_range"

# (answer cell, what is wrong, the solution's text, the broken text): each passes the visible tests
# (checked when they were written; not here, to keep this file fast).
BROKEN = [
    ("p1_solution", "negates where s > 0.5", "torch.where(s < 0.5", "torch.where(s > 0.5"),
    ("p2_solution", "counts a zero in the input as normal", "zero = (stored == 0) & ~overflow",
     "zero = (stored == 0) & (x != 0) & ~overflow"),
    ("p3_solution", "gives NaN, not 0.0, when no value is in the normal range",
     "if bool(normal_range.any()) else 0.0", "if bool(normal_range.any()) else float('nan')"),
    ("p4_solution_b", "does not clip a threshold below low", "t = min(max(t, low), high)", "t = min(t, high)"),
    ("p4_solution_b", "accepts low == high", "if not 0 < low < high:", "if not 0 < low <= high:"),
]


@pytest.mark.parametrize("cell, wrong, text, broken", BROKEN, ids=[f"{c[:2]}-{w[:30]}" for c, w, _, _ in BROKEN])
def test_a_wrong_answer_that_passes_the_visible_tests_loses_its_part(cell, wrong, text, broken):
    solution = fabricate.solution_cells(EX)[cell]
    assert text in solution
    part = notebooks.part_of(cell)
    verdict = judged(EX, {cell: solution.replace(text, broken)}, only=part)[f"{part}_tests"]
    assert not verdict["passed"], f"{part}: an answer that {wrong} passed"


def test_fractions_computed_as_float32_means_pass_parts_2_and_3():
    """An honest habit: each fraction as `mask.float().mean().item()` (float32, off by ~1e-8 of the
    exact count): Part 2 allows half a count, so must Part 3, whose table reuses `classify`
    (its "lost" once had rtol 1e-12 and cost this answer Part 3: red team 45, A4c)."""
    exact = ('return {"zero": zero.sum().item() / total, "subnormal": subnormal.sum().item() / total,\n'
             '            "normal": normal.sum().item() / total, "overflow": overflow.sum().item() / total}')
    solution = fabricate.solution_cells(EX)["p2_solution"]
    assert exact in solution
    means = solution.replace(exact, 'return {kind: mask.float().mean().item() for kind, mask in '
                                    '(("zero", zero), ("subnormal", subnormal), ("normal", normal), ("overflow", overflow))}')
    verdicts = judged(EX, {"p2_solution": means})
    assert verdicts["p2_tests"]["passed"] and verdicts["p3_tests"]["passed"], verdicts


def test_an_answer_that_checks_no_input_fails_the_visible_tests_of_each_part_that_asks_for_checks():
    cells = fabricate.solution_cells(EX)
    verdicts = judged(EX, {cell: unchecked(cells[cell]) for cell in ("p1_solution", "p2_solution", "p4_solution_b")},
                      visible=True)
    for part in ("p1", "p2", "p4"):
        message = verdicts[f"{part}_tests"]["message"]
        assert not verdicts[f"{part}_tests"]["passed"] and "for this bad input" in message, (part, message)
    assert verdicts["p3_tests"]["passed"], "Part 3 asks for no input check"
