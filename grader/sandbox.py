"""The sandbox a student's code runs in: what it sees, who it runs as, what it may use. Runs student
code: this is the boundary, and everything it runs is confined as below.

    run(command, show=[...], files={...}, limits=Limits(...), stdin=b"") -> Outcome

A list of what to *show*, not of what to hide. Inside bubblewrap the command sees:

- the system's programs and libraries (`/usr` and its links), a handful of files of `/etc` that
  programs read at start-up, a fresh `/dev` and `/proc` (its own processes only);
- read-only, at their own paths: `show` (the Python environment, the course library);
- read-only, at the paths given: `files` (the release, the student's notebook, ...);
- one writable place, `/tmp`, a RAM-backed folder of at most `tmpfs_bytes`. Nothing on the host's
  disk is writable, so nothing the sandbox writes can be followed or replaced afterwards.

Nothing else: not the course directory, not the repository, not the instructor's home or
environment (`--clearenv`; a minimal PATH and HOME), not the kernel's keyrings (a seccomp filter
on every process refuses `add_key`, `request_key`, `keyctl` and the kernel crypto sockets that can
load a key by its number; `/proc/keys` and `/proc/key-users` read as nothing; and the grader runs in
a session keyring of its own, empty), and no POSIX message queue (a zero `msgqueue` limit: nothing
one student of a batch leaves reaches the next). The command runs as a real unprivileged user
of its own (`UID_BASE` + slot, no capabilities, `no_new_privs`), so files only root may read
(`/etc/shadow`) stay unreadable even where they are shown. No network, its own process namespace:
every process it starts ends with it.

Limits: per process (`prlimit`) address space, CPU time, file size, core dumps and the number of
processes of its user; for the whole process tree (cgroup v1, nested under the grader's own
cgroups, where root may create them): processes (`pids.max`), memory including `/tmp`
(`memory.limit_in_bytes`, swap included), CPU (`cfs_quota`: at most `cpus` CPUs at once, so a
sandbox full of busy processes cannot starve its neighbour) and total CPU time (`cpuacct.usage`,
checked twice a second); the whole run ends after `seconds` of wall-clock time, and as soon as one of
its processes is found stopped (SIGSTOP, or a tracer's stop; checked once a second among the
processes its cgroups list, or without them those of its uid: `stopped_in`). What comes back:
the exit status, the last 20 kB of stdout and stderr, and at most `output_bytes` from file
descriptor 3 (a pipe: the only way a result leaves the sandbox).
"""
import errno
import fcntl
import grp
import itertools
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from grader import no_threads

# Sandbox slot k runs as uid and gid UID_BASE + k: far above the ranges that distributions give to
# users, services and containers' subordinate ids; a uid some account has is skipped. A process
# claims its slots machine-wide (a lock on CLAIMS/k, held until it exits), so two grading runs on one
# machine, or the test suite beside one, never share a uid, nor the per-uid process limit that a
# fork bomb exhausts (issue 46: a bomb in one run made every other run fail with "Cannot fork").
UID_BASE = 1_900_000_000
CLAIMS = Path("/run/mpcourse-sandbox-slots")
SLOTS = itertools.count()
SLOT_LOCK = threading.Lock()
FREE_SLOTS: list[int] = []
CLAIMED: dict[int, int] = {}  # slot: the file descriptor holding its lock
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "alternatives", "fonts",
       "mime.types")
TAIL = 20_000
CGROUP_ROOT = Path("/sys/fs/cgroup")
STOP = threading.Event()  # set: every sandbox running ends now (the grader was stopped)
MEMORY_BYTES = 4 * 2**30  # the most a sandbox's whole tree may take (schedule.JOB_MEMORY sets it aside)
# The kernel's keyrings belong to no namespace: bubblewrap and setpriv leave the sandbox holding the
# grader's session keyring (readable, erasable), a uid's persistent keyring outlives the sandbox for
# the next one of that uid, and request_key starts the host's helpers as root (red team 16: B07, B01,
# B03). Every process of a sandbox is refused the three calls (add_key, request_key, keyctl).
KEYRING_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
# Red team 16d (E): /proc/keys listed the grader's keys; a kernel crypto socket (AF_ALG) loads a
# key the process possesses by its number (ALG_SET_KEY_BY_KEY_SERIAL, Linux 6.2 on).
SOCKET_CALL, AF_ALG = {"x86_64": 41, "aarch64": 198}, 38
KEYCTL_JOIN_SESSION_KEYRING = 1


