"""Plain dataclasses the protocol core works on.

`GroupState` is one group's snapshot as the shell loaded it (under the group's lock). The
engine mutates it only through the methods below, which keep the per-member indexes right
and record what changed in `Changes`, so the shell persists exactly the dirty rows. The
protocol's words (errorCode, status, revocation states) come from `dataplane.protocol`, the one
home both sides share; member states and group phases are the coordinator's own.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from dataplane.protocol import HTTP_STATUS, ErrorCode, RevokeState, Status


class MemberStatus(StrEnum):
    # Live members.
    STABLE = "STABLE"  # reconciled: epoch == assignmentEpoch, target fully granted
    REVOKING = "REVOKING"  # owes REVOKED for shards that left its target
    PENDING = "PENDING"  # waits for target shards still held by others (or not yet synced)
    # §9 R2s: a static member that stopped with memberEpoch -2. Still in the group (its place,
    # shards and target are reserved) until it rejoins (R1s) or its session times out (L1s).
    TEMPORARILY_LEFT = "TEMPORARILY_LEFT"
    # Tombstones, kept so the next heartbeat gets the right error (R8, L1).
    LEFT = "LEFT"
    EXPIRED = "EXPIRED"
    FENCED = "FENCED"


# Members the group holds: they count toward max_members, own shards and targets, and expire
# by L1. A temporarily left member is one of them, but sends no heartbeats.
LIVE_STATUSES = frozenset({
    MemberStatus.STABLE, MemberStatus.REVOKING, MemberStatus.PENDING, MemberStatus.TEMPORARILY_LEFT,
})


class GroupPhase(StrEnum):
    EMPTY = "EMPTY"
    ASSIGNING = "ASSIGNING"
    RECONCILING = "RECONCILING"
    STABLE = "STABLE"


class ShardState(StrEnum):
    """One word per live shard of a group, as describe and `rsc_group_shards` show it."""

    GRANTED = "granted"
    REVOKING = "revoking"
    UNOWNED = "unowned"
    DRAINED = "drained"


@dataclass(frozen=True)
class RevokeReport:
    shard: str
    state: RevokeState


@dataclass(frozen=True)
class HeartbeatRequest:
    member_id: str
    member_epoch: int
    metadata_epoch: int | None = None
    client_id: str = ""
    rebalance_timeout_ms: int | None = None
    owned_shards: tuple[str, ...] | None = None  # None: unchanged since last accepted
    revoking_shards: tuple[RevokeReport, ...] = ()
    drained_shards: tuple[str, ...] = ()
    instance_id: str | None = None  # §9 static membership
    # Issue 25.7: the client library and version (the User-Agent's first product, e.g.
    # "rsc-dataplane/0.2.0"), set by the view on joins only: not part of the body.
    library_version: str = ""


# The member fields a steady answer reads (coordination.steady.steady_answer): a change to one
# files the member as touched in its group (GroupState.take_touched).
_STEADY_FIELDS = frozenset({"status", "member_epoch", "revocation_deadline"})


@dataclass(slots=True)
class Member:
    member_id: str
    status: MemberStatus
    member_epoch: int = 0
    previous_member_epoch: int = 0
    client_id: str = ""
    rebalance_timeout_ms: int = 60_000
    joined_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    revocation_deadline: datetime | None = None
    last_reported_owned: tuple[str, ...] | None = ()  # None: not loaded (not needed)
    fenced_reason: str = ""
    fenced_by: str = ""
    instance_id: str | None = None  # §9: at most one live member per instanceId in a group
    # Issue 25.7: set by a join (a process's library cannot change without a rejoin); None:
    # not loaded, the writer leaves the column alone (no write on the steady path).
    library_version: str | None = None
    # The member table that holds this member: told when its status changes, so the group's
    # roster of live members stays right without a walk (issue 26.2). Not a protocol field.
    table: MemberTable | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        table = getattr(self, "table", None) if name in _STEADY_FIELDS else None  # unset in __init__
        object.__setattr__(self, name, value)
        if table is not None:
            if name == "status":
                table.reclassify(self.member_id)  # files it as touched too
            else:
                table.state.touch_steady(self.member_id)

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def temporarily_left(self) -> bool:
        return self.status == MemberStatus.TEMPORARILY_LEFT


@dataclass(slots=True)
class ShardSlot:
    """One shard as one group sees it: target member, current owner, grant epoch, drain."""

    shard_id: str
    parents: tuple[str, ...] = ()
    sealed: bool = False  # its version's seal markers are written (§6 step 2)
    owner: str | None = None
    revoking: bool = False
    grant_epoch: int = 0  # last epoch this shard was granted at; only rises (fencing token)
    target: str | None = None
    drained: bool = False


@dataclass
class Event:
    kind: str  # joined, rejoined, left, left_temporarily, replaced, expired, fenced, rebalanced, drained
    member_id: str = ""
    group_epoch: int = 0
    member_epoch: int | None = None
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class Changes:
    group: bool = False
    members: set[str] = field(default_factory=set)
    shards: set[str] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    granted: bool = False  # some shard got an owner: the write must be durable before the answer

    @property
    def empty(self) -> bool:
        return not (self.group or self.members or self.shards or self.events)


class MemberTable(dict[str, Member]):
    """`GroupState.members`: a dict that files every member it takes in, gives up, or whose
    status changes (`Member.__setattr__`) in its group's roster (`GroupState.reclassify`)."""

    def __init__(self, state: GroupState, members: dict[str, Member]) -> None:
        super().__init__()
        self.state = state
        for mid, member in members.items():
            self[mid] = member

    def __setitem__(self, member_id: str, member: Member) -> None:
        old = dict.get(self, member_id)
        if old is not None and old is not member:
            old.table = None
        dict.__setitem__(self, member_id, member)
        member.table = self
        self.state.reclassify(member_id)

    def __delitem__(self, member_id: str) -> None:
        member = dict.pop(self, member_id)
        member.table = None
        self.state.reclassify(member_id)

    def pop(self, member_id: str, *default: Any) -> Any:
        if member_id in self:
            member = dict.__getitem__(self, member_id)
            del self[member_id]
            return member
        if default:
            return default[0]
        raise KeyError(member_id)

    def reclassify(self, member_id: str) -> None:
        self.state.reclassify(member_id)

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("GroupState.members changes one member at a time (it keeps the roster)")

    update = setdefault = popitem = clear = __ior__ = _unsupported


