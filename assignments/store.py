"""Load a group's protocol state from the database, and keep this process's snapshots of it.

The only code that turns rows into `coordination.model` objects; `assignments.writer` writes
what the core changed back (the one writer). Callers hold the group's row lock (`lock_group`)
for the whole load → core → save sequence.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from assignments.models import ShardAssignment
from coordination import assignor
from coordination.model import LIVE_STATUSES, Changes, GroupState, Member, MemberStatus, ShardSlot
from coordinator_project import dbpool
from coordinator_project.named_locks import NamedLocks
from coordinator_project.process_state import PROCESS, ProcessCache
from groups.models import Group, Installation, Shard, Stream, VersionState
from members.models import Member as MemberRow

_LIVE = [s.value for s in LIVE_STATUSES]


@dataclass
class Loaded:
    """Row ids behind the loaded state, so saving touches rows by primary key."""

    group: Group
    member_pk: dict[str, int] = field(default_factory=dict)
    # Members a slot names (owner or target) that were not loaded: a tombstone whose target a
    # deferred recompute has not moved yet (R1b), or another member in a partial view.
    other_pk: dict[str, int] = field(default_factory=dict)
    slot_pk: dict[str, int] = field(default_factory=dict)
    drained_at: dict[str, datetime] = field(default_factory=dict)
    # Each member's row as read (raw, `_MEMBER_COLUMNS`) and its columns as last written:
    # saving writes only the columns the core changed, so a snapshot's older last-seen of a
    # member is never written back over a newer stamp.
    member_rows: dict[str, tuple] = field(default_factory=dict)
    member_values: dict[str, dict[str, object]] = field(default_factory=dict)


def lock_group(name: str) -> Group | None:
    """Take the group's row lock (held until the surrounding transaction ends)."""
    # of=("self",): without it FOR UPDATE also locks the joined stream row, which serialises
    # every group of a stream and deadlocks with resharding (stream lock, then group locks).
    return Group.objects.select_for_update(of=("self",)).select_related("stream").filter(name=name).first()


@dataclass(frozen=True)
class _ShardInfo:
    shard_id: str
    parents: tuple[str, ...]
    sealed: bool


_catalogue: ProcessCache[tuple[int, int], dict[int, _ShardInfo]] = PROCESS.own(
    "shard catalogue", ProcessCache(),
    "The static part of a stream's shards. key: (stream id, stream metadataEpoch); bound: 256"
    " entries, then emptied; invalidated: a new stream metadataEpoch (every change of versions"
    " raises it); N hosts: every host reads the same rows for one epoch.",
)


def _shard_catalogue(stream_id: int, metadata_epoch: int, need: set[int]) -> dict[int, _ShardInfo]:
    key = (stream_id, metadata_epoch)
    cat = _catalogue.get(key)
    if cat is None or not need <= cat.keys():
        rows = Shard.objects.filter(version__stream_id=stream_id).exclude(
            version__state=VersionState.RETIRED
        ).values_list("id", "shard_id", "parents", "version__state")
        cat = {
            pk: _ShardInfo(sid, tuple(parents or ()), vstate == VersionState.SEALED)
            for pk, sid, parents, vstate in rows
        }
        if len(_catalogue) > 256:
            _catalogue.clear()
        _catalogue[key] = cat
    return cat


def _name_unloaded(cursor: object, pk_member: dict[int, str], loaded: Loaded, pks: set[int | None]) -> None:
    """Read the names of the members slots refer to that are not in `pk_member` (one query,
    only when there are any); they go in `loaded.other_pk`, so saving maps them back."""
    unknown = sorted(pk for pk in pks if pk is not None and pk not in pk_member)
    if not unknown:
        return
    cursor.execute(  # type: ignore[attr-defined]
        f"SELECT id, member_id FROM {MemberRow._meta.db_table} WHERE id IN {_in(unknown)}", unknown
    )
    for pk, mid in cursor.fetchall():  # type: ignore[attr-defined]
        pk_member[pk] = mid
        loaded.other_pk[mid] = pk


