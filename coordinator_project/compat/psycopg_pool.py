"""psycopg_pool internals that `coordinator_project.postgresql.base.FailFastPool` overrides
or calls, and Django's PostgreSQL backend internals its DatabaseWrapper reuses (checked by
tests/unit/test_compat.py). FailFastPool is itself the adapter; this module only names what
it relies on, so an upgrade that renames any of it fails by name."""
from __future__ import annotations

# Methods of psycopg_pool.ConnectionPool that FailFastPool overrides (their signature and
# role must stay) or calls.
POOL_METHODS = (
    "getconn", "_check_open_getconn", "_getconn_with_check_loop", "_getconn_unchecked",
    "_check_connection", "_putconn", "_get_ready_connection", "_maybe_grow_pool", "_connect",
    "schedule_task", "run_task", "_reset_connection", "check_connection",
)
# Attributes of a pool instance it reads or changes under the pool's lock.
POOL_ATTRIBUTES = ("_lock", "_pool", "_waiting", "_stats", "_REQUESTS_QUEUED", "_REQUESTS_ERRORS")
# Classes of psycopg_pool.pool it uses.
POOL_CLASSES = ("AddConnection", "MaintenanceTask", "ReturnConnection", "WaitingClient")
# Django's PostgreSQL DatabaseWrapper (5.1+) members its `pool` property reuses.
DJANGO_BACKEND = ("_connection_pools", "_configure_connection", "get_connection_params")


def problems() -> list[str]:
    """What FailFastPool relies on and the installed psycopg_pool or Django lacks."""
    from django.db.backends.postgresql import base
    from psycopg_pool import ConnectionPool, pool

    found = [f"psycopg_pool.ConnectionPool.{name} is gone" for name in POOL_METHODS
             if not callable(getattr(ConnectionPool, name, None))]
    probe = ConnectionPool("", open=False)
    found += [f"a psycopg_pool.ConnectionPool has no {name}" for name in POOL_ATTRIBUTES
              if not hasattr(probe, name)]
    found += [f"psycopg_pool.pool.{name} is gone" for name in POOL_CLASSES if not hasattr(pool, name)]
    found += [f"django's PostgreSQL DatabaseWrapper has no {name}" for name in DJANGO_BACKEND
              if not hasattr(base.DatabaseWrapper, name)]
    if not callable(getattr(pool.WaitingClient, "fail", None)):
        found.append("psycopg_pool.pool.WaitingClient.fail is gone")
    return found
