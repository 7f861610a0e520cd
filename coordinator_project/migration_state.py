"""Whether this node's database holds every migration of this release (issue 24.3).

/readyz answers 503 until it does, and a request that fails on a missing table or column
answers 503 COORDINATOR_UNAVAILABLE naming `manage.py migrate`, not a 500 with a traceback:
on a fresh database (gunicorn started before `migrate`) or after an upgrade without it, every
request fails the same way until the operator migrates, which is an outage of the node.
"""
from __future__ import annotations

from django.db import DatabaseError, OperationalError, connection

from coordinator_project.process_state import PROCESS

# PostgreSQL's undefined_table and undefined_column (SQLite says it in the message).
_UNDEFINED_TABLE = "42P01"
_UNDEFINED_COLUMN = "42703"


class _MigrationsSeen:
    """Whether this process saw every migration of its code applied (then for good: nothing
    unapplies them behind a running release)."""

    def __init__(self) -> None:
        self.seen = False

    def reset(self) -> None:
        self.seen = False


_MIGRATIONS = PROCESS.own(
    "migrations applied", _MigrationsSeen(),
    "Whether /readyz (or a request failing on a missing column) saw every migration of this release applied. key: none (one flag); bound: one"
    " flag; invalidated: reset (tests, a database rewind); while migrations are missing each /readyz"
    " asks again; N hosts: each process asks its own database connection",
)


def pending_migrations() -> list[str]:
    """This release's migrations the default database has not applied ("app.name"), in order."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return [f"{m.app_label}.{m.name}" for m, backwards in
            executor.migration_plan(executor.loader.graph.leaf_nodes()) if not backwards]


def check_migrations() -> str:
    """A release started on a database migrated by an older one answers every heartbeat 503
    until `manage.py migrate`: not ready (issue 24.3's not-migrated case, for the web tier)."""
    if _MIGRATIONS.seen:
        return "ok"
    pending = pending_migrations()
    if not pending:
        _MIGRATIONS.seen = True
        return "ok"
    more = f" and {len(pending) - 1} more" if len(pending) > 1 else ""
    return f"error: migrations of this release not applied ({pending[0]}{more}): run manage.py migrate"


def missing_schema(exc: BaseException) -> str | None:
    """"table" or "column" when the database lacks one this code reads, else None. Only what
    the error says: whether migrations are pending is `is_not_migrated`'s question."""
    if not isinstance(exc, DatabaseError):
        return None
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    sqlite = str(exc) if isinstance(exc, OperationalError) else ""
    if sqlstate == _UNDEFINED_TABLE or sqlite.startswith("no such table"):
        return "table"
    if sqlstate == _UNDEFINED_COLUMN or sqlite.startswith("no such column") or "has no column named" in sqlite:
        return "column"
    return None


def is_not_migrated(exc: BaseException) -> bool:
    """The error is this release's schema missing from the database: a table (always: the
    code only reads tables its migrations create), or a column while migrations are pending
    (a column missing from a fully migrated database is a bug, and keeps its 500)."""
    kind = missing_schema(exc)
    if kind != "column":
        return kind == "table"
    try:
        return check_migrations() != "ok"
    except Exception:  # the migrations table unreadable too: nothing is migrated
        return True
