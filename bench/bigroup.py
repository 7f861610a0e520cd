"""A settled group of N members over M shards, built in bulk (seconds, not a join storm).

For the admin's scale test and `make bench-describe`: round-robin ownership (member i holds
every shard whose index ≡ i mod N, owner = target, grant epoch 2), every member STABLE at
the assignment epoch, heartbeats spread over the last second (interval 15 s: alive for a while, not beating). Optionally each shard stream
gets a small backlog (index mod 7 entries, the consumer group at "0") so lag has values.
PostgreSQL only (one UPDATE … FROM).
"""
from __future__ import annotations

from datetime import datetime, timedelta

import redis
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from assignments.models import ShardAssignment
from bench.redis_keys import delete_keys
from dataplane.routing import ShardKeys
from groups.models import Group, Shard
from groups.services import create_group, create_stream
from members.models import Member

EPOCH = 2


def member_name(i: int) -> str:
    return f"m-{i:04d}"


def build_settled_group(
    stream: str, group: str, members: int, shards: int, *, now: datetime | None = None,
    backlog: redis.Redis | None = None,
) -> Group:
    now = now or timezone.now()
    with override_settings(MAX_SHARDS_PER_STREAM=max(shards, 1024)):  # beyond the default cap
        create_stream(stream, shards)
    g = create_group(group, stream, max_members=max(members, 1000), heartbeat_interval_ms=15_000,
                     session_timeout_ms=3_600_000, rebalance_timeout_ms=3_600_000)
    with transaction.atomic():
        Member.objects.bulk_create(
            Member(group=g, member_id=member_name(i), status="STABLE", member_epoch=EPOCH,
                   previous_member_epoch=EPOCH - 1, client_id=f"host-{i % 50}/pid-{1000 + i}",
                   joined_at=now - timedelta(minutes=5),
                   last_heartbeat_at=now - timedelta(milliseconds=(i * 7) % 1000))
            for i in range(members)
        )
        Group.objects.filter(pk=g.pk).update(group_epoch=EPOCH, assignment_epoch=EPOCH)
        with connection.cursor() as cur:
            cur.execute(
                f"""UPDATE {ShardAssignment._meta.db_table} a SET owner_id = m.id, target_id = m.id, grant_epoch = %s
                    FROM {Shard._meta.db_table} s, {Member._meta.db_table} m
                    WHERE a.group_id = %s AND a.shard_id = s.id AND m.group_id = %s
                      AND m.member_id = 'm-' || lpad((s.index %% %s)::text, 4, '0')""",
                [EPOCH, g.pk, g.pk, members],
            )
            cur.execute("ANALYZE")  # bulk-loaded tables have no planner statistics yet
    if backlog is not None:  # the consumer groups: made at 0 by create_group
        pipe = backlog.pipeline(transaction=False)
        for i in range(shards):
            key = ShardKeys(f"{stream}:1:{i}", g.stream.key_prefix).stream
            for n in range(i % 7):
                pipe.xadd(key, {"key": f"k{n}", "n": str(n)})
        pipe.execute()
    g.refresh_from_db()
    return g


def drop_backlog(client: redis.Redis, stream: str, prefix: str = "rsc*") -> None:
    delete_keys(client, f"{prefix}:{{{stream}:*")
