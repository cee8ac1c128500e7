"""grader/hidden_tests.py run by the tests as a fresh process runs it, without paying its imports
each time (issue 52: about two seconds of CPU a run, hundreds of runs).

    run(script, job, *, cwd, env) -> subprocess.CompletedProcess (stdout and stderr as text)

One server per test process imports what every run imports first (numpy, torch,
matplotlib.pyplot: hidden_tests.py's own first imports), nothing of the course, and forks a child
for each run. The child is the run: its environment, working directory, `sys.argv`, `sys.path`
(the script's folder, then the PYTHONPATH given, as `python script` builds it) and standard
streams (files) are the run's, and it executes the script as `__main__`. The course library is
imported in the child, from the PYTHONPATH of that run (the course's, or a copy that withholds
functions: grader/withheld.py). The hash seed and the maths threads are the server's, fixed when
it starts (PYTHONHASHSEED=0, one thread), as every run of the tests asks. Runs that need another
interpreter state use subprocess as before.
"""
import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r"""
import json, os, runpy, sys
import numpy, torch  # noqa: F401  what every run imports first, before any of the course
try:
    import matplotlib.pyplot  # noqa: F401
except Exception:
    pass
base_path = list(sys.path[1:])  # without the server's own '' entry
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1  # what the child exits with if setting it up fails
        try:
            for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
                os.dup2(os.open(request[name], mode), fd)
            sys.stdin = open(0, "r", closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            extra = [p for p in request["env"].get("PYTHONPATH", "").split(":") if p]
            sys.path[:] = [os.path.dirname(request["script"]), *extra, *base_path]
            sys.argv = [request["script"], *request["args"]]
            code = 0
            try:
                runpy.run_path(request["script"], run_name="__main__")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if stop.code is not None and not isinstance(stop.code, int):
                    print(stop.code, file=sys.stderr)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""

_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": tempfile.gettempdir(),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=env, cwd=tempfile.gettempdir())
        atexit.register(_server.kill)
    return _server


def run(script: Path, job: dict, *, cwd, env: dict, args=("-",)) -> subprocess.CompletedProcess:
    """`python script -` with `job` (JSON) on its stdin, in `cwd`, with the environment `env`."""
    with tempfile.TemporaryDirectory() as folder, _lock:
        files = {name: str(Path(folder) / name) for name in ("stdin", "stdout", "stderr")}
        Path(files["stdin"]).write_text(json.dumps(job))
        for name in ("stdout", "stderr"):
            Path(files[name]).touch()
        server = _started()
        server.stdin.write(json.dumps({**files, "script": str(script), "args": list(args), "cwd": str(cwd),
                                       "env": {"HOME": tempfile.gettempdir(), **env}}) + "\n")
        server.stdin.flush()
        returncode = json.loads(server.stdout.readline())
        return subprocess.CompletedProcess([str(script), *args], returncode, Path(files["stdout"]).read_text(),
                                           Path(files["stderr"]).read_text())
