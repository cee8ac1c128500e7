"""Runs one student's hidden tests, or the instructor's reference solution under the same tests (or,
with `--students`, many students' hidden tests one after another: `students`, below).
Runs student code: the untrusted half of the grader, started by grader/runs.py inside a sandbox of
its own, where it is copied alone with grader/no_threads.py (it imports nothing else of `grader`,
only `mpcourse`). It never
sees the student's notebook, only the job, on its stdin:

    {"secret": "...", "timeout": 60, "setup": "<the instructor's set-up cell>",
     "parts": [{"test_id": "p1_tests", "cells": [["p1_solution", "<answer code>"], ...],
                "names": ["naive_softmax", ...], "test": "<the part's test cell>"}, ...]}

For each part it forks a child (numpy, torch, matplotlib.pyplot and the checker are imported
before any answer code and before the fork). The reference's job may list `secrets` instead of one
`secret` (grader/runs.py, run_references): each secret's parts then run, in turn, each in a child
of its own, and the result is a list of records, one per secret. The child runs the set-up cell twice, into two namespaces: the answer cells
run in one, the test cell in the other, which receives only the names the exercise asks for
(`names`), so nothing an answer cell rebinds (`grading`, `torch`, ...) reaches the tests. The
answer cells run as the notebook ran them: help lines (`name?`) are comments (grader/notebooks.py),
`display` and `input` exist (a module exists only where a cell of the job imports it, as in the
notebook: student walkthrough 48g, D4), and an answer cell that
raises (a try-out line that used something of the notebook's outside the answer cells) does not
stop the part: what it defined is tested,
and the failure message names the cell. The tests' random generators start as the set-up cell
left them, whatever the answer cells drew. After the set-up cell and before the first answer cell
the child forbids itself threads and processes (grader/no_threads.py, a seccomp filter): the
own-work watcher then sees every call the answer makes. If that cannot be done, the run fails (a
grader failure: nobody is graded on a part that runs unguarded).

The child decides nothing. `mpcourse.grading` runs in observing mode there: each check records
what the answer did, as data (grader/judge.py compares those records with the reference's), and
the record goes back on a pipe with the error that stopped the tests, if any. A child that hangs,
ignores signals or exits is killed or ignored after `timeout` seconds of CPU time (or four times
that of wall-clock time: a loaded machine does not fail an honest slow part) and that part's
record says so. Code written against this runner can write any record it likes: it still needs
the right values on the secret inputs to match the reference's.

Prints one line per part, RECORD<tab>[0, "p1_tests"]<tab>{"observations": [...], "stopped": null} (a
batch: the secret's number in place of 0), then RESULT <the number of secrets run>, and exits 0. A
part's record is its own line so that the grader checks each record's size before it parses it,
and a record too large to read (mpcourse.records.record_problem) costs that part only: its record
then says why, and carries "refused" (a review flag).
"""
import __future__
import ast
import contextlib
import ctypes
import json
import math  # noqa: F401  (imported before any student code, as the tests expect)
import os
import random  # noqa: F401
import resource
import re
import select
import signal
import sys
import time

import numpy  # noqa: F401
import torch  # noqa: F401
import torch.nn.functional  # noqa: F401

import no_threads  # beside this file (grader/runs.py copies both)
try:  # every exercise's set-up cell imports it: once here, not once per part (~0.5 s each)
    import matplotlib.pyplot  # noqa: F401
except Exception:  # noqa: BLE001  the set-up cell's own import says what is wrong
    pass

from mpcourse import grading


# The compiler flags of the `from __future__` imports run so far in this process: a notebook keeps
# them for the cells after (IPython does), and each statement here is compiled on its own, so a
# statement after `from __future__ import annotations` lost it (red team 45g, A06: a class method
# annotated with its own class raised NameError, 0/3 for an honest answer).
FUTURE = [0]


