"""ex2's grade comes from the judge: an answer that is right on the visible inputs only, or that
skips one input check the hidden tests grade, loses its part (tests/test_student_answers.py checks
that an answer checking no input fails ex2's visible tests)."""
import pytest

from grader import fabricate
from tests.test_observed_ex1_precision_comparison import judged

EX = "ex2_loss_scaling"

# (part, what is wrong, the solution's text, the broken text): each passes the visible tests
# (checked when they were written; not here, to keep this file fast).
BROKEN = [
    ("p1", "counts one element wrong beyond the visible inputs", "return survived.double().mean().item()",
     "return survived.double().mean().item() if values.numel() < 100 else survived[1:].double().mean().item()"),
    ("p2", "decides on S g instead of the FP16 value stored",
     "if bool((stored >= torch.finfo(torch.float16).tiny).all()):",
     "if bool((nonzero.abs() * scale >= torch.finfo(torch.float16).tiny).all()):"),
    ("p3", "does not round init_scale to float32", "scale = float(torch.tensor(init_scale, dtype=torch.float32))",
     "scale = float(init_scale)"),
    ("p4", "looks at the last gradient only for inf and NaN",
     "found_inf = not all(bool(torch.isfinite(grad).all()) for grad in grads16)",
     "found_inf = not bool(torch.isfinite(grads16[-1]).all())"),
    ("p4", "accepts FP16 master weights", "        if master.dtype != torch.float32:\n", "        if False:\n"),
]


@pytest.mark.parametrize("part, wrong, text, broken", BROKEN, ids=[f"{p}-{w[:30]}" for p, w, _, _ in BROKEN])
def test_a_wrong_answer_that_passes_the_visible_tests_loses_its_part(part, wrong, text, broken):
    solution = fabricate.solution_cells(EX)[f"{part}_solution"]
    assert text in solution
    verdict = judged(EX, {f"{part}_solution": solution.replace(text, broken)}, only=part)[f"{part}_tests"]
    assert not verdict["passed"], f"{part}: an answer that {wrong} passed"


# Part 3's update(), written as red team A10 wrote it: torch's own GradScaler kernel does the work.
TORCH_KERNEL = '''    def update(self, found_inf):
        """End a step: torch's GradScaler kernel decides."""
        scale = torch.tensor(self.scale, dtype=torch.float32)
        steps = torch.tensor(self.clean_steps, dtype=torch.int32)
        torch._amp_update_scale_(scale, steps, torch.tensor(float(found_inf)), self.growth_factor,
                                 self.backoff_factor, self.growth_interval)
        self.scale, self.clean_steps = float(scale), int(steps)
'''


def test_part_3_refuses_torchs_gradscaler_kernel_and_keeps_an_honest_answers_marks():
    solution = fabricate.solution_cells(EX)["p3_solution"]
    update = solution.index("    def update(self, found_inf):")
    verdicts = {answer: judged(EX, {"p3_solution": answer}, only="p3")["p3_tests"]
                for answer in (solution, solution[:update] + TORCH_KERNEL)}
    assert verdicts[solution]["passed"], verdicts[solution]["message"]
    refused = verdicts[solution[:update] + TORCH_KERNEL]
    assert not refused["passed"] and "torch._amp_update_scale_" in refused["message"], refused


# Part 4's check and unscale done by torch's own GradScaler kernel (red team 45): forbidden too.
TORCH_UNSCALE = '''    found = torch.zeros(1)
    unscaled = [grad.float() for grad in grads16]
    torch._amp_foreach_non_finite_check_and_unscale_(unscaled, found, torch.tensor(1.0 / scaler.scale))
    found_inf = bool(found.item())
    if not found_inf:
        with torch.no_grad():
            for master, g in zip(masters, unscaled):
                master -= lr * g
    scaler.update(found_inf)
    return not found_inf
'''


def test_part_4_refuses_torchs_unscale_kernel():
    solution = fabricate.solution_cells(EX)["p4_solution"]
    start = solution.index("    found_inf = not all(")
    verdict = judged(EX, {"p4_solution": solution[:start] + TORCH_UNSCALE}, only="p4")["p4_tests"]
    assert not verdict["passed"] and "torch._amp_foreach_non_finite_check_and_unscale_" in verdict["message"], verdict
