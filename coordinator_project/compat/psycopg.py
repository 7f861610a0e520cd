"""psycopg internals the coordinator reads (checked by tests/unit/test_compat.py).

`assignments.batch` sends a locked pass's statements in one round trip. psycopg caches the
placeholder parse of a query only up to a size; a batch beyond it is merged statement by
statement instead (each short one cached). The bounds are private: read here, with the
values of psycopg 3.2 as the fallback, so an upgrade that drops them costs speed, not
correctness, and `problems()` says so.
"""
from __future__ import annotations

from psycopg import _queries

_FALLBACK = (4096, 50)


def cached_query_bounds() -> tuple[int, int]:
    """(characters, values) up to which psycopg caches a query's parse."""
    return (getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", _FALLBACK[0]),
            getattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", _FALLBACK[1]))


def problems() -> list[str]:
    """What `cached_query_bounds` relies on and the installed psycopg lacks."""
    return [f"psycopg._queries.{name} is gone" for name in
            ("MAX_CACHED_STATEMENT_LENGTH", "MAX_CACHED_STATEMENT_PARAMS") if not hasattr(_queries, name)]
