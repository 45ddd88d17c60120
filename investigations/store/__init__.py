"""State store (SQLAlchemy Core on SQLite or Postgres)."""

from investigations.store.state import (
    DIED_COLLECTING,
    QUEUE_DEPTH_KEYS,
    RUN_DIED,
    AcceptResult,
    Collection,
    DeadLetter,
    InboxItem,
    QueuedCollection,
    QueueEntry,
    StateStore,
    utcnow,
)

__all__ = ["DIED_COLLECTING", "QUEUE_DEPTH_KEYS", "RUN_DIED", "AcceptResult", "Collection", "DeadLetter",
           "InboxItem", "QueueEntry", "QueuedCollection", "StateStore", "utcnow"]