def run_cell(source: str, name: str, namespace: dict) -> str | None:
    """Run an answer cell's top-level statements in turn in `namespace`; one that raises does not
    stop the ones after it: a try-out line at the top of a cell (`print(f(a))`, `a` made by a cell of
    the notebook that grading does not run) would otherwise leave the functions below it undefined
    (red team 45c, A03d). The first error's description, or None. Exiting (SystemExit, ...) is no
    try-out: it propagates."""
    try:
        statements = ast.parse(source, name).body
    except Exception as error:  # noqa: BLE001  a cell that does not parse defines nothing
        return describe(error)
    first = None
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            for alias in statement.names:
                FUTURE[0] |= getattr(getattr(__future__, alias.name, None), "compiler_flag", 0)
        try:
            exec(compile(ast.Module([statement], type_ignores=[]), name, "exec", flags=FUTURE[0], dont_inherit=True),
                 namespace)
        except Exception as error:  # noqa: BLE001  what the cell defines elsewhere is still tested
            first = first or describe(error)
    return first


def describe(error: BaseException) -> str:
    """`Type: message` of an exception, without trusting the exception's own methods."""
    try:
        text = BaseException.__str__(error)
    except Exception:  # noqa: BLE001
        text = ""
    return f"{type(error).__name__}: {text}"[:2000] if text else type(error).__name__


class Shell:
    """`get_ipython()` as a notebook exported to Python calls it: `get_ipython().run_line_magic("time",
    "f(x)")` for `%time f(x)`, `.system("ls")` for `!ls`. Like those lines in a cell (grader/notebooks.py,
    `without_magics`), each call runs nothing and gives None (issue 48: a NameError cost the part)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


# What a notebook gives an answer cell that plain Python does not: display(...) shows (here: to
# nowhere), input() waits for an answer (here: an empty one, as if the student pressed Enter),
# get_ipython() is the notebook's shell (here: one that runs no magic).
NOTEBOOK_HABITS = {"display": lambda *objects, **options: None, "input": lambda prompt="": "",
                   "get_ipython": lambda: SHELL}
SHELL = Shell()

def rng_state() -> tuple:
    import random
    return (random.getstate(), numpy.random.get_state(), torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def set_rng_state(state: tuple) -> None:
    import random
    random.setstate(state[0])
    numpy.random.set_state(state[1])
    torch.set_rng_state(state[2])
    if state[3] is not None:
        torch.cuda.set_rng_state_all(state[3])


def run_part(job: dict, part: dict, record_fd: int, guard_fd: int) -> None:
    """In the child: run the answer cells and the part's tests observing, write the record, exit.
    `guard_fd`: where it says, before any answer cell, whether threads could be forbidden (then
    closed: no answer cell can write there)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    seconds = int(job["timeout"])
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 2))  # then SIGXCPU, then SIGKILL
    stopped = []  # answer cells that raised: a try-out line may need what the notebook had around it
    observations: list = []
    early: list = []  # what the answer cells called that the part's tests forbid its functions (watched_early)
    hooks_tried: list = []  # audit hooks and monitoring callbacks the answer tried to add (refuse_unwatched_callbacks)
    try:
        tests = {"__name__": "__main__"}
        exec(compile(job["setup"], "<set-up cell>", "exec"), tests)
        answers = {"__name__": "__main__"}
        exec(compile(job["setup"], "<set-up cell>", "exec"), answers)
        answers.update(NOTEBOOK_HABITS)
        random_state = rng_state()  # as the set-up cell left it
        before = modules_now()
        forbid_threads(guard_fd)
        refuse_unwatched_callbacks(hooks_tried)
        with watched_early(part["test"], early):
            for cell_id, source in part["cells"]:
                error = run_cell(source, f"<{whose(cell_id)}>", answers)
                if error:
                    stopped.append((cell_id, f"{whose(cell_id)} raised {error}"))
        changed = modules_changed(before)
        if changed:
            record = {"observations": [], "stopped": f"the tests of this part did not run: the answer {changed}",
                      "refused": f"{changed} (the tests could then call what the answer chose)"}
            write_record(record, record_fd)
        tests.update({name: answers[name] for name in part["names"] if name in answers})
        set_rng_state(random_state)  # the tests draw the same numbers whatever the answers drew
        # The secret only now: an answer cell that calls grading.seed(n) gets n, the visible tests' seed,
        # and cannot draw the hidden inputs in advance (red team 18, A2 and A3).
        grading._secret = before[1]["mpcourse.grading"]["_secret"] = job["secret"]
        grading._observations = observations
        before[1]["mpcourse.grading"]["_observations"] = observations  # and no other list (red team 17b, B4)
        exec(compile(part["test"], f"<tests of {part['test_id']}>", "exec"), tests)
        changed = modules_changed(before)  # by the answer's functions, called by the tests
        if changed:
            record = {"observations": [], "stopped": f"the tests of this part were changed as they ran: the answer {changed}",
                      "refused": f"{changed} (the tests could then call what the answer chose)"}
            write_record(record, record_fd)
        record = {"observations": observations, "stopped": None, **early_flag(early)}
    except BaseException as error:  # noqa: BLE001
        said, raised = describe(error), grading.raised_in  # the call own_work made, if it raised this
        if type(raised) is tuple and len(raised) == 2 and raised[0] is error and type(raised[1]) is str:
            said = f"{raised[1][:300]} raised {said}"  # plain data only: no method of the student's runs here
        record = {"observations": observations, "stopped": failure(said, stopped, part["test_id"]), **early_flag(early)}
    if hooks_tried:
        record["flagged"] = "; ".join(filter(None, (record.get("flagged"), UNWATCHED_CALLBACKS)))[:500]
    write_record(record, record_fd)