def own_session_keyring() -> None:
    """Put this process in a new, empty session keyring, which the sandboxes it starts inherit: the
    instructor's session (pam_keyinit's, a desktop's) then holds no key a sandbox possesses. Done on
    import, before the grader starts threads (a thread's keyrings are its own). Where keyctl is
    refused (a container's seccomp profile), the sandboxes' filter still refuses it to them."""
    import ctypes
    machine = platform.machine()
    if machine in KEYRING_CALLS:
        ctypes.CDLL(None, use_errno=True).syscall(KEYRING_CALLS[machine][2], KEYCTL_JOIN_SESSION_KEYRING, None)


own_session_keyring()


@dataclass(frozen=True)
class Limits:
    seconds: float                    # wall clock, the whole run
    cpu_seconds: float                # CPU time of the whole process tree (and of each process)
    memory_bytes: int = MEMORY_BYTES  # the whole tree's memory, /tmp included (cgroup)
    address_space: int = 8 * 2**30    # per process (prlimit)
    tmpfs_bytes: int = 512 * 2**20    # /tmp, the only writable place
    processes: int = 256              # tasks (threads count) of the whole tree
    file_bytes: int = 256 * 2**20     # largest file written
    output_bytes: int = 60 * 2**20    # read from the result pipe (fd 3); the rest is dropped
    cpus: float = 1.0                 # CPUs used at once (cgroup)


@dataclass
class Outcome:
    returncode: int | None            # None: killed at a limit
    result: bytes                     # what the command wrote on fd 3
    stdout: str                       # the last TAIL characters
    stderr: str
    killed: str = ""                  # which limit ended it ("", "time", "cpu time", "stalled", "suspended"), or "stopped" (STOP)
    cpu_seconds: float | None = None  # of the whole tree, where cgroups measure it
    wall_seconds: float = 0.0
    memory_bytes: int | None = None   # the whole tree's peak memory (/tmp included), where cgroups measure it


def problem() -> str | None:
    """Why this machine cannot sandbox, or None if bubblewrap works here as needed."""
    if not shutil.which("bwrap"):
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.geteuid() != 0:
        return ("grading must run as root: each sandbox runs as an unprivileged user of its own, "
                "which only root can switch to")
    if platform.machine() not in KEYRING_CALLS:
        return f"no seccomp filter for this machine ({platform.machine()}): x86_64 and aarch64 only"
    seccomp = keyring_filter()
    try:
        probe = subprocess.run(wrapped(["/bin/true"], show=[], files={}, limits=Limits(10, 10), uid=UID_BASE,
                                       seccomp_fd=seccomp), capture_output=True, text=True, pass_fds=(seccomp,))
    finally:
        os.close(seccomp)
    if probe.returncode != 0:
        return f"bubblewrap cannot create the sandbox here: {probe.stderr.strip()[:300]}"
    return None


def _parents(path: Path):
    return [p for p in reversed(path.parents) if p != Path("/")]


def keyring_filter() -> int:
    """A file descriptor (10 or above, inheritable) holding the filter that refuses the keyring calls,
    for bubblewrap's --seccomp, which reads it whole; the caller closes it."""
    machine = platform.machine()
    read, write = os.pipe()
    os.write(write, no_threads.refusing(machine, {number: errno.EPERM for number in KEYRING_CALLS[machine]},
                                        SOCKET_CALL[machine], (AF_ALG,)))
    os.close(write)
    fd = fcntl.fcntl(read, fcntl.F_DUPFD, 10)  # above the 3 that the result pipe is moved to
    os.close(read)
    os.set_inheritable(fd, True)
    return fd


