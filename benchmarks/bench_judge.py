"""What the reference run costs: the hidden tests of one student, before and after issue 32.

Before, one sandbox ran the student's answers under the hidden tests and decided there. Now a
second sandbox runs the instructor's solution under the same tests on the same secret inputs, and
the judge compares the two records. For each assignment, within every repeat, the student's run
alone and the whole (reference run + student's run + judge) are timed in turn, so a slow spell of
the machine hits both alike; the ratio is the median whole / the median student's run alone,
measured side by side in one run. The student is the instructor's full solution (every part runs
to its end: the most work a part does).

    python benchmarks/bench_judge.py [--repeats 3] [--timeout 60] [ex4_softmax_stability ...]

The feedback run (the notebook under nbgrader, for the student's page) is not included: see
benchmarks/bench_grading.py for a whole student's grading.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grader import fabricate, judge, notebooks, runs  # noqa: E402

SECRET = "bench-secret"


def student_run(source: dict, release: dict, timeout: int, sandbox: bool) -> float:
    job = runs.hidden_test_job(source, submission_of(release), SECRET, timeout)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        record, problem = runs.run_hidden_tests(Path(scratch) / "student", job, sandbox, timeout)
        seconds = time.perf_counter() - start
    assert problem is None, problem
    return seconds


def whole(source: dict, release: dict, timeout: int, sandbox: bool) -> float:
    jobs = {"reference": runs.hidden_test_job(source, source, SECRET, timeout, reference=True),
            "student": runs.hidden_test_job(source, submission_of(release), SECRET, timeout)}
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        records = {who: runs.run_hidden_tests(Path(scratch) / who, job, sandbox, timeout)[0] for who, job in jobs.items()}
        verdicts = judge.judge(records["reference"], records["student"])
        seconds = time.perf_counter() - start
    assert all(v["passed"] for v in verdicts.values()), verdicts
    return seconds


def submission_of(release: dict) -> dict:
    """The release with the instructor's solutions in its answer cells: a full-marks student."""
    cells = fabricate.solution_cells(release["metadata"]["mpcourse_assignment"])
    return {**release, "cells": [{**c, "source": cells.get(notebooks.grade_id(c), c["source"])} for c in release["cells"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=["ex4_softmax_stability", "ex2_loss_scaling"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=60)
    args = parser.parse_args()
    sandbox = runs.sandbox_problem() is None
    print(f"sandbox: {'bubblewrap' if sandbox else 'none (limits only): ' + runs.sandbox_problem()}")
    print(f"{'assignment':<30} {'student alone (s)':>18} {'with reference (s)':>19} {'ratio':>6}")
    for assignment in args.assignments:
        source = notebooks.read_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
        release = notebooks.read_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
        release["metadata"]["mpcourse_assignment"] = assignment
        alone, both = [], []
        for _ in tqdm(range(args.repeats), desc=assignment, leave=False):
            alone.append(student_run(source, release, args.timeout, sandbox))
            both.append(whole(source, release, args.timeout, sandbox))
        a, b = statistics.median(alone), statistics.median(both)
        print(f"{assignment:<30} {a:>18.1f} {b:>19.1f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
