"""Deterministic, plausible and entirely fake content for a lead, per source.

Everything is drawn from a Random seeded by sha256 of (seed, source, kind, q), so the same request
always yields the same records and two sources disagree like real ones do. Only reserved names
(`*.example`), documentation IP ranges and ASNs, and obviously made-up people are used.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import random
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

KINDS = ("domain", "username", "email", "url", "org", "ip")

_DOC_NETS = ("192.0.2", "198.51.100", "203.0.113")
_SITES = ("forum.example", "codehub.example", "photoshare.example", "microblog.example",
          "videotube.example", "gamers.example", "recipes.example", "travelnotes.example")
_FIRST = ("Alex", "Robin", "Sam", "Jordan", "Casey", "Morgan", "Taylor", "Riley")
_LAST = ("Example", "Sample", "Placeholder", "Fixture", "Testcase", "Mockup")
_PLACES = ("Exampleville", "Sampletown", "Port Placeholder", "Fixture Falls", "Mockford")
_TOPICS = ("home networking", "sourdough", "trail running", "retro games", "birdwatching",
           "mechanical keyboards", "urban gardening", "film photography")
_REGISTRARS = ("Example Registrar Ltd", "Placeholder Domains Inc.", "Sample Names LLC")
_SUBDOMAINS = ("mail", "dev", "staging", "vpn", "api", "shop", "blog", "cdn")
_EPOCH = dt.date(2015, 1, 1).toordinal()


def lead_rng(seed: int, source: str, kind: str, q: str) -> random.Random:
    """A Random fixed by (seed, source, kind, q); hash-based so it is stable across processes."""
    digest = hashlib.sha256(f"{seed}\x00{source}\x00{kind}\x00{q}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _ip(rng: random.Random) -> str:
    return f"{rng.choice(_DOC_NETS)}.{rng.randint(1, 254)}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _date(rng: random.Random) -> str:
    return dt.date.fromordinal(_EPOCH + rng.randrange(3650)).isoformat()


def _domain(rng: random.Random, q: str) -> list[tuple[str, str]]:
    host = q.strip().rstrip(".").lower()
    return [
        ("dns_a", _ip(rng)),
        ("dns_a", _ip(rng)),
        ("dns_mx", f"10 mx{rng.randint(1, 3)}.{host}"),
        ("dns_ns", f"ns{rng.randint(1, 4)}.dnshost.example"),
        ("dns_txt", rng.choice(("v=spf1 include:_spf.mailhost.example ~all",
                                f"site-verification={rng.getrandbits(64):016x}"))),
        ("registrar", rng.choice(_REGISTRARS)),
        ("certificate_subject", f"CN={rng.choice((host, '*.' + host))}"),
        *(("subdomain", f"{sub}.{host}") for sub in rng.sample(_SUBDOMAINS, 3)),
    ]


def _username(rng: random.Random, q: str) -> list[tuple[str, str]]:
    handle = q.strip().removeprefix("@")
    return [
        *(("profile", f"https://{site}/{quote(handle)}") for site in rng.sample(_SITES, 4)),
        ("display_name", _person(rng)),
        ("linked_email", f"{handle}@mail.example"),
        ("location", rng.choice(_PLACES)),
        ("bio", f"{rng.choice(_TOPICS).capitalize()} enthusiast. Opinions are my own."),
        ("joined", str(rng.randint(2008, 2023))),
    ]


def _email(rng: random.Random, q: str) -> list[tuple[str, str]]:
    local, at, domain = q.strip().lower().rpartition("@")
    if not at:  # not an address: read the whole value as the local part
        local, domain = domain, "mail.example"
    return [
        ("username_guess", local),
        ("mail_domain", domain),
        ("dns_mx", f"10 mx.{domain}"),
        ("breach_mention", f"listed in fictional dataset demo-leak-{rng.randint(2012, 2023)}"),
        ("avatar_hash", hashlib.sha256(q.strip().lower().encode()).hexdigest()[:32]),
        *(("profile", f"https://{site}/{quote(local)}") for site in rng.sample(_SITES, 2)),
        ("display_name", _person(rng)),
        ("paste_mention", f"https://paste.example/{rng.getrandbits(40):010x}"),
    ]


def _url(rng: random.Random, q: str) -> list[tuple[str, str]]:
    raw = q.strip()
    host = urlsplit(raw if "://" in raw else "https://" + raw).hostname or "site.example"
    return [
        ("http_status", rng.choice(("200", "200", "301", "403"))),
        ("page_title", f"{rng.choice(_TOPICS).title()} | {host}"),
        ("server_header", rng.choice(("nginx", "Apache", "Caddy"))),
        ("archived_snapshot", f"https://archive.example/{_date(rng).replace('-', '')}/{raw}"),
        ("resolved_ip", _ip(rng)),
        ("outlink", f"https://{rng.choice(_SITES)}/{rng.getrandbits(32):08x}"),
        ("technology", rng.choice(("WordPress", "Django", "Hugo", "Drupal"))),
        ("certificate_subject", f"CN={host}"),
    ]


def _org(rng: random.Random, q: str) -> list[tuple[str, str]]:
    slug = re.sub(r"[^a-z0-9]+", "-", q.lower()).strip("-") or "org"
    return [
        ("website", f"https://{slug}.example"),
        ("domain", f"{slug}.example"),
        ("address", f"{rng.randint(1, 250)} Example Street, {rng.choice(_PLACES)}"),
        ("registration_number", f"EX-{rng.randint(100000, 999999)}"),
        ("employee_profile", f"https://{rng.choice(_SITES)}/{slug}-{rng.choice(_FIRST).lower()}"),
        ("social_account", f"https://microblog.example/{slug}"),
        ("industry", rng.choice(("logistics", "software", "retail", "consulting"))),
        ("contact_email", f"info@{slug}.example"),
    ]


def _ip_lead(rng: random.Random, q: str) -> list[tuple[str, str]]:
    return [
        ("reverse_dns", f"host-{rng.randint(1, 254)}.isp.example"),
        ("asn", f"AS{rng.randint(64496, 64511)}"),  # documentation ASNs (RFC 5398)
        *(("open_port", f"{port}/tcp") for port in rng.sample((22, 25, 80, 443, 8080, 8443), 2)),
        ("geo", rng.choice(_PLACES)),
        ("hosted_domain", f"{rng.choice(_SUBDOMAINS)}.site.example"),
        ("abuse_contact", "abuse@isp.example"),
        ("netblock", f"{rng.choice(_DOC_NETS)}.0/24"),
    ]


_CANDIDATES: dict[str, Callable[[random.Random, str], list[tuple[str, str]]]] = {
    "domain": _domain, "username": _username, "email": _email, "url": _url, "org": _org, "ip": _ip_lead,
}


def records(source: str, kind: str, q: str, seed: int) -> list[dict[str, str]]:
    """3 to 8 records a JSON source knows about the lead, always the same for the same input."""
    rng = lead_rng(seed, source, kind, q)
    pool = list(dict.fromkeys(_CANDIDATES[kind](rng, q)))  # drop rare exact duplicates, keep order
    chosen = rng.sample(pool, min(len(pool), rng.randint(3, 8)))
    page_url = f"https://{source}.sandbox.example/{kind}/{quote(q, safe='')}"
    return [
        {"id": f"{source}-{rng.getrandbits(48):012x}", "type": type_, "value": value,
         "first_seen": _date(rng), "source_url": page_url}
        for type_, value in chosen
    ]


def profile(source: str, kind: str, q: str, seed: int) -> dict[str, Any]:
    """A profile (name and 2 to 6 posts) an HTML source shows for the lead; deterministic."""
    rng = lead_rng(seed, source, kind, q)
    name = _person(rng) if kind in ("username", "email") else q
    posts = []
    for _ in range(rng.randint(2, 6)):
        topic = rng.choice(_TOPICS)
        posts.append({
            "id": f"{rng.getrandbits(48):012x}",
            "title": rng.choice(
                (f"Notes on {topic}", f"Why I got into {topic}", f"{topic.capitalize()}, again")
            ),
            "date": _date(rng),
            "body": f"A post about {topic} that mentions {q} along the way.",
        })
    return {"name": name, "posts": sorted(posts, key=lambda p: p["date"], reverse=True)}


def render_profile(source: str, kind: str, q: str, seed: int, *, empty: bool = False) -> str:
    """The profile page as HTML in the fixed format the fleet's HTML adapter parses.

    An empty source still answers with a well-formed page, just without posts: silent emptiness.
    """
    data = profile(source, kind, q, seed)
    e = html.escape
    items = "" if empty else "".join(
        f'<li class="post" data-id="{e(p["id"])}"><a class="title" href="/{e(source)}/post/{e(p["id"])}">'
        f'{e(p["title"])}</a><time datetime="{e(p["date"])}">{e(p["date"])}</time>'
        f'<p class="body">{e(p["body"])}</p></li>'
        for p in data["posts"]
    )
    return (
        f"<html><head><title>{e(data['name'])} on {e(source)}</title></head><body>"
        f'<div class="profile" data-kind="{e(kind)}"><h1 class="name">{e(data["name"])}</h1>'
        f'<ul class="posts">{items}</ul></div></body></html>'
    )
