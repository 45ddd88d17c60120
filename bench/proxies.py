"""Forward proxies on loopback, one per identity: tinyproxy, each sending from its own 127.0.0.x.

A site keys its per-client limits by the address it sees. Each proxy binds its outgoing connections
to an address of its own (tinyproxy's `Bind`; all of 127.0.0.0/8 is on the loopback interface), so a
limiter behind them sees one client per identity, as it would see one exit per proxy on the web.
Every proxy runs in the foreground (`-d`) as the current user, with its config in a temp dir; ports
are picked free and picked again if one is taken before tinyproxy binds it.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import Service, ToolMissing, find_tool, free_port

TINYPROXY_MISSING = (
    "tinyproxy is not installed, and the product bench sends each identity through one.\n"
    "Install it with:  apt-get update && apt-get install -y tinyproxy   (Debian/Ubuntu, as root)\n"
    "`make bench-product` installs it when it is missing."
)
START_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 5
FIRST_OUTGOING_HOST = 11  # 127.0.0.11, .12, ...: clear of 127.0.0.1, which the fleet itself uses


def find_tinyproxy() -> str | None:
    return find_tool("tinyproxy", "/usr/bin/tinyproxy", "/usr/sbin/tinyproxy")


def _config(port: int, outgoing: str) -> str:
    return f"""# Written by bench/proxies.py for one bench run; deleted with its directory.
Port {port}
Listen 127.0.0.1
Bind {outgoing}
Timeout 60
MaxClients 100
Allow 127.0.0.1
LogLevel Warning
DisableViaHeader Yes
"""


class Proxies(Service):
    """`count` tinyproxy processes; `urls[i]` is the i-th proxy, `outgoing[i]` the address it sends from.

    Use as a context manager: leaving stops every proxy and deletes the temp dir.
    """

    def __init__(self, count: int) -> None:
        binary = find_tinyproxy()
        if binary is None:
            raise ToolMissing(TINYPROXY_MISSING)
        if not 1 <= count <= 200:
            raise ValueError(f"count ({count}) must be 1-200")
        self._binary, self.count = binary, count
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-proxies-")
        self.workdir = Path(self._tmp.name)
        self.outgoing = [f"127.0.0.{FIRST_OUTGOING_HOST + n}" for n in range(count)]
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start(self) -> None:
        for n in range(self.count):
            self._start_one(n)

    def _start_one(self, n: int) -> None:
        log = self.workdir / f"proxy{n}.log"
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            conf = self.workdir / f"proxy{n}.conf"
            conf.write_text(_config(port, self.outgoing[n]))
            with log.open("ab") as out:
                proc = subprocess.Popen([self._binary, "-d", "-c", str(conf)], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=out)
            if _wait_listening(port, proc):
                self.ports.append(port)
                self.procs.append(proc)
                return
            _stop(proc)
        raise RuntimeError(f"tinyproxy {n} did not start:\n{log.read_text(errors='replace')[-2000:]}")

    def cleanup(self) -> None:
        for proc in self.procs:
            _stop(proc)
        self.procs = []
        self._tmp.cleanup()


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> bool:
    deadline_s = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline_s and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()  # only our own proxy, by its handle
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
