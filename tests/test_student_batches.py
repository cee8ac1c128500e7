"""Many students' hidden tests in one sandbox, one after another (grader/runs.py, run_students;
grader/hidden_tests.py, `students`): each gets the records a run of their own gives, nothing one
leaves reaches the next, and one that ends or stops the run costs the students after it only a run
of their own, never a grade. The whole path, with real exercises and the hostile corpus, is graded
through these batches in tests/test_exercises.py and tests/test_hostile_corpus.py.
"""
import os
import time

import pytest

from grader import runs, sandbox as sandboxing
from grader.withheld import library_copy

NO_SANDBOX = runs.sandbox_problem()
pytestmark = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")

# What a student's answer sees of what others left: /tmp (what is this user's there: the sandbox may
# show a course or an environment that lives under /tmp, in root's folders), and System V shared memory
TMP_SEEN = ("import os\nseen = sorted(e for e in os.listdir('/tmp') if os.stat('/tmp/' + e).st_uid == os.getuid())\n"
            "seen += open('/proc/sysvipc/shm').read().splitlines()[1:]\n"
            "def f():\n    return seen\n")
LEAVES = ("import os, ctypes\nos.makedirs('/tmp/kept/inner')\nopen('/tmp/kept/inner/answers.py', 'w').write('x = 1')\n"
          "os.chmod('/tmp/kept/inner', 0)\nos.chmod('/tmp/kept', 0o500)\nopen('/tmp/home/.pythonrc', 'w').write('')\n"
          "assert ctypes.CDLL(None).shmget(0, 2**20, 0o1600) >= 0\n"
          "def f():\n    return ['home']\n")
# The batch's first process: the parent of the process that forks the parts (hidden_tests.students).
FIRST = "int(open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()[1])"


def job(cells: str) -> dict:
    return {"secret": "s" * 64, "timeout": 5, "setup": "import os, signal",
            "parts": [{"test_id": "p1_tests", "names": ["f"], "cells": [["p1_solution", cells]],
                       "test": "assert f() == ['home'], f()"}]}


def stopped(records) -> list:
    assert None not in records, records  # every student graded in the batch
    return [r["p1_tests"]["stopped"] for r in records]


def test_nothing_a_student_leaves_in_tmp_reaches_the_next_one(tmp_path):
    library = library_copy([], tmp_path / "library")
    batch = runs.run_students(tmp_path / "batch", [job(TMP_SEEN), job(LEAVES), job(TMP_SEEN)], 5, library)
    assert stopped(batch) == [None, None, None]  # /tmp held HOME alone and no segment, before and after
    alone, problem = runs.run_hidden_tests(tmp_path / "alone", {**job(TMP_SEEN), "sandboxed": True}, True, 5, library)
    assert problem is None and batch[0] == alone


def test_a_student_who_ends_the_batch_leaves_the_students_after_them_to_runs_of_their_own(tmp_path):
    library = library_copy([], tmp_path / "library")
    kills = TMP_SEEN + f"os.kill({FIRST}, signal.SIGKILL)\n"
    batch = runs.run_students(tmp_path / "batch", [job(TMP_SEEN), job(kills), job(TMP_SEEN)], 5, library)
    assert stopped(batch[:1]) == [None] and batch[1:] == [None, None]
    ends_its_own = "os.kill(os.getppid(), signal.SIGKILL)\n" + TMP_SEEN
    batch = runs.run_students(tmp_path / "batch2", [job(ends_its_own), job(TMP_SEEN)], 5, library)
    assert batch == [None, None]


# Red team 15: what a student's process may change in the first one, which every later student of
# the batch would inherit: a limit lowered (every later part failed), the session's nice value
# (red team 15b), a scheduling slice (red team 16, B03: sched_setattr's runtime, Linux 6.12 on).
SLICE = ("import ctypes, platform, struct\n"  # struct sched_attr: SCHED_OTHER, a 100 ms slice
         "call = {'x86_64': 314, 'aarch64': 274}[platform.machine()]\n"
         "attributes = struct.pack('=IIQiIQQQ', 48, 0, 0, 0, 0, 100_000_000, 0, 0)\n"
         "assert ctypes.CDLL(None).syscall(call, PID, attributes, 0) == 0\n")
CHANGES = {"a CPU-time limit": f"import resource\nresource.prlimit({FIRST}, resource.RLIMIT_CPU, (40, 40))\n",
           "the session's nice value": ("import ctypes\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable: its /proc files its own\n"
                                        "open('/proc/self/autogroup', 'w').write('19')\n"),
           "a scheduling slice": SLICE.replace("PID", FIRST)}


def kernel_keeps_a_slice() -> bool:
    """Whether this kernel keeps a SCHED_OTHER slice that sched_setattr sets (EEVDF, Linux 6.12 on)."""
    import subprocess
    import sys
    check = SLICE.replace("PID", "0") + ("got = ctypes.create_string_buffer(56)\n"  # sched_getattr
                                          "ctypes.CDLL(None).syscall(call + 1, 0, got, 56, 0)\n"
                                          "print(struct.unpack_from('=Q', got.raw, 24)[0])\n")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "100000000"


@pytest.mark.parametrize("change", CHANGES)
def test_a_student_who_changes_the_first_process_ends_the_batch_there(tmp_path, change):
    if "autogroup" in CHANGES[change] and not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroups")
    if change == "a scheduling slice" and not kernel_keeps_a_slice():
        pytest.skip("this kernel keeps no slice of a process's own (Linux 6.12 on)")
    library = library_copy([], tmp_path / "library")
    batch = runs.run_students(tmp_path / "batch", [job(TMP_SEEN), job(CHANGES[change] + TMP_SEEN), job(TMP_SEEN)],
                              5, library)
    assert stopped(batch[:1]) == [None] and batch[1:] == [None, None]


def test_a_run_silent_past_its_stall_limit_is_ended_as_stalled():
    started = time.monotonic()
    outcome = sandboxing.run(["/bin/sh", "-c", "echo first >&3; sleep 60"], limits=sandboxing.Limits(seconds=60, cpu_seconds=60),
                             sandbox=False, stall_seconds=1)
    assert outcome.killed == "stalled" and outcome.result == b"first\n" and time.monotonic() - started < 30