def wrapped(command: list[str], *, show, files, limits: Limits, uid: int, cgroups=(), env=None,
            result_fd: int | None = None, seccomp_fd: int | None = None) -> list[str]:
    """The command line that runs `command` sandboxed (see the module's doc); `seccomp_fd`: a
    keyring_filter() for every process in it."""
    mounts, made = ["--ro-bind", "/usr", "/usr"], {Path("/usr")}
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            mounts += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            mounts += ["--ro-bind", top, top]
    mounts += ["--perms", "0755", "--dir", "/etc"]
    mounts += [a for name in ETC if os.path.exists(f"/etc/{name}") for a in ("--ro-bind", f"/etc/{name}", f"/etc/{name}")]
    # /tmp first, then what is shown: a course or a Python environment that lives under /tmp (a
    # mktemp clone) is bound on top of the empty /tmp instead of being hidden by it.
    mounts += ["--perms", "1777", "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp"]
    made.add(Path("/tmp"))
    for target, source in [*((Path(p), Path(p)) for p in show), *((Path(t), Path(s)) for t, s in files.items())]:
        for parent in _parents(target):  # folders bwrap creates on the way are 0700 unless told
            if parent not in made:
                made.add(parent)
                mounts += ["--perms", "0755", "--dir", str(parent)]
        mounts += ["--ro-bind", str(source), str(target)]
        made.add(target)
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp/home", "LANG": "C.UTF-8",
                   "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/home/.matplotlib", "PYTHONDONTWRITEBYTECODE": "1",
                   "JUPYTER_RUNTIME_DIR": "/tmp/home/jupyter-runtime", **(env or {})}
    masked = [a for name in ("/proc/keys", "/proc/key-users") if os.path.exists(name)
              for a in ("--ro-bind", "/dev/null", name)]
    bwrap = ["bwrap", *mounts, "--dev", "/dev", "--proc", "/proc", *masked,
             "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--clearenv",
             *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
             *[a for k, v in environment.items() for a in ("--setenv", k, v)], "--chdir", "/tmp", "--"]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]
    prlimit = ["prlimit", f"--as={limits.address_space}", f"--fsize={limits.file_bytes}",
               f"--cpu={int(limits.cpu_seconds) + 1}", "--core=0", f"--nproc={limits.processes}",
               "--msgqueue=0", "--"]
    # Join the cgroups (as root, before anything else runs) and put the result pipe on fd 3.
    join = ["/bin/bash", "-c", 'for f in $0; do echo $$ > "$f" || exit 97; done; '
            'if [ -n "$1" ]; then eval "exec 3>&$1 $1>&-"; fi; shift; exec "$@"',
            " ".join(str(Path(c) / "cgroup.procs") for c in cgroups), str(result_fd or "")]
    home = ["/bin/sh", "-c", 'mkdir -p /tmp/home && exec "$@"', "sh"]  # HOME exists before Python looks
    return [*join, *prlimit, *bwrap, *drop, *home, *command]


def unsandboxed(command, *, limits: Limits, cgroups, result_fd: int) -> list[str]:
    """`command` with the limits only (DANGEROUS: it sees and may change what its user may)."""
    join = wrapped([], show=[], files={}, limits=limits, uid=0, cgroups=cgroups, result_fd=result_fd)[:5]
    prlimit = ["prlimit", f"--as={limits.address_space}", f"--fsize={limits.file_bytes}",
               f"--cpu={int(limits.cpu_seconds) + 1}", "--core=0", "--"]
    return [*join, *prlimit, *command]


# --- cgroups (v1, nested under the grader's own) --------------------------------------------

def _own_cgroup(controller: str) -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    return None


