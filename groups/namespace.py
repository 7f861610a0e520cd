"""This installation's namespace on a shared Redis (issue 12.2).

Every database has an installation id (one `Installation` row, made on first use). From it
come the default key prefix of new streams (`rsc-<id8>`) and the Celery queue and broker key
prefix (coordinator_project/celery.py), so a second checkout, a reset `var/` or a test
database on the same Redis starts in a namespace of its own.

A prefix is claimed with an owner key `<prefix>:owner` holding the installation id. Keys this
database did not write — another installation's owner key, or the seal markers, streams and
fence tokens of shards this database is only now creating — are refused with a message that
says so, before anything is written (they would seal a new stream's shards or fence its
members with tokens nobody here issued).
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from coordinator_project.process_state import PROCESS
from dataplane.errors import is_noperm
from dataplane.routing import ShardKeys
from groups.errors import ServiceError
from groups.models import Installation

PREFIX_BASE = "rsc"

log = logging.getLogger(__name__)


class ForeignKeysFound(ServiceError):
    """Redis holds keys in this namespace that this database did not write."""


def installation_id() -> str:
    """The id of the installation this database belongs to (made and stored on first use)."""
    row = Installation.objects.filter(pk=1).first()
    if row is not None:
        return row.installation_id
    try:
        with transaction.atomic():
            row = Installation.objects.create(pk=1, installation_id=uuid.uuid4().hex)
    except IntegrityError:  # made concurrently by another process: theirs wins
        row = Installation.objects.get(pk=1)
    return row.installation_id


def observe_generation() -> None:
    """Read the installation's generation and let this process's caches follow it (a new one
    after a restore drops them all: coordinator_project.process_state)."""
    row = Installation.objects.filter(pk=1).values_list("generation", flat=True).first()
    PROCESS.observe_generation(1 if row is None else row)


def raise_generation() -> int:
    """A restore step: every process that reads the new generation forgets what it cached
    (epochs it was keyed by may have gone back and will be reached again)."""
    installation_id()  # the row exists
    Installation.objects.filter(pk=1).update(generation=F("generation") + 1)
    generation = Installation.objects.values_list("generation", flat=True).get(pk=1)
    PROCESS.observe_generation(generation)
    return generation


def namespace_for(install_id: str) -> str:
    """`rsc-<first 8 hex digits>`: the default key prefix and the Celery queue name."""
    return f"{PREFIX_BASE}-{install_id[:8]}"


def default_key_prefix() -> str:
    return namespace_for(installation_id())


def owner_key(prefix: str) -> str:
    return f"{prefix}:owner"


def identity_key(prefix: str) -> str:
    """`<prefix>:identity`: the installation id, published in the stream Redis for members to
    compare with the heartbeat metadata's `installationId` before their first read (issue
    25.4). One key per prefix, read alone, so it carries no hash tag (like the owner key)."""
    return f"{prefix}:identity"


def publish_identity(prefixes: Iterable[str] | None = None, client: redis.Redis | None = None) -> list[str]:
    """SET `<prefix>:identity` to this installation's id for each prefix (default: every
    stream's and the installation's own default), pipelined. Written with each stream and
    group, at each reshard, at Celery worker/beat start and by `manage.py publish_identity`.
    Returns the keys written. Redis errors raise ServiceError; an ACL refusal (an older
    coordinator role without SET on the key) is logged and nothing is written: members then
    refuse that Redis, naming the key and the fix."""
    mine = installation_id()
    if prefixes is None:
        from groups.models import Stream

        prefixes = {default_key_prefix(), *Stream.objects.values_list("key_prefix", flat=True).distinct()}
    keys = sorted({identity_key(p) for p in prefixes})
    if not keys:
        return []
    client = client or stream_redis()
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, mine)
        pipe.execute()
    except redis.RedisError as exc:
        if is_noperm(exc):
            log.warning("cannot publish the installation identity %s: %s; members refuse this "
                        "Redis until it is there (give the coordinator role SET on it: "
                        "docs/SECURITY.md)", " ".join(keys), exc)
            return []
        raise ServiceError(f"cannot publish the installation identity in the stream Redis "
                           f"(STREAM_REDIS_URL): {exc}") from exc
    return keys


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True)


PROCESS.own("stream Redis clients (namespace)", _client, "key: STREAM_REDIS_URL -> client; bound: one per URL; invalidated: never (a connection pool, no data); N hosts: holds no state.",
            reset=_client.cache_clear)


def stream_redis() -> redis.Redis:
    """The Redis holding the streams (STREAM_REDIS_URL)."""
    return _client(settings.STREAM_REDIS_URL)


def claim_prefix(prefix: str, client: redis.Redis | None = None) -> None:
    """Make `prefix` ours (SET NX of its owner key), or refuse if another installation has it.

    This installation's own default prefix needs no owner key (only a copy of this very
    database could share it, and a copy would write the same id): nothing is written for it.
    """
    mine = installation_id()
    client = client or stream_redis()
    if prefix == namespace_for(mine):
        publish_identity([prefix], client)
        return
    with _redis_errors():
        client.set(owner_key(prefix), mine, nx=True)
        owner = client.get(owner_key(prefix))
    if owner != mine:
        raise ForeignKeysFound(
            f"Redis key prefix {prefix!r} belongs to another installation (its {owner_key(prefix)} "
            f"is {owner!r}, this database is {mine!r}): its seal markers and fence tokens are not "
            f"this database's. Use another key prefix (the default, {default_key_prefix()!r}, is "
            "this installation's own), or point STREAM_REDIS_URL at another Redis database"
        )
    publish_identity([prefix], client)


def check_new_shards(
    prefix: str, shard_ids: Iterable[str], groups: Iterable[str] = (), client: redis.Redis | None = None,
    stream: str | None = None,
) -> None:
    """Refuse shards whose stream, seal marker or fence tokens already exist in Redis.

    Called for shards this database is about to create (a new stream, a reshard's new
    version) or a group it is about to create: any such key was written by someone else.
    One pipelined EXISTS per key; no SCAN.
    """
    client = client or stream_redis()
    group_names = list(groups)
    keys: list[str] = []
    for sid in shard_ids:
        shard_keys = ShardKeys(sid, prefix)
        if group_names:
            keys.extend(shard_keys.fence(g) for g in group_names)
        else:
            keys.extend((shard_keys.stream, shard_keys.sealed))
    found: list[str] = []
    with _redis_errors():
        for start in range(0, len(keys), 1000):
            pipe = client.pipeline(transaction=False)
            chunk = keys[start:start + 1000]
            for key in chunk:
                pipe.exists(key)
            found.extend(k for k, n in zip(chunk, pipe.execute(), strict=True) if n)
    if found:
        log.warning("refused: Redis already holds keys this database did not write: %s", " ".join(found))
        if group_names and stream is not None:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            # Issue 24.5: a group deleted without --purge-redis leaves its fence tokens; the
            # name is usable again once they are gone, and the refusal says how.
            raise ForeignKeysFound(
                f"Redis already holds {found[0]}{more}: fence tokens of a group named"
                f" {group_names[0]!r} on stream {stream!r} that this database does not have (a group"
                " deleted without --purge-redis, or another installation using key prefix"
                f" {prefix!r}). If it was this installation's, clear them with: manage.py delete_group"
                f" {group_names[0]} --stream {stream} --purge-redis"
            )
        raise ForeignKeysFound(foreign_keys_message(prefix, found))


SHOWN_KEYS = 20


def foreign_keys_message(prefix: str, found: list[str]) -> str:
    """What to tell the operator: every key to delete (up to SHOWN_KEYS, then how to list the
    rest), the command, and who could have written them (issue 27.6: a stray key must not
    block a reshard without the operator knowing exactly what to remove)."""
    shown = found[:SHOWN_KEYS]
    head = ", ".join(shown)
    if len(found) > SHOWN_KEYS:
        # Every key checked carries one shard id as its hash tag: name that shard version.
        shard = shown[0].split("{", 1)[1].split("}", 1)[0]
        version = shard.rsplit(":", 1)[0]
        head += (
            f" and {len(found) - SHOWN_KEYS} more (all are listed in the coordinator's log; "
            f"`redis-cli --scan --pattern '{prefix}:{{{version}:*'` lists that version's keys)"
        )
    quoted = " ".join(f"'{k}'" for k in shown)
    return (
        f"Redis already holds {head}, which this database did not write: another installation, "
        f"a deleted stream or group, or a client that may write this stream's keys (a producer "
        f"role can XADD into a stream key of a version not made yet) used key prefix {prefix!r}. "
        f"Nothing was changed. Look at them (a stream may hold messages), delete them "
        f"(redis-cli DEL {quoted}) and retry, or use another key prefix"
    )


class ConsumerGroupsRefused(ServiceError):
    """The coordinator's Redis user may not create consumer groups (no ``xgroup|create``)."""