@dataclass
class GroupState:
    name: str
    stream: str
    group_epoch: int = 1
    assignment_epoch: int = 1
    metadata_epoch: int = 1
    max_members: int = 1000
    heartbeat_interval_ms: int = 3000
    session_timeout_ms: int = 30_000
    rebalance_timeout_ms: int = 60_000
    # Join batching (engine.r1b_defer_rebalance): the window (a coordinator setting), the
    # last target recompute, when a deferred one is due (None: none is waiting) and when the
    # first change it waits for came.
    rebalance_window_ms: int = 0
    rebalanced_at: datetime | None = None
    rebalance_due_at: datetime | None = None
    rebalance_deferred_at: datetime | None = None
    # §11 group pause: since when (None: not paused) and who paused it.
    paused_at: datetime | None = None
    paused_by: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    shards: dict[str, ShardSlot] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)

    def __post_init__(self) -> None:
        self._granted: dict[str, set[str]] = {}
        self._revoking: dict[str, set[str]] = {}
        self._target: dict[str, set[str]] = {}
        self._untargeted: set[str] = set()
        # §6 assignable set, kept while no slot's drain or parents change (engine.s6_assignable_set).
        self.assignable_cache: frozenset[str] | None = None
        # The roster (issue 26.2): live members, temporarily left ones, and the target count of
        # every member the assignor balances over ("sharing": live, not temporarily left),
        # kept by the member table and the slot index so a recompute reads it without a walk.
        self._live: set[str] = set()
        self._reserved: set[str] = set()
        self._count: dict[str, int] = {}
        self._orphaned_by: set[str] = set()  # not live (or gone) yet some slot targets them
        # `_count` grouped by count, ids in order; brought up to date when read (roster_buckets).
        self._buckets: dict[int, list[str]] = {}
        self._placed: dict[str, int] = {}
        self._unplaced: set[str] = set()
        # Ids of the members whose steady answer may have changed since the shell last took
        # this set (take_touched): their record was replaced, dropped or changed in a field a
        # steady answer reads, or a slot naming them as owner or target changed. The shell
        # keeps the other members' memoized steady answers across a locked pass.
        self._touched: set[str] = set()
        for slot in self.shards.values():
            self._index(slot)
        self.members = MemberTable(self, self.members)

    # -- indexes ---------------------------------------------------------------------------
    def _index(self, slot: ShardSlot) -> None:
        self._touch_slot(slot)
        if slot.owner is not None:
            bucket = self._revoking if slot.revoking else self._granted
            bucket.setdefault(slot.owner, set()).add(slot.shard_id)
        if slot.target is not None:
            self._target.setdefault(slot.target, set()).add(slot.shard_id)
            self._target_count_changed(slot.target)
        else:
            self._untargeted.add(slot.shard_id)

    def _unindex(self, slot: ShardSlot) -> None:
        self._touch_slot(slot)
        if slot.owner is not None:
            bucket = self._revoking if slot.revoking else self._granted
            bucket.get(slot.owner, set()).discard(slot.shard_id)
        if slot.target is not None:
            self._target.get(slot.target, set()).discard(slot.shard_id)
            self._target_count_changed(slot.target)
        else:
            self._untargeted.discard(slot.shard_id)

    def _touch_slot(self, slot: ShardSlot) -> None:
        if slot.owner is not None:
            self._touched.add(slot.owner)
        if slot.target is not None:
            self._touched.add(slot.target)

    def touch_steady(self, member_id: str) -> None:
        """A field of this member that a steady answer reads changed (Member.__setattr__)."""
        self._touched.add(member_id)

    def take_touched(self) -> set[str]:
        """The members touched since the last call (see `_touched`); starts a new set."""
        touched, self._touched = self._touched, set()
        return touched

    # -- roster ----------------------------------------------------------------------------
    def reclassify(self, member_id: str) -> None:
        """The member table changed this id's member or its status: file it again."""
        self._touched.add(member_id)
        m = dict.get(self.members, member_id)
        live = m is not None and m.status in LIVE_STATUSES
        reserved = live and m is not None and m.status == MemberStatus.TEMPORARILY_LEFT
        (self._live.add if live else self._live.discard)(member_id)
        (self._reserved.add if reserved else self._reserved.discard)(member_id)
        sharing = live and not reserved
        if sharing != (member_id in self._count):
            if sharing:
                self._count[member_id] = len(self._target.get(member_id, ()))
            else:
                del self._count[member_id]
            self._unplaced.add(member_id)
        self._check_orphaned(member_id)

    def _target_count_changed(self, member_id: str) -> None:
        if member_id in self._count:
            self._count[member_id] = len(self._target[member_id])
            self._unplaced.add(member_id)
        else:
            self._check_orphaned(member_id)

    def _check_orphaned(self, member_id: str) -> None:
        if member_id not in self._live and self._target.get(member_id):
            self._orphaned_by.add(member_id)
        else:
            self._orphaned_by.discard(member_id)

    def live_ids(self) -> set[str]:
        """Ids of the live members, temporarily left ones included (read only)."""
        return self._live

    def reserved_ids(self) -> set[str]:
        """Ids of the temporarily left members (§9), whose targets are kept (read only)."""
        return self._reserved

    def orphaned_targets(self) -> list[str]:
        """Shards targeted at a member that is no longer live."""
        return [s for mid in self._orphaned_by for s in self._target[mid]]

    def roster_buckets(self) -> dict[int, list[str]]:
        """Target count → ids (in order) of the members the assignor balances over: live and
        not temporarily left (read only). Members whose count changed since the last read are
        moved now: one by one when few did, else every bucket is rebuilt (a big recompute)."""
        unplaced = self._unplaced
        if len(unplaced) > 256:
            buckets: dict[int, list[str]] = {}
            for mid, count in self._count.items():
                buckets.setdefault(count, []).append(mid)
            for ids in buckets.values():
                ids.sort()
            self._buckets, self._placed = buckets, dict(self._count)
        else:
            for mid in unplaced:
                was, now = self._placed.get(mid), self._count.get(mid)
                if was == now:
                    continue
                if was is not None:
                    ids = self._buckets[was]
                    del ids[bisect_left(ids, mid)]
                    if not ids:
                        del self._buckets[was]
                    del self._placed[mid]
                if now is not None:
                    insort(self._buckets.setdefault(now, []), mid)
                    self._placed[mid] = now
        unplaced.clear()
        return self._buckets

    def granted_to(self, member_id: str) -> set[str]:
        return self._granted.get(member_id, set())

    def revoking_from(self, member_id: str) -> set[str]:
        return self._revoking.get(member_id, set())

    def held_by(self, member_id: str) -> set[str]:
        return self.granted_to(member_id) | self.revoking_from(member_id)

    def target_of(self, member_id: str) -> set[str]:
        return self._target.get(member_id, set())

    def targets(self) -> dict[str, set[str]]:
        """Every member id (live or not) that some slot targets → those shards (read only)."""
        return self._target

    def untargeted(self) -> set[str]:
        """Shards no member is targeted for (read only)."""
        return self._untargeted

    def live_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.live]

    def holder_of_instance(self, instance_id: str) -> Member | None:
        """§9: the live (or temporarily left) member holding this instanceId, if any."""
        for m in self.members.values():
            if m.instance_id == instance_id and m.live:
                return m
        return None
    def load_slot(self, slot: ShardSlot) -> None:
        """The shell re-read a slot from storage (snapshot catch-up): not a change."""
        old = self.shards.get(slot.shard_id)
        if old is not None:
            self._unindex(old)
        if old is None or (old.drained, old.parents) != (slot.drained, slot.parents):
            self.assignable_cache = None
        self.shards[slot.shard_id] = slot
        self._index(slot)

    # -- mutations (the only writers of slots) ---------------------------------------------
    def _mutate_slot(self, shard_id: str, **values: object) -> None:
        slot = self.shards[shard_id]
        self._unindex(slot)
        for name, value in values.items():
            setattr(slot, name, value)
        self._index(slot)
        self.changes.shards.add(shard_id)

    def grant(self, shard_id: str, member_id: str, epoch: int) -> None:
        self.changes.granted = True
        self._mutate_slot(shard_id, owner=member_id, revoking=False, grant_epoch=epoch)

    def start_revoke(self, shard_id: str) -> None:
        self._mutate_slot(shard_id, revoking=True)

    def release(self, shard_id: str) -> None:
        self._mutate_slot(shard_id, owner=None, revoking=False)

    def set_target(self, shard_id: str, member_id: str | None) -> None:
        self._mutate_slot(shard_id, target=member_id)

    def mark_drained(self, shard_id: str) -> None:
        self.assignable_cache = None
        self._mutate_slot(shard_id, drained=True)

    def touch_member(self, member: Member) -> None:
        self.changes.members.add(member.member_id)

    def touch_group(self) -> None:
        self.changes.group = True

    def emit(self, kind: str, member: Member | None = None, **detail: object) -> None:
        self.changes.events.append(
            Event(
                kind=kind,
                member_id=member.member_id if member else "",
                group_epoch=self.group_epoch,
                member_epoch=member.member_epoch if member else None,
                detail=dict(detail),
            )
        )


@dataclass(frozen=True)
class Assignment:
    assigned: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    revoking: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeartbeatResponse:
    error_code: ErrorCode
    error_message: str | None = None
    status: Status | None = None
    member_id: str | None = None
    member_epoch: int | None = None
    assignment_epoch: int | None = None
    heartbeat_interval_ms: int | None = None
    assignment: Assignment | None = None
    full_metadata: bool = False  # the shell attaches the full metadata document

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.error_code]


def deadline(now: datetime, ms: int) -> datetime:
    return now + timedelta(milliseconds=ms)
