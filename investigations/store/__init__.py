"""State store (SQLAlchemy Core on SQLite or Postgres)."""

from investigations.store.state import (
    AcceptResult,
    Collection,
    DeadLetter,
    InboxItem,
    StateStore,
    utcnow,
)

__all__ = ["AcceptResult", "Collection", "DeadLetter", "InboxItem", "StateStore", "utcnow"]