def create_consumer_groups(
    prefix: str,
    starts: Iterable[tuple[str, str]],
    groups: Iterable[str],
    client: redis.Redis | None = None,
    *,
    required: bool = False,
) -> int:
    """``XGROUP CREATE <stream> <group> <start> MKSTREAM`` of every group on every shard
    (``starts``: shard id -> start id), so that members need no ``xgroup|create`` (issue 27.6):
    a member could otherwise create a group that does not exist yet at ``$`` (skipping what
    the group's start position promises) or a next version's stream key. An existing consumer
    group is kept as it is (BUSYGROUP). Pipelined, 1,000 commands a round trip. Returns how
    many were created.

    Redis errors propagate (the callers roll back or retry), except the user's refusal:
    ``required`` raises :class:`ConsumerGroupsRefused`; otherwise it is logged and 0 returned,
    and members create their groups themselves as before, where their role allows (an older
    setup whose coordinator user lacks ``xgroup|create``).
    """
    client = client or stream_redis()
    names = list(groups)
    commands = [(ShardKeys(sid, prefix).stream, g, start) for sid, start in starts for g in names]
    created = 0
    for first in range(0, len(commands), 1000):
        pipe = client.pipeline(transaction=False)
        for stream, group, start in commands[first:first + 1000]:
            pipe.xgroup_create(stream, group, id=start, mkstream=True)
        for res in pipe.execute(raise_on_error=False):
            if not isinstance(res, Exception):
                created += 1
            elif is_noperm(res):
                if required:
                    raise ConsumerGroupsRefused(
                        f"the coordinator's Redis user (STREAM_REDIS_URL) may not create consumer "
                        f"groups: {res}. Give it +xgroup|create on the stream keys "
                        "(docs/redis-acl.example.acl)"
                    )
                log.warning("cannot create consumer groups %s under %s: %s; members create their "
                            "own where their Redis role allows (docs/SECURITY.md)", names, prefix, res)
                return created
            elif "BUSYGROUP" not in str(res):
                raise res
    return created


@contextmanager
def _redis_errors() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        raise ServiceError(
            f"cannot check the stream Redis (STREAM_REDIS_URL) for keys of another installation: {exc}"
        ) from exc
