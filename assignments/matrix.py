"""The assignment matrix of a group (members × shards), for the admin.

Built from `assignments.store.load_state`, the same snapshot the core decides on, and the
core's own read-side helpers (`granted_to`, `target_of`, `s6_assignable`, `group_phase`), so
the page shows exactly what the next heartbeat would see. Read-only: no lock is taken, so
it is a consistent-enough snapshot of rows committed at read time, never a writer.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from assignments.store import load_state
from coordination import engine
from coordination.liveness import Liveness, liveness
from coordination.model import GroupState, Member, ShardSlot, shard_sort_key
from groups.models import Group


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


@dataclass(frozen=True)
class ShardColumn:
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
class MemberRow:
    member_id: str
    client_id: str
    status: str
    member_epoch: int
    seconds_since_heartbeat: float | None
    liveness: Liveness
    revocation_deadline: datetime | None
    cells: tuple[Cell, ...]
    granted: int
    pending: int
    revoking: int


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
        if slot.revoking:
            kind = CellKind.REVOKING
        else:
            kind = CellKind.GRANTED if in_target else CellKind.LEAVING
        return Cell(kind, in_target, slot.grant_epoch)
    if in_target:
        return Cell(CellKind.PENDING, True)
    return Cell(CellKind.EMPTY)


def matrix_from_state(state: GroupState, now: datetime) -> Matrix:
    """Pure: one snapshot of the core's state → the matrix."""
    assignable = set(engine.s6_assignable(state))
    slots = sorted(state.shards.values(), key=lambda s: shard_sort_key(s.shard_id))
    columns = []
    for slot in slots:
        _, version, index = shard_sort_key(slot.shard_id)
        columns.append(ShardColumn(
            shard_id=slot.shard_id, version=version, index=index, sealed=slot.sealed,
            drained=slot.drained, assignable=slot.shard_id in assignable, parents=slot.parents,
            owner=slot.owner, revoking=slot.revoking, target=slot.target, grant_epoch=slot.grant_epoch,
        ))
    versions: list[tuple[int, int, bool]] = []
    for col in columns:
        if versions and versions[-1][0] == col.version:
            v, n, sealed = versions[-1]
            versions[-1] = (v, n + 1, sealed)
        else:
            versions.append((col.version, 1, col.sealed))
    rows = []
    for member in sorted(state.live_members(), key=lambda m: m.member_id):
        seconds, alive = liveness(
            member.last_heartbeat_at, now, state.heartbeat_interval_ms, state.session_timeout_ms
        )
        granted = state.granted_to(member.member_id)
        rows.append(MemberRow(
            member_id=member.member_id,
            client_id=member.client_id,
            status=member.status.value,
            member_epoch=member.member_epoch,
            seconds_since_heartbeat=seconds,
            liveness=alive,
            revocation_deadline=member.revocation_deadline,
            cells=tuple(_cell(state, member, slot) for slot in slots),
            granted=len(granted),
            pending=len(state.target_of(member.member_id) - granted),
            revoking=len(state.revoking_from(member.member_id)),
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
    )


def build_matrix(group: Group, now: datetime) -> Matrix:
    state, _ = load_state(group)
    return matrix_from_state(state, now)
