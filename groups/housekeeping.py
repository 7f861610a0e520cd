"""Listing, describing and deleting streams and groups (issue 12.5); the commands are thin.

Deleting is refused while anything still uses the object: a group with live members (or any
member still holding a shard), a stream with groups. Redis is touched only when asked
(`purge_redis`), and then only the object's own keys: a group's consumer groups (XGROUP
DESTROY on each shard) and fence tokens; a stream's shard streams, seal markers and whatever
else lives in its shards' slots. Without a purge the keys stay, and creating an object of the
same name again is refused until they are gone (groups.namespace).
"""
from __future__ import annotations

import logging
from typing import Any

import redis
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from assignments.models import ShardAssignment
from assignments.rows import load_state, lock_group
from assignments.writer import delete_group_rows, save_state
from coordination.model import LIVE_STATUSES, MemberStatus
from coordination.restore import parse_fence_epoch, raise_epochs_above
from dataplane.routing import ShardKeys
from groups.errors import ServiceError
from groups.models import Event, Group, Shard, ShardVersion, Stream, VersionState
from groups.namespace import raise_generation, stream_redis
from groups.services import temporarily_left_note
from members.models import Member

log = logging.getLogger(__name__)
_LIVE = [s.value for s in LIVE_STATUSES]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


# --- reading -------------------------------------------------------------------------------
def list_streams() -> list[dict[str, Any]]:
    streams = Stream.objects.annotate(n_groups=Count("groups", distinct=True)).order_by("name")
    shards = dict(
        ShardVersion.objects.filter(version=F("stream__write_version")).values_list("stream_id", "shard_count")
    )
    return [
        {"stream": s.name, "state": s.state, "writeVersion": s.write_version, "shards": shards.get(s.pk),
         "groups": s.n_groups, "keyPrefix": s.key_prefix}
        for s in streams
    ]


def list_groups(stream: str | None = None) -> list[dict[str, Any]]:
    groups = Group.objects.select_related("stream").order_by("name")
    if stream is not None:
        if not Stream.objects.filter(name=stream).exists():
            raise ServiceError(f"stream {stream!r} does not exist")
        groups = groups.filter(stream__name=stream)
    groups = groups.annotate(live=Count("members", filter=Q(members__status__in=_LIVE)))
    return [
        {"group": g.name, "stream": g.stream.name, "liveMembers": g.live, "groupEpoch": g.group_epoch,
         "assignmentEpoch": g.assignment_epoch}
        for g in groups
    ]


def describe_stream(name: str) -> dict[str, Any]:
    """The stream, its versions, and per group how much of each sealed version it drained."""
    stream = Stream.objects.filter(name=name).first()
    if stream is None:
        raise ServiceError(f"stream {name!r} does not exist")
    versions = list(ShardVersion.objects.filter(stream=stream).order_by("version"))
    sealed = [v.version for v in versions if v.state == VersionState.SEALED]
    # A sealed shard is done for a group once it reported it drained and nobody holds it (§6.4).
    done = (
        ShardAssignment.objects.filter(group__stream=stream, shard__version__state=VersionState.SEALED,
                                       drained_at__isnull=False, owner__isnull=True)
        .values_list("group__name", "shard__version__version")
        .annotate(n=Count("id"))
    )
    drained: dict[tuple[str, int], int] = {(g, v): n for g, v, n in done}
    counts = {v.version: v.shard_count for v in versions}
    groups = []
    for g in list_groups(name):
        g["drain"] = {str(v): {"drained": drained.get((g["group"], v), 0), "shards": counts[v]} for v in sealed}
        groups.append(g)
    return {
        "stream": stream.name, "state": stream.state, "writeVersion": stream.write_version,
        "keyPrefix": stream.key_prefix, "metadataEpoch": stream.metadata_epoch,
        "stateChangedAt": _iso(stream.state_changed_at),
        "versions": [
            {"version": v.version, "shardCount": v.shard_count, "state": v.state, "createdAt": _iso(v.created_at),
             "sealedAt": _iso(v.sealed_at), "retiredAt": _iso(v.retired_at)}
            for v in versions
        ],
        "groups": groups,
    }


