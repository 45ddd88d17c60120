"""Burn: the fleet's identity pool against naive proxy rotation, on a source that bans addresses.

"Burn a proxy range with an aggressive job and you've degraded every other job." Eight identities
in two ranges, each a real forward proxy on its own loopback address (127.0.0.2-5 range dc1,
127.0.0.6-9 range dc2), so the source sees one client address per identity. The source is the
sandbox's `banning` route with its defaults: an address sending more than 1 request/s over 5 s, or
whose last 8 gaps vary less than a coefficient of variation of 0.1, is banned for 60 s (403 and a
captcha page), and a ban counts every request, so hammering through it earns the next one.

Two modes run side by side for `--duration-s`, each against a sandbox of its own (so one's bans
cannot touch the other's addresses), through the same eight proxies, at the same total rate
(IDENTITY_PER_S per identity):

- `fleet`: the engine as the fleet runs it. FLEET_WORKERS threads collect fresh leads with one
  `Collector`: every collection leases an identity from the `IdentityPool` (least recently used,
  healthy, range not resting, lane free), paces on the shared GCRA lanes with heavy-tailed jitter,
  reports every answer's verdict to the pool (a block rests the identity, two of a range rest the
  range), saves the identity's cookies and gives the lease back. A parked collection (no identity
  free now) is retried after a short pause, as the queue would hand the worker other work.
- `naive`: a plain loop over the eight proxies, round robin, at a fixed pace (one request every
  1 / total rate), no resting, no jitter: the classic rotating scraper.

The fleet's source lane is set at SOURCE_HEADROOM x the identities' total (`--source-headroom`):
this site limits each address, not its total. Note: whenever the source lane's slot opens even a
few ms after the identity's, the rate lanes draw the send delay at the source's interval (here
0.16 s, capped there) instead of the identity's (2.5 s), and that identity's sends fall onto a
~2.5 s grid the rhythm rule catches; the `lowest 8-gap CV` column shows how close each mode came.

Figures per mode: net records (collections that stored records), requests and statuses as the
sandbox counted them, bans (the sandbox's own counters, per address and per rule) and the lowest
coefficient of variation of 8 consecutive gaps each address showed (the rhythm rule bans below 0.1).
Goal: 0 bans for the fleet, and more net records than naive.

    python -m bench.burn [--duration-s 300] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    DeadlineReached,
    DeadlineSleep,
    engine_digest,
    finish,
    host_load,
    parse_args,
    print_table,
    report_host,
)

NAME = "burn"
DEFAULT_DURATION_S = 300.0
RANGES = {"dc1": ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"),
          "dc2": ("127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9")}
# Per identity, well under the source's ban rate (1 r/s over 5 s): the pool's lanes keep each
# identity's own pace; naive rotation gets the same per-address rate from its fixed total pace.
IDENTITY_PER_S = 0.4
# The site limits each address, not its total: the source lane is set above what the identities
# can send together, so each identity's own lane (and its jitter) shapes what one address looks like.
SOURCE_HEADROOM = 2.0
FLEET_WORKERS = 8  # collections at once: one per identity at most, the pool decides which
PARK_PAUSE_S = (0.2, 0.6)  # a parked collection's worker comes back after this long (uniform)
REQUEST_TIMEOUT_S = 5.0
START_DELAY_S = 0.5
STOP_GRACE_S = 15.0  # after the deadline: the longest request in flight plus the lease's release
SEED = 42

_FINGERPRINTS = """
fingerprints:
  chrome_win:
    user_agent: "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36"
    accept_language: "en-US,en;q=0.9"
    headers: [[User-Agent, ""], [Accept, "text/html,application/xhtml+xml,*/*;q=0.8"], [Accept-Encoding, "gzip, deflate"], [Accept-Language, ""], [Connection, keep-alive]]
  firefox_mac:
    user_agent: "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.4; rv:125.0) Gecko/20100101 Firefox/125.0"
    accept_language: "en-GB,en;q=0.7"
    headers: [[User-Agent, ""], [Accept, "text/html,*/*;q=0.8"], [Accept-Language, ""], [Accept-Encoding, "gzip, deflate"], [Connection, keep-alive]]
"""

_SOURCE = """
sources:
  - name: banning
    description: the sandbox's banning route (bans an address for asking too fast or too regularly)
    adapter: html
    lead_kinds: [username]
    request: {{url: "{url}/banning/profile/{{kind}}/{{value}}"}}
    parse: {{records_selector: li.post, record_key: "@data-id", fields: {{title: a.title}}}}
    rate: {{source_per_s: {source_per_s}, source_burst: 2, identity_per_s: {identity_per_s}, identity_burst: 1}}
    retry: {{attempts: 2, base_delay_s: 0.5, max_delay_s: 2, step_retries: 0}}
    throttle: {{park_after_s: 30}}
    timeout_s: {timeout_s}
