"""The one writer of the group, member and assignment tables.

A steady answer or a snapshot cached in one process (assignments.fastpath, assignments.snapshot_cache)
is correct on every other coordinator host only if each write that can change it raises the
group's `state_version` (the core's writes; deletes also raise `deletion_epoch`) or a metadata
epoch (settings, slots added or retired). Every such write is a function of this module, so
that rule is kept in one place; tests/unit/test_one_writer.py fails on an ORM `update()`,
`delete()`, `save()`, `create()` or `bulk_*`, or a raw UPDATE / DELETE / INSERT, of these
tables anywhere else (the lock-free last-seen stamps of assignments.fastpath, which write
only liveness columns no cached answer carries, are the one listed exception).

Callers hold the group's row lock (`rows.lock_group`) unless a function says otherwise.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import F, JSONField, Model, Q
from django.utils import timezone

from assignments.batch import Batch
from assignments.models import ShardAssignment, SQLValue, concrete_field, db_column
from assignments.rows import MEMBER_COLUMNS, Loaded, row_id_of
from coordination.model import GroupState
from coordinator_project.compat.django import outermost_transaction
from groups.models import Event, Group, Stream, VersionState
from members.models import Member as MemberRow

event_log = logging.getLogger("coordinator.events")


# After a burst of locked writes (a join storm writes a group's rows in seconds) the planner
# must not keep planning on statistics of the empty tables until autovacuum comes, if it is
# on at all: every ANALYZE_EVERY-th write of a group analyzes the member and slot tables
# (tens of ms, after the commit, outside the lock).
ANALYZE_EVERY = 500


def _analyze_hot_tables() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {MemberRow._meta.db_table}, {ShardAssignment._meta.db_table}")


# Values the ORM's field preparation would hand on unchanged: an int, str, bool or None for any
# field but a JSON one, and on PostgreSQL an aware datetime. A locked pass of a join storm writes
# hundreds of member rows, and the field calls were a twentieth of a worker's time.
_AS_IS = frozenset({int, str, bool, type(None)})


def _prep(model: type[Model], values: dict[str, object]) -> tuple[list[str], list[SQLValue]]:
    """Columns and database values of model fields, as the ORM would write them."""
    fields = [concrete_field(model, name) for name in values]
    aware_as_is = connection.vendor == "postgresql"
    params: list[SQLValue] = []
    for field, value in zip(fields, values.values(), strict=True):
        if not isinstance(field, JSONField) and (type(value) in _AS_IS or (
                aware_as_is and type(value) is datetime and value.tzinfo is not None)):
            params.append(cast(SQLValue, value))
        else:
            params.append(field.get_db_prep_save(value, connection))
    return [f.column for f in fields], params


def save_state(state: GroupState, loaded: Loaded, now: datetime, actor: str = "", *, commit: bool = False) -> None:
    """Write the dirty group, member and slot rows and the events, in that order, in one
    round trip (`Batch`). `commit`: the caller's transaction ends with these writes, and on
    PostgreSQL its COMMIT rides in the same round trip (not when it is nested in another
    transaction, as in tests: that one stays open)."""
    changes = state.changes
    group = loaded.group
    writes = Batch()
    commit = commit and connection.vendor == "postgresql" and outermost_transaction(connection)
    if not (changes.group or changes.members or changes.shards):
        _save_events(writes, state, loaded, actor)
        writes.run(commit=commit)
        return
    if not changes.granted and connection.vendor == "postgresql":
        # Only a grant must be on disk before its answer (R9 across a crash: a member may start
        # reading at once). A write that grants nothing (a batched join, a leave, a recompute,
        # a revocation) commits without waiting for the WAL flush: lost in a crash, it costs a
        # rejoin or a repeated revocation, and any later grant's synchronous commit flushes it
        # first (WAL order). Under a join storm the fsyncs were what the group lock waited on.
        writes.add("SET LOCAL synchronous_commit TO OFF", [])
    # One new state_version per locked write, on the group row and on every row written
    # (load_for_heartbeat's snapshots catch up by it). The caller holds the group lock.
    version = group.state_version + 1
    group.state_version = version
    group.group_epoch = state.group_epoch
    group.assignment_epoch = state.assignment_epoch
    group.rebalanced_at = state.rebalanced_at
    group.rebalance_due_at = state.rebalance_due_at
    group.rebalance_deferred_at = state.rebalance_deferred_at
    group.paused_at, group.paused_by = state.paused_at, state.paused_by
    adapt = connection.ops.adapt_datetimefield_value  # SQLite: naive UTC text
    writes.add(
        f"UPDATE {Group._meta.db_table} SET group_epoch = %s, assignment_epoch = %s,"
        " state_version = %s, rebalanced_at = %s, rebalance_due_at = %s,"
        " rebalance_deferred_at = %s, paused_at = %s, paused_by = %s WHERE id = %s",
        [state.group_epoch, state.assignment_epoch, version, adapt(state.rebalanced_at),
         adapt(state.rebalance_due_at), adapt(state.rebalance_deferred_at),
         adapt(state.paused_at), state.paused_by, group.pk],
    )
    if version % ANALYZE_EVERY == 0 and connection.vendor == "postgresql":
        transaction.on_commit(_analyze_hot_tables)
    table = MemberRow._meta.db_table
    upserted: set[str] = set()
    # Removed members first: a replacement (§9 R1s) takes over the old one's instanceId, which
    # the unique constraint allows only once the old row is no longer live.
    for mid in sorted(changes.members, key=lambda mid: (state.members[mid].live, mid)):
        m = state.members[mid]
        values: dict[str, object] = dict(
            status=m.status.value,
            member_epoch=m.member_epoch,
            previous_member_epoch=m.previous_member_epoch,
            client_id=m.client_id,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            last_heartbeat_at=m.last_heartbeat_at,
            revocation_deadline=m.revocation_deadline,
            fenced_reason=m.fenced_reason,
            fenced_by=m.fenced_by,
            instance_id=m.instance_id,
        )
        if m.joined_at is not None:
            values["joined_at"] = m.joined_at
        if m.library_version is not None:  # a join's (issue 25.7); None: leave it alone
            values["library_version"] = m.library_version
        if m.last_reported_owned is not None:  # None: not loaded, leave the column alone
            values["last_reported_owned"] = list(m.last_reported_owned)
        pk = loaded.member_pk.get(mid)
        if pk is None:
            upserted.add(mid)
            # A tombstone not loaded (or a new member): upsert by the natural key, in one
            # statement; a new row gets the model's defaults for what the core left unset.
            update = [db_column(MemberRow, name) for name in [*values, "state_version"]]
            insert_values = {"last_reported_owned": [], "joined_at": None, "library_version": "", **values,
                             "group": group.pk, "member_id": mid, "state_version": version}
            columns, params = _prep(MemberRow, insert_values)
            writes.add(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
                f" ON CONFLICT (group_id, member_id) DO UPDATE SET"
                f" {', '.join(f'{c} = EXCLUDED.{c}' for c in update)} RETURNING id",
                params, _remember_pk(loaded, mid, values),
            )
            continue
        prior = loaded.member_values.get(mid)
        if prior is None:
            prior = dict(zip(MEMBER_COLUMNS, loaded.member_rows.get(mid, ()), strict=False))
        changed = {k: v for k, v in values.items() if k not in prior or prior[k] != v}
        columns, params = _prep(MemberRow, {**changed, "state_version": version})
        writes.add(f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in columns)} WHERE id = %s", [*params, pk])
        loaded.member_values[mid] = {**prior, **changed}
    if changes.shards:
        by_name = upserted if connection.vendor == "postgresql" else set()
        if upserted and not by_name:
            writes.run()  # slots name an upserted member by its (new) row id: write it first

        def ref(name: str | None) -> tuple[int | None, str | None]:
            # PostgreSQL: a member upserted in this batch is named, and the slot statement
            # finds its new row id itself (one round trip for a join that recomputes).
            return (None, name) if name in by_name else (row_id_of(loaded, name), None)

        rows = []
        for shard_id in sorted(changes.shards):
            slot = state.shards[shard_id]
            drained_at = loaded.drained_at.setdefault(shard_id, now) if slot.drained else None
            owner, owner_name = ref(slot.owner)
            target, target_name = ref(slot.target)
            rows.append((
                owner, slot.revoking, slot.grant_epoch, target,
                connection.ops.adapt_datetimefield_value(drained_at),  # SQLite: naive UTC text
                version, loaded.slot_pk[shard_id], owner_name, target_name,
            ))
        _write_slots(writes, rows, group.pk if by_name else None)
    _save_events(writes, state, loaded, actor)
    writes.run(commit=commit)


def delete_members(group: Group, ids: list[int], still: Q) -> int:
    """Delete these member rows of the (locked) group that still match `still` (a
    compare-and-set), and say so to every process's snapshot: state_version and
    deletion_epoch rise (see `_shape`). Returns how many rows went."""
    if not ids:
        return 0
    deleted, _ = MemberRow.objects.filter(group=group, id__in=ids).filter(still).delete()
    if deleted:
        Group.objects.filter(pk=group.pk).update(
            state_version=F("state_version") + 1, deletion_epoch=F("deletion_epoch") + 1
        )
    return deleted


def _remember_pk(loaded: Loaded, mid: str, values: dict[str, object]) -> Callable[[list[tuple]], None]:
    def remember(rows: list[tuple]) -> None:
        loaded.member_pk[mid] = rows[0][0]
        loaded.member_values[mid] = values
    return remember


def _write_slots(writes: Batch, rows: list[tuple], named_in_group: int | None = None) -> None:
    """(owner, revoking, grant epoch, target, drained at, version, row id, owner's name,
    target's name) per changed slot: one statement on PostgreSQL (a recompute may move
    thousands of targets), plain UPDATEs elsewhere. Django's bulk_update builds a CASE per
    field and row, slower than either. A member upserted in the same batch has no row id
    yet: on PostgreSQL (`named_in_group`: its group) the slot names it and the statement
    looks its id up, after the upsert that precedes it in the batch; elsewhere the caller
    writes the upsert first."""
    table = ShardAssignment._meta.db_table
    if connection.vendor == "postgresql":
        columns = [list(c) for c in zip(*rows, strict=True)]
        owner, target = "v.owner_id", "v.target_id"
        if named_in_group is not None:
            member = (f"(SELECT m.id FROM {MemberRow._meta.db_table} AS m"
                      f" WHERE m.group_id = {int(named_in_group)} AND m.member_id = v.{{}})")
            owner = f"COALESCE(v.owner_id, {member.format('owner_name')})"
            target = f"COALESCE(v.target_id, {member.format('target_name')})"
        else:
            columns = columns[:7]
        names = ", %s::text[], %s::text[]" if named_in_group is not None else ""
        writes.add(
            f"UPDATE {table} AS a SET owner_id = {owner}, revoking = v.revoking,"
            f" grant_epoch = v.grant_epoch, target_id = {target}, drained_at = v.drained_at,"
            " state_version = v.state_version FROM unnest(%s::bigint[], %s::boolean[],"
            f" %s::integer[], %s::bigint[], %s::timestamptz[], %s::bigint[], %s::bigint[]{names})"
            " AS v(owner_id, revoking, grant_epoch, target_id, drained_at, state_version, id"
            f"{', owner_name, target_name' if names else ''}) WHERE a.id = v.id",
            columns,
        )
        return
    for row in rows:
        writes.add(
            f"UPDATE {table} SET owner_id = %s, revoking = %s, grant_epoch = %s, target_id = %s,"
            " drained_at = %s, state_version = %s WHERE id = %s",
            list(row[:7]),
        )


def _save_events(writes: Batch, state: GroupState, loaded: Loaded, actor: str) -> None:
    changes = state.changes
    group = loaded.group
    if not changes.events:
        return
    created_at = timezone.now()
    rows = []
    for e in changes.events:
        columns, params = _prep(Event, dict(
            created_at=created_at, kind=e.kind, group=group.pk, stream=group.stream_id,
            member_id=e.member_id, group_epoch=e.group_epoch, member_epoch=e.member_epoch,
            actor=str(e.detail.get("actor", actor)), detail=e.detail,
        ))
        rows.append(params)
    one = f"({', '.join(['%s'] * len(columns))})"
    writes.add(f"INSERT INTO {Event._meta.db_table} ({', '.join(columns)}) VALUES {', '.join([one] * len(rows))}",
               [p for row in rows for p in row])
    for e in changes.events:  # one log line per event row (JSON with LOG_FORMAT=json)
        event_log.info(
            "%s group=%s member=%s groupEpoch=%s %s", e.kind, state.name, e.member_id or "-",
            e.group_epoch, " ".join(f"{k}={v}" for k, v in e.detail.items()),
            extra={"event": e.kind, "group": state.name, "stream": state.stream, "memberId": e.member_id,
                   "memberEpoch": e.member_epoch, "groupEpoch": e.group_epoch,
                   "assignmentEpoch": e.detail.get("assignmentEpoch")},
        )


# --- writes outside the core's locked passes ------------------------------------------------
def create_group_rows(stream: Stream, shard_pks: Iterable[int], **config: Any) -> Group:
    """A new group with one (empty) slot per live shard (inside the caller's transaction)."""
    group = Group.objects.create(stream=stream, **config)
    ShardAssignment.objects.bulk_create(ShardAssignment(group=group, shard_id=pk) for pk in shard_pks)
    return group


def update_group_settings(group: Group, changed: dict[str, object]) -> None:
    """Write an operator's settings change and raise the group's metadataEpoch (R7: members
    learn the settings through SYNC_METADATA; every cached snapshot and steady answer names
    that epoch, so each process reloads). Read-increment-write under the row lock."""
    for name, value in changed.items():
        setattr(group, name, value)
    group.metadata_epoch += 1
    group.save(update_fields=[*changed, "metadata_epoch"])


def raise_metadata_epoch(group: Group) -> None:
    """R7: members holding older metadata get SYNC_METADATA (drain-only) until they catch up;
    snapshots and steady answers of the older epoch are no longer used."""
    Group.objects.filter(pk=group.pk).update(metadata_epoch=F("metadata_epoch") + 1)
    group.refresh_from_db(fields=["metadata_epoch"])


def add_slots(group: Group, shard_pks: list[int]) -> None:
    """Empty slots for shards the group lacks (a reshard's new version); the caller raises the
    metadata epoch (slots change only with it, see snapshot_cache.shape_of)."""
    ShardAssignment.objects.bulk_create(ShardAssignment(group=group, shard_id=pk) for pk in shard_pks)


def delete_retired_slots(stream: Stream) -> None:
    """Drop the slots of the stream's retired shards (no longer loaded). The caller holds the
    locks of every group of the stream and raises their metadata epochs."""
    ShardAssignment.objects.filter(group__stream=stream, shard__version__state=VersionState.RETIRED).delete()


def delete_group_rows(group: Group) -> None:
    """Delete a group with its slots and members (its API keys and events go with it): a
    snapshot of it is never used again (a group recreated under the name has another id and
    creation time, snapshot_cache.shape_of)."""
    ShardAssignment.objects.filter(group=group).delete()  # before members: they PROTECT them
    MemberRow.objects.filter(group=group).delete()
    group.delete()
