"""bench.nginx's pure parts: how a limiter's rates are written for nginx, and how its log is read.

Process-free: the config is rendered, not run (the benches that run nginx are under `soak`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.nginx import LOG_FORMAT, Limiter, LogRow, _config, nginx_rate, parse_log_line, refusals_by_zone


def test_whole_rates_are_written_per_second_and_others_per_minute() -> None:
    assert nginx_rate(5) == "5r/s" and nginx_rate(5.0) == "5r/s" and nginx_rate(30.0) == "30r/s"
    assert nginx_rate(1.5) == "90r/m" and nginx_rate(0.5) == "30r/m" and nginx_rate(2.25) == "135r/m"
    assert nginx_rate(0.1) == "6r/m"  # 0.1 x 60 is 6.000000000000001 in floating point
    assert nginx_rate(1 / 60) == "1r/m"
    for bad in (0.01, 1 / 7, 0, -1.0, 2.001):
        with pytest.raises(ValueError):
            nginx_rate(bad)


def test_a_limiter_nginx_cannot_take_is_refused_when_made() -> None:
    with pytest.raises(ValueError):
        Limiter("a", 0.01, 2)
    with pytest.raises(ValueError):
        Limiter("a", 5, 2, site_rate_per_s=1 / 7, site_burst=5)
    assert Limiter("a", 1.5, 2, site_rate_per_s=1.5, site_burst=5).rate_per_s == 1.5


def test_the_config_writes_each_zone_at_its_rate(tmp_path: Path) -> None:
    limiters = [
        Limiter("whole", 5, 3),  # as bench.pacing and bench.product make them: int rates
        Limiter("site", 3, 3, site_rate_per_s=8, site_burst=3, pass_refusals=True),
        Limiter("slow", 1.5, 2, site_rate_per_s=1.5, site_burst=5),
        Limiter("mixed", 10.0, 2, site_rate_per_s=2.5, site_burst=5),
    ]
    conf = _config(tmp_path, limiters, {lim.name: 9000 + n for n, lim in enumerate(limiters)}, "127.0.0.1:1")
    zones = sorted(line.strip() for line in conf.splitlines() if line.strip().startswith("limit_req_zone"))
    assert zones == sorted([
        "limit_req_zone $binary_remote_addr zone=whole:1m rate=5r/s;",
        "limit_req_zone $binary_remote_addr zone=site:1m rate=3r/s;",
        "limit_req_zone $server_port zone=site_site:1m rate=8r/s;",
        "limit_req_zone $binary_remote_addr zone=slow:1m rate=90r/m;",
        "limit_req_zone $server_port zone=slow_site:1m rate=90r/m;",
        "limit_req_zone $binary_remote_addr zone=mixed:1m rate=10r/s;",
        "limit_req_zone $server_port zone=mixed_site:1m rate=150r/m;",
    ])
    assert "limit_req zone=slow burst=2 nodelay;" in conf and "limit_req zone=slow_site burst=5 nodelay;" in conf
    assert "limit_req zone=whole_site" not in conf  # no site-wide zone unless asked for
    assert f"log_format bench '{LOG_FORMAT}';" in conf and "$request_uri" in LOG_FORMAT


def test_a_log_line_reads_back_with_its_url_and_arrival() -> None:
    row = parse_log_line("1733450000.250 429 127.0.0.3 0.050 /robust/api/lookup?kind=domain&q=a.example")
    assert row == LogRow(1733450000.25, 429, "127.0.0.3", 0.05, "/robust/api/lookup?kind=domain&q=a.example")
    assert row.arrived == pytest.approx(1733450000.2)
    assert parse_log_line("1.000 200 127.0.0.2 0.000 /a b?q=x").uri == "/a b?q=x"  # the URL last, whole


def test_refusals_are_counted_per_zone_from_the_error_log(tmp_path: Path) -> None:
    assert "limit_req_log_level warn;" in _config(tmp_path, [Limiter("high4", 5, 2)], {"high4": 9000}, "127.0.0.1:1")
    log = "\n".join([
        '2026/12/07 02:40:00 [warn] 11#0: *5 limiting requests, excess: 2.460 by zone "high4", client: 127.0.0.3',
        '2026/12/07 02:40:01 [warn] 11#0: *9 limiting requests, excess: 5.010 by zone "high4_site", client: 127.0.0.4',
        '2026/12/07 02:40:01 [warn] 11#0: *9 limiting requests, excess: 1.000 by zone "high4", client: 127.0.0.4',
        '2026/12/07 02:40:02 [warn] 11#0: *12 limiting requests, excess: 1.000 by zone "right", client: 127.0.0.2',
        '2026/12/07 02:40:03 [notice] 11#0: signal process started',
    ])
    assert refusals_by_zone(log, "high4") == {"address": 2, "site": 1}
    assert refusals_by_zone("", "high4") == {"address": 0, "site": 0}
