"""One place that turns a ``--store`` value into a store: a path or a PostgreSQL URL."""

from __future__ import annotations

from pathlib import Path

from lamina.pipeline._store.postgres import PostgresStore, is_postgres_url
from lamina.pipeline._store.sqlite import SqliteStore

__all__ = ["open_store"]


def open_store(
    value: str | Path, *, timeout: float = 10.0, read_only: bool = False
) -> SqliteStore | PostgresStore:
    """``postgresql://...`` opens a ``PostgresStore``; anything else is a SQLite file path.

    The CLI's ``--store`` and the Python API choose the same way, so a host switches
    databases by changing one setting. ``read_only`` opens only an existing Lamina store
    at this schema version and never writes (no tables made, no migration, no save)."""
    if isinstance(value, str) and is_postgres_url(value):
        return PostgresStore(value, timeout=timeout, read_only=read_only)
    return SqliteStore(value, timeout=timeout, read_only=read_only)
