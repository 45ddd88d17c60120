"""The `changing` source's answers: each lead's changes at a known rate, from hourly to never.

A lead's answer changes as a Poisson process whose rate is fixed by the lead (its kind and value)
and the seed: a share NEVER_SHARE never changes, the others change on average once per an interval
drawn log-uniformly between FASTEST_S and SLOWEST_S. Its content is a function of (lead, version),
the version being the last change at or before the moment asked about, so the same lead asked about
at the same moment always gets the same records, and a change gives it new ones.

Nothing reads a clock here: every question names its moment (epoch seconds), so the app asks with its
injected clock and a bench asks with a simulated one, months in seconds. Change times are drawn per
block of BLOCK_CHANGES expected changes (a Random per lead and block), so any moment's version is
found without drawing the history before it.
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_right
from functools import lru_cache

from investigations.sandbox.content import lead_rng, records

SOURCE = "changing"
FASTEST_S = 3_600.0  # the fastest leads change about hourly ...
SLOWEST_S = 365 * 86_400.0  # ... the slowest about yearly ...
NEVER_SHARE = 0.2  # ... and this share never
# Changes expected per block of a lead's time line: few, so a version is found a block or two back.
BLOCK_CHANGES = 4.0
# How far back a version is looked for: a lead with no change in this many blocks keeps version 0.
_MAX_BLOCKS_BACK = 1_000

Version = tuple[int, int]  # (block, changes up to then in it); (0, 0): never changed


class ChangeModel:
    """Each lead's rate of change and its change times, fixed by the seed (see the module docstring)."""

    def __init__(self, seed: int = 7, *, fastest_s: float = FASTEST_S, slowest_s: float = SLOWEST_S,
                 never_share: float = NEVER_SHARE) -> None:
        if not 0 < fastest_s <= slowest_s or not 0 <= never_share <= 1:
            raise ValueError("need 0 < fastest_s <= slowest_s and 0 <= never_share <= 1")
        self.seed, self.fastest_s, self.slowest_s, self.never_share = seed, fastest_s, slowest_s, never_share

    def rate_per_s(self, kind: str, q: str) -> float:
        """The lead's changes per second (0: it never changes)."""
        rng = lead_rng(self.seed, SOURCE, kind, q)
        if rng.random() < self.never_share:
            return 0.0
        low, high = math.log(1 / self.slowest_s), math.log(1 / self.fastest_s)
        return math.exp(rng.uniform(low, high))

    def changes(self, kind: str, q: str, start_s: float, end_s: float) -> list[float]:
        """The lead's change times in (start_s, end_s], in order."""
        rate = self.rate_per_s(kind, q)
        if rate <= 0 or end_s <= start_s:
            return []
        block_s = BLOCK_CHANGES / rate
        found: list[float] = []
        for block in range(math.floor(start_s / block_s), math.floor(end_s / block_s) + 1):
            times = _block_times(self.seed, kind, q, rate, block)
            found.extend(times[bisect_right(times, start_s):bisect_right(times, end_s)])
        return found

    def version(self, kind: str, q: str, at_s: float) -> Version:
        """The lead's last change at or before `at_s`, as (block, how many changes of that block up to
        it): what its answer at `at_s` is made from."""
        rate = self.rate_per_s(kind, q)
        if rate <= 0:
            return (0, 0)
        block_s = BLOCK_CHANGES / rate
        block = math.floor(at_s / block_s)
        seen = bisect_right(_block_times(self.seed, kind, q, rate, block), at_s)
        for _ in range(_MAX_BLOCKS_BACK):
            if seen:
                return (block, seen)
            block -= 1
            seen = len(_block_times(self.seed, kind, q, rate, block))
        return (0, 0)

    def records(self, kind: str, q: str, at_s: float) -> list[dict[str, str]]:
        """The lead's answer at `at_s`: 3 to 8 records, new ones after each change."""
        block, index = self.version(kind, q, at_s)
        digest = hashlib.sha256(f"{self.seed}\x00{block}\x00{index}".encode()).digest()
        return records(SOURCE, kind, q, int.from_bytes(digest[:8], "big"))


@lru_cache(maxsize=1 << 14)
def _block_times(seed: int, kind: str, q: str, rate_per_s: float, block: int) -> tuple[float, ...]:
    """The lead's change times in its block `block` (of BLOCK_CHANGES / rate seconds), in order: a
    Poisson process drawn from a Random of its own."""
    digest = hashlib.sha256(f"{seed}\x00{SOURCE}\x00{kind}\x00{q}\x00{block}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    block_s = BLOCK_CHANGES / rate_per_s
    at, end, times = block * block_s, (block + 1) * block_s, []
    while (at := at + rng.expovariate(rate_per_s)) < end:
        times.append(at)
    return tuple(times)

