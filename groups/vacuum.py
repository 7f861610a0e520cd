"""Whether PostgreSQL will vacuum the coordinator's busiest tables, said once per `migrate`.

Every steady heartbeat's last-seen stamp is an UPDATE of its member row, and every locked pass
rewrites rows of its group: the dead rows they leave are only reclaimed by vacuum. With
autovacuum off (the server setting, `track_counts`, which it needs, or a table's own
`autovacuum_enabled`), the tables and their indexes grow with the traffic, not with the groups
(35,000 dead member rows after one 10-minute 10,000-member bench). `manage.py migrate`, which
every installation and upgrade runs, logs one warning line naming what is off (so does
`flush`, which sends the same signal).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction

from assignments.models import ShardAssignment
from groups.models import Group
from members.models import Member

log = logging.getLogger(__name__)

# A table's reloption that turns autovacuum off, in the spellings PostgreSQL accepts for false.
_OFF = ("autovacuum_enabled=false", "autovacuum_enabled=off", "autovacuum_enabled=no", "autovacuum_enabled=0")


def busiest_tables() -> list[str]:
    """The tables every heartbeat or locked pass updates."""
    return [Member._meta.db_table, ShardAssignment._meta.db_table, Group._meta.db_table]


def vacuum_problem(autovacuum: str, track_counts: str, tables_off: Sequence[str]) -> str | None:
    """One line saying what keeps vacuum from the busiest tables (None: nothing does)."""
    off = [f"{name} = off" for name, value in (("autovacuum", autovacuum), ("track_counts", track_counts))
           if value != "on"]
    off += [f"autovacuum_enabled = false on {table}" for table in tables_off]
    if not off:
        return None
    return (f"PostgreSQL will not vacuum the coordinator's tables ({'; '.join(off)}): every heartbeat's"
            " last-seen stamp is an UPDATE, and the dead rows it leaves stay. Turn autovacuum on"
            " (postgresql.conf: autovacuum = on, track_counts = on; docs/OPERATING.md, PostgreSQL)")


def database_vacuum_problem(using: str = "default") -> str | None:
    """`vacuum_problem` of the database `using` names (None on SQLite, or if it cannot be read)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    try:
        # A savepoint where the caller holds a transaction (a flush in a test): a failed read
        # must not leave it aborted.
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('autovacuum'), current_setting('track_counts'),"
                # to_regclass: the tables as the connection's search_path finds them, NULL if not there
                " ARRAY(SELECT c.relname::text FROM pg_class AS c"
                " WHERE c.oid = ANY(ARRAY(SELECT to_regclass(t) FROM unnest(%s::text[]) AS t))"
                " AND EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o WHERE lower(o) = ANY(%s::text[]))"
                " ORDER BY 1)",
                [busiest_tables(), list(_OFF)],
            )
            autovacuum, track_counts, tables_off = cursor.fetchone()
    except DatabaseError:  # a warning only: never the reason a migrate fails
        return None
    return vacuum_problem(autovacuum, track_counts, tables_off)


def warn_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate receiver (groups' own, so once per migrate)."""
    problem = database_vacuum_problem(using)
    if problem is not None:
        log.warning(problem)
