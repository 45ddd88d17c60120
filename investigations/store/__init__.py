"""State store (SQLAlchemy Core on SQLite or Postgres)."""

from investigations.store.state import (
    AcceptResult,
    Collection,
    DeadLetter,
    QueuedCollection,
    InboxItem,
    StateStore,
    utcnow,
)

__all__ = ["AcceptResult", "Collection", "DeadLetter", "InboxItem", "QueuedCollection", "StateStore", "utcnow"]
