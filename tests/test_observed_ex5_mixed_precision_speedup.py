"""ex5's tests record observations and the judge decides (grader/judge.py). ex5 times things, so what
is observed must not be a measured time: every part's observations are the same, run after run,
for one secret, and differ for another; a wrong answer loses its part on the secret inputs, though
it passes every visible test."""
import pytest

from grader import fabricate, notebooks, runs
from tests.test_student_answers import ROOT, SECRET, run, runner

EX5 = "ex5_mixed_precision_speedup"


def values_observed(secret: str) -> dict:
    """Per part, the value observations (not own_work's calls, not raises') of the reference
    solution under its hidden tests with `secret`."""
    source = notebooks.read_notebook(ROOT / "solutions" / EX5 / f"{EX5}.ipynb")
    record = runner(runs.hidden_test_job(source, source, secret, 120, reference=True))
    return {part: [o for o in r["observations"] if o["check"] in ("close", "equal", "reference")]
            for part, r in record.items()}


def test_every_part_observes_values_of_the_secret_inputs_and_no_measured_time():
    first, again, other = values_observed(SECRET), values_observed(SECRET), values_observed("another secret")
    assert first == again, "an observation changed between two runs: a measured time?"
    assert set(first) == {"p1_tests", "p2_tests", "p3_tests", "p4_tests"}
    for part in first:
        assert first[part] != other[part], f"{part} observes no value that depends on the secret"


def changed(part: str, old: str, new: str) -> str:
    """The reference answer of `part` with `old` replaced by `new` (which must be there)."""
    source = fabricate.solution_cells(EX5)[f"{part}_solution"]
    assert old in source, (part, old)
    return source.replace(old, new)


# Right only where the visible tests look
WRONG_ON_SECRET_INPUTS = {
    "p1": changed("p1", "    for _ in range(warmup):", "    for _ in range(warmup - (warmup != 3)):"),
    "p2": changed("p2", "float(np.median(seconds))", "float(np.median(seconds) if seconds.size <= 6 else seconds.mean())"),
    "p3": changed("p3", "nbytes = batch * (m * k + k * n + m * n) * dtype.itemsize",
                  "nbytes = batch * (m * k + k * n + m * n) * dtype.itemsize\n"
                  "    if (m, n, k) not in ((4096, 4096, 4096), (4096, 4096, 1024), (512, 512, 64)):\n"
                  "        nbytes -= batch * m * n * dtype.itemsize  # forgets the result"),
    "p4": changed("p4", "if flops / nbytes < peak / bandwidth:", "if flops / nbytes <= peak / bandwidth:"),
}


@pytest.mark.parametrize("parts", [("p1", "p3"), ("p2", "p4")])
def test_answers_right_only_on_the_visible_inputs_pass_them_and_lose_exactly_their_parts(parts):
    answers = {f"{part}_solution": WRONG_ON_SECRET_INPUTS[part] for part in parts}
    visible, _ = run(EX5, answers, visible=True)
    assert all(v["passed"] for v in visible.values()), visible
    hidden, _ = run(EX5, answers)
    assert {p for p, v in hidden.items() if not v["passed"]} == {f"{p}_tests" for p in parts}, hidden


def test_part_4_may_call_part_3s_functions_as_its_task_says_and_a_bug_there_costs_it_too():
    """Student walkthrough 48f, D: the task said "do not call Part 3's functions (each part is graded
    on its own)", and an answer that called them got full marks: the grader runs the earlier parts'
    cells an answer uses (the students' page). The task now says so."""
    task = next(notebooks.source_text(c) for c in notebooks.read_notebook(ROOT / "exercises" / EX5 / f"{EX5}.ipynb")["cells"]
                if "Write `roofline_split(" in notebooks.source_text(c))
    assert "do not call Part 3" not in task and "may call Part 3's `ridge_point` and `bound_by`" in task
    assert "a mistake there costs this part as well" in " ".join(task.split())
    solution = fabricate.solution_cells(EX5)
    line = "        if flops / nbytes < peak / bandwidth:"
    assert line in solution["p4_solution"]
    calling = solution["p4_solution"].replace(
        line, '        if bound_by(flops, nbytes, ridge_point(peak_tflops, bandwidth_gbs)) == "memory":')
    assert run(EX5, {"p4_solution": calling}, only="p4")[0]["p4_tests"]["passed"]
    broken = solution["p3_solution"].replace('return "memory" if flops / nbytes < ridge else "compute"',
                                             'return "memory" if flops / nbytes <= ridge / 2 else "compute"')
    verdicts, _ = run(EX5, {"p3_solution": broken, "p4_solution": calling}, only=None)
    assert not verdicts["p3_tests"]["passed"] and not verdicts["p4_tests"]["passed"]