# Code that CPython runs with profilers and tracers off: an audit hook, when the answer raises its
# event (sys.audit), and on Python 3.12 and later a sys.monitoring callback. What such code computed
# went unseen by the own-work check and the check of forbidden calls (red team 21, A03 and A04:
# scipy's softmax in ex4 Part 3, the library's matmul_bytes in ex5 Part 3, full marks, unflagged).
# No hook is added and no monitoring tool is free, whoever asks (on Python 3.12 an installed package
# may ask: filelock, for its fork safety, which a run without processes needs not).
UNWATCHED_CALLBACKS = ("the answer tried to add an audit hook (sys.addaudithook) or a sys.monitoring callback, whose "
                       "code would run unseen by the checks: none was added")
MONITORING = ("use_tool_id", "free_tool_id", "clear_tool_id", "register_callback", "set_events", "set_local_events")


def refuse_unwatched_callbacks(tried: list) -> None:
    """From now on this process adds no audit hook: its own, added first, refuses each later one, which
    sys.addaudithook then drops without a word (CPython's rule for a hook that raises RuntimeError on
    that event; a hook cannot be removed from Python). Every sys.monitoring tool is taken, and the
    functions that would free one or give it a callback are replaced by ones that refuse: the
    originals then have no reference left. `tried` counts the attempts, for the record's flag."""
    def refuse(event, args):
        if event == "sys.addaudithook":
            tried.append(event)
            raise RuntimeError("no audit hook is added while a part is graded")
    sys.addaudithook(refuse)
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:  # before Python 3.12
        return

    def refused(*args, **kwargs):
        tried.append("sys.monitoring")
        raise RuntimeError("sys.monitoring cannot be used while your work is graded")
    for tool in range(6):  # the tool ids Python code may take (sys.setprofile and sys.settrace have their own)
        if monitoring.get_tool(tool) is None:
            monitoring.use_tool_id(tool, "grader")
    for name in MONITORING:
        if hasattr(monitoring, name):
            setattr(monitoring, name, refused)


@contextlib.contextmanager
def watched_early(test: str, calls: list):
    """The answer cells watched as own_work watches the answer's functions, if the part's tests call
    own_work: what they call of the course library (importing a module of it aside), or of the torch
    functions the tests' start(...) forbids, goes into `calls`. Red team 18 (A1-A3): an answer cell
    ran the library, or torch.softmax, on every input the tests would use, before any watcher was
    on, and the function only looked the answers up: full marks, unseen. A call there is not a wrong
    answer (a try-out line may compare with torch's softmax): it flags the part for the instructor."""
    if "own_work" not in test:
        yield
        return
    forbidden, seen = frozenset(forbidden_in(test)), []
    try:
        with grading._watch_calls_into(grading._PACKAGE_DIR, grading._THIS_FILE, forbidden) as seen, \
                grading._forbidden_ops(forbidden, seen):
            yield
    finally:
        calls.extend(call for call in seen if not str(call).endswith(".<module>"))


