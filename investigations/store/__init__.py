"""State store (SQLAlchemy Core on SQLite or Postgres)."""

from investigations.store.state import (
    QUEUE_DEPTH_KEYS,
    AcceptResult,
    Collection,
    DeadLetter,
    InboxItem,
    QueuedCollection,
    StateStore,
    utcnow,
)

__all__ = ["QUEUE_DEPTH_KEYS", "AcceptResult", "Collection", "DeadLetter", "InboxItem", "QueuedCollection",
           "StateStore", "utcnow"]
