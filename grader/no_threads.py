"""No threads and no processes in a part's hidden-test run, enforced by the kernel (issue 45).
Runs student code (in a sandbox): grader/runs.py copies it beside grader/hidden_tests.py into the
hidden-test sandbox, and each part's child calls `forbid()` after the set-up cell, before any
answer cell runs in that process. It imports nothing of `grader` or `mpcourse`.

    problem() -> why this machine cannot forbid them, or None
    forbid()  -> from now on this process cannot start a thread or a process (RuntimeError if it
                 cannot be made so: the run then fails, as a grader failure, never a grade)

Why: `mpcourse.grading.own_work` watches the calls of a student's function with a profiler that
only the calling thread and threads started later get; a thread started earlier (in an answer
cell), or a child process (whose calls no profiler of ours sees), computed with what a part
forbids, unwatched. After `forbid()` the kernel refuses them, whatever the process does:

- a seccomp filter (`prctl(PR_SET_NO_NEW_PRIVS)`, then `seccomp(SECCOMP_SET_MODE_FILTER)`) makes
  `clone` fail with EAGAIN (threads and processes alike: `fork`, `vfork`, `posix_spawn` and
  `pthread_create` all come down to it), `fork` and `vfork` with EAGAIN, and `clone3` with ENOSYS
  (so that the C library falls back to `clone`, refused as well). A seccomp filter cannot be
  removed or loosened by the process, nor by its children: it lasts until the process ends;
- `execve` and `execveat` fail with EPERM: a new program in the same process would run unwatched;
- a system call of another architecture's numbering (`int 0x80`'s i386 table, the x32 one on
  x86_64) is refused with EPERM, whatever it is: the filter knows one table per machine;
- a machine whose table this module does not know is refused before anything runs (`problem`).

Python's own ways in (`threading`, `_thread`, `os.fork`, `subprocess`, `multiprocessing`, ...) are
also replaced by functions that raise with a message saying why ("threads cannot be started while
your work is graded"): only for the message; code that restores them meets the kernel's refusal.
The maths libraries start no thread of their own after it: `forbid` sets torch's intra-op and
inter-op pools, OpenBLAS and OpenMP to one thread (the sandbox gives one CPU: grader/runs.py
`threads`) before the filter, and `torch.set_num_threads(n)` keeps one thread after it (libgomp,
asked for more, would end the process: an honest answer that asks for more threads must not lose
its part). What still needs a thread or a process (torch.compile's compiler, a DataLoader's
workers) fails with the message; no exercise asks for one.
"""
import ctypes
import errno
import os
import platform
import struct
import sys

THREADS_REFUSED = "threads cannot be started while your work is graded"
PROCESSES_REFUSED = "processes cannot be started while your work is graded"

# Per machine: (AUDIT_ARCH_* of its native system calls, {system call: number} of those to refuse,
# the number of `clone3`, the bit that marks another table (x32) or None).
MACHINES = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58}, 435, 0x40000000),
    "aarch64": (0xC00000B7, {"clone": 220}, 435, None),
}
# And `execve`, `execveat`: a new program in this process, unwatched, could compute the answers and
# write a record of them (review 74: after forbid(), os.execv ran a fresh Python with no profiler).
EXECS = {"x86_64": {"execve": 59, "execveat": 322}, "aarch64": {"execve": 221, "execveat": 281}}
PROGRAMS_REFUSED = "other programs cannot be run while your work is graded"
PR_SET_NO_NEW_PRIVS, PR_GET_SECCOMP = 38, 21
SECCOMP_SET_MODE_FILTER = 1
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
# BPF
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


def _instruction(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str) -> bytes:
    """The filter for `machine`, as the kernel's `struct sock_filter` array."""
    _, refused, clone3, _ = MACHINES[machine]
    return refusing(machine, {clone3: errno.ENOSYS, **{number: errno.EAGAIN for number in refused.values()},
                              **{number: errno.EPERM for number in EXECS[machine].values()}})