def forbidden_in(test: str) -> list[str]:
    """The names a test cell's `start(part, forbidden=(...))` forbids (literal strings only)."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "start":
            for keyword in node.keywords:
                if keyword.arg == "forbidden" and isinstance(keyword.value, (ast.Tuple, ast.List)):
                    names += [e.value for e in keyword.value.elts if isinstance(e, ast.Constant) and type(e.value) is str]
    return names


def early_flag(calls: list) -> dict:
    """The record's flag for calls the answer cells made (watched_early), as plain text, or nothing."""
    named = sorted({str(call)[:80] for call in calls})
    if not named:
        return {}
    return {"flagged": (f"an answer cell called {', '.join(named[:5])} before the tests ran: answers computed there "
                        "and only looked up by the function pass the check of own work: read it")[:300]}


WATCHED = ("mpcourse.grading", "mpcourse.records")  # the modules the tests check with


# What the checking modules change themselves as the tests run: the part's forbidden set (start),
# the last call that raised (own_work), what is left of the record budget (records). Every other
# name they hold stays as this runner set it (the secret and the observations list after the answer
# cells).
STATE = {"mpcourse.grading": {"_forbidden", "raised_in"}, "mpcourse.records": {"_budget"}}
# Names torch's compiler (dynamo) adds to the module of a function it compiles (red team 17b, H1: an
# honest torch.compile(backend="eager") failed its part): none shadows a built-in.
COMPILER_NAMES = re.compile(r"__(builtins_dict_|compiled_fn_|resume_at_|import_|nested_resume_at_)")


def modules_now() -> tuple:
    """What the tests' checks rest on, before the answers run: each module in sys.modules and its
    class, and every name the checking modules hold (functions, modules, data) but their STATE."""
    modules = {name: (module, type(module)) for name, module in list(sys.modules.items())}
    held = {name: dict(vars(sys.modules[name])) for name in WATCHED if name in sys.modules}
    return modules, held


def modules_changed(before: tuple) -> str | None:
    """What the answers changed of `before` (modules_now), or None. Red team 16d, A: a subclass of
    the module type given to mpcourse.grading handed the tests an unwatched own_work and the tamper
    check the real one; 16e: a function of grading's that no check lists (`_is_forbidden`)
    replaced in its namespace, grading's own `sys` swapped, a copy of grading put in sys.modules.
    Each let a forbidden call pass unseen."""
    modules, held = before
    for name, (module, kind) in modules.items():
        now = sys.modules.get(name, module)
        if now is not module or type(now) is not kind:
            return f"replaced the module {name[:100]} or changed its class"
    for name, values in held.items():
        namespace = vars(modules[name][0])
        for key in list(namespace):  # a name added shadows a built-in the module calls (red team 17a, A8: frozenset)
            if key not in values and not (isinstance(key, str) and COMPILER_NAMES.match(key)):
                return f"added {name}.{str(key)[:100]}"
        for key, value in values.items():
            if key not in STATE.get(name, ()) and namespace.get(key) is not value:
                return f"replaced {name}.{key[:100]}"
    return None


def write_record(record: dict, record_fd: int) -> None:
    """Write `record` as JSON on `record_fd`, then end this process."""
    try:
        text = json.dumps(record)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps({"observations": [], "stopped": "the tests' record could not be written"})
    data = text.encode()
    while data:
        data = data[os.write(record_fd, data):]
    os._exit(0)


def whose(cell_id: str) -> str:
    """A cell of the job as the student knows it: the notebook's own example cells (grader/notebooks.py,
    `p3_example (code cell 9)`) are not theirs (student walkthrough 48f, C: "your cell p3_example")."""
    notebooks = cell_id.split("_", 1)[-1].startswith("example (")
    return f"the notebook's cell {cell_id}" if notebooks else f"your cell {cell_id}"


OTHER_PART_CHARS = 160  # the most of another part's cell's error kept in a message


