"""What grading a class costs here: seconds per student for each step, and students per minute
at `--jobs 1, 2, ...` up to the cores of this machine, side by side in one run.

    python benchmarks/bench_grading.py [--assignment ex4_softmax_stability] [--students 8]
                                       [--jobs 1,2] [--no-feedback]

A scratch course gets `--students` fabricated submissions (full, blank, partial and
reference-calling, in turn), graded by grader/schedule.py exactly as `python -m grader grade` grades,
once per `--jobs` value, from an empty gradebook each time. Nothing about a student's grading is
assumed: every sandboxed run that `schedule.grade_student` makes is timed as it happens and sorted
by what it runs (the feedback run, the hidden tests, anything else, such as a reference run), and
the rest of a student's time is the set-up (reading, checking, writing the feedback notebook).
The reference's runs for the whole class (schedule.reference_records, one per worker before the
students' runs) are in the students per minute, not in any one student's steps.
The machine's load average is printed before and after: on a shared machine, other work slows
every figure. The figures extrapolate to a class: students / (students per minute).
"""
import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from grader import fabricate, runs, schedule  # noqa: E402
from grader.course import make_course  # noqa: E402

KINDS = ["full", "blank", "partial", "reference"]
CLASSES = (300, 1000)


def step_of(command: list[str]) -> str:
    """Which step of a student's grading a sandboxed command is."""
    text = " ".join(command)
    if "nbgrader autograde" in text:
        return "feedback run"
    if "hidden_tests.py" in text:
        return "hidden tests"
    return "other sandboxed runs"


class Clock:
    """Times every sandboxed run of each student's grading (runs.run_sandboxed, in the thread
    that grades that student) and keeps each run's peak memory."""

    def __init__(self):
        self.local, self.lock = threading.local(), threading.Lock()
        self.steps = defaultdict(lambda: defaultdict(float))  # student -> step -> seconds
        self.memory = defaultdict(int)                          # step -> peak bytes of one sandbox
        self.run_sandboxed, self.grade_student = runs.run_sandboxed, schedule.grade_student

    def __enter__(self):
        def grade_student(course, assignment, student, *args):
            self.local.student = student
            return self.grade_student(course, assignment, student, *args)

        def run_sandboxed(command, **kwargs):
            started = time.monotonic()
            outcome = self.run_sandboxed(command, **kwargs)
            student = getattr(self.local, "student", None)
            if student is not None:  # not the environment check, made once before anyone
                with self.lock:
                    self.steps[student][step_of(command)] += time.monotonic() - started
                    self.memory[step_of(command)] = max(self.memory[step_of(command)], outcome.memory_bytes or 0)
            return outcome

        schedule.grade_student, runs.run_sandboxed = grade_student, run_sandboxed
        return self

    def __exit__(self, *exc):
        schedule.grade_student, runs.run_sandboxed = self.grade_student, self.run_sandboxed


def make_class(course: Path, assignment: str, count: int) -> None:
    fabricated = fabricate.submissions(assignment)
    make_course(course, [assignment])
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        fabricate.write_submission(course, assignment, f"s{i:03d}_{kind}", fabricated[kind])


def measure(course: Path, assignment: str, jobs: int, feedback: bool, timeout: int):
    """(Report, Clock) of grading the whole class at `jobs`, into an empty gradebook."""
    for folder in ("autograded", "feedback"):
        shutil.rmtree(course / folder, ignore_errors=True)
    (course / "gradebook.db").unlink(missing_ok=True)
    with Clock() as clock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = schedule.grade(course, assignment, workers=jobs, feedback=feedback, timeout=timeout, progress=True)
    return report, clock


def per_student(report, clock) -> dict[str, float]:
    """Mean seconds per student of each step, the set-up being what the sandboxed runs leave."""
    students = list(report.seconds)
    steps = sorted({step for s in students for step in clock.steps[s]})
    means = {step: sum(clock.steps[s][step] for s in students) / len(students) for step in steps}
    means["set-up"] = sum(report.seconds[s] - sum(clock.steps[s].values()) for s in students) / len(students)
    means["total"] = sum(report.seconds.values()) / len(students)
    return means


def hours(students: int, per_minute: float) -> str:
    minutes = students / per_minute
    return f"{minutes / 60:.1f} h" if minutes >= 90 else f"{minutes:.0f} min"


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assignment", default="ex4_softmax_stability")
    parser.add_argument("--students", type=int, default=4 * cores)
    parser.add_argument("--jobs", default=",".join(str(j) for j in range(1, cores + 1)),
                        help=f"comma-separated (default: 1 to the {cores} cores here)")
    parser.add_argument("--no-feedback", action="store_true", help="grades only, as `grade --no-feedback`")
    parser.add_argument("--timeout", type=int, default=60)
    args = parser.parse_args()
    jobs = [int(j) for j in args.jobs.split(",")]
    load = os.getloadavg()
    print(f"{args.students} students of {args.assignment}, {'without' if args.no_feedback else 'with'} the feedback "
          f"run; {cores} cores; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} before", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as scratch:
        course = Path(scratch) / "course"
        make_class(course, args.assignment, args.students)
        for j in jobs:
            results[j] = measure(course, args.assignment, j, not args.no_feedback, args.timeout)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} after")

    steps = per_student(*results[jobs[0]])
    print(f"\nseconds per student at --jobs {jobs[0]}: " +
          ", ".join(f"{step} {seconds:.2f}" for step, seconds in steps.items()))
    memory = results[jobs[0]][1].memory
    print("peak memory of one sandbox: " + ", ".join(f"{step} {peak / 2**20:.0f} MiB" for step, peak in memory.items()) +
          f" (schedule.JOB_MEMORY, the --jobs default's unit: {schedule.JOB_MEMORY / 2**20:.0f} MiB)")
    print(f"\n{'jobs':>4} {'wall s':>8} {'students/min':>13} {'speed-up':>9} {'not graded':>11}   "
          + "   ".join(f"{n} students" for n in CLASSES))
    base = None
    for j, (report, _) in results.items():
        rate = 60 * len(report.seconds) / report.wall_seconds
        base = base or rate
        print(f"{j:>4} {report.wall_seconds:>8.0f} {rate:>13.1f} {rate / base:>8.2f}x {len(report.not_graded):>11}   "
              + "   ".join(f"{hours(n, rate):>{len(str(n)) + 9}}" for n in CLASSES))
    best = max(60 * len(r.seconds) / r.wall_seconds for r, _ in results.values())
    print(f"\nper core: {best / max(jobs):.1f} students per minute; N such machines as shards: N times that "
          f"({', '.join(f'{n} students on 4 machines: {hours(n, 4 * best)}' for n in CLASSES)})")


if __name__ == "__main__":
    main()
