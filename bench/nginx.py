"""nginx `limit_req` on loopback: a real rate limiter the fleet did not write, in front of the sandbox.

The bench writes a config into a temp dir and runs nginx in the foreground (`daemon off`, one process
with `master_process off`, so it runs as the current user and one pid stops it), with its pid, logs and
temp paths in that dir. One `server` per limiter, each with its own zone, so fleets measured side by
side never share a bucket; a limiter may add a site-wide zone (one bucket for every client) on top of
the per-address one. A limiter's rates are in requests per second and need not be whole: nginx takes
whole rates only, per second or per minute, so a whole rate is written `Nr/s` and another `Nr/m`
(1.5 r/s is `90r/m`; `nginx_rate`), and a rate that is neither is refused when the `Limiter` is
made. Rejections answer 429 (`limit_req_status`); every limited request is logged as
`$msec $status $remote_addr $request_time $request_uri`, the limiter's own count of what it admitted
and refused, and which URL each asked for and when it arrived (`request_rows`). nginx tells
the sandbox each client's address (`X-Forwarded-For`, which uvicorn trusts from loopback); a limiter
with `pass_refusals` also hands each refusal on to the sandbox (`error_page 429` to a location that
proxies it with `X-Limiter-Refused`), so the sandbox's ban rules see what nginx refused.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx

from bench.common import Service, ToolMissing, find_tool, free_port

NGINX_MISSING = (
    "nginx is not installed, and the pacing bench needs its limit_req as the limiter under test.\n"
    "Install it with:  apt-get update && apt-get install -y nginx-light   (Debian/Ubuntu, as root)\n"
    "`make bench` does this once the Makefile's bench target installs it (see bench/README.md)."
)
START_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 5


def find_nginx() -> str | None:
    return find_tool("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx")


def nginx_rate(rate_per_s: float) -> str:
    """A rate as nginx's `limit_req_zone` takes it: whole requests per second (`5r/s`), else whole
    requests per minute (1.5 r/s -> `90r/m`); ValueError for a rate that is neither (0.01 r/s, 1/7 r/s)."""
    if not rate_per_s > 0:
        raise ValueError(f"nginx rate {rate_per_s!r}: a rate must be above 0")
    for rate, unit in ((rate_per_s, "s"), (rate_per_s * 60, "m")):
        whole = round(rate)
        if whole >= 1 and abs(rate - whole) <= 1e-9 * max(1.0, rate):
            return f"{whole}r/{unit}"
    raise ValueError(f"nginx rate {rate_per_s:g} r/s is not a whole number of requests per second or per minute")


@dataclass(frozen=True)
class Limiter:
    """One limited entry point: `rate=<rate_per_s> burst=<burst> nodelay`, keyed by client address,
    and with `site_rate_per_s` also a site-wide zone (`rate=<site_rate_per_s> burst=<site_burst>`,
    one bucket for every client): a request passes only when both admit it. Rates are in requests
    per second, whole or not; each is written as nginx takes it (`nginx_rate`: 5 -> `5r/s`,
    1.5 -> `90r/m`), and a rate nginx cannot take raises ValueError here."""

    name: str
    rate_per_s: float
    burst: int
    site_rate_per_s: float | None = None
    site_burst: int = 0
    pass_refusals: bool = False  # refusals go on to the sandbox, which counts them and answers the 429

    def __post_init__(self) -> None:
        nginx_rate(self.rate_per_s)
        if self.site_rate_per_s:
            nginx_rate(self.site_rate_per_s)


class LogRow(NamedTuple):
    """One limited request as nginx logged it (`LOG_FORMAT`)."""

    at: float  # $msec: when nginx logged it (its answer sent), epoch seconds
    status: int  # 429 when a zone refused it
    address: str  # the client address nginx saw
    request_s: float  # $request_time: from its first byte read to the log; `at - request_s` is its arrival
    uri: str  # $request_uri: the path and query the client asked for

    @property
    def arrived(self) -> float:
        """When the request reached nginx, epoch seconds."""
        return self.at - self.request_s


# The URI last: it is the only field that might hold a space.
LOG_FORMAT = "$msec $status $remote_addr $request_time $request_uri"


def parse_log_line(line: str) -> LogRow:
    """One line of `LOG_FORMAT`."""
    at, status, address, request_s, uri = line.split(" ", 4)
    return LogRow(float(at), int(status), address, float(request_s), uri)


# A refusal as nginx logs it at `limit_req_log_level` (warn, so the error log at warn keeps it).
_REFUSAL_LINE = re.compile(r'limiting requests, excess: [0-9.]+ by zone "([^"]+)"')


def refusals_by_zone(error_log: str, name: str) -> dict[str, int]:
    """The limiter `name`'s refusals in nginx's error log text, per zone: `address` (its own zone) and
    `site` (`name_site`)."""
    counts = Counter(match[1] for match in _REFUSAL_LINE.finditer(error_log))
    return {"address": counts.get(name, 0), "site": counts.get(f"{name}_site", 0)}


_PROXY_HEADERS = 'proxy_set_header Connection ""; proxy_set_header X-Forwarded-For $remote_addr;'


def _site_limit(lim: Limiter) -> str:
    if not lim.site_rate_per_s:
        return ""
    return f"\n            limit_req zone={lim.name}_site burst={lim.site_burst} nodelay;"


def _refusals(workdir: Path, lim: Limiter) -> tuple[str, str]:
    """The `error_page` line and the named location that pass a limiter's refusals to the sandbox."""
    if not lim.pass_refusals:
        return "", ""
    return (f"\n            error_page 429 = @{lim.name}_refused;",
            f"""
        location @{lim.name}_refused {{
            access_log {workdir}/{lim.name}.log bench;
            {_PROXY_HEADERS} proxy_set_header X-Limiter-Refused 1;
            proxy_pass http://sandbox;
        }}""")