def failure(said: str, stopped: list, test_id: str) -> str:
    """What stopped the part's tests (`said`) first, then the cells that raised before it: this
    part's own, then, shortened, other parts' (whose errors their own parts report in full). A
    message is cut where it is shown: the part's own failure comes first so that it is not what is
    lost (student walkthrough 48f, C: two other parts' errors came first, and the page cut the rest)."""
    part = test_id.split("_")[0]
    mine = [text for cell_id, text in stopped if cell_id.split("_")[0] == part]
    others = [text if len(text) <= OTHER_PART_CHARS else text[:OTHER_PART_CHARS] + " [...]"
              for cell_id, text in stopped if cell_id.split("_")[0] != part]
    return "; before it, ".join([said, "; ".join(mine + others)]) if stopped else said


def forbid_threads(guard_fd: int) -> None:
    """Forbid threads and processes (grader/no_threads.py); say on `guard_fd` if that failed, and
    then end the child: its part is not run unguarded."""
    try:
        no_threads.forbid()
    except BaseException as error:  # noqa: BLE001
        os.write(guard_fd, f"threads could not be forbidden: {describe(error)}".encode()[:4000])
        os._exit(0)
    finally:
        os.close(guard_fd)


def end_the_others() -> None:
    """Kill every process of this sandbox but this one and its parent (its pid namespace holds
    nothing else of ours; bubblewrap's pid 1 is root's; the parent is pid 1, or the batch's first
    process, `students`): what a part started in new sessions ends with the part, instead of slowing
    the next parts down."""
    for _ in range(3):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, os.getpid(), os.getppid()):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass


# The most a student's run writes of records, all parts together (the sandbox reads 60 MB of the
# result pipe, grader/sandbox.py): a part whose record would take them past it is refused.
RESULT_BYTES = 48 * 2**20


class GraderFailure(Exception):
    """The run cannot grade (threads could not be forbidden): nobody's grade, the run fails."""


def grade_part(job: dict, part: dict) -> dict:
    read_fd, write_fd = os.pipe()
    guard_read, guard_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.close(guard_read)
        os.setpgid(0, 0)
        run_part(job, part, write_fd, guard_write)
    os.close(write_fd)
    os.close(guard_write)
    deadline, chunks, size = time.monotonic() + 4 * job["timeout"], [], 0
    while size <= grading.RECORD_BYTES:  # one chunk past it at most
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(read_fd, 2**20) if ready else None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    timed_out = time.monotonic() >= deadline
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    os.close(read_fd)
    os.set_blocking(guard_read, False)
    try:
        guard = os.read(guard_read, 4096)  # written (if at all) and closed before any answer cell ran
    except BlockingIOError:  # held open by something the set-up cell started: nothing was written
        guard = b""
    os.close(guard_read)
    if guard:
        raise GraderFailure(guard.decode(errors="replace"))
    if job.get("sandboxed"):
        end_the_others()
    text = b"".join(chunks)
    too_large = grading.record_problem(text)  # before parsing it: red team 45c, A06b
    if too_large:
        return refused(too_large)
    try:
        record = json.loads(text)
        if isinstance(record, dict) and isinstance(record.get("observations"), list):
            return {"observations": record["observations"], "stopped": record.get("stopped"),
                    **{key: record[key][:300] for key in ("refused", "flagged") if isinstance(record.get(key), str)}}
    except (ValueError, RecursionError):
        pass
    cpu = os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL) and not timed_out
    reason = (f"did not finish within {job['timeout']} s of CPU time" if cpu
              else f"did not finish within {4 * job['timeout']} s" if timed_out
              else "ended the process before the tests finished")
    return {"observations": [], "stopped": f"the tests of this part {reason}"}


def refused(problem: str) -> dict:
    """The record of a part whose own record is not read: `problem` says why; "refused" flags it."""
    return {"observations": [], "stopped": f"the tests of this part {problem}", "refused": problem}


BATCH_BYTES = 24 * 2**20  # a batch stops after the record that takes its records past this


