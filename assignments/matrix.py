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

from assignments.selectors import read_group_state
from coordination import engine
from coordination.liveness import Liveness, liveness
from coordination.model import GroupState, Member, ShardSlot
from dataplane.routing import shard_sort_key
from groups.models import Group, StreamState
from groups.namespace import observe_generation
from groups.selectors import group_shard_stats
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
    state = read_group_state(group)
    stats = group_shard_stats(group) if with_stats else None
    return matrix_from_state(state, now, stats, full=full)
