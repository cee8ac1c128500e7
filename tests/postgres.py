"""A real PostgreSQL server for the tests, on a local port, in a temporary data folder.

    with Server() as server:
        url = server.database("gradebook")   # postgresql+psycopg://postgres@127.0.0.1:PORT/gradebook

Debian's `postgresql` package (.ci/run installs it) puts its programs in
/usr/lib/postgresql/<version>/bin. `initdb` refuses to run as root, so as root the server runs as
the `postgres` user (`runuser`) on a data folder that user owns; as anyone else, as that user.
`problem()` says why no server can run here, or None.
"""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl (the newest installed version), or None."""
    found = shutil.which("initdb") and shutil.which("pg_ctl")
    if found:
        return Path(shutil.which("pg_ctl")).resolve().parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                     if Path(p).parent.name.isdigit() else 0)
    return Path(folders[-1]) if folders and (Path(folders[-1]) / "initdb").exists() else None


def problem() -> str | None:
    if binaries() is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg (PostgreSQL's driver for Python) is not installed: pip install -r requirements.txt"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as (initdb refuses root)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self):
        self.port = free_port()
        # In /tmp itself: the postgres user must reach the folder (a $TMPDIR may sit in a private one).
        self.folder = Path(tempfile.mkdtemp(prefix="mpcourse-postgres-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.data = self.folder / "data"
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _as_owner(self, *command: str) -> subprocess.CompletedProcess:
        line = ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)
        result = subprocess.run(line, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result

    def __enter__(self):
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
        bin_ = binaries()
        self._as_owner(str(bin_ / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust",
                       "--encoding=UTF8", "--no-sync")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_owner(str(bin_ / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"),
                       "-w", "-t", "60", "start")
        return self

    def database(self, name: str, options: str = "") -> str:
        """A new, empty database (`options`: CREATE DATABASE's, e.g. an encoding); its SQLAlchemy address."""
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}" {options}')
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"

    def __exit__(self, *exc):
        try:
            self._as_owner(str(binaries() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