"""


def hosts() -> list[tuple[str, str]]:
    """(range, address) of every identity, in range order."""
    return [(range_name, host) for range_name, addresses in RANGES.items() for host in addresses]


def identities_yaml(proxy_urls: Sequence[str]) -> str:
    """The identities file of the bench: one identity per proxy, alternating the two fingerprints."""
    lines = ["tiers: [datacenter]", _FINGERPRINTS, "defaults: {tier: datacenter}", "identities:"]
    for n, ((range_name, _), url) in enumerate(zip(hosts(), proxy_urls, strict=True)):
        profile = ("chrome_win", "firefox_mac")[n % 2]
        lines.append(f"  - {{id: {range_name}_{n}, proxy_url: \"{url}\", range: {range_name}, fingerprint: {profile}}}")
    return "\n".join(lines) + "\n"


def source_yaml(url: str, source_headroom: float = SOURCE_HEADROOM) -> str:
    source_per_s = source_headroom * IDENTITY_PER_S * len(hosts())
    return _SOURCE.format(url=url, source_per_s=source_per_s, identity_per_s=IDENTITY_PER_S,
                          timeout_s=REQUEST_TIMEOUT_S)


# -- the fleet -------------------------------------------------------------------------------------


class FleetMode:
    """The engine: one Collector over a pool, lanes and circuits in a SQLite store, driven by threads."""

    def __init__(self, url: str, proxy_urls: Sequence[str], workdir: Path, *, source_headroom: float) -> None:
        from investigations.collection.collect import Collector
        from investigations.collection.fetcher import Fetcher
        from investigations.evidence.records import RecordStore
        from investigations.identities import CookieStore, IdentityPool, parse_identities
        from investigations.pacing import Circuits, GapSampler, RateLanes
        from investigations.sources.specs import parse_sources
        from investigations.store import StateStore

        self.store = StateStore.from_url(f"sqlite:///{workdir / 'fleet.db'}")
        self.catalog = parse_sources(source_yaml(url, source_headroom), origin="bench/burn")
        self.pool = IdentityPool(self.store, parse_identities(identities_yaml(proxy_urls), origin="bench/burn"),
                                 rng=random.Random(SEED))
        self.sleep = DeadlineSleep(float("inf"))
        lanes = RateLanes(self.store, sampler=GapSampler(random.Random(SEED)))
        self.fetcher = Fetcher(sink=self.store, lanes=lanes, pool=self.pool, cookies=CookieStore(self.store),
                               rng=random.Random(SEED + 1), sleep=self.sleep)
        self.collector = Collector(catalog=self.catalog, store=self.store, records=RecordStore(workdir / "fleet"),
                                   fetcher=self.fetcher, circuits=Circuits(self.store))
        self.outcomes: Counter[str] = Counter()
        self.net_records = 0
        self.records = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def drive(self, worker: int, deadline_s: float) -> None:
        """Collect fresh leads one after another until the deadline."""
        from investigations.collection.collect import CollectionFailed, CollectionParked
        from investigations.intake.leads import normalize_lead

        rng = random.Random(SEED * 1009 + worker)
        n = 0
        lead = None
        try:
            while time.time() < deadline_s:
                if lead is None:
                    lead = normalize_lead("username", f"burn-fleet-{worker}-{n}")
                    self.store.add_lead(lead, case_id="burn")
                    n += 1
                try:
                    result = self.collector.collect("banning", lead.id, run_id=f"burn-fleet-{worker}")
                except CollectionParked:
                    self._count("parked")
                    self.sleep(rng.uniform(*PARK_PAUSE_S))  # then the same lead again
                    continue
                except CollectionFailed as failed:
                    self._count(f"failed:{failed.reason_group}")
                    lead = None
                    continue
                with self._lock:
                    self.outcomes[result.outcome] += 1
                    self.records += result.records
                    self.net_records += result.records > 0
                lead = None
        except DeadlineReached:
            pass
        except Exception:  # a bench reports what broke a worker rather than dying silently
            with self._lock:
                self.errors.append(traceback.format_exc(limit=6))

    def _count(self, what: str) -> None:
        with self._lock:
            self.outcomes[what] += 1

    def health_at_end(self) -> dict[str, Any]:
        """Identities resting or retired at the source, and ranges resting there, when the run ended."""
        now = time.time()
        resting = {}
        for identity_id in self.pool.catalog.ids:
            health = self.pool.health(identity_id, "banning")
            if health is not None and health.state != "healthy":
                resting[identity_id] = health.state
        ranges = [name for name in RANGES if (self.pool.range_rest_until_s(name, "banning") or 0) > now]
        return {"identities_not_healthy": resting, "ranges_resting": ranges}

    def close(self) -> None:
        self.fetcher.close()
        self.pool.close()
        self.store.close()


# -- naive rotation --------------------------------------------------------------------------------


class NaiveMode:
    """A plain loop over the proxies, round robin, at a fixed pace; every 200 is parsed and stored."""

    def __init__(self, url: str, proxy_urls: Sequence[str], workdir: Path) -> None:
        from investigations.adapters import build_adapter
        from investigations.evidence.records import RecordStore
        from investigations.sources.specs import parse_sources

        self.spec = parse_sources(source_yaml(url), origin="bench/burn").get("banning")
        self.adapter = build_adapter(self.spec)
        self.records_store = RecordStore(workdir / "naive")
        self.clients = [httpx.Client(proxy=proxy, trust_env=False, timeout=REQUEST_TIMEOUT_S) for proxy in proxy_urls]
        self.interval_s = 1.0 / (IDENTITY_PER_S * len(proxy_urls))
        self.outcomes: Counter[str] = Counter()
        self.net_records = 0
        self.records = 0
        self.errors: list[str] = []

    def drive(self, start_s: float, deadline_s: float) -> None:
        from investigations.intake.leads import normalize_lead

        n = 0
        try:
            while True:
                send_at = start_s + n * self.interval_s  # a fixed schedule: the pace never drifts
                if send_at >= deadline_s:
                    break
                time.sleep(max(0.0, send_at - time.time()))
                lead = normalize_lead("username", f"burn-naive-{n}")
                request = next(iter(self.adapter.requests_for(lead)))
                client = self.clients[n % len(self.clients)]
                n += 1
                try:
                    response = client.request(request.method, request.url, headers=request.headers)
                except httpx.HTTPError as exc:
                    self.outcomes[f"error:{type(exc).__name__}"] += 1
                    continue
                if response.status_code != 200:
                    self.outcomes[f"http_{response.status_code}"] += 1
                    continue
                found = self.adapter.parse(response.content, url=str(response.url))
                written = self.records_store.write("banning", lead.id, found, fetched_at=datetime.now(UTC))
                self.outcomes["ok" if written.records else "empty"] += 1
                self.records += written.records
                self.net_records += written.records > 0
        except Exception:  # reported, not swallowed
            self.errors.append(traceback.format_exc(limit=6))

    def close(self) -> None:
        for client in self.clients:
            client.close()


# -- the run ---------------------------------------------------------------------------------------


def run(duration_s: float = DEFAULT_DURATION_S, *, source_headroom: float = SOURCE_HEADROOM) -> dict[str, Any]:
    """Both modes at once for `duration_s`, each against its own sandbox, through the same proxies."""
    from investigations.sandbox import SandboxConfig, start_in_thread
    from investigations.sandbox.proxy import start_proxies

    load_before = host_load()
    errors: list[str] = []
    addresses = [host for _, host in hosts()]
    config = SandboxConfig(seed=SEED)
    with (
        tempfile.TemporaryDirectory(prefix="bench-burn-") as tmp,
        start_in_thread(config) as fleet_web,
        start_in_thread(SandboxConfig(seed=SEED)) as naive_web,
        start_proxies(addresses) as proxies,
    ):
        proxy_urls = [proxy.url for proxy in proxies.proxies]
        fleet = FleetMode(fleet_web.url, proxy_urls, Path(tmp), source_headroom=source_headroom)
        naive = NaiveMode(naive_web.url, proxy_urls, Path(tmp))
        try:
            start_s = time.time() + START_DELAY_S
            deadline_s = start_s + duration_s
            fleet.sleep.deadline_s = deadline_s
            threads = [threading.Thread(target=_after, args=(start_s, fleet.drive, w, deadline_s),
                                        name=f"burn-fleet-{w}", daemon=True) for w in range(FLEET_WORKERS)]
            threads.append(threading.Thread(target=naive.drive, args=(start_s, deadline_s), name="burn-naive",
                                            daemon=True))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(0.1, deadline_s + STOP_GRACE_S - time.time()))
            errors += [f"{t.name}: still running after the deadline" for t in threads if t.is_alive()]
            modes = {
                "fleet": {**_mode_figures(fleet, fleet_web.app_state.snapshot(), duration_s), **fleet.health_at_end()},
                "naive": _mode_figures(naive, naive_web.app_state.snapshot(), duration_s),
            }
            errors += fleet.errors + naive.errors
        finally:
            fleet.close()
            naive.close()
        modes["fleet"]["proxies"] = {p.host: vars(p.stats).copy() for p in proxies.proxies}
        # Stopping a sandbox with requests in flight makes uvicorn log them; they are the bench's own.
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    fleet_figures, naive_figures = modes["fleet"], modes["naive"]
    return {
        "bench": NAME,
        "started_at": datetime.now(UTC).isoformat(),
        "duration_s": duration_s,
        "engine": engine_digest(),
        "host": {"before": load_before, "after": host_load()},
        "setup": {
            "identities": len(addresses), "ranges": {name: list(hs) for name, hs in RANGES.items()},
            "identity_per_s": IDENTITY_PER_S, "total_per_s": IDENTITY_PER_S * len(addresses),
            "fleet_source_per_s": source_headroom * IDENTITY_PER_S * len(addresses),
            "fleet_workers": FLEET_WORKERS,
            "ban_rules": {"rate_per_s": config.banning_rate_per_s, "window_s": config.banning_window_s,
                          "rhythm_cv_below": config.banning_rhythm_cv, "rhythm_gaps": config.banning_rhythm_gaps,
                          "ban_s": config.banning_ban_s},
        },
        "goals": {"fleet_bans": 0, "fleet_net_records_above_naive": True},
        "meets_goals": fleet_figures["bans"] == 0 and fleet_figures["net_records"] > naive_figures["net_records"],
        "modes": modes,
        "errors": errors,
    }


def _after(start_s: float, target: Any, *args: Any) -> None:
    time.sleep(max(0.0, start_s - time.time()))
    target(*args)


def _mode_figures(mode: FleetMode | NaiveMode, sandbox: dict[str, Any], duration_s: float) -> dict[str, Any]:
    banning = sandbox["sources"]["banning"]
    return {
        "net_records": mode.net_records,
        "net_records_per_min": mode.net_records * 60.0 / duration_s,
        "records": mode.records,
        "outcomes": dict(sorted(mode.outcomes.items())),
        "requests": banning["requests"],
        "status_counts": banning["status_counts"],
        "bans": sum(banning["bans"].values()),
        "bans_by_address": banning["bans"],
        "ban_reasons": banning["ban_reasons"],
        "banned_at_end": banning["banned_now"],
        # How close each address came to the rhythm rule (its most regular 8 gaps; banned below 0.1).
        "lowest_rhythm_cv": banning["lowest_rhythm_cv"],
        "lowest_rhythm_cv_min": min(banning["lowest_rhythm_cv"].values(), default=None),
        "requests_by_address": banning["clients"],
    }


def report(figures: dict[str, Any]) -> None:
    """The two modes side by side, then what the fleet's pool thought of its identities."""
    setup = figures["setup"]
    print(f"\nBurn: {figures['duration_s']:g} s, {setup['identities']} identities in {len(setup['ranges'])} ranges "
          f"(loopback proxies), {setup['identity_per_s']:g} r/s per identity ({setup['total_per_s']:g} r/s in all) "
          f"against the banning source; engine {figures['engine']}")
    rows = []
    for name, mode in figures["modes"].items():
        counts = mode["status_counts"]
        rows.append([name, mode["net_records"], f"{mode['net_records_per_min']:.1f}", mode["requests"],
                     counts.get("200", 0), counts.get("403", 0), mode["bans"], len(mode["bans_by_address"]),
                     len(mode["banned_at_end"]), mode["lowest_rhythm_cv_min"]])
    print_table("Net records and bans (goal: fleet 0 bans and more net records than naive)",
                ["mode", "net records", "per min", "requests", "200", "403", "bans", "addresses banned",
                 "banned at end", "lowest 8-gap CV"], rows)
    fleet = figures["modes"]["fleet"]
    print(f"  fleet collections: {fleet['outcomes']}")
    print(f"  fleet identities not healthy at end: {fleet['identities_not_healthy'] or 'none'}; "
          f"ranges resting: {fleet['ranges_resting'] or 'none'}")
    print(f"  naive outcomes: {figures['modes']['naive']['outcomes']}; ban rules hit: "
          f"{figures['modes']['naive']['ban_reasons']}")
    print(f"\n  meets goals: {figures['meets_goals']}")
    report_host(figures)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.burn [--duration-s S] [--source-headroom X] [--results-dir DIR]`."""

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--source-headroom", type=float, default=SOURCE_HEADROOM,
                            help=f"fleet source lane / identities' total rate (default {SOURCE_HEADROOM:g})")

    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S,
                      extra=extra)
    if args.source_headroom <= 0:
        raise SystemExit("--source-headroom must be above 0")
    figures = run(args.duration_s, source_headroom=args.source_headroom)
    report(figures)
    return finish(NAME, figures, args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
