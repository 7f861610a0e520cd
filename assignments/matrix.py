"""The assignment matrix of a group (members × shards), for the admin.

At scale (1,000 members × 4,096 shards) a members × shards table is 4 million cells: the
page shows per-member summaries (counts, shards as compact ranges, lag and pending of what
the member holds) and a per-shard grid that is filtered and paged instead; the full cell
table is built only for small groups (`FULL_MATRIX_MAX_CELLS`). Lag/pending/DLQ come from
`groups.shardstats` (cached ≤ 2 s), never from a read of the shards here.

Built from `assignments.selectors.read_group_state`, the same snapshot the core decides on, and the
core's own read-side helpers (`granted_to`, `target_of`, `s6_assignable`, `group_phase`), so
the page shows exactly what the next heartbeat would see. Read-only: no lock is taken, so
it is a consistent-enough snapshot of rows committed at read time, never a writer.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from assignments.models import SQLValue
from assignments.rows import count_live_members, load_page, shard_rows
from assignments.selectors import group_phase_of, read_group_state
from coordination import engine
from coordination.liveness import Liveness, cutoffs, liveness
from coordination.model import GroupState, Member, ShardSlot
from dataplane.routing import shard_sort_key
from groups.models import Group, StreamState
from groups.namespace import observe_generation
from groups.selectors import group_shard_stats, live_shard_keys
from groups.shardstats import GroupStats

# Above this many members × shards the page shows summaries and the shard grid only.
FULL_MATRIX_MAX_CELLS = 64 * 64
# Lag colour scale: bucket upper bounds (0, ≤10, ≤100, ≤1k, ≤10k, more), log-like.
HEAT_BOUNDS = (0, 10, 100, 1000, 10_000)


def heat(value: int | None) -> str:
    """A colour-scale class: h0 (nothing) … h5 (more than 10k), hx (unknown)."""
    if value is None:
        return "hx"
    for i, bound in enumerate(HEAT_BOUNDS):
        if value <= bound:
            return f"h{i}"
    return f"h{len(HEAT_BOUNDS)}"


def compact_ranges(shards: Iterable[tuple[int, int]]) -> str:
    """(version, index) pairs → `v1: 0-2, 7 · v2: 3` (shards of a member, read at a glance)."""
    by_version: dict[int, list[int]] = {}
    for version, index in shards:
        by_version.setdefault(version, []).append(index)
    parts = []
    for version in sorted(by_version):
        indices = sorted(by_version[version])
        runs: list[str] = []
        start = prev = indices[0]
        for i in indices[1:]:
            if i == prev + 1:
                prev = i
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = i
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        parts.append(f"v{version}: {', '.join(runs)}")
    return " · ".join(parts)


class CellKind(StrEnum):
    GRANTED = "granted"  # owned, in target
    LEAVING = "leaving"  # owned, no longer in target: REVOKING at the member's next heartbeat
    REVOKING = "revoking"  # owned, the member owes REVOKED
    PENDING = "pending"  # in target, not granted yet (held by another, parents undrained, R7)
    EMPTY = ""


@dataclass(frozen=True)
class Cell:
    kind: CellKind
    target: bool = False  # the shard is in this member's target
    grant_epoch: int | None = None  # shown where the member holds the shard

    @property
    def label(self) -> str:
        if self.kind == CellKind.EMPTY:
            return ""
        if self.grant_epoch is not None:
            return f"{self.kind.value} @{self.grant_epoch}"
        return self.kind.value


class _HeatMixin:
    """Colour-scale classes of a row or column with `lag` and `pending_entries`."""

    lag: int | None
    pending_entries: int | None

    @property
    def heat(self) -> str:
        return heat(self.lag)

    @property
    def pending_heat(self) -> str:
        return heat(self.pending_entries)


@dataclass(frozen=True)
class ShardColumn(_HeatMixin):
    shard_id: str
    version: int
    index: int
    sealed: bool
    drained: bool
    assignable: bool  # in the core's assignable set (§6: undrained, parents drained)
    parents: tuple[str, ...]
    owner: str | None
    revoking: bool
    target: str | None
    grant_epoch: int
    lag: int | None = None
    lag_exact: bool = True
    pending_entries: int | None = None
    dlq: int | None = None
    last_delivered_id: str | None = None

    @property
    def status(self) -> str:
        """One word for the column footer."""
        if self.drained:
            return "drained"
        if self.sealed:
            return "sealed"
        if not self.assignable:
            return "waiting for parents"
        if self.target is None:
            return "no target"
        return "assigned"


@dataclass(frozen=True)
class MemberRow(_HeatMixin):
    member_id: str
    client_id: str
    status: str
    member_epoch: int
    seconds_since_heartbeat: float | None
    liveness: Liveness
    revocation_deadline: datetime | None
    cells: tuple[Cell, ...]  # empty when the group is too big for the full table
    granted: int
    pending: int
    revoking: int
    ranges: str = ""  # held shards as compact ranges
    lag: int | None = None  # over the shards it holds
    pending_entries: int | None = None


@dataclass(frozen=True)
class VersionSummary:
    """One live version as this group sees it, for the reshard panel."""

    version: int
    sealed: bool
    shards: int
    drained: int
    waiting_for_parents: int  # undrained, not assignable yet (§6)
    holders: tuple[str, ...]  # members still holding undrained shards of a sealed version


@dataclass(frozen=True)
class Matrix:
    group: str
    stream: str
    phase: str
    group_epoch: int
    assignment_epoch: int
    metadata_epoch: int
    exclusive: bool  # R9 in this snapshot
    columns: tuple[ShardColumn, ...]
    rows: tuple[MemberRow, ...]
    versions: tuple[tuple[int, int, bool], ...]  # (version, column count, sealed) for the header
    full: bool = True  # cells were built (small group)
    version_summaries: tuple[VersionSummary, ...] = ()
    stats: GroupStats | None = field(default=None, compare=False)
    # A big group (issue 26.3): `rows` is empty, members are read a page at a time (PagedRows),
    # and these are the member counts of the totals.
    paged_members: dict[str, int] | None = None

    @property
    def resharding(self) -> bool:
        return len(self.version_summaries) > 1 or any(v.sealed for v in self.version_summaries)

    def waits_for(self, stream_state: str) -> list[str]:
        """What the reshard waits for, in words (§6 steps)."""
        if stream_state == StreamState.PREPARING:
            return ["the next sweep writes the seal markers of the old version (PREPARING → SEALING)"]
        if stream_state == StreamState.SEALING:
            return ["seal markers being written; then members drain the sealed version"]
        out = []
        for v in self.version_summaries:
            left = v.shards - v.drained
            if v.sealed and left:
                who = ", ".join(v.holders[:5]) + (f" and {len(v.holders) - 5} more" if len(v.holders) > 5 else "")
                out.append(f"v{v.version}: {left} of {v.shards} sealed shards still to drain"
                           + (f" (held by {who})" if who else " (not held: waiting for an owner)"))
            elif v.sealed:
                out.append(f"v{v.version}: drained by this group; the sweep retires it once every group has")
            if v.waiting_for_parents:
                out.append(f"v{v.version}: {v.waiting_for_parents} shards wait for their parents to drain")
        return out

    @property
    def totals(self) -> dict[str, int]:
        if self.paged_members is not None:
            return {
                **self.paged_members,
                "shards": len(self.columns),
                "sealed": sum(c.sealed and not c.drained for c in self.columns),
                "drained": sum(c.drained for c in self.columns),
            }
        return {
            "members": len(self.rows),
            "shards": len(self.columns),
            "granted": sum(r.granted for r in self.rows),
            "pending": sum(r.pending for r in self.rows),
            "revoking": sum(r.revoking for r in self.rows),
            "sealed": sum(c.sealed and not c.drained for c in self.columns),
            "drained": sum(c.drained for c in self.columns),
        }


def _cell(state: GroupState, member: Member, slot: ShardSlot) -> Cell:
    mid = member.member_id
    in_target = slot.target == mid
    if slot.owner == mid:
        kind = CellKind.REVOKING if slot.revoking else CellKind.GRANTED if in_target else CellKind.LEAVING
        return Cell(kind, in_target, slot.grant_epoch)
    if in_target:
        return Cell(CellKind.PENDING, True)
    return Cell(CellKind.EMPTY)


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def matrix_from_state(
    state: GroupState, now: datetime, stats: GroupStats | None = None, *, full: bool | None = None,
) -> Matrix:
    """Pure: one snapshot of the core's state (and the shard figures, if any) → the matrix."""
    assignable = set(engine.s6_assignable(state))
    keys = {sid: shard_sort_key(sid) for sid in state.shards}
    slots = sorted(state.shards.values(), key=lambda s: keys[s.shard_id])
    live = sorted(state.live_members(), key=lambda m: m.member_id)
    if full is None:
        full = len(slots) * max(len(live), 1) <= FULL_MATRIX_MAX_CELLS
    columns = []
    for slot in slots:
        _, version, index = keys[slot.shard_id]
        fig = stats.shard(slot.shard_id) if stats is not None and stats.ok else None
        columns.append(ShardColumn(
            shard_id=slot.shard_id, version=version, index=index, sealed=slot.sealed,
            drained=slot.drained, assignable=slot.shard_id in assignable, parents=slot.parents,
            owner=slot.owner, revoking=slot.revoking, target=slot.target, grant_epoch=slot.grant_epoch,
            lag=fig.lag if fig else None, lag_exact=fig.lag_exact if fig else True,
            pending_entries=fig.pending if fig else None, dlq=fig.dlq_length if fig else None,
            last_delivered_id=fig.last_delivered_id if fig else None,
        ))
    by_shard = {c.shard_id: c for c in columns}
    versions: list[tuple[int, int, bool]] = []
    for col in columns:
        if versions and versions[-1][0] == col.version:
            v, n, sealed = versions[-1]
            versions[-1] = (v, n + 1, sealed)
        else:
            versions.append((col.version, 1, col.sealed))
    rows = []
    for member in live:
        seconds, alive = liveness(
            member.last_heartbeat_at, now, state.heartbeat_interval_ms, state.session_timeout_ms
        )
        granted = state.granted_to(member.member_id)
        held = [by_shard[s] for s in state.held_by(member.member_id) if s in by_shard]
        rows.append(MemberRow(
            member_id=member.member_id,
            client_id=member.client_id,
            status=member.status.value,
            member_epoch=member.member_epoch,
            seconds_since_heartbeat=seconds,
            liveness=alive,
            revocation_deadline=member.revocation_deadline,
            cells=tuple(_cell(state, member, slot) for slot in slots) if full else (),
            granted=len(granted),
            pending=len(state.target_of(member.member_id) - granted),
            revoking=len(state.revoking_from(member.member_id)),
            ranges=compact_ranges((c.version, c.index) for c in held) if held else "",
            lag=_sum(c.lag for c in held) if stats is not None and stats.ok else None,
            pending_entries=_sum(c.pending_entries for c in held) if stats is not None and stats.ok else None,
        ))
    return Matrix(
        group=state.name,
        stream=state.stream,
        phase=engine.group_phase(state).value,
        group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch,
        metadata_epoch=state.metadata_epoch,
        exclusive=engine.owners_are_exclusive(state),
        columns=tuple(columns),
        rows=tuple(rows),
        versions=tuple(versions),
        full=full,
        version_summaries=_version_summaries(columns),
        stats=stats,
    )


