"""Removing what a SQLite installation of a test wrote to the shared Redis (no FLUSHDB)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import redis

from tests.redis_keys import delete_keys


def installation_namespace(db: Path) -> str | None:
    """`rsc-<id8>` of the installation in that SQLite database, if it made one."""
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT installation_id FROM groups_installation").fetchone()
    except sqlite3.OperationalError:  # no database, or not migrated
        return None
    return f"rsc-{row[0][:8]}" if row else None


def delete_namespace_keys(db: Path, redis_url: str) -> None:
    """Its streams, seal markers, fence tokens and Celery keys: everything under its prefix."""
    namespace = installation_namespace(db)
    if not namespace:
        return
    client = redis.Redis.from_url(redis_url)
    delete_keys(client, f"{namespace}:*")
    client.close()
