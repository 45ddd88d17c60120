"""The state store: one facade over the table families of the fleet's shared state.

Everything that several runs and processes must agree on lives here, in one database (SQLite by
default, Postgres for a fleet), so the engine stays stateless between calls. Each family is its own
module: leads, cases and the inbox (`leads`), the fetch log (`fetchlog`), the collection queue
(`queue`), collections and their history (`collections`), dead letters (`deadletters`), each
source's canary incident (`incidents`), each lead's visits and how often its answer changes
(`visits`); what they share is in `sql`. The rate lanes, circuits, identity pool and cookie jars keep
their own tables beside these, in their own packages.
"""

from __future__ import annotations

from sqlalchemy import Engine

from investigations.store.collections import Collection, CollectionTables
from investigations.store.deadletters import DeadLetter, DeadLetterTables
from investigations.store.engine import make_engine
from investigations.store.fetchlog import FetchLogTables
from investigations.store.incidents import IncidentTables, SourceIncident
from investigations.store.leads import AcceptResult, InboxItem, LeadTables
from investigations.store.migrations import migrate
from investigations.store.queue import (
    DIED_COLLECTING,
    QUEUE_DEPTH_KEYS,
    RUN_DIED,
    QueuedCollection,
    QueueEntry,
    QueueTables,
)
from investigations.store.sql import utcnow
from investigations.store.visits import VisitTables

__all__ = ["DIED_COLLECTING", "QUEUE_DEPTH_KEYS", "RUN_DIED", "AcceptResult", "Collection", "DeadLetter",
           "InboxItem", "QueueEntry", "QueuedCollection", "SourceIncident", "StateStore", "utcnow"]


class StateStore(LeadTables, FetchLogTables, DeadLetterTables, QueueTables, CollectionTables, IncidentTables,
                 VisitTables):
    """Shared state of the fleet. Safe to use from many threads and processes at once."""

    def __init__(self, engine: Engine, *, schema: str | None = None) -> None:
        self.engine = engine
        self.schema = schema
        self.schema_version = migrate(engine, schema=schema)

    @classmethod
    def from_url(cls, url: str, *, schema: str | None = None) -> StateStore:
        return cls(make_engine(url, schema=schema), schema=schema)

    def close(self) -> None:
        self.engine.dispose()
