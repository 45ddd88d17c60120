"""What one collection run works through: the leads its handover owes, and, for an interactive run,
the fresh leads the dispatcher joins to it while it is open.

A run costs seconds of CPU and of waiting before its first request (launch, imports, resources), so
a fresh lead that arrives while a run of its source is collecting (another case's burst, say) is
better off joining that run than starting one: the dispatcher hands it to the run's handover
(`investigations.scheduling.dispatch.join_collectors`) and the run takes it at its next look, a fraction of a
second later, ahead of the leads it already had. An interactive run is open to such leads from its
request (OPEN_BEFORE_START_S until it starts), while it collects and LINGER_S after its last lead,
at most OPEN_FOR_S in all: it keeps a row in the store's
`collectors` table, renewed every RENEW_S to OPEN_LEASE_S ahead, so a run that dies stops being
joined within seconds (what was joined to it comes back with the rest of what it owed). A run that
closes deletes its row first, then reads what it owes once more: whatever was joined before that is
collected, and nothing can be joined after.

Nothing here knows Dagster: the asset iterates `RunWork.outcomes()` and reports each outcome.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from investigations.store import QueuedCollection, StateStore

# An interactive run takes joined leads for at most this long after it started ...
OPEN_FOR_S = 300.0
# ... and stays open this long after its last lead finished, for the next fresh lead of its source:
# a stream of single leads (an investigator adding them one by one) then costs one run, not one each.
LINGER_S = 15.0
# How often an open run looks at its handover for joined leads, and renews its row.
POLL_S = 0.25
RENEW_S = 1.0
# How far ahead a renewal keeps the run open: a run that died is no longer joined after this.
OPEN_LEASE_S = 5.0
# A run is open to joins from its request on (leads joined before it starts are simply among the
# leads it starts with), for this long until it starts and renews: a fresh lead arriving while the
# run of its source's first fresh lead is still starting joins it instead of starting another.
OPEN_BEFORE_START_S = 30.0

Outcome = TypeVar("Outcome")


class RunWork(Generic[Outcome]):
    """The leads of one run, collected `concurrency` at a time, each outcome given back as it
    finishes. With `open_to_joins` (an interactive run with a handover) the run also takes the leads
    joined to its handover while it is open (at most `open_for_s`, and `linger_s` after its last
    lead), each ahead of the leads still waiting; `on_join` hears
    of the rows each look found. `taken_rows` are the ids of the handover's rows `leads` came from
    (a lead joined later comes with a row of its own). `clock` is monotonic time, `sleep` waits on
    it, `wall` is the epoch time the store compares `open_until_s` with."""

    def __init__(
        self,
        store: StateStore,
        *,
        source: str,
        handover_key: str | None,
        leads: Sequence[str],
        collect: Callable[[str], Outcome],
        concurrency: int,
        taken_rows: Iterable[int] = (),
        open_to_joins: bool = False,
        open_for_s: float = OPEN_FOR_S,
        linger_s: float = LINGER_S,
        on_join: Callable[[list[QueuedCollection]], None] = lambda _rows: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store, self._source, self._key = store, source, handover_key or ""
        self._pending = deque(leads)
        self._taken = set(taken_rows)
        self._collect, self._concurrency = collect, concurrency
        self._open = open_to_joins and bool(handover_key)
        self._open_for_s, self._linger_s = open_for_s, linger_s
        self._on_join, self._clock, self._sleep, self._wall = on_join, clock, sleep, wall
        # True while the outcome just given back left nothing in flight or waiting: what the caller
        # holds back for a group (check results) should go out now, not when an open run closes.
        self.idle = False

    def outcomes(self) -> Iterator[tuple[str, Outcome]]:
        """(lead id, outcome) for every lead of the run, in the order they finish."""
        started = last_busy = self._clock()
        next_look = next_renewal = started
        running: dict[Future[Outcome], str] = {}
        with ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix=f"collect-{self._source}") as pool:
            try:
                if self._open:
                    self._renew()
                while True:
                    self._fill(pool, running)
                    if not running and not self._open:
                        return
                    if running:
                        done, _ = wait(running, timeout=POLL_S if self._open else None, return_when=FIRST_COMPLETED)
                        finished = [(running.pop(future), future) for future in done]
                        # The freed threads take their next leads before the outcomes go back: the
                        # caller's work on each (Dagster storing its events) then runs beside their
                        # next collections instead of holding those threads idle until it returns.
                        self._fill(pool, running)
                        for n, (lead, future) in enumerate(finished, start=1):
                            self.idle = not running and not self._pending and n == len(finished)
                            yield lead, future.result()
                    else:
                        self._sleep(POLL_S)  # open, nothing to do: wait for a joined lead
                    now = self._clock()
                    if running or self._pending:
                        last_busy = now
                    if self._open:
                        next_look, next_renewal = self._keep_open(now, started=started, last_busy=last_busy,
                                                                  next_look=next_look, next_renewal=next_renewal)
            except BaseException:
                # A terminated run stops after the leads in flight instead of collecting the rest of
                # its work first; those go back to the queue as its handover's owed rows.
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            finally:
                if self._open:
                    self._store.close_collector(self._key)

    def _fill(self, pool: ThreadPoolExecutor, running: dict[Future[Outcome], str]) -> None:
        """Start waiting leads until `concurrency` are in flight."""
        while self._pending and len(running) < self._concurrency:
            lead = self._pending.popleft()
            running[pool.submit(self._collect, lead)] = lead

    def _keep_open(self, now: float, *, started: float, last_busy: float, next_look: float,
                   next_renewal: float) -> tuple[float, float]:
        """An open run's housekeeping at `now`: close when open long enough or idle past the linger,
        else take what joined and renew the open mark, each on its own period. The next times for both."""
        if now - started >= self._open_for_s or now - last_busy >= self._linger_s:
            self._close()
            return next_look, next_renewal
        if now >= next_look:
            self._take_joined()
            next_look = now + POLL_S
        if now >= next_renewal:
            self._renew()
            next_renewal = now + RENEW_S
        return next_look, next_renewal

    def _renew(self) -> None:
        self._store.open_collector(self._key, self._source, until_s=self._wall() + OPEN_LEASE_S)

    def _close(self) -> None:
        """Take no more joins, then whatever was joined before that."""
        self._store.close_collector(self._key)
        self._open = False
        self._take_joined()

    def _take_joined(self) -> None:
        rows = [row for row in self._store.handover_rows(self._key, known=self._taken) if row.id not in self._taken]
        if not rows:
            return
        self._taken.update(row.id for row in rows)
        # Fresh leads first: each joined a run so as not to wait, and there are few of them.
        self._pending.extendleft(reversed([row.lead_id for row in rows]))
        self._on_join(rows)
