"""ex2's grade comes from the judge: an answer that is right on the visible inputs only, or that
skips one input check the hidden tests grade, loses its part (tests/test_student_answers.py checks
that an answer checking no input fails ex2's visible tests)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader import fabricate
from grader.notebooks import grade_id, read_notebook, source_text
from tests.test_observed_ex1_precision_comparison import judged

EX = "ex2_loss_scaling"
ROOT = Path(__file__).resolve().parent.parent

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


# Runs the released notebook's code cells top to bottom in one namespace, as Jupyter does (a cell
# that raises does not stop the next: --allow-errors), and prints each part that ticked.
NOTEBOOK = r"""
import json, sys
from grader.notebooks import grade_id, source_text, without_magics
cells = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for cell in cells:
    try:
        exec(compile(without_magics(cell), "<cell>", "exec"), namespace)
    except Exception as error:
        print(f"raised {type(error).__name__}")
"""


def ticks_in_the_notebook(answers: dict, release: Path = ROOT / "exercises" / EX / f"{EX}.ipynb") -> str:
    """What the release notebook prints, run top to bottom with the solutions, `answers` in their place."""
    cells = {**fabricate.solution_cells(EX), **answers}
    code = [cells.get(grade_id(c), source_text(c)) for c in read_notebook(release)["cells"]
            if c.get("cell_type") == "code" and "%pip" not in source_text(c)]
    run = subprocess.run([sys.executable, "-c", NOTEBOOK], input=json.dumps(code), capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_part_4s_visible_tests_catch_unscaling_by_the_global_s():
    """Student walkthrough 48f, A: `sgd_step` unscaled by the global S instead of scaler.scale. Part
    4's test cell set S = 2^20 and gave its scaler that S, so the slip ticked in the notebook and
    scored 0 graded (where S came from the example cell: 8192). The scaler's scale now differs from
    every S of the notebook."""
    solution = fabricate.solution_cells(EX)["p4_solution"]
    text, slip = "inv_scale = 1.0 / scaler.scale", "inv_scale = 1.0 / S"
    assert text in solution
    honest = ticks_in_the_notebook({})
    assert all(f"\N{CHECK MARK} Part {n}: all tests in this cell pass." in honest for n in (1, 2, 3, 4)), honest
    slipped = ticks_in_the_notebook({"p4_solution": solution.replace(text, slip)})
    assert "Part 4: all tests" not in slipped and "raised AssertionError" in slipped, slipped
    verdict = judged(EX, {"p4_solution": solution.replace(text, slip)}, only="p4")["p4_tests"]
    assert not verdict["passed"]  # graded too: the tick and the grade agree