def refusing(machine: str, refused: dict[int, int], socket_call: int | None = None,
             socket_families: tuple[int, ...] = ()) -> bytes:
    """A filter for `machine` that fails each system call numbered in `refused` with its error,
    `socket_call` (the socket system call's number) with EPERM for each of `socket_families`, and
    every call of another architecture's table with EPERM, and lets the rest through (also used by
    grader/sandbox.py for the whole sandbox)."""
    arch, _, _, other_table = MACHINES[machine]
    code = [_instruction(LD_W_ABS, 0, 0, 4),                     # A = seccomp_data.arch
            _instruction(JEQ_K, 1, 0, arch),                     # native: go on
            _instruction(RET_K, 0, 0, RET_ERRNO | errno.EPERM),  # another architecture's call
            _instruction(LD_W_ABS, 0, 0, 0)]                     # A = seccomp_data.nr
    if other_table is not None:
        code += [_instruction(JGE_K, 0, 1, other_table),
                 _instruction(RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
    for number, error in refused.items():
        code += [_instruction(JEQ_K, 0, 1, number), _instruction(RET_K, 0, 0, RET_ERRNO | error)]
    if socket_call is not None and socket_families:
        code += [_instruction(JEQ_K, 0, 1 + 2 * len(socket_families), socket_call),
                 _instruction(LD_W_ABS, 0, 0, 16)]                # A = the low word of args[0], the family
        for family in socket_families:
            code += [_instruction(JEQ_K, 0, 1, family), _instruction(RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
    return b"".join(code + [_instruction(RET_K, 0, 0, RET_ALLOW)])


def problem() -> str | None:
    """Why `forbid` cannot work on this machine, or None."""
    machine = platform.machine()
    if machine not in MACHINES or not sys.platform.startswith("linux"):
        return f"threads cannot be forbidden on this machine ({sys.platform} {machine}): no seccomp filter for it"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return f"this kernel has no seccomp ({os.strerror(ctypes.get_errno())})"
    return None


def _refuse(message: str, kind=RuntimeError):
    def refused(*args, **kwargs):
        raise kind(message) if kind is RuntimeError else kind(
            errno.EPERM if kind is PermissionError else errno.EAGAIN, message)
    return refused


def _replace_python_ways_in() -> None:
    """The messages: Python's functions that start threads or processes raise, saying why."""
    import _thread
    import threading
    for owner, name in [(_thread, "start_new_thread"), (_thread, "start_new"), (_thread, "start_joinable_thread"),
                        (threading, "_start_new_thread"), (threading, "_start_joinable_thread")]:
        if hasattr(owner, name):
            setattr(owner, name, _refuse(THREADS_REFUSED))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _refuse(PROCESSES_REFUSED, BlockingIOError))
    for name in ("execv", "execve"):  # os.execl, execlp, execvp, ... call these
        setattr(os, name, _refuse(PROGRAMS_REFUSED, PermissionError))
    try:
        import _posixsubprocess
        _posixsubprocess.fork_exec = _refuse(PROCESSES_REFUSED, BlockingIOError)
    except ImportError:
        pass
    if hasattr(sys.modules.get("subprocess"), "_fork_exec"):
        sys.modules["subprocess"]._fork_exec = _posixsubprocess.fork_exec
    torch = sys.modules.get("torch")
    if torch is not None:  # an honest answer may ask torch for more threads: OpenMP would end the process
        for name in ("set_num_threads", "set_num_interop_threads"):
            setattr(torch, name, _one_thread_still(getattr(torch, name)))


def _one_thread_still(original):
    """torch.set_num_threads(n) as checked by torch, that keeps one thread: OpenMP, asked for more,
    fails to start them and ends the process (`libgomp: Thread creation failed`)."""
    def set_threads(count):
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return original(count)  # torch's own error
        return None
    set_threads.__name__ = set_threads.__qualname__ = original.__name__
    set_threads.__doc__ = original.__doc__
    return set_threads


# The thread-count setters of the BLAS and OpenMP libraries a process may have loaded (NumPy's
# OpenBLAS, by its several names; torch's own are set by torch.set_num_threads).
SETTERS = ("openblas_set_num_threads", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
           "scipy_openblas_set_num_threads64_", "MKL_Set_Num_Threads", "omp_set_num_threads")


def _one_maths_thread() -> None:
    """Every maths library loaded computes on the calling thread from now on: a pool that would
    start its threads lazily (OpenBLAS restarts its pool after a fork) starts none. OpenBLAS that
    cannot start a thread it wants raises SIGINT: an honest part would stop."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already started: at most the one thread it has, started before the filter
            pass
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split(None, 5)[5].strip() for line in maps if ".so" in line and len(line.split(None, 5)) == 6}
    except OSError:
        libraries = set()
    for path in sorted(libraries):
        if not any(word in path.lower() for word in ("blas", "mkl", "omp")):
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter(1)


def forbid() -> None:
    """From now on neither this process nor anything it runs can start a thread or a process."""
    why = problem()
    if why:
        raise RuntimeError(why)
    _one_maths_thread()
    machine = platform.machine()
    code = program(machine)
    filter_array = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(code) // 8, ctypes.cast(filter_array, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise RuntimeError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(SYS_SECCOMP[machine]), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                    ctypes.c_long(0), ctypes.byref(fprog)) != 0:
        raise RuntimeError(f"the seccomp filter could not be installed: {os.strerror(ctypes.get_errno())}")
    _replace_python_ways_in()
