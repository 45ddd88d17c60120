"""State store (SQLAlchemy Core on SQLite or Postgres)."""

from investigations.store.state import (
    DIED_COLLECTING,
    QUEUE_DEPTH_KEYS,
    RUN_DIED,
    InboxItem,
    QueuedCollection,
    QueueEntry,
    SourceIncident,
    StateStore,
    utcnow,
)

__all__ = [
    "DIED_COLLECTING",
    "InboxItem",
    "QUEUE_DEPTH_KEYS",
    "QueueEntry",
    "QueuedCollection",
    "RUN_DIED",
    "SourceIncident",
    "StateStore",
    "schema",
    "utcnow",
]
