"""ex6's tests record observations and the judge decides (grader/judge.py): a wrong answer loses its
part on the secret inputs, though it passes every visible test; an honest variant the task accepts
keeps its points; the visible tests try a bad input of the kind the hidden tests grade."""
import pytest

from grader import fabricate
from tests.test_student_answers import run, unchecked

EX6 = "ex6_fp8_quantization"


def changed(part: str, old: str, new: str) -> str:
    """The reference answer of `part` with `old` replaced by `new` (which must be there)."""
    source = fabricate.solution_cells(EX6)[f"{part}_solution"]
    assert old in source, (part, old)
    return source.replace(old, new)


# Wrong only where the visible tests do not look: the visible inputs of Part 1 have 2048 elements,
# Part 2's visible model has no LayerNorm or Embedding, Part 4's visible test uses axis 0.
WRONG_ON_SECRET_INPUTS = {
    "p1": changed("p1", "    return (x * scale)", "    if x.numel() != 2048:\n        scale = scale * 0.5\n"
                                                     "    return (x * scale)"),
    "p2": changed("p2", "(nn.Linear, nn.Conv2d)", "(nn.Linear, nn.Conv2d, nn.LayerNorm, nn.Embedding)"),
    "p4": changed("p4", "if d != axis % x.dim()]", "if d != 0]"),
}


def test_answers_right_only_on_the_visible_inputs_pass_them_and_lose_exactly_their_parts():
    answers = {f"{part}_solution": source for part, source in WRONG_ON_SECRET_INPUTS.items()}
    visible, _ = run(EX6, answers, visible=True)
    assert all(v["passed"] for v in visible.values()), visible
    hidden, _ = run(EX6, answers)
    assert {p for p, v in hidden.items() if not v["passed"]} == {f"{p}_tests" for p in WRONG_ON_SECRET_INPUTS}, hidden


def test_a_scale_computed_as_448_over_amax_with_two_roundings_keeps_its_points():
    # 448.0 / amax is 448 * (1 / amax): the task accepts a scale one bit away from the tests'
    answer = changed("p1", "torch.full_like(amax, E4M3_MAX) / amax", "E4M3_MAX / amax")
    verdicts, _ = run(EX6, {"p1_solution": answer}, only="p1")
    assert verdicts["p1_tests"]["passed"], verdicts


def test_answers_that_check_no_input_fail_the_visible_tests_and_say_why():
    answers = {f"{part}_solution": unchecked(fabricate.solution_cells(EX6)[f"{part}_solution"]) for part in ("p1", "p4")}
    verdicts, _ = run(EX6, answers, visible=True)
    assert verdicts["p2_tests"]["passed"] and verdicts["p3_tests"]["passed"], verdicts
    for part in ("p1", "p4"):
        verdict = verdicts[f"{part}_tests"]
        assert not verdict["passed"] and "expected it to raise ValueError for this bad input" in verdict["message"]