def _referenced(slot_rows: list[tuple]) -> set[int | None]:
    return {row[2] for row in slot_rows} | {row[5] for row in slot_rows}


def _member_pk(loaded: Loaded, name: str | None) -> int | None:
    if name is None:
        return None
    pk = loaded.member_pk.get(name)
    return pk if pk is not None else loaded.other_pk[name]


def _in(values: tuple[str, ...] | list[str]) -> str:
    """A portable IN list (SQLite has no = ANY); (NULL) matches nothing."""
    return "(" + ", ".join(["%s"] * len(values)) + ")" if values else "(NULL)"


def _aware(value: datetime | None) -> datetime | None:
    # Raw SQLite rows carry naive UTC datetimes (the ORM would attach the zone).
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


_MEMBER_COLUMNS = (
    "id", "member_id", "status", "member_epoch", "previous_member_epoch", "client_id",
    "rebalance_timeout_ms", "last_heartbeat_at", "revocation_deadline",
    "fenced_reason", "fenced_by", "instance_id",
)


def _member_from_row(row: tuple, reports: dict[str, list[str]]) -> Member:
    (_pk, mid, status, epoch, prev, client_id, rto, last_hb, deadline_at, reason, by, instance_id) = row
    return Member(
        member_id=mid,
        status=MemberStatus(status),
        member_epoch=epoch,
        previous_member_epoch=prev,
        client_id=client_id,
        rebalance_timeout_ms=rto,
        joined_at=None,  # not needed by the core; written only when a join sets it
        last_heartbeat_at=_aware(last_hb),
        revocation_deadline=_aware(deadline_at),
        # Only the heartbeating member's last report matters (R3, ownedShards null).
        last_reported_owned=tuple(reports[mid]) if mid in reports else None,
        fenced_reason=reason,
        fenced_by=by,
        instance_id=instance_id,
    )


def _slot_from_row(
    row: tuple, catalogue: dict[int, _ShardInfo], pk_member: dict[int, str], loaded: Loaded
) -> ShardSlot | None:
    pk, shard_pk, owner, revoking, grant_epoch, target, drained_at = row
    info = catalogue.get(shard_pk)
    if info is None:  # a retired version's leftover row
        return None
    loaded.slot_pk[info.shard_id] = pk
    if drained_at is not None:
        loaded.drained_at[info.shard_id] = _aware(drained_at)
    else:
        loaded.drained_at.pop(info.shard_id, None)
    return ShardSlot(
        shard_id=info.shard_id,
        parents=info.parents,
        sealed=info.sealed,
        owner=None if owner is None else pk_member[owner],
        revoking=revoking,
        grant_epoch=grant_epoch,
        target=None if target is None else pk_member[target],
        drained=drained_at is not None,
    )


def _reports(cursor: object, group: Group, member_ids: list[str]) -> dict[str, list[str]]:
    if not member_ids:
        return {}
    cursor.execute(  # type: ignore[attr-defined]
        f"SELECT member_id, last_reported_owned FROM {MemberRow._meta.db_table}"
        f" WHERE group_id = %s AND member_id IN {_in(member_ids)}",
        [group.pk, *member_ids],
    )
    return {mid: owned if isinstance(owned, list) else json.loads(owned or "[]")
            for mid, owned in cursor.fetchall()}  # type: ignore[attr-defined]


_MEMBER_SQL = f"SELECT {', '.join(_MEMBER_COLUMNS)} FROM {MemberRow._meta.db_table} WHERE group_id = %s"
_MEMBER_WITH_REPORT_SQL = (
    f"SELECT {', '.join(_MEMBER_COLUMNS)}, last_reported_owned FROM {MemberRow._meta.db_table}"
    " WHERE group_id = %s AND member_id IN "
)