def _config(workdir: Path, limiters: list[Limiter], ports: dict[str, int], upstream: str) -> str:
    zones = "\n".join(
        f"    limit_req_zone $binary_remote_addr zone={lim.name}:1m rate={nginx_rate(lim.rate_per_s)};"
        for lim in limiters
    ) + "".join(
        # The server's port is the same for every request of the server: one bucket for the site.
        f"\n    limit_req_zone $server_port zone={lim.name}_site:1m rate={nginx_rate(lim.site_rate_per_s)};"
        for lim in limiters if lim.site_rate_per_s
    )
    servers = "\n".join(
        f"""    server {{
        listen 127.0.0.1:{ports[lim.name]};
        proxy_http_version 1.1;
        {_PROXY_HEADERS}
        location = /healthz {{ proxy_pass http://sandbox; }}
        location / {{
            limit_req zone={lim.name} burst={lim.burst} nodelay;{_site_limit(lim)}{_refusals(workdir, lim)[0]}
            access_log {workdir}/{lim.name}.log bench;
            proxy_pass http://sandbox;
        }}{_refusals(workdir, lim)[1]}
    }}"""
        for lim in limiters
    )
    temp = workdir / "tmp"
    return f"""# Written by bench/nginx.py for one bench run; deleted with its directory.
daemon off;
master_process off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    log_format bench '{LOG_FORMAT}';
    limit_req_status 429;
    limit_req_log_level warn;
    upstream sandbox {{ server {upstream}; keepalive 32; }}
{zones}
{servers}
}}
"""


class Nginx(Service):
    """nginx running in front of `upstream` (host:port) with one loopback port per limiter.

    Use as a context manager (read `log_rows` inside it: leaving stops nginx and deletes its dir).
    Ports are picked free; if one is taken before nginx binds it, nginx is started again on new ones.
    """

    def __init__(self, limiters: list[Limiter], upstream: str) -> None:
        binary = find_nginx()
        if binary is None:
            raise ToolMissing(NGINX_MISSING)
        self._binary, self._limiters, self._upstream = binary, limiters, upstream
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-nginx-")
        self.workdir = Path(self._tmp.name)
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self) -> None:
        (self.workdir / "tmp").mkdir(exist_ok=True)
        problem = ""
        for _ in range(PORT_ATTEMPTS):
            self.ports = {lim.name: free_port() for lim in self._limiters}
            conf = self.workdir / "nginx.conf"
            conf.write_text(_config(self.workdir, self._limiters, self.ports, self._upstream))
            stderr = (self.workdir / "stderr.log").open("ab")
            command = [self._binary, "-p", f"{self.workdir}/", "-e", str(self.workdir / "error.log"),
                       "-c", str(conf)]
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
            stderr.close()
            if self._wait_ready():
                return
            problem = self._log_tail()
            self.stop()
            if "Address already in use" not in problem:
                break
        raise RuntimeError(f"nginx did not start:\n{problem}")

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline_s = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(trust_env=False, timeout=1.0) as client:
            pending = set(self.ports)
            while pending and time.monotonic() < deadline_s and self._proc.poll() is None:
                for name in sorted(pending):
                    try:
                        if client.get(f"{self.url(name)}/healthz").status_code == 200:
                            pending.discard(name)
                    except httpx.TransportError:
                        pass
                time.sleep(0.05)
            return not pending

    def _log_tail(self) -> str:
        text = ""
        for name in ("stderr.log", "error.log"):
            path = self.workdir / name
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.strip().splitlines()[-10:])

    def log_rows(self, name: str) -> list[tuple[float, int]]:
        """What the limiter `name` logged: (time in s, status) per limited request, in order."""
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return []
        return [(at, status) for at, status, _ in self.client_rows(name)]

    def client_rows(self, name: str) -> list[tuple[float, int, str]]:
        """What the limiter `name` logged, with the client address nginx saw: (time in s, status, address)."""
        return [(row.at, row.status, row.address) for row in self.request_rows(name)]

    def request_rows(self, name: str) -> list[LogRow]:
        """What the limiter `name` logged, with the client address and the URI asked for, in order."""
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return []
        return [parse_log_line(line) for line in path.read_text().splitlines() if line]

    def refusals_by_zone(self, name: str) -> dict[str, int]:
        """How many requests each zone of the limiter `name` refused, from nginx's error log (its
        `limiting requests ... by zone` lines): the per-address zone is `name`, the site-wide `name_site`."""
        path = self.workdir / "error.log"
        return refusals_by_zone(path.read_text(errors="replace") if path.exists() else "", name)

    def stop(self) -> None:
        """Stop nginx (SIGTERM, then SIGKILL), keeping its logs until `cleanup()`."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def cleanup(self) -> None:
        """Stop nginx and delete its temp dir (config, logs)."""
        self.stop()
        self._tmp.cleanup()