def _version_summaries(columns: list[ShardColumn]) -> tuple[VersionSummary, ...]:
    out = []
    for version in sorted({c.version for c in columns}):
        cols = [c for c in columns if c.version == version]
        sealed = any(c.sealed for c in cols)
        holders = sorted({c.owner for c in cols if sealed and not c.drained and c.owner})
        out.append(VersionSummary(
            version=version, sealed=sealed, shards=len(cols), drained=sum(c.drained for c in cols),
            waiting_for_parents=sum(not c.drained and not c.assignable for c in cols),
            holders=tuple(holders),
        ))
    return tuple(out)


def build_matrix(group: Group, now: datetime, *, with_stats: bool = True, full: bool | None = None) -> Matrix:
    observe_generation()  # after a restore, no cached catalogue or figure of the old history
    if live_member_count(group) > PAGED_ABOVE_MEMBERS:
        return build_big_matrix(group, now, with_stats=with_stats)
    state = read_group_state(group)
    stats = group_shard_stats(group) if with_stats else None
    return matrix_from_state(state, now, stats, full=full)


# --- big groups (issue 26.3) -----------------------------------------------------------------
# Above this many live members the admin reads the shards without the members, and the members
# a page at a time: at 10,000 × 16,384 a whole snapshot plus a row per member took seconds.
PAGED_ABOVE_MEMBERS = 2000


