"""This process's snapshot of each group, and the locked load that keeps it current.

A join into a big group used to load every live member and slot (~15-20 ms for
1,000 x 4,096) although it changes a handful of rows. Each process keeps the last snapshot
of a group it wrote or read under the lock; the group row's state_version (raised by every
locked write, see `assignments.writer.save_state`) says whether it is current, and if not,
the rows stamped with a newer version are exactly the ones to re-read. A snapshot is taken
out of the cache while a transaction uses it and put back only once that transaction
commits, so a rolled-back write can never leave a snapshot that claims a version with other
contents. The steady path (`assignments.fastpath`) checks a snapshot out the same way to
answer from it.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from assignments.batch import Batch
from assignments.gates import group_gate
from assignments.models import db_column
from assignments.rows import (
    GENERATION_SQL,
    LIVE,
    MEMBER_SQL,
    SLOT_SQL,
    Loaded,
    group_settings,
    heartbeating_members,
    in_list,
    load_state,
    lock_group,
    member_from_row,
    members_with_reports,
    name_unloaded,
    referenced_members,
    shard_catalogue,
    slot_from_row,
)
from coordination import assignor
from coordination.model import Changes, GroupState
from coordination.steady import group_inputs
from coordinator_project.process_state import PROCESS, ProcessCache
from groups.models import Group, Stream
from members.models import Member as MemberRow

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
    shape: tuple[object, ...]  # what a version number alone does not cover (see shape_of)
    # The steady answer last given to each member from this snapshot (fastpath._decide):
    # member id -> (its request's epochs and ownedShards, the answer). A locked pass that
    # takes the snapshot drops, at its commit, the answers of the members it touched (every
    # answer if a group-wide input changed): the others are still the core's answer.
    steady: dict[str, tuple[tuple[object, ...], Any]] = field(default_factory=dict)


_snapshots: OrderedDict[int, Snapshot] = PROCESS.own(
    "group snapshots", OrderedDict(),
    "Each group's last full state used under its lock, with its steady-answer memo (Snapshot."
    "steady: one per member). key: group id; bound: _SNAPSHOT_GROUPS, least"
    " recently used out; invalidated: a group row whose state_version, metadata epochs,"
    " deletion_epoch or created_at differ (checked on every use), rollback; memo entries: a"
    " locked pass drops those of the members it touched, or all on a group-wide change;"
    " N hosts: every write on any host raises one of those in the same transaction (assignments."
    "writer).",
    reset=lambda: forget_snapshots(),
)
_snapshots_lock = threading.Lock()
_SNAPSHOT_GROUPS = 64  # groups per process; the least recently used snapshot goes first


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


def forget_snapshots() -> None:
    with _snapshots_lock:
        _snapshots.clear()
        _seats.clear()
        _pk_by_name.clear()


def shape_of(group: Group) -> tuple[object, ...]:
    # Slots are added or removed only together with a metadataEpoch rise (resharding); member
    # rows are deleted only with a deletion_epoch rise (delete_members); the creation time
    # tells a group recreated under a reused id (a restored database) apart; the installation
    # generation, a restore (the lock statement and the steady read observe it). The same
    # columns, in this order, as fastpath._VERSION_SQL reads.
    return (group.created_at, group.stream_id, group.metadata_epoch, group.stream.metadata_epoch,
            group.deletion_epoch, PROCESS.generation or 1)


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
            cursor.execute(MEMBER_SQL + " AND state_version > %s", [group.pk, snap.version])
            member_rows = cursor.fetchall()
            cursor.execute(SLOT_SQL + " AND state_version > %s", [group.pk, snap.version])
            slot_rows = cursor.fetchall()
        else:
            member_rows, slot_rows = fetched.members, fetched.slots
        for row in member_rows:
            snap.pk_member[row[0]] = row[1]
            _put_member(snap, row, {})
        name_unloaded(cursor, snap.pk_member, loaded, referenced_members(slot_rows))
    catalogue = shard_catalogue(group.stream_id, group.stream.metadata_epoch, set())
    for row in slot_rows:
        slot = slot_from_row(row, catalogue, snap.pk_member, loaded)
        if slot is not None:
            state.load_slot(slot)


def _put_member(snap: Snapshot, row: tuple, reports: dict[str, list[str]], keep: bool = False) -> None:
    """Place a fresh member row in the snapshot as a full load would: live members (and the
    heartbeating member, `keep`) are in, tombstones out."""
    pk, mid = row[0], row[1]
    snap.pk_member[pk] = mid
    member = member_from_row(row, reports)
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
    f"SELECT {', '.join('g.' + db_column(Group, n) for n in _GROUP_FIELDS)},"
    f" {', '.join('s.' + db_column(Stream, n) for n in _STREAM_FIELDS)}, {GENERATION_SQL}"
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
    if pk is not None and fetched.snap is not None:  # a snapshot is checked out by pk
        version = fetched.snap.version
        batch.add(MEMBER_SQL + " AND state_version > %s", [pk, version], fetched.members.extend)
        batch.add(SLOT_SQL + " AND state_version > %s", [pk, version], fetched.slots.extend)
        ids = heartbeating_members(member_id)
        batch.add(*members_with_reports(pk, ids), fetched.member_row.extend)
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
    heartbeating = heartbeating_members(member_id)
    snap = fetched.snap if fetched is not None else _checkout(group.pk)
    if snap is not None and snap.version > group.state_version and snap.shape == shape_of(group):
        # The database went back (a restore) without a new generation yet: nothing this
        # process keeps can be trusted.
        PROCESS.rewound(f"group {group.name} state_version {snap.version} -> {group.state_version}")
    if snap is not None and (snap.shape != shape_of(group) or snap.version > group.state_version):
        snap = None  # a reshard step changed the slot set, or the database went back
    memo_inputs: tuple[object, ...] | None = None  # None: a new snapshot, whose memo is empty
    if snap is None:
        state, loaded = load_state(group, heartbeating)
        snap = Snapshot(state, loaded, {pk: mid for mid, pk in loaded.member_pk.items()},
                         group.state_version, shape_of(group))
    else:
        # The memo holds answers of the snapshot's version. From here to the commit, the
        # state files every member whose steady answer this pass and its catch-up may change
        # (GroupState.take_touched); the checkin drops their answers, or all of them if a
        # group-wide input changed. Nobody reads the memo meanwhile: the snapshot is checked out.
        memo_inputs = group_inputs(snap.state)
        snap.state.take_touched()
        if snap.version < group.state_version:
            _catch_up(snap, group, fetched)
        # The heartbeating members' rows are always read fresh: their last-seen and last
        # report are written by the lock-free steady path, which does not raise the version.
        if heartbeating:
            if fetched is not None:
                found = fetched.member_row
            else:
                with connection.cursor() as cursor:
                    cursor.execute(*members_with_reports(group.pk, heartbeating))
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
        for name, value in group_settings(group).items():
            setattr(state, name, value)
        state.changes = Changes()
        snap.loaded.group = group

    def checkin() -> None:
        # Runs only after the commit: the snapshot now matches the version just committed.
        touched = snap.state.take_touched()
        if memo_inputs is None or group_inputs(snap.state) != memo_inputs:
            snap.steady.clear()  # a new snapshot (empty), or a group-wide input changed
        else:
            for mid in touched:
                snap.steady.pop(mid, None)
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


def live_member_counts(group_name: str, member_id: str) -> tuple[int, int, bool] | None:
    """(maxMembers, live members, whether `member_id` is live) in one statement, no lock."""
    live = in_list(LIVE)
    sql = (
        f"SELECT g.max_members, count(m.id), count(m.id) FILTER (WHERE m.member_id = %s)"
        f" FROM {Group._meta.db_table} AS g LEFT JOIN {MemberRow._meta.db_table} AS m"
        f" ON m.group_id = g.id AND m.status IN {live} WHERE g.name = %s GROUP BY g.id, g.max_members"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [member_id, *LIVE, group_name])
        row = cursor.fetchone()
    if row is None:
        return None
    _seats[group_name] = (row[0], row[1])  # clearly_has_room's figure until the next checkin
    return row[0], row[1], row[2] > 0