def batched(job: dict) -> list:
    """The reference's records for many secrets in one process (grader/runs.py, run_references):
    [{test_id: record}, ...], one per secret of `job["secrets"]`, in their order, or the first of
    them: it stops after the record that takes the records' JSON past `job["batch_bytes"]`
    (BATCH_BYTES), and the grader runs the rest in another process (a reference's records can be
    large: ex4's are 3 MB a secret, and 45 of them overflowed the result pipe). Each part of each
    secret runs in a child forked from this process, which runs no code of the job itself: every
    child starts from the state a fresh process gives the first (modules, random generators,
    torch's default dtype and threads), so a secret's record is the one a run of its own gives."""
    records, size = [], 0
    for secret in job["secrets"]:
        records.append({part["test_id"]: grade_part({**job, "secret": secret}, part) for part in job["parts"]})
        size += len(json.dumps(records[-1]))
        if size > job.get("batch_bytes", BATCH_BYTES):
            break
    return records


def main() -> None:
    # Not dumpable: the children cannot open this process's stdout or memory through /proc.
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    why = no_threads.problem()
    if why:
        sys.exit(f"grading refused: {why}")
    if sys.argv[1:] == ["--students"]:
        students()
    else:
        run_job(json.load(sys.stdin))  # over a pipe: no file to read the hidden tests or the seed from


def run_job(job: dict) -> None:
    """Grade `job`'s parts (or each secret's, a batch) and print their records, then RESULT."""
    try:
        if "secrets" in job:  # the reference's batch: each secret's parts as a job of their own (batched)
            results = batched(job)
        else:
            results = [{part["test_id"]: grade_part(job, part) for part in job["parts"]}]
    except GraderFailure as error:
        sys.exit(f"grading refused: {error}")
    written = 0
    for number, records in enumerate(results):
        for test_id, record in records.items():
            text = json.dumps(record)
            if written + len(text) > RESULT_BYTES and "secrets" not in job:  # a batch stops by itself (batched)
                text = json.dumps(refused(f"wrote a record that took the parts' records past what the grader "
                                          f"reads ({RESULT_BYTES // 2**20} MiB in all)"))
            written += len(text)
            print(f"RECORD\t{json.dumps([number, test_id])}\t{text}")
    print(f"RESULT {len(results)}", flush=True)


# --- many students, one after another, in one sandbox (grader/runs.py, run_students) -----------
#
# Importing torch and the rest is most of a student's run (1.7 of 2 s for ex4's four parts): a
# batch pays it once. The first process reads the batch's first line, {"students": N,
# "sandboxed": true}, and nothing else: it never holds a student's job, records or code, so that
# nothing of one student is in the memory the next one's processes start from. For each student
# in turn it forks a child that reads that student's job itself (a line with its length, then
# the JSON) and grades it as a run of its own would, each part in a child forked from it; then it
# kills every other process of the sandbox, empties /tmp (the only place a sandbox writes; the
# folders the sandbox itself put there are root's and stay: shown_in_tmp), and
# prints END <number> <status>. A student whose child did not end well ends the batch: the grader
# gives each student from that one on a run of their own. Answer cells start no process and no
# thread (grader/no_threads.py), and no process here can be traced or read by another (not
# dumpable: prctl above, inherited by every child). What a process of the same user may still
# change in another, and what the next student's processes would inherit or share, is checked or
# removed between students (red team 15: an answer cell lowered the first process's CPU-time
# limit with prlimit, and every later student of the batch lost every part; a System V shared
# memory segment outlived its student and held the batch's memory): the first process's limits,
# priority, scheduling and CPUs are compared with what they were when it started, and a change
# ends the batch (no limit lowered can be raised again); the sandbox's System V objects (its own
# IPC namespace) are removed.

