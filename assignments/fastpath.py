"""The steady-state heartbeat in one SQL statement, without the group lock (PostgreSQL only).

A heartbeat of a STABLE member at the current assignment and metadata epochs, reporting no
revocations or drains and claiming only shards it is granted, changes nothing but liveness:
the core would answer OK with its granted shards (R3, R4, R6 with nothing to do). This
statement checks exactly those conditions and stamps last-seen; if any fails it returns no
row and the caller takes the locked path, where the core decides. Anything that changes a
member's ownership either changes its row (status, epoch) or raises the group's
assignmentEpoch, so a matching row proves the cached answer is still the core's answer.
It runs on the "liveness" connection (synchronous_commit=off): a lost last-seen stamp in a
crash is harmless, and fsync stalls would otherwise gate every heartbeat.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connections

from coordination.model import HeartbeatRequest

log = logging.getLogger(__name__)

_SQL = """
WITH me AS (
    SELECT m.id, g.assignment_epoch, g.heartbeat_interval_ms, g.metadata_epoch
      FROM groups_group AS g
      JOIN members_member AS m ON m.group_id = g.id AND m.member_id = %s
     WHERE g.name = %s
       AND m.status = 'STABLE'
       AND m.member_epoch = %s
       AND g.assignment_epoch = m.member_epoch
       AND g.metadata_epoch = %s
), granted AS (
    SELECT COALESCE(array_agg(s.shard_id::text ORDER BY s.version_id, s.index), '{}') AS shards
      FROM me
      JOIN assignments_shardassignment AS a ON a.owner_id = me.id AND NOT a.revoking
      JOIN groups_shard AS s ON s.id = a.shard_id
), stamped AS (
    -- Re-checked on the row's newest version, so a concurrent sweep or fence wins.
    UPDATE members_member AS m
       SET last_heartbeat_at = %s,
           last_reported_owned = COALESCE(%s::jsonb, m.last_reported_owned)
      FROM me, granted
     WHERE m.id = me.id
       AND m.status = 'STABLE'
       AND m.member_epoch = %s
       AND (%s::text[] IS NULL OR %s::text[] <@ granted.shards)
    RETURNING m.id
)
SELECT me.assignment_epoch, me.heartbeat_interval_ms, me.metadata_epoch, granted.shards
  FROM stamped, me, granted
"""


@dataclass(frozen=True)
class SteadyAnswer:
    assignment_epoch: int
    heartbeat_interval_ms: int
    metadata_epoch: int
    assigned: tuple[str, ...]


def available() -> bool:
    return "liveness" in connections.databases


def eligible(req: HeartbeatRequest) -> bool:
    return (
        req.member_epoch > 0
        and req.metadata_epoch is not None
        and not req.revoking_shards
        and not req.drained_shards
    )


def steady_heartbeat(group: str, req: HeartbeatRequest, now: datetime) -> SteadyAnswer | None:
    owned = list(req.owned_shards) if req.owned_shards is not None else None
    owned_json = json.dumps(sorted(owned)) if owned is not None else None
    # Positional, in the order the placeholders appear in _SQL (cheaper than named ones).
    params = (
        req.member_id, group, req.member_epoch, req.metadata_epoch,
        now, owned_json, req.member_epoch, owned, owned,
    )
    conn = connections["liveness"]
    try:
        with conn.cursor() as cursor:
            cursor.execute(_SQL, params)
            row = cursor.fetchone()
    except DatabaseError as exc:
        # No per-request health-check ping on this connection (a round trip per heartbeat),
        # and its statements are prepared (a migration can invalidate them): on any error
        # the connection is dropped and this heartbeat takes the locked path, which decides.
        log.warning("steady heartbeat path failed, using the locked path: %s", exc)
        conn.close()
        return None
    if conn.pool is not None:
        # Pooled (gevent workers): hand the connection back now, not at the request's end, so
        # a heartbeat going on to the locked path does not hold it while it queues there.
        conn.close()
    if row is None:
        return None
    return SteadyAnswer(row[0], row[1], row[2], tuple(row[3]))
