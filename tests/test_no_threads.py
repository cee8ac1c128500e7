"""grader/no_threads.py (issue 45): after `forbid()`, the kernel refuses every thread and process
the process tries to start, however it tries and whatever it undoes first, and the maths still
work. The attempts run in one fresh Python (the filter lasts as long as the process), forked after
NumPy's and torch's thread pools started, as a part's child is."""
import json
import os
import platform
import subprocess
import sys

import pytest

from grader import no_threads
from grader.course import ROOT

pytestmark = pytest.mark.skipif(no_threads.problem() is not None, reason=str(no_threads.problem()))

ATTEMPTS = {  # label: a statement that starts a thread or a process
    "thread": "threading.Thread(target=int).start()",
    "pool": "__import__('concurrent.futures').futures.ThreadPoolExecutor(1).submit(int).result()",
    "_thread": "_thread.start_new_thread(int, ())",
    "fork": "os.fork()",
    "subprocess": "subprocess.run(['/bin/true'])",
    "multiprocessing": "multiprocessing.get_context('fork').Pool(1).apply(int)",
    "posix_spawn": "os.posix_spawn('/bin/true', ['true'], {})",
    "exec": "os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])",  # review 74: a new program, unwatched
}
# Python's functions kept from before the filter, restored: the kernel's refusal remains.
KEPT = {
    "kept _thread": "originals[0](int, ())",
    "kept fork": "pid = originals[1]()\nif pid == 0: os._exit(0)",
    "kept exec": "originals[3](sys.executable, [sys.executable, '-c', 'print(1)'])",
    "restored spawn": ("_posixsubprocess.fork_exec = subprocess._fork_exec = originals[2]\n"
                       "multiprocessing.get_context('spawn').Process(target=int).start()"),
}
SCRIPT = f"""
import ctypes, errno, json, mmap, os, sys, threading, subprocess, multiprocessing, _thread, _posixsubprocess
sys.path.insert(0, {str(ROOT / "grader")!r})
import numpy, torch, no_threads
a = numpy.random.rand(800, 800)
a @ a  # NumPy's OpenBLAS pool started (a fork ends it; it restarts lazily), torch's too
torch.randn(500, 500) @ torch.randn(500, 500)
originals = (_thread.start_new_thread, os.fork, subprocess._fork_exec, os.execv)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
def attempt(label, code):
    try:
        exec(code, globals())
        out[label] = 'STARTED'
    except BaseException as error:
        out[label] = f'{{type(error).__name__}}: {{error}}'
pid = os.fork()
if pid == 0:
    no_threads.forbid()
    for label, code in {json.dumps({**ATTEMPTS, **KEPT})}.items():
        attempt(label, code)
    torch.set_num_threads(4)  # an honest answer may ask for more: it keeps one (libgomp would end the process)
    attempt('zero threads', 'torch.set_num_threads(0)')  # still torch's own error
    b = numpy.linalg.solve(a @ a + numpy.eye(800), a)
    x = torch.randn(600, 600, dtype=torch.float16, requires_grad=True)
    (x.float() @ x.float()).softmax(-1).logsumexp(-1).sum().backward()
    out['maths'] = [list(b.shape), list(x.grad.shape), torch.get_num_threads()]
    if {platform.machine() == "x86_64"}:
        tid = ctypes.c_ulong()
        callback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda arg: None)
        out['pthread_create'] = ctypes.CDLL('libc.so.6').pthread_create(ctypes.byref(tid), None, callback, None)
        for name, number, flags in [('clone', 56, 17), ('clone thread', 56, 0x50f00), ('fork', 57, 0), ('vfork', 58, 0),
                                    ('clone3', 435, 0), ('x32 clone', 0x40000000 | 56, 17), ('execve', 59, 0),
                                    ('execveat', 322, 0)]:
            result = libc.syscall(number, flags, 0, 0, 0, 0)
            if result == 0:
                os._exit(0)
            out['sys ' + name] = [result, errno.errorcode.get(ctypes.get_errno())]
        code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))  # mov eax, 20 (i386 getpid); int 0x80; ret
        out['int80 getpid'] = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
        # undoing it: seccomp mode 0 is refused; a filter that allows all is stacked, and loosens nothing
        out['disable'] = [libc.prctl(22, 0, 0, 0, 0), errno.errorcode.get(ctypes.get_errno())]
        allow = ctypes.create_string_buffer(no_threads._instruction(no_threads.RET_K, 0, 0, no_threads.RET_ALLOW), 8)
        class Program(ctypes.Structure):
            _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
        out['stacked'] = libc.syscall(ctypes.c_long(317), ctypes.c_long(1), ctypes.c_long(0),
                                      ctypes.byref(Program(1, ctypes.cast(allow, ctypes.c_void_p))))
        out['status'] = open('/proc/self/status').read().split('Seccomp:')[1].split()[0]
        result = libc.syscall(57)
        if result == 0:
            os._exit(0)
        out['fork after'] = result
    print('OUT ' + json.dumps(out), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def outcome():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "4", "OMP_NUM_THREADS": "4"})
    line = [line for line in result.stdout.splitlines() if line.startswith("OUT ")]
    assert line, result.stderr[-3000:]
    assert "pthread_create failed" not in result.stderr  # no maths library tried
    return json.loads(line[0].removeprefix("OUT "))


@pytest.mark.parametrize("label", ATTEMPTS)
def test_a_thread_or_a_process_is_refused_with_a_message_saying_why(outcome, label):
    why = (no_threads.PROCESSES_REFUSED if label in ("fork", "subprocess", "multiprocessing", "posix_spawn") else
           no_threads.PROGRAMS_REFUSED if label == "exec" else no_threads.THREADS_REFUSED)
    assert why in outcome[label], outcome[label]


@pytest.mark.parametrize("label", KEPT)
def test_the_kernel_refuses_what_python_functions_kept_from_before_try(outcome, label):
    assert ("can't start new thread" in outcome[label] or "Resource temporarily unavailable" in outcome[label]
            or label == "kept exec" and "Operation not permitted" in outcome[label]), outcome[label]


def test_the_maths_still_work_on_one_thread_however_many_the_libraries_or_the_answer_wanted(outcome):
    assert outcome["maths"] == [[800, 800], [600, 600], 1]
    assert outcome["zero threads"].startswith("RuntimeError"), outcome["zero threads"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64's system call numbers")
def test_the_system_calls_themselves_are_refused_and_the_filter_cannot_be_undone(outcome):
    assert outcome["pthread_create"] == 11  # EAGAIN
    for name in ("clone", "clone thread", "fork", "vfork"):
        assert outcome[f"sys {name}"] == [-1, "EAGAIN"], name
    assert outcome["sys clone3"] == [-1, "ENOSYS"] and outcome["sys x32 clone"] == [-1, "EPERM"]
    assert outcome["sys execve"] == outcome["sys execveat"] == [-1, "EPERM"]  # not EFAULT: refused before the path is read
    assert outcome["int80 getpid"] == -1  # -EPERM, not a pid
    assert outcome["disable"] == [-1, "EINVAL"] and outcome["status"] == "2" and outcome["fork after"] == -1


def test_an_unknown_machine_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(no_threads.platform, "machine", lambda: "sparc64")
    assert "sparc64" in no_threads.problem()
    with pytest.raises(RuntimeError, match="cannot be forbidden"):
        no_threads.forbid()