def _heartbeating(member_id: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The heartbeating members of a locked pass: none (a sweep), one, or a batch."""
    if member_id is None:
        return ()
    return (member_id,) if isinstance(member_id, str) else tuple(dict.fromkeys(member_id))


def _members_with_reports(group_pk: int, member_ids: tuple[str, ...]) -> tuple[str, list[object]]:
    """The statement and parameters reading these members' rows with their last reports."""
    return _MEMBER_WITH_REPORT_SQL + _in(member_ids), [group_pk, *member_ids]


_SLOT_SQL = (
    "SELECT id, shard_id, owner_id, revoking, grant_epoch, target_id, drained_at"
    f" FROM {ShardAssignment._meta.db_table} WHERE group_id = %s"
)


def load_state(
    group: Group, member_id: str | tuple[str, ...] | None = None, *, lock_members: bool = False
) -> tuple[GroupState, Loaded]:
    """The group's snapshot: live members (plus `member_id`'s row whatever its status, with its
    last report: the heartbeating member, or each of a batch of them) and every slot.

    `lock_members` row-locks the members too: sweeps use it so a concurrent lock-free steady
    heartbeat (fastpath) either lands before the sweep reads last-seen or waits and misses.
    Plain tuples, not model instances: this runs on every locked heartbeat of big groups.
    """
    also = _heartbeating(member_id)
    member_sql = _MEMBER_SQL + f" AND (status IN {_in(_LIVE)} OR member_id IN {_in(also)})"
    if lock_members and connection.features.has_select_for_update:
        member_sql += " FOR UPDATE"
    return _load(group, member_sql, [group.pk, *_LIVE, *also], _SLOT_SQL, [group.pk], also)


def load_member_view(
    group: Group, member_id: str, claimed: tuple[str, ...]
) -> tuple[GroupState, Loaded]:
    """A partial snapshot for one member's regular heartbeat: that member, the slots it holds
    or targets and the shards it `claimed`, enough for R3–R7; the core refuses to recompute
    the target on it (used with RSC_GROUP_SNAPSHOTS off)."""
    me = f"SELECT id FROM {MemberRow._meta.db_table} WHERE group_id = %s AND member_id = %s"
    slot_sql = _SLOT_SQL + (
        f" AND (owner_id IN ({me}) OR target_id IN ({me}) OR shard_id IN"
        f" (SELECT id FROM {Shard._meta.db_table} WHERE shard_id IN {_in(claimed)}))"
    )
    return _load(
        group, _MEMBER_SQL + " AND member_id = %s", [group.pk, member_id],
        slot_sql, [group.pk, group.pk, member_id, group.pk, member_id, *claimed], (member_id,),
        partial=True,
    )


def _load(
    group: Group, member_sql: str, member_params: list[object], slot_sql: str,
    slot_params: list[object], heartbeating: tuple[str, ...], partial: bool = False,
) -> tuple[GroupState, Loaded]:
    loaded = Loaded(group=group)
    members: dict[str, Member] = {}
    with connection.cursor() as cursor:
        # Raw rows: the ORM's per-row machinery costs more than the query for big groups.
        cursor.execute(member_sql, member_params)
        member_rows = cursor.fetchall()
        pk_member = {row[0]: row[1] for row in member_rows}
        cursor.execute(slot_sql, slot_params)
        slot_rows = cursor.fetchall()
        present = set(pk_member.values())
        reports = _reports(cursor, group, [mid for mid in heartbeating if mid in present])
        _name_unloaded(cursor, pk_member, loaded, _referenced(slot_rows))
    for row in member_rows:
        loaded.member_pk[row[1]] = row[0]
        loaded.member_rows[row[1]] = row
        members[row[1]] = _member_from_row(row, reports)
    catalogue = _shard_catalogue(
        group.stream_id, group.stream.metadata_epoch, {row[1] for row in slot_rows}
    )
    shards: dict[str, ShardSlot] = {}
    for row in sorted(slot_rows, key=lambda r: r[1]):
        slot = _slot_from_row(row, catalogue, pk_member, loaded)
        if slot is not None:
            shards[slot.shard_id] = slot
    state = GroupState(
        name=group.name,
        stream=group.stream.name,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_epoch=group.metadata_epoch,
        max_members=group.max_members,
        heartbeat_interval_ms=group.heartbeat_interval_ms,
        session_timeout_ms=group.session_timeout_ms,
        rebalance_timeout_ms=group.rebalance_timeout_ms,
        rebalance_window_ms=rebalance_window_ms(),
        rebalanced_at=group.rebalanced_at,
        rebalance_due_at=group.rebalance_due_at,
        rebalance_deferred_at=group.rebalance_deferred_at,
        paused_at=group.paused_at,
        paused_by=group.paused_by,
        members=members,
        shards=shards,
        partial=partial,
    )
    return state, loaded


def live_member_counts(group_name: str, member_id: str) -> tuple[int, int, bool] | None:
    """(maxMembers, live members, whether `member_id` is live) in one statement, no lock."""
    live = _in(_LIVE)
    sql = (
        f"SELECT g.max_members, count(m.id), count(m.id) FILTER (WHERE m.member_id = %s)"
        f" FROM {Group._meta.db_table} AS g LEFT JOIN {MemberRow._meta.db_table} AS m"
        f" ON m.group_id = g.id AND m.status IN {live} WHERE g.name = %s GROUP BY g.id, g.max_members"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [member_id, *_LIVE, group_name])
        row = cursor.fetchone()
    if row is None:
        return None
    _seats[group_name] = (row[0], row[1])  # clearly_has_room's figure until the next checkin
    return row[0], row[1], row[2] > 0


# --- per-process snapshots ----------------------------------------------------------------
# A join into a big group used to load every live member and slot (~15–20 ms for
# 1,000 × 4,096) although it changes a handful of rows. Each process keeps the last snapshot
# of a group it wrote or read under the lock; the group row's state_version (raised by every
# locked write, see save_state) says whether it is current, and if not, the rows stamped with
# a newer version are exactly the ones to re-read. A snapshot is taken out of the cache while
# a transaction uses it and put back only once that transaction commits, so a rolled-back
# write can never leave a snapshot that claims a version with other contents.


@dataclass
class Snapshot:
    state: GroupState
    loaded: Loaded
    pk_member: dict[int, str]
    version: int
    shape: tuple[object, ...]  # what a version number alone does not cover (see _shape)
    # Steady answers given from this snapshot at this version (fastpath._from_snapshot); every
    # locked pass that takes the snapshot empties it before it changes anything.
    steady: dict[tuple[object, ...], Any] = field(default_factory=dict)


_snapshots: OrderedDict[int, Snapshot] = PROCESS.own(
    "group snapshots", OrderedDict(),
    "Each group's last full state used under its lock, with its steady-answer memo (Snapshot."
    "steady: one per member and request, 20,000). key: group id; bound: _SNAPSHOT_GROUPS, least"
    " recently used out; invalidated: a group row whose state_version, metadata epochs,"
    " deletion_epoch or created_at differ (checked on every use), a locked pass (memo), rollback;"
    " N hosts: every write on any host raises one of those in the same transaction (assignments."
    "writer).",
    reset=lambda: forget_snapshots(),
)
_snapshots_lock = threading.Lock()
_SNAPSHOT_GROUPS = 64  # groups per process; the least recently used snapshot goes first


def rebalance_window_ms() -> int:
    """Join batching's window (`RSC_REBALANCE_WINDOW_MS`, engine.r1b_defer_rebalance)."""
    return int(getattr(settings, "RSC_REBALANCE_WINDOW_MS", 1000))


def snapshots_enabled() -> bool:
    return bool(getattr(settings, "RSC_GROUP_SNAPSHOTS", True))


def clearly_has_room(group_name: str, joining: int = 1) -> bool:
    """Whether this process's last figure of the group (its snapshot's members at the last
    checkin, all counted as live, or its last count) leaves a seat for each of `joining`
    joins: this one and those of this process still queued for the group. A hint only, for
    skipping the lock-free capacity precheck of a join (services._refused_join): R1's check
    under the lock decides anyway, so a figure made stale by another process's joins costs
    refused joins one locked pass (batched, group commit), after which the figure here is
    current again. False when there is no figure here.
    It is kept beside the snapshot, not read from it: in a join storm the snapshot is checked
    out by a locked pass nearly all the time, and every join's count statement then queued
    for the worker's two connections ahead of the locked pass itself (measured: p50 435 ms)."""
    seats = _seats.get(group_name)
    if seats is None:
        return False
    max_members, live = seats
    return max_members - live >= joining


_seats: ProcessCache[str, tuple[int, int]] = PROCESS.own(
    "seat figures", ProcessCache(),
    "key: group name -> (maxMembers, live members) last seen here; bound: one per group this"
    " process served; invalidated: each snapshot check-in and count; N hosts: only lets a join"
    " skip the lock-free count, R1 under the group lock decides.",
)


def _checkout(group_pk: int) -> Snapshot | None:
    with _snapshots_lock:
        return _snapshots.pop(group_pk, None)


def _checkin(group_pk: int, snap: Snapshot) -> None:
    # Every member the snapshot holds counts as live: an upper bound, so the room it shows is
    # never more than there is, and it costs nothing per pass (a count over 1,000 members
    # here cost ~0.4 ms of every locked pass).
    seats = (snap.state.max_members, len(snap.state.members))
    with _snapshots_lock:
        _snapshots[group_pk] = snap
        _seats[snap.state.name] = seats
        while len(_snapshots) > _SNAPSHOT_GROUPS:
            _snapshots.popitem(last=False)


# One locked pass per group at a time in each process. Without it, when a pass commits, the
# next waiter on the group's row lock may be another request of the same worker that wakes
# before the committing one has put the snapshot back (gevent runs either first): it finds no
# snapshot and loads the whole group (~20 ms for 1,000 × 4,096). In a join storm that was one
# locked pass in six. Waiting here is cooperative (gevent patches threading) and costs
# nothing the row lock would not: the passes of a group run one at a time anyway.
_gates = PROCESS.own(
    "group gates", NamedLocks(),
    "One locked pass per group and process. key: group name -> lock; bound: one per group this"
    " process served; invalidated: never (a lock holds no data); N hosts: the group's row lock"
    " orders passes across processes, this only orders them within one.",
)


@contextmanager
def group_gate(name: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold this process's gate of group `name` for a locked pass (load → core → save →
    commit → snapshot back). Yields False, without waiting, when `wait` is off and the gate
    is taken. Call it outside any transaction: before waiting it hands this request's
    database connections back (to the pools under gevent), since the holder may need one."""
    gate = _gates[name]
    if not gate.acquire(blocking=False):
        if not wait:
            yield False
            return
        # Waiters holding pooled connections would starve the holder of one (a deadlock until
        # the pool's timeout): a waiter keeps none, of either database.
        dbpool.release_all()
        gate.acquire()
    try:
        yield True
    finally:
        gate.release()


def forget_snapshots() -> None:
    with _snapshots_lock:
        _snapshots.clear()
        _seats.clear()
        _pk_by_name.clear()


def _shape(group: Group) -> tuple[object, ...]:
    # Slots are added or removed only together with a metadataEpoch rise (resharding); member
    # rows are deleted only with a deletion_epoch rise (delete_members); the creation time
    # tells a group recreated under a reused id (a restored database) apart; the installation
    # generation, a restore (the lock statement and the steady read observe it). The same
    # columns, in this order, as fastpath._VERSION_SQL reads.
    return (group.created_at, group.stream_id, group.metadata_epoch, group.stream.metadata_epoch,
            group.deletion_epoch, PROCESS.generation or 1)


# The installation's generation as the lock statement and the steady read select it (a missing
# row, a database nobody has used yet, is generation 1: the column's default).
GENERATION_SQL = (
    f"COALESCE((SELECT i.{Installation._meta.get_field('generation').column}"
    f" FROM {Installation._meta.db_table} AS i WHERE i.id = 1), 1)"
)


def steady_snapshot(group_pk: int, version: int, shape: tuple[object, ...]) -> Snapshot | None:
    """Check out the group's snapshot if it is exactly the committed state `version` (the
    caller read version and shape in one statement); give it back with `return_snapshot`."""
    snap = _checkout(group_pk)
    if snap is None:
        return None
    if snap.version != version or snap.shape != shape:
        # Behind: the next locked pass here catches it up. Ahead: the caller's read of the
        # group row started before the commit that this snapshot already holds (reads are
        # shared, fastpath._GroupReads). Either way it stays; a locked pass drops a snapshot
        # that does not fit the locked row. (Dropping it here cost a full load of the group.)
        _checkin(group_pk, snap)
        return None
    return snap


def return_snapshot(group_pk: int, snap: Snapshot) -> None:
    _checkin(group_pk, snap)


def refresh_snapshot(group_name: str) -> None:
    """Bring this process's snapshot of the group up to date, if the group lock is free now
    (a steady heartbeat found it behind; waiting here would queue it behind a join)."""
    with group_gate(group_name, wait=False) as free, transaction.atomic():
        if not free:
            return
        group = (Group.objects.select_for_update(of=("self",), skip_locked=True)
                 .select_related("stream").filter(name=group_name).first())
        if group is not None:
            load_for_heartbeat(group, None)


def _catch_up(snap: Snapshot, group: Group, fetched: _Prefetch | None = None) -> None:
    """Re-read the member and slot rows written after the snapshot's version (under the lock),
    or use the ones `lock_and_load` read with the lock."""
    state, loaded = snap.state, snap.loaded
    with connection.cursor() as cursor:
        if fetched is None:
            cursor.execute(_MEMBER_SQL + " AND state_version > %s", [group.pk, snap.version])
            member_rows = cursor.fetchall()
            cursor.execute(_SLOT_SQL + " AND state_version > %s", [group.pk, snap.version])
            slot_rows = cursor.fetchall()
        else:
            member_rows, slot_rows = fetched.members, fetched.slots
        for row in member_rows:
            snap.pk_member[row[0]] = row[1]
            _put_member(snap, row, {})
        _name_unloaded(cursor, snap.pk_member, loaded, _referenced(slot_rows))
    catalogue = _shard_catalogue(group.stream_id, group.stream.metadata_epoch, set())
    for row in slot_rows:
        slot = _slot_from_row(row, catalogue, snap.pk_member, loaded)
        if slot is not None:
            state.load_slot(slot)


def _put_member(snap: Snapshot, row: tuple, reports: dict[str, list[str]], keep: bool = False) -> None:
    """Place a fresh member row in the snapshot as a full load would: live members (and the
    heartbeating member, `keep`) are in, tombstones out."""
    pk, mid = row[0], row[1]
    snap.pk_member[pk] = mid
    member = _member_from_row(row, reports)
    if not (member.live or keep):
        _drop_member(snap, mid)
        return
    snap.state.members[mid] = member
    snap.loaded.member_pk[mid] = pk
    snap.loaded.member_rows[mid] = row
    snap.loaded.member_values.pop(mid, None)


def _drop_member(snap: Snapshot, mid: str) -> None:
    snap.state.members.pop(mid, None)
    pk = snap.loaded.member_pk.pop(mid, None)
    if pk is not None:  # slots may still name it (a target a deferred recompute will move)
        snap.loaded.other_pk[mid] = pk
    snap.loaded.member_rows.pop(mid, None)
    snap.loaded.member_values.pop(mid, None)


@dataclass
class _Prefetch:
    """What `lock_and_load` read together with the lock, for the snapshot it checked out."""

    snap: Snapshot | None
    members: list[tuple] = field(default_factory=list)
    slots: list[tuple] = field(default_factory=list)
    member_row: list[tuple] = field(default_factory=list)


_GROUP_FIELDS = [f.attname for f in Group._meta.concrete_fields]
_STREAM_FIELDS = [f.attname for f in Stream._meta.concrete_fields]
_LOCK_SQL = (
    f"SELECT {', '.join('g.' + Group._meta.get_field(n).column for n in _GROUP_FIELDS)},"
    f" {', '.join('s.' + Stream._meta.get_field(n).column for n in _STREAM_FIELDS)}, {GENERATION_SQL}"
    f" FROM {Group._meta.db_table} AS g JOIN {Stream._meta.db_table} AS s ON s.id = g.stream_id"
    " WHERE g.name = %s FOR UPDATE OF g"  # not the stream row: see lock_group
)
_pk_by_name: ProcessCache[str, int] = PROCESS.own(
    "group ids", ProcessCache(),
    "key: group name -> row id, for snapshots this process holds; bound: one per group this"
    " process served; invalidated: a lock by name that finds another id drops the snapshot;"
    " N hosts: the lock statement goes by name and returns the id it found.",
)
PROCESS.own(
    "assignor orders", assignor._order_cache,
    "The natural order of a shard set (pure memo of coordination.assignor). key: the frozenset"
    " of shard ids; bound: 8; invalidated: never needed (a function of its key); N hosts: the"
    " same on every host.",
)
PROCESS.own(
    "assignor ranks", assignor._rank_cache,
    "Each shard's natural rank in a shard set (pure memo of coordination.assignor). key: the"
    " frozenset of shard ids; bound: 8; invalidated: never needed (a function of its key);"
    " N hosts: the same on every host.",
)


def lock_and_load(
    group_name: str, member_id: str | tuple[str, ...]
) -> tuple[Group | None, GroupState | None, Loaded | None]:
    """`lock_group` then `load_for_heartbeat`, in one round trip on PostgreSQL: the lock
    statement goes out with the reads that bring this process's snapshot up to date (rows
    written after its version, the heartbeating members' rows). They run after the lock is
    granted, in the same transaction, so they see every write before it; if the snapshot turns
    out not to fit the locked row, it is dropped and the group loaded in full. Every round trip
    inside the lock is a wait for the whole group (and, under gevent, a chance for the worker's
    other requests to run first)."""
    if connection.vendor != "postgresql":
        group = lock_group(group_name)
        if group is None:
            return None, None, None
        return group, *load_for_heartbeat(group, member_id)
    pk = _pk_by_name.get(group_name)
    fetched = _Prefetch(_checkout(pk) if pk is not None else None)
    found: list[tuple] = []
    batch = Batch()
    batch.add(_LOCK_SQL, [group_name], found.extend)
    if fetched.snap is not None:
        version = fetched.snap.version
        batch.add(_MEMBER_SQL + " AND state_version > %s", [pk, version], fetched.members.extend)
        batch.add(_SLOT_SQL + " AND state_version > %s", [pk, version], fetched.slots.extend)
        ids = _heartbeating(member_id)
        batch.add(*_members_with_reports(pk, ids), fetched.member_row.extend)
    batch.run()
    if not found:
        return None, None, None
    row = found[0]
    PROCESS.observe_generation(row[-1])  # a restore: everything cached here is dropped
    group = Group.from_db(connection.alias, _GROUP_FIELDS, row[:len(_GROUP_FIELDS)])
    group.stream = Stream.from_db(connection.alias, _STREAM_FIELDS, row[len(_GROUP_FIELDS):-1])
    if fetched.snap is not None and PROCESS.generation != fetched.snap.shape[-1]:
        fetched.snap = None  # of an older generation (dropped from the cache just now)
    if group.pk != pk:
        fetched.snap = None  # a group recreated under its name: the snapshot is of another
    return group, *load_for_heartbeat(group, member_id, fetched)


def load_for_heartbeat(
    group: Group, member_id: str | tuple[str, ...] | None, fetched: _Prefetch | None = None
) -> tuple[GroupState, Loaded]:
    """The full snapshot a locked heartbeat needs (the caller holds the group lock), from this
    process's cache when it can be brought up to date cheaply; exactly what
    `load_state(group, member_id)` returns. `fetched`: the snapshot and rows `lock_and_load`
    read with the lock.
    """
    heartbeating = _heartbeating(member_id)
    snap = fetched.snap if fetched is not None else _checkout(group.pk)
    if snap is not None and snap.version > group.state_version and snap.shape == _shape(group):
        # The database went back (a restore) without a new generation yet: nothing this
        # process keeps can be trusted.
        PROCESS.rewound(f"group {group.name} state_version {snap.version} -> {group.state_version}")
    if snap is not None and (snap.shape != _shape(group) or snap.version > group.state_version):
        snap = None  # a reshard step changed the slot set, or the database went back
    if snap is None:
        state, loaded = load_state(group, heartbeating)
        snap = Snapshot(state, loaded, {pk: mid for mid, pk in loaded.member_pk.items()},
                         group.state_version, _shape(group))
    else:
        snap.steady.clear()  # the answers of the state this pass may change
        if snap.version < group.state_version:
            _catch_up(snap, group, fetched)
        # The heartbeating members' rows are always read fresh: their last-seen and last
        # report are written by the lock-free steady path, which does not raise the version.
        if heartbeating:
            if fetched is not None:
                found = fetched.member_row
            else:
                with connection.cursor() as cursor:
                    cursor.execute(*_members_with_reports(group.pk, heartbeating))
                    found = cursor.fetchall()
            fresh = {row[1]: row for row in found}
            for mid in heartbeating:
                row = fresh.get(mid)
                if row is None:
                    _drop_member(snap, mid)
                    continue
                owned = row[-1]
                report = owned if isinstance(owned, list) else json.loads(owned or "[]")
                _put_member(snap, row[:-1], {mid: report}, keep=True)
        state = snap.state
        state.group_epoch = group.group_epoch
        state.assignment_epoch = group.assignment_epoch
        state.metadata_epoch = group.metadata_epoch
        state.max_members = group.max_members
        state.heartbeat_interval_ms = group.heartbeat_interval_ms
        state.session_timeout_ms = group.session_timeout_ms
        state.rebalance_timeout_ms = group.rebalance_timeout_ms
        state.rebalance_window_ms = rebalance_window_ms()
        state.rebalanced_at = group.rebalanced_at
        state.rebalance_due_at = group.rebalance_due_at
        state.rebalance_deferred_at = group.rebalance_deferred_at
        state.paused_at = group.paused_at
        state.paused_by = group.paused_by
        state.changes = Changes()
        snap.loaded.group = group

    def checkin() -> None:
        # Runs only after the commit: the snapshot now matches the version just committed.
        for mid in snap.state.changes.members:  # new rows: slots name their members by pk
            snap.pk_member[snap.loaded.member_pk[mid]] = mid
        for mid in heartbeating:
            member = snap.state.members.get(mid)
            if member is None:
                continue
            if member.live:
                member.last_reported_owned = None  # a full load reads it for the heartbeating members only
            else:
                _drop_member(snap, mid)
        snap.state.changes = Changes()
        snap.version = group.state_version
        _pk_by_name[group.name] = group.pk
        _checkin(group.pk, snap)

    transaction.on_commit(checkin)
    return snap.state, snap.loaded


class Batch:
    """Statements sent in one round trip, in order (the lock with its reads; one save's writes). On PostgreSQL they go out as one multi-statement
    execute, one round trip (a client-side cursor; each statement's rows come back in order,
    reached with nextset()): under a join storm every round trip inside the group lock was a
    wait for the whole group, and under gevent a chance for the worker's other requests to
    run first. Elsewhere (SQLite) they run one by one."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, list[object], Callable[[list[tuple]], None] | None]] = []

    def add(self, sql: str, params: list[object], on_rows: Callable[[list[tuple]], None] | None = None) -> None:
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
                cursor.execute(";\n".join(sql for sql, _, _ in statements),
                               [p for _, params, _ in statements for p in params])
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
