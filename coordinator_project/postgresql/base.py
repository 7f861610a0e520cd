"""Django's PostgreSQL backend with a pool that fails fast when the database is unreachable.

psycopg_pool queues a request for up to its `timeout` (DB_POOL_TIMEOUT, 15 s): right for a
burst, wrong for an outage. With PostgreSQL refusing connections, every request of a gevent
worker waited out those 15 s before its 503 (issue 24.4), and a database that accepts and
never answers did the same (issue 27.4). `FailFastPool` notes whether its latest connection
attempt failed; while it did and no connection is idle, a request gets the 503 at once, and a
failed attempt also fails every request already queued. Its background reconnections retry at
least every RECONNECT_DELAY_CAP seconds for as long as it takes (psycopg_pool's own back-off
doubles up to minutes and then gives up), so the first request after the database is back
finds a connection within about a second.

It also bounds the rollback of a connection handed back inside a transaction: on a frozen
server it would otherwise wait forever in the greenlet that returns it.

And a request dropped while it queues for a connection leaves the queue (issue 27.4's open
defect). The request deadline (coordinator_project.wsgi_guard) is a BaseException raised where
the request waits; psycopg_pool's waiter handles only `Exception`, so a dropped waiter stayed
in the pool's queue, and the next connection handed back went to it and was never seen again.
Two such drops emptied a gevent worker's "default" pool for good: every later request waited,
no statement reached PostgreSQL, and every answer was the deadline's 503 (the 10,000-member
storm's stall).
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.pool import AddConnection, MaintenanceTask, ReturnConnection, WaitingClient

log = logging.getLogger(__name__)

RECONNECT_DELAY_CAP = 1.0  # seconds between reconnection attempts during an outage, at most
ROLLBACK_TIMEOUT = 2.0  # seconds a returned connection's rollback may take before it is closed


class Unreachable(PoolTimeout):
    """The latest connection attempt failed: the 503 at once, not after the pool's timeout."""


class FailFastPool(ConnectionPool[Connection[Any]]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Never give up reconnecting (the default gives up after 5 minutes and then shrinks).
        kwargs.setdefault("reconnect_timeout", 10 * 365 * 86400.0)
        super().__init__(*args, **kwargs)
        self.unreachable: str | None = None  # the latest connection attempt's error, if it failed

    def getconn(self, timeout: float | None = None) -> Connection[Any]:
        timeout = self.timeout if timeout is None else timeout
        self._check_open_getconn()
        try:
            return self._getconn_with_check_loop(time.monotonic() + timeout)
        except Unreachable:
            raise
        except PoolTimeout:
            raise PoolTimeout(f"couldn't get a connection after {timeout:.2f} s") from None

    def _getconn_with_check_loop(self, deadline: float) -> Connection[Any]:
        # As psycopg_pool's, except that a connection failing its check is followed by the next
        # one at once (psycopg_pool sleeps 1 s or more first), and that nobody queues while
        # the latest connection attempt failed. Reading two attributes without the pool's lock
        # is fine: a stale answer costs one queued request or one early 503, not a wrong
        # connection.
        while True:
            if self.unreachable is not None and not self._pool:
                raise Unreachable(f"the database is unreachable: {self.unreachable}")
            conn = self._getconn_unchecked(deadline - time.monotonic())
            try:
                self._check_connection(conn)
            except Exception:
                self._putconn(conn, from_getconn=True)  # discarded; a new one is being made
                continue
            except BaseException:
                self._putconn(conn, from_getconn=True)
                raise
            return conn

    def _getconn_unchecked(self, timeout: float) -> Connection[Any]:
        # As psycopg_pool's, except for the BaseException branch (see the module docstring).
        with self._lock:
            conn = self._get_ready_connection(timeout)
            if conn is None:
                pos: WaitingClient[Connection[Any]] = WaitingClient()
                self._waiting.append(pos)
                self._stats[self._REQUESTS_QUEUED] += 1
                self._maybe_grow_pool()
        if conn is None:
            try:
                conn = pos.wait(timeout=timeout)
            except Exception:
                if pos.conn:  # handed over as the wait failed: back to the pool
                    self.run_task(ReturnConnection(self, pos.conn, from_getconn=True))
                self._stats[self._REQUESTS_ERRORS] += 1
                raise
            except BaseException:
                self._leave_queue(pos)
                raise
        conn._pool = self
        return conn

    def _leave_queue(self, pos: WaitingClient[Connection[Any]]) -> None:
        """A waiter dropped by a BaseException (the request deadline) leaves the queue; a
        connection handed to it meanwhile goes back to the pool (to the next waiter)."""
        with self._lock, contextlib.suppress(ValueError):
            self._waiting.remove(pos)
        if not pos.fail(PoolTimeout("the request waiting for a connection was dropped")) and pos.conn:
            self.run_task(ReturnConnection(self, pos.conn, from_getconn=True))
        self._stats[self._REQUESTS_ERRORS] += 1

    def _connect(self, timeout: float | None = None) -> Connection[Any]:
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            first = self.unreachable is None
            lines = str(exc).strip().splitlines()
            self.unreachable = f"{exc.__class__.__name__}: {lines[0] if lines else ''}"
            if first:
                log.warning("database unreachable from pool %r (%s): requests answer 503 until it is back",
                            self.name, self.unreachable)
            with self._lock:
                waiting = list(self._waiting)
                self._waiting.clear()
            for client in waiting:
                client.fail(Unreachable(f"the database is unreachable: {self.unreachable}"))
            raise
        if self.unreachable is not None:
            log.warning("database reachable again from pool %r", self.name)
        self.unreachable = None
        return conn

    def schedule_task(self, task: MaintenanceTask, delay: float) -> None:
        if isinstance(task, AddConnection):
            delay = min(delay, RECONNECT_DELAY_CAP)
        super().schedule_task(task, delay)

    def _reset_connection(self, conn: Connection[Any]) -> None:
        timer = gevent.Timeout(ROLLBACK_TIMEOUT, TimeoutError("rollback of a returned connection timed out"))
        timer.start()
        try:
            super()._reset_connection(conn)
        except TimeoutError as exc:
            log.warning("%s: discarding the connection", exc)
            conn.pgconn.finish()  # closes the socket without a word to the server
        finally:
            timer.close()


class DatabaseWrapper(base.DatabaseWrapper):
    # Django's own (5.1+: the per-alias pools, the set-up run on each new connection), which
    # django-stubs 5.2 does not declare. Annotations only: nothing is shadowed at run time.
    _connection_pools: dict[str, FailFastPool]  # every pooled alias runs this backend (settings)
    _configure_connection: Callable[[Connection[Any]], None]

    @property
    def pool(self) -> FailFastPool | None:
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            # As Django's own (django.db.backends.postgresql.base), with FailFastPool.
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True
            pool = FailFastPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,
                check=ConnectionPool.check_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if pool_options is True else pool_options),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]


