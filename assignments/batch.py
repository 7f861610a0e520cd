"""Statements sent to the database in one round trip, with the transaction's COMMIT when asked."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import connection

from assignments.models import SQLValue
from coordinator_project.compat.psycopg import cached_query_bounds

CACHED_SQL_CHARS, CACHED_SQL_VALUES = cached_query_bounds()


class Batch:
    """Statements sent in one round trip, in order (the lock with its reads; one save's writes). On PostgreSQL they go out as one multi-statement
    execute, one round trip (a client-side cursor; each statement's rows come back in order,
    reached with nextset()): under a join storm every round trip inside the group lock was a
    wait for the whole group, and under gevent a chance for the worker's other requests to
    run first. Elsewhere (SQLite) they run one by one."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Sequence[SQLValue], Callable[[list[tuple]], None] | None]] = []

    def add(self, sql: str, params: Sequence[SQLValue], on_rows: Callable[[list[tuple]], None] | None = None) -> None:
        self.statements.append((sql, params, on_rows))

    def run(self, *, commit: bool = False) -> None:
        """Send the statements added so far (the batch is then empty again). `commit`: end the
        transaction in the same round trip; Django's commit at the end of the atomic block then
        finds it over and sends nothing (psycopg skips COMMIT when the server is idle), and on
        an error the COMMIT is never reached and the block rolls back as usual."""
        if commit:
            self.add("COMMIT", [])
        statements, self.statements = self.statements, []
        if not statements:
            return
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # The joined text's length and the values' count, without building either for
                # a batch that is then merged instead.
                chars = sum(len(sql) for sql, _, _ in statements) + 2 * (len(statements) - 1)
                if chars <= CACHED_SQL_CHARS and sum(len(p) for _, p, _ in statements) <= CACHED_SQL_VALUES:
                    cursor.execute(";\n".join(sql for sql, _, _ in statements),
                                   [v for _, params, _ in statements for v in params])
                else:
                    # psycopg caches a query's placeholder parse only up to 4 KB and 50 values,
                    # and a storm's batch of member rows is longer: parsed whole on every pass
                    # (a regex over it), it cost ~1.5 times the client CPU of each statement
                    # merged with its values on its own (short: cached, its text repeats from
                    # pass to pass), the batch then sent without parameters (50 statements:
                    # 7.4 vs 4.7 ms).
                    merge = cursor.cursor.mogrify
                    cursor.execute(";\n".join(merge(sql, params) for sql, params, _ in statements))
                for i, (_, _, on_rows) in enumerate(statements):
                    if i:
                        cursor.nextset()
                    if on_rows is not None:
                        on_rows(cursor.fetchall())
                return
            for sql, params, on_rows in statements:
                cursor.execute(sql, params)
                if on_rows is not None:
                    on_rows(cursor.fetchall())
