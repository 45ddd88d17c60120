"""A PostgreSQL server of a bench's own, so the bench may crash and restart it mid-run.

The fault suite stops Postgres under a running fleet. It must not do that to the machine's server
(other work uses it), so it starts one of its own: `initdb` in a temp dir, trust auth, listening on a
free port on 127.0.0.1 only, its socket in its data dir. `crash()` is `pg_ctl stop -m immediate`:
every backend is killed at once with no checkpoint, as a power cut or an OOM kill would leave it,
and the next `start()` goes through crash recovery. Postgres will not run as root: as root, the
server's commands run as the `postgres` user, which owns the data dir.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.common import Service, ToolMissing, free_port

POSTGRES_MISSING = (
    "PostgreSQL's server programs (initdb, pg_ctl) are not installed; the fault suite runs a server of its own.\n"
    "Install them with:  apt-get update && apt-get install -y postgresql   (Debian/Ubuntu, as root)"
)
START_TIMEOUT_S = 60.0


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl: on the PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_ctl")
    if found and (bindir := Path(found).resolve().parent).joinpath("initdb").is_file():
        return bindir
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


class PostgresServer(Service):
    """One private server: `start()`, `crash()`, `start()` again, `cleanup()` (stops it and deletes its files)."""

    def __init__(self) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise ToolMissing(POSTGRES_MISSING)
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, user="postgres", group="postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")

    @property
    def url(self) -> str:
        """The server's URL for its `postgres` database (`bench.common.pg_url` names another)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *argv: str) -> None:
        command = [*self._as_user, str(self.bindir / program), *argv]
        done = subprocess.run(command, cwd=self.dir, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} exited with {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Start the server; returns once it takes connections (after a crash: once recovery is done)."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c max_connections=200 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", str(int(START_TIMEOUT_S)), "start")  # -w: returns once it takes connections

    def crash(self) -> None:
        """Kill the server at once (`-m immediate`): open connections break, nothing is checkpointed."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def cleanup(self) -> None:
        """Stop the server if it runs and delete its files."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