def make_cgroups(limits: Limits) -> dict[str, Path]:
    """{controller: folder} of new cgroups with `limits`; {} where they cannot be made here."""
    made = {}
    name = f"mpcourse-sandbox-{uuid.uuid4().hex[:12]}"
    settings = {"pids": {"pids.max": limits.processes},
                "memory": {"memory.limit_in_bytes": limits.memory_bytes,
                           "memory.memsw.limit_in_bytes": limits.memory_bytes},
                "cpu": {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": int(100_000 * limits.cpus)},
                "cpuacct": {}}
    try:
        for controller, values in settings.items():
            parent = _own_cgroup(controller)
            if parent is None or not parent.is_dir():
                raise OSError(f"no {controller} cgroup")
            folder = parent / name
            folder.mkdir()
            made[controller] = folder
            for key, value in values.items():
                if (folder / key).exists():
                    (folder / key).write_text(str(value))
        return made
    except OSError:
        remove_cgroups(made)
        return {}


def cgroups_available() -> bool:
    """Whether this machine gives each sandbox its own cgroups (and so its own share of the CPU)."""
    made = make_cgroups(Limits(1, 1))
    remove_cgroups(made)
    return bool(made)


def cgroup_pids(cgroups: dict[str, Path]) -> list[int]:
    try:
        return [int(p) for p in (cgroups["pids"] / "cgroup.procs").read_text().split()]
    except (KeyError, OSError, ValueError):
        return []


def uid_pids(uid: int) -> list[int]:
    """The processes whose real uid is `uid`: a sandbox's, where no cgroup lists them (each sandbox
    slot has a uid no other process on the machine has: UID_BASE)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile
                pass
    return found


def stopped_in(cgroups: dict[str, Path], uid: int | None = None) -> bool:
    """Whether a process of the run is stopped (state T: SIGSTOP, SIGTSTP; t: a tracer's stop). A
    student's code runs as the same user as the grader's own processes in the sandbox, so it can stop
    them: a stopped batch runner enforces no part's deadline, and each run then lasted its whole limit
    (red team 24, A02: 1253 s for one student at --timeout 30). No honest notebook stops a process,
    and nothing in a sandbox has a terminal to be stopped by. The run's processes are those its
    cgroups list, or without cgroups (cgroup v2 only) those of the sandbox's `uid`."""
    for pid in cgroup_pids(cgroups) if cgroups or uid is None else uid_pids(uid):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # ended meanwhile
            continue
        if state in ("T", "t"):
            return True
    return False


def cpu_used(cgroups: dict[str, Path]) -> float | None:
    try:
        return int((cgroups["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
    except (KeyError, OSError, ValueError):
        return None


def memory_peak(cgroups: dict[str, Path]) -> int | None:
    try:
        return int((cgroups["memory"] / "memory.max_usage_in_bytes").read_text())
    except (KeyError, OSError, ValueError):
        return None


def remove_cgroups(cgroups: dict[str, Path]) -> None:
    for _ in range(50):  # kill whatever is left, until nothing is
        pids = cgroup_pids(cgroups)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    for folder in cgroups.values():
        for _ in range(20):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.05)


# --- running ------------------------------------------------------------------------------

def _slot() -> int:
    with SLOT_LOCK:
        if FREE_SLOTS:
            return FREE_SLOTS.pop()
        while True:
            slot = next(SLOTS)
            if not _taken(UID_BASE + slot) and _claim(slot):
                return slot


def _claim(slot: int) -> bool:
    """Whether this process now holds slot `slot` machine-wide (a lock no other process holds; the
    kernel releases it when this process ends, however it ends). Where no claim can be made (not
    root: then nothing runs as the slot's uid) every slot is this process's."""
    try:
        CLAIMS.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(CLAIMS / str(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    CLAIMED[slot] = fd
    return True


def _taken(uid: int) -> bool:
    """Whether an account or a group has this id."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


def _release(slot: int) -> None:
    with SLOT_LOCK:
        FREE_SLOTS.append(slot)


def _drain(fd: int, keep: int, tail: bool, into: list, seen: list | None = None) -> None:
    """Read `fd` to its end, keeping the first (or last) `keep` bytes; `seen`: [when it last read]."""
    data = bytearray()
    while chunk := os.read(fd, 1 << 16):
        if seen is not None:
            seen[0] = time.monotonic()
        data += chunk
        if len(data) > keep:
            data = data[-keep:] if tail else data[:keep]
            if not tail:
                while os.read(fd, 1 << 16):  # read on, so that the writer is never blocked
                    pass
                break
    os.close(fd)
    into.append(bytes(data))


def run(command: list[str], *, show=(), files=None, limits: Limits, stdin: bytes = b"", env=None,
        sandbox: bool = True, stall_seconds: float | None = None) -> Outcome:
    """Run `command` sandboxed, within `limits` (see the module's doc). `sandbox=False`: with the
    limits only, as the caller's user, seeing everything (`files` are then read where they are).
    `stall_seconds`: also end it (killed "stalled") once the result pipe has been silent that long
    (a batch that writes as it goes: grader/runs.py, run_students)."""
    slot = _slot()
    cgroups = make_cgroups(limits)
    started = time.monotonic()
    pipes = {name: os.pipe() for name in ("result", "stdout", "stderr")}
    seccomp = keyring_filter() if sandbox else None
    try:
        line = (wrapped(command, show=show, files=files or {}, limits=limits, uid=UID_BASE + slot,
                        cgroups=cgroups.values(), env=env, result_fd=pipes["result"][1], seccomp_fd=seccomp) if sandbox
                else unsandboxed(command, limits=limits, cgroups=cgroups.values(), result_fd=pipes["result"][1]))
        environment = ({"PATH": "/usr/bin:/bin"} if sandbox else
                       {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **(env or {})})
        process = subprocess.Popen(line,
            stdin=subprocess.PIPE, stdout=pipes["stdout"][1], stderr=pipes["stderr"][1],
            pass_fds=(pipes["result"][1], *([seccomp] if seccomp is not None else [])), start_new_session=True,
            env=environment, cwd="/")
        if seccomp is not None:
            os.close(seccomp)
            seccomp = None
        readers = {name: [] for name in pipes}
        seen = [started]
        threads = [threading.Thread(target=_drain, args=(read, keep, tail, readers[name],
                                                         seen if name == "result" else None), daemon=True)
                   for name, (read, _), keep, tail in
                   (("result", pipes["result"], limits.output_bytes, False),
                    ("stdout", pipes["stdout"], TAIL, True), ("stderr", pipes["stderr"], TAIL, True))]
        for _, write in pipes.values():
            os.close(write)
        pipes = {}
        for thread in threads:
            thread.start()
        threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True).start()
        killed, looked = "", started
        while process.poll() is None:
            used = cpu_used(cgroups)
            if time.monotonic() - started > limits.seconds:
                killed = "time"
            elif used is not None and used > limits.cpu_seconds:
                killed = "cpu time"
            elif stall_seconds is not None and time.monotonic() - seen[0] > stall_seconds:
                killed = "stalled"
            elif STOP.is_set():
                killed = "stopped"
            elif time.monotonic() - looked >= 1:
                looked = time.monotonic()
                killed = "suspended" if stopped_in(cgroups, UID_BASE + slot if sandbox else None) else ""
            if killed:
                _kill(process, cgroups)
                break
            try:  # back at once when it ends (a sleep here cost every run up to 0.2 s)
                process.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
        process.wait()
        _kill(process, cgroups)  # what it left behind (its namespace ends with it; cgroups say so)
        for thread in threads:
            thread.join(5)
        text = {k: (v[0] if v else b"") for k, v in readers.items()}
        return Outcome(None if killed else process.returncode, text["result"],
                       text["stdout"].decode(errors="replace"), text["stderr"].decode(errors="replace"),
                       killed, cpu_used(cgroups), time.monotonic() - started, memory_peak(cgroups))
    finally:
        for read, write in pipes.values():  # only if it could not start
            os.close(read)
            os.close(write)
        if seccomp is not None:
            os.close(seccomp)
        remove_cgroups(cgroups)
        _release(slot)


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:  # it stopped reading: its loss
        pass


def _kill(process: subprocess.Popen, cgroups) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    for pid in cgroup_pids(cgroups):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