# --- deleting ------------------------------------------------------------------------------
def delete_group(name: str, *, purge_redis: bool = False, actor: str = "operator") -> dict[str, Any]:
    """Delete a group that nobody uses any more; with `purge_redis`, its Redis state too.

    Under the group's row lock: no heartbeat can join a member between the check and the
    delete. Redis is purged before the rows go, inside the transaction, so a Redis failure
    leaves the group in place (a purge repeated later finds less to do: it is idempotent).
    """
    with transaction.atomic():
        group = lock_group(name)
        if group is None:
            raise ServiceError(f"group {name!r} does not exist")
        rows = Member.objects.filter(group=group, status__in=_LIVE).order_by("member_id")
        live = list(rows.values_list("member_id", "status", "instance_id", "last_heartbeat_at"))
        running = [mid for mid, status, _iid, _last in live if status != MemberStatus.TEMPORARILY_LEFT]
        away = [(mid, iid, last) for mid, status, iid, last in live if status == MemberStatus.TEMPORARILY_LEFT]
        if running:
            shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
            raise ServiceError(
                f"group {name!r} has {len(running)} live member(s) ({shown}): stop them (they leave the "
                "group) or fence them first"
            )
        if away:
            # Stopped already: "stop them" would not help (issue 24.5).
            raise ServiceError(f"group {name!r} has {temporarily_left_note(group, away, timezone.now())}; then delete it")
        holders = ShardAssignment.objects.filter(group=group, owner__isnull=False).count()
        if holders:
            raise ServiceError(f"group {name!r}: {holders} shard(s) are still held by a member; try again shortly")
        shard_ids = list(Shard.objects.filter(version__stream_id=group.stream_id).values_list("shard_id", flat=True))
        result: dict[str, Any] = {"group": name, "stream": group.stream.name, "purgedRedis": purge_redis}
        if purge_redis:
            result.update(_purge_group(group.stream.key_prefix, shard_ids, name))
        delete_group_rows(group)  # its slots, members, API keys and events
        Event.objects.create(kind="group_deleted", stream=group.stream, actor=actor, detail=result)
    log.info("group %s deleted by %s (redis purged: %s)", name, actor, purge_redis)
    return result


def purge_deleted_group(name: str, stream: str, *, actor: str = "operator") -> dict[str, Any]:
    """Clear what a group deleted without --purge-redis left in Redis (its consumer groups and
    fence tokens on the stream's live shards), so the name can be used again (issue 24.5).
    Refused while a group of that name exists: that one is deleted with its own purge."""
    with transaction.atomic():
        if Group.objects.filter(name=name).exists():
            raise ServiceError(
                f"group {name!r} exists: delete it with manage.py delete_group {name} --purge-redis"
            )
        stream_row = Stream.objects.filter(name=stream).first()
        if stream_row is None:
            raise ServiceError(f"stream {stream!r} does not exist")
        shard_ids = list(Shard.objects.filter(version__stream=stream_row)
                         .exclude(version__state=VersionState.RETIRED).values_list("shard_id", flat=True))
        result: dict[str, Any] = {"group": name, "stream": stream, "purgedRedis": True, "leftovers": True}
        result.update(_purge_group(stream_row.key_prefix, shard_ids, name))
        Event.objects.create(kind="group_leftovers_purged", stream=stream_row, actor=actor, detail=result)
    log.info("leftover Redis keys of deleted group %s on %s purged by %s", name, stream, actor)
    return result


def _purge_group(prefix: str, shard_ids: list[str], group: str) -> dict[str, int]:
    """XGROUP DESTROY the group on every shard stream and delete its fence tokens.

    A coordinator-side write that touches only this group's own consumer group (§8 forbids
    reading or ACKing messages, which this does not). DLQ streams are kept: they hold messages.
    """
    client = stream_redis()
    try:
        pipe = client.pipeline(transaction=False)
        for sid in shard_ids:
            pipe.xgroup_destroy(ShardKeys(sid, prefix).stream, group)
        # A missing stream answers an error: nothing to destroy there.
        destroyed = sum(1 for r in pipe.execute(raise_on_error=False) if r == 1)
        pipe = client.pipeline(transaction=False)
        for sid in shard_ids:
            pipe.delete(ShardKeys(sid, prefix).fence(group))
        tokens = sum(pipe.execute())
    except redis.RedisError as exc:
        raise ServiceError(f"purging Redis failed, nothing deleted: {exc}") from exc
    return {"consumerGroupsDestroyed": destroyed, "fenceTokensDeleted": tokens}


