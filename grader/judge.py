"""The judge: decides each part from two records. Never runs student code: it only reads data.

    judge(reference, student) -> {test_id: {"passed": bool, "message": str}}

Both records come from grader/hidden_tests.py: the instructor's reference solution and the student's
answers, each run in a sandbox under the same tests on the same secret inputs. Each part's
record is a list of observations (mpcourse.grading, observing mode) and the error that stopped the
tests, if any. A part passes when the student's tests ran to the end and the student's i-th
observation matches the reference's i-th, for every i, by the reference's rules:

- "close": the student's value within the reference's `atol + rtol*|expected|` of the reference's
  expected value (the student's copy of the tests never held one), with the same NaN and infinities;
- "equal": the student's value is the reference's expected value exactly (type, dtype, shape, NaN;
  an int and a float of one value count as the same);
- "reference": the student's value is the reference solution's own value (numbers within tolerance);
- "raises": the student's call raised one of the exceptions the tests expect (a subclass counts);
- "own_work": the student's function called nothing the part forbids.

Everything but the student's values (the kind of check, its tolerance, the expected value and what
it is called) is taken from the reference's record, so a forged record can only win with the right
values. The last two kinds are yes/no answers the student's process could forge: the guarantee is
that marks need correct values on the secret inputs (book/grading_guarantees.md). A reference that fails its
own checks, or records nothing for a part, is the instructor's problem: `ReferenceProblem`.
"""
import numpy as np

from mpcourse.records import (closeness_problem, difference, numbers_of, own_work_problem, raises_problem, same_data,
                              shown_data)

KINDS = ("close", "equal", "reference", "raises", "own_work")


class ReferenceProblem(RuntimeError):
    """The reference solution does not pass its own tests: fix the exercise, not the student."""


def as_numbers(record):
    """A recorded value as a float64 array (what `assert_close` compares), or a message."""
    if isinstance(record, dict) and "float" in record:
        try:
            return np.float64(float.fromhex(str(record["float"])))
        except (ValueError, OverflowError):
            return "not a number"
    if isinstance(record, dict) and "int" in record:
        try:
            return np.float64(int(str(record["int"])[:400]))
        except (ValueError, OverflowError):
            return "not a number"
    if isinstance(record, dict) and ("tensor" in record or "array" in record or "shape" in record):
        try:
            return numbers_of(record)
        except (ValueError, TypeError, OverflowError):
            return "a damaged array"
    if isinstance(record, dict) and "too_large" in record:
        return "too large to record"
    return "not a number, array or tensor"


def compare(reference: dict, student: dict) -> str | None:
    """Why the student's observation does not match the reference's (None if it does)."""
    kind, what = reference["check"], str(reference.get("what", "a check"))
    if kind == "close":
        expected = as_numbers(reference.get("expected"))
        if isinstance(expected, str):
            raise ReferenceProblem(f"the reference's expected value of {what!r} is {expected}")
        actual = as_numbers(student.get("actual"))
        if isinstance(actual, str):
            return f"{what} should be a number, array or tensor ({actual})"
        return closeness_problem(actual, expected, float(reference["rtol"]), float(reference["atol"]), what)
    if kind == "equal":
        if not same_data(reference.get("expected"), student.get("actual")):
            return f"{what}: {difference(reference.get('expected'), student.get('actual'))}"
        return None
    if kind == "reference":
        want, got = reference.get("actual"), student.get("actual")
        numeric = isinstance(want, dict) and not ({"float", "int", "tensor", "array"}.isdisjoint(want))
        if numeric and (reference["rtol"] or reference["atol"]):
            if isinstance(got, dict) and ("tensor" in got) != ("tensor" in want):
                return f"{what}: expected {shown_data(want)}, got {shown_data(got)}"
            for key in ("tensor", "array", "device"):
                if isinstance(got, dict) and got.get(key) != want.get(key):
                    return f"{what}: expected {shown_data(want)}, got {shown_data(got)}"
            actual = as_numbers(got)
            if isinstance(actual, str):
                return f"{what} should be a number, array or tensor ({actual})"
            return closeness_problem(actual, as_numbers(want), float(reference["rtol"]), float(reference["atol"]),
                                     what)
        return None if same_data(want, got) else f"{what}: {difference(want, got)}"
    if kind == "raises":
        raised = student.get("raised")
        raised = [str(name) for name in raised] if isinstance(raised, list) else None
        return raises_problem(what, [str(n) for n in reference["expected"]], raised, str(student.get("did", ""))[:300])
    if kind == "own_work":
        calls = student.get("calls")
        calls = [str(c) for c in calls][:5] if isinstance(calls, list) else ["(a damaged record of its calls)"]
        if student.get("forbidden") != reference.get("forbidden"):  # changed while the tests ran (red team 16f)
            calls.append("(the part's forbidden functions were replaced)")
        return own_work_problem(what, calls)
    raise ReferenceProblem(f"the reference recorded a check of an unknown kind: {kind!r}")


def self_check(test_id: str, record: dict) -> None:
    """The reference passes its own tests, or ReferenceProblem says where it does not."""
    if record.get("stopped"):
        raise ReferenceProblem(f"{test_id}: the reference solution's tests stopped: {record['stopped']}")
    observations = record.get("observations") or []
    if not observations:
        raise ReferenceProblem(f"{test_id}: the tests recorded nothing to compare (no grading check ran)")
    for number, observation in enumerate(observations, 1):
        if observation.get("check") not in KINDS:
            raise ReferenceProblem(f"{test_id}: check {number} is of an unknown kind")
        problem = compare(observation, observation)
        if problem:
            raise ReferenceProblem(f"{test_id}: the reference solution fails its own check {number}: {problem}")


def judge_part(reference: dict, student) -> dict:
    if not isinstance(student, dict) or not isinstance(student.get("observations"), list):
        return {"passed": False, "message": "the tests of this part sent back no record"}
    observations = student["observations"]
    stopped = student.get("stopped")
    stopped = str(stopped)[:2000] if stopped else None
    for number, expected in enumerate(reference["observations"]):
        got = observations[number] if number < len(observations) else None
        if not isinstance(got, dict):
            return {"passed": False, "message": stopped or f"the tests stopped before checking {expected.get('what')}"}
        if got.get("check") != expected["check"]:
            return {"passed": False, "message": stopped or (f"the tests ran differently from the reference solution's "
                                                            f"at {expected.get('what')}")}
        try:
            problem = compare(expected, got)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError):
            problem = f"{expected.get('what')}: a damaged record"
        if problem:
            return {"passed": False, "message": problem}
    if stopped:
        return {"passed": False, "message": stopped}
    if len(observations) != len(reference["observations"]):
        return {"passed": False, "message": "the tests ran differently from the reference solution's (more checks)"}
    return {"passed": True, "message": ""}


def judge(reference: dict, student: dict) -> dict:
    """{test_id: {"passed", "message"}} for every part of the reference's record."""
    for test_id, record in reference.items():
        self_check(test_id, record)
    student = student if isinstance(student, dict) else {}
    return {test_id: judge_part(record, student.get(test_id)) for test_id, record in reference.items()}