def live_member_count(group: Group) -> int:
    return count_live_members(group)


def build_big_matrix(group: Group, now: datetime, *, with_stats: bool = True) -> Matrix:
    """The matrix of a big group: every shard column from one statement (owners and targets by
    name), no member rows (see `PagedRows`), counts from the columns and aggregates."""
    stats = group_shard_stats(group) if with_stats else None
    ok = stats is not None and stats.ok
    rows = shard_rows(group)
    drained = {row[0] for row in rows if row[7]}
    ids = {row[0] for row in rows}
    keys = live_shard_keys(group.stream_id, group.stream.metadata_epoch)
    if not ids <= keys.keys():  # the stream changed since the group row was read
        keys = {row[0]: shard_sort_key(row[0])[1:] for row in rows}
    rows.sort(key=lambda row: keys[row[0]])
    columns = []
    for sid, parents, sealed, owner, revoking, grant_epoch, target, is_drained in rows:
        version, index = keys[sid]
        fig = stats.shard(sid) if stats is not None and ok else None
        columns.append(ShardColumn(
            shard_id=sid, version=version, index=index, sealed=sealed, drained=is_drained,
            assignable=not is_drained and (not parents or all(p not in ids or p in drained for p in parents)),
            parents=parents, owner=owner, revoking=revoking, target=target, grant_epoch=grant_epoch,
            lag=fig.lag if fig else None, lag_exact=fig.lag_exact if fig else True,
            pending_entries=fig.pending if fig else None, dlq=fig.dlq_length if fig else None,
            last_delivered_id=fig.last_delivered_id if fig else None,
        ))
    versions: list[tuple[int, int, bool]] = []
    for col in columns:
        if versions and versions[-1][0] == col.version:
            v, n, sealed_v = versions[-1]
            versions[-1] = (v, n + 1, sealed_v)
        else:
            versions.append((col.version, 1, col.sealed))
    live = live_member_count(group)
    return Matrix(
        group=group.name,
        stream=group.stream.name,
        phase=group_phase_of(group).value,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_epoch=group.metadata_epoch,
        exclusive=True,  # one owner column per (group, shard) row: UNIQUE in the database (R9)
        columns=tuple(columns),
        rows=(),
        versions=tuple(versions),
        full=False,
        version_summaries=_version_summaries(columns),
        stats=stats,
        paged_members={
            "members": live,
            "granted": sum(c.owner is not None and not c.revoking and not c.drained for c in columns),
            "pending": sum(c.target is not None and (c.owner != c.target or c.revoking) for c in columns),
            "revoking": sum(c.revoking for c in columns),
        },
    )


