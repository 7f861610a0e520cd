"""Pooled connections under gevent workers (settings: DB_POOL).

A gevent worker serves many requests at once from small per-process pools (two "default"
connections, four "liveness"). A request that keeps a pooled connection while it waits for
something else (the group's gate, a shared read, the other pool) can starve the request it
waits for: in a join storm with a connection per member, requests that kept their "liveness"
connection from the stamp flush and queued for the gate, while the gate's holder waited for a
"default" one held by requests waiting for "liveness", stalled the worker until the pools'
15 s timeouts, again and again. So a short read outside a transaction hands its pooled
connection back at once (`release`), and nobody waits while holding one: every wait for
another request goes through `coordinator_project.waiting`, which calls
`hand_back_before_waiting` first.
"""
from __future__ import annotations

from django.db import connections

from coordinator_project.process_state import PROCESS


def release(alias: str = "default") -> None:
    """Hand this request's pooled connection of `alias` back to its pool, unless it is inside
    a transaction. Unpooled connections (sync workers, tests) are kept: closing them would
    cost a new connection per request. An alias this setup lacks (SQLite has no "liveness")
    holds nothing."""
    if alias not in connections.settings:
        return
    conn = connections[alias]
    if conn.connection is not None and getattr(conn, "pool", None) is not None and not conn.in_atomic_block:
        conn.close()


def hand_back_before_waiting() -> None:
    """Before a request waits for another (`coordinator_project.waiting`, the only caller):
    hand back every connection it holds outside a transaction, pooled or not, so the request
    it waits for can get one. A connection inside a transaction is kept (its work is not
    done; waiting there is the caller's bug)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block:
            conn.close()


def hand_back_pooled() -> None:
    """Every pooled connection this thread holds outside a transaction goes back to its pool."""
    for alias in connections.settings:
        release(alias)


def close_pools() -> None:
    """Worker exit: close this process's connections and its pools (no new connection is made
    for them after this)."""
    for conn in connections.all():
        close_pool = getattr(conn, "close_pool", None)  # PostgreSQL backends (Django 5.1+)
        if conn.settings_dict.get("OPTIONS", {}).get("pool") and close_pool is not None:
            close_pool()
    connections.close_all()


PROCESS.own(
    "connection pools", connections,
    "This process's database connections and their pools (settings.DB_POOL under gevent:"
    " 'default' 2, 'liveness' 4). key: database alias -> pool; bound: the pool sizes;"
    " invalidated: reset hands pooled connections back, close (worker exit) closes the pools;"
    " N hosts: each process has its own pools on the one database.",
    reset=hand_back_pooled, close=close_pools,
)