def delete_stream(name: str, *, purge_redis: bool = False, actor: str = "operator") -> dict[str, Any]:
    """Delete a stream without groups; with `purge_redis`, every key of its shards too."""
    with transaction.atomic():
        stream = Stream.objects.select_for_update(no_key=True).filter(name=name).first()
        if stream is None:
            raise ServiceError(f"stream {name!r} does not exist")
        groups = sorted(Group.objects.filter(stream=stream).values_list("name", flat=True))
        if groups:
            raise ServiceError(
                f"stream {name!r} still has {len(groups)} group(s) ({', '.join(groups)}): delete them first "
                "(delete_group)"
            )
        result: dict[str, Any] = {"stream": name, "purgedRedis": purge_redis}
        if purge_redis:
            shard_ids = list(Shard.objects.filter(version__stream=stream).values_list("shard_id", flat=True))
            result["keysDeleted"] = _purge_stream(stream.key_prefix, name, shard_ids)
        stream.delete()  # versions, shards, API keys and events go with it
    log.info("stream %s deleted by %s (redis purged: %s)", name, actor, purge_redis)
    return result


def _purge_stream(prefix: str, stream: str, shard_ids: list[str]) -> int:
    """Every key in the slots of the stream's shards: streams, seal markers, DLQs, leftovers."""
    client = stream_redis()
    try:
        keys = {key for s in shard_ids for key in (ShardKeys(s, prefix).stream, ShardKeys(s, prefix).sealed)}
        # Stream names are [A-Za-z0-9._-]: nothing in the pattern is a glob character.
        keys.update(client.scan_iter(match=f"{prefix}:{{{stream}:*", count=1000))
        deleted = 0
        ordered = sorted(keys)
        for start in range(0, len(ordered), 500):
            pipe = client.pipeline(transaction=False)
            for key in ordered[start:start + 500]:
                pipe.delete(key)
            deleted += sum(pipe.execute())
    except redis.RedisError as exc:
        raise ServiceError(f"purging Redis failed, nothing deleted: {exc}") from exc
    return deleted


# --- after a database restore --------------------------------------------------------------
def raise_epochs_after_restore(
    group: str | None = None, *, dry_run: bool = False, actor: str = "operator"
) -> list[dict[str, Any]]:
    """Raise each group's epochs above the highest fence token of its shards in Redis.

    See docs/OPERATING.md "Backup and restore". The tokens are read before the group lock is
    taken (members are meant to be stopped); the core decides under the lock whether a raise
    is still needed, so running it twice, or beside heartbeats, raises at most once.
    """
    if group is not None and not Group.objects.filter(name=group).exists():
        raise ServiceError(f"group {group!r} does not exist")
    if not dry_run:
        # Every coordinator process drops what it cached (documents, catalogues, snapshots keyed
        # by epochs the restore rewound) at its next read of the generation (issue 23.3).
        raise_generation()
    names = [group] if group else list(Group.objects.order_by("name").values_list("name", flat=True))
    report = []
    for name in names:
        row = Group.objects.select_related("stream").get(name=name)
        floor = _highest_fence_epoch(row)
        entry: dict[str, Any] = {
            "group": name, "fenceTokenEpoch": floor, "groupEpoch": row.group_epoch,
            "assignmentEpoch": row.assignment_epoch, "raised": False,
            "needed": floor is not None and row.assignment_epoch <= floor,
        }
        if floor is not None and entry["needed"] and not dry_run:
            with transaction.atomic():
                locked = lock_group(name)
                if locked is not None:
                    state, loaded = load_state(locked)
                    if raise_epochs_above(state, floor):
                        save_state(state, loaded, timezone.now(), actor=actor)
                        entry.update(raised=True, raisedTo=state.assignment_epoch)
        report.append(entry)
    return report


def _highest_fence_epoch(group: Group) -> int | None:
    prefix = group.stream.key_prefix
    shard_ids = list(Shard.objects.filter(version__stream_id=group.stream_id).values_list("shard_id", flat=True))
    try:
        tokens = stream_redis().mget([ShardKeys(s, prefix).fence(group.name) for s in shard_ids]) if shard_ids else []
    except redis.RedisError as exc:
        raise ServiceError(f"reading fence tokens from Redis failed: {exc}") from exc
    # str: the client decodes (namespace._client); bytes only if that ever changed.
    epochs = [e for e in (parse_fence_epoch(t if isinstance(t, str) else t.decode()) for t in tokens if t)
              if e is not None]
    return max(epochs, default=None)