def read_exactly(count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = os.read(0, count - len(data))
        if not chunk:
            raise EOFError("the batch ended early")
        data += chunk
    return bytes(data)


def read_line(limit: int = 200) -> bytes:
    """One line of stdin, read a byte at a time: nothing after it is read (the next line is the next
    student's, for their own process to read)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        if len(line) > limit:
            raise ValueError("a batch's header line is too long")
        line += read_exactly(1)
    return bytes(line)


def shown_in_tmp() -> set[str]:
    """What the sandbox itself put in /tmp, none of it this user's: the folders on the way to what it
    shows there (a Python environment or a course in a mktemp clone: grader/sandbox.py), made by
    root, read-only below. HOME (/tmp/home) is this user's: made again for each student."""
    return {entry.name for entry in os.scandir("/tmp") if entry.stat(follow_symlinks=False).st_uid != os.getuid()}


def empty_tmp(kept: set[str]) -> None:
    """Remove everything under /tmp but `kept` (shown_in_tmp: nothing a student can write to), a
    student's folders of any mode included (each made this user's to change first: red team 16, B02,
    a folder of mode 0 inside a read-only one), then make HOME again (unless the sandbox shows
    something at /tmp/home: it is kept)."""
    import shutil
    for entry in os.scandir("/tmp"):
        if entry.name in kept and entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        if entry.is_dir(follow_symlinks=False):
            folders = [entry.path]
            while folders:  # top down: a folder can be listed once it is ours to read
                folder = folders.pop()
                os.chmod(folder, 0o700)
                folders += [e.path for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    if set(os.listdir("/tmp")) != kept:
        raise RuntimeError("/tmp could not be emptied")
    os.makedirs("/tmp/home", exist_ok=True)


IOPRIO_GET = {"x86_64": 252, "aarch64": 31}  # the ioprio_get system call's number
SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}  # sched_getattr: the policy's attributes, the slice too


def sched_attributes() -> bytes:
    """This process's `struct sched_attr` as the kernel gives it (56 bytes): what sched_setattr may
    change beyond policy and priority (red team 16, B03: a 100 ms slice the next student inherited)."""
    import platform
    attributes = ctypes.create_string_buffer(56)
    ctypes.CDLL(None).syscall(SCHED_GETATTR.get(platform.machine(), -1), 0, attributes, 56, 0)
    return attributes.raw


def process_state() -> tuple:
    """What a process of the same user may change in this one and its children would inherit:
    limits, priority, scheduling (its attributes too), CPUs, I/O priority, and the session's
    autogroup nice value (red team 15b: /proc/self/autogroup, shared by every process of the
    sandbox's session)."""
    import platform
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    call = IOPRIO_GET.get(platform.machine())
    try:
        with open("/proc/self/autogroup") as file:
            autogroup = file.read().split()[-1]
    except OSError:  # a kernel without autogroups
        autogroup = None
    return (limits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority,
            sorted(os.sched_getaffinity(0)), call and ctypes.CDLL(None).syscall(call, 1, 0), autogroup,
            sched_attributes())


IPC_RMID = 0


def remove_ipc() -> None:
    """Remove every System V shared memory segment, message queue and semaphore set of this
    sandbox's IPC namespace (all of its processes are dead: a segment is freed with its removal)."""
    libc = ctypes.CDLL(None, use_errno=True)
    remove = {"shm": lambda i: libc.shmctl(i, IPC_RMID, None), "msg": lambda i: libc.msgctl(i, IPC_RMID, None),
              "sem": lambda i: libc.semctl(i, 0, IPC_RMID)}
    for kind, rm in remove.items():
        for line in open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]:
            rm(int(line.split()[1]))
        if open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]:
            raise RuntimeError(f"System V {kind} objects could not be removed")


def students() -> None:
    header = json.loads(read_line())
    if header.get("sandboxed") is not True:  # emptying /tmp is for a sandbox's own /tmp only
        sys.exit("grading refused: a batch of students runs in a sandbox only")
    started, kept = process_state(), shown_in_tmp()
    for number in range(int(header["students"])):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                run_job(json.loads(read_exactly(int(read_line()))))
                sys.stdout.flush()
                status = 0
            except BaseException as error:  # noqa: BLE001  SystemExit included: its message, then the status
                print(error if isinstance(error, SystemExit) else repr(error), file=sys.stderr, flush=True)
                status = 1
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        end_the_others()
        empty_tmp(kept)
        remove_ipc()
        if process_state() != started:
            sys.exit("the batch's first process was changed by a student's run: the students from this one on "
                     "get runs of their own")
        print(f"END {number} {status}", flush=True)
        if status != 0:
            return


if __name__ == "__main__":
    main()