def _liveness_condition(group: Group, now: datetime, alive: str) -> tuple[str, list[SQLValue]]:
    """The liveness filter as SQL on last_heartbeat_at (the classifier's cutoffs)."""
    c = cutoffs(now, group.heartbeat_interval_ms, group.session_timeout_ms)
    conditions: dict[Liveness, tuple[str, list[SQLValue]]] = {
        Liveness.UNKNOWN: (" AND last_heartbeat_at IS NULL", []),
        Liveness.EXPIRED: (" AND last_heartbeat_at < %s", [c.expired_before]),
        Liveness.LATE: (" AND last_heartbeat_at < %s AND last_heartbeat_at >= %s", [c.late_before, c.expired_before]),
        Liveness.ALIVE: (" AND last_heartbeat_at >= %s", [c.late_before]),
    }
    return conditions[Liveness(alive)]


class PagedRows:
    """A big group's member rows, filtered like the small group's list and read one page at a
    time: Django's Paginator asks `count()`, then one slice."""

    def __init__(self, group: Group, matrix: Matrix, now: datetime, query: str = "", alive: str = "") -> None:
        self.group, self.matrix, self.now = group, matrix, now
        where, params = "", list[SQLValue]()
        if query:
            where += " AND (member_id LIKE %s ESCAPE '\\' OR client_id LIKE %s ESCAPE '\\')"
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            params += [like, like]
        if alive:
            more, more_params = _liveness_condition(group, now, alive)
            where += more
            params += more_params
        self.where, self.params = where, params
        self._count: int | None = None

    def count(self) -> int:
        if self._count is None:
            self._count = count_live_members(self.group, self.where, self.params)
        return self._count

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, index: slice) -> list[MemberRow]:
        start = index.start or 0
        stop = index.stop if index.stop is not None else start + 100
        state, ids, _ = load_page(self.group, start, stop - start, member_where=self.where,
                                  where_params=self.params, shards=False)
        by_shard = {c.shard_id: c for c in self.matrix.columns}
        ok = self.matrix.stats is not None and self.matrix.stats.ok
        classify = cutoffs(self.now, state.heartbeat_interval_ms, state.session_timeout_ms).classify
        out = []
        for mid in ids:
            member = state.members[mid]
            granted = state.granted_to(mid)
            held = [by_shard[s] for s in state.held_by(mid) if s in by_shard]
            last = member.last_heartbeat_at
            out.append(MemberRow(
                member_id=mid, client_id=member.client_id, status=member.status.value,
                member_epoch=member.member_epoch,
                seconds_since_heartbeat=None if last is None else max(0.0, (self.now - last).total_seconds()),
                liveness=classify(last), revocation_deadline=member.revocation_deadline, cells=(),
                granted=len(granted), pending=len(state.target_of(mid) - granted),
                revoking=len(state.revoking_from(mid)),
                ranges=compact_ranges((c.version, c.index) for c in held) if held else "",
                lag=_sum(c.lag for c in held) if ok else None,
                pending_entries=_sum(c.pending_entries for c in held) if ok else None,
            ))
        return out

    def late(self) -> int:
        """Live members the classifier does not call alive (the overview's "late")."""
        return self.count() - PagedRows(self.group, self.matrix, self.now, alive=Liveness.ALIVE.value).count()
