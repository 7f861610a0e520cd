"""Builders for pure engine tests: a group with shards and a clock."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from coordination import engine
from coordination.model import (
    Changes,
    GroupState,
    HeartbeatRequest,
    HeartbeatResponse,
    RevokeReport,
    ShardSlot,
)
from dataplane.protocol import RevokeState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_group(shards: int = 4, stream: str = "orders", **config: int) -> GroupState:
    slots = {f"{stream}:1:{i}": ShardSlot(shard_id=f"{stream}:1:{i}") for i in range(shards)}
    return GroupState(name="g", stream=stream, shards=slots, **config)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Client:
    """Plays one well-behaved member against the engine (C1–C5)."""

    def __init__(self, state: GroupState, member_id: str, instance_id: str | None = None) -> None:
        self.state = state
        self.member_id = member_id
        self.instance_id = instance_id  # §9: sent on every request when set
        self.epoch = 0
        self.owned: list[str] = []
        self.metadata_epoch: int | None = None
        self.last: HeartbeatResponse | None = None

    def send(self, now: datetime = T0, **overrides: object) -> HeartbeatResponse:
        fields: dict[str, object] = dict(
            member_id=self.member_id,
            member_epoch=self.epoch,
            metadata_epoch=self.metadata_epoch,
            owned_shards=tuple(self.owned),
            instance_id=self.instance_id,
        )
        fields.update(overrides)
        self.state.changes = Changes()
        r = engine.heartbeat(self.state, HeartbeatRequest(**fields), now)  # type: ignore[arg-type]
        self.last = r
        return r

    def join(self, now: datetime = T0) -> HeartbeatResponse:
        self.epoch, self.owned = 0, []
        r = self.send(now)
        self._apply(r)
        return r

    def beat(self, now: datetime = T0) -> HeartbeatResponse:
        r = self.send(now)
        self._apply(r)
        return r

    def revoke_all(self, now: datetime = T0) -> HeartbeatResponse:
        """Report every revoking shard REVOKED (in-flight drained)."""
        assert self.last
        assert self.last.assignment
        revoked = tuple(RevokeReport(s, RevokeState.REVOKED) for s in self.last.assignment.revoking)
        self.owned = [s for s in self.owned if s not in self.last.assignment.revoking]
        r = self.send(now, revoking_shards=revoked)
        self._apply(r)
        return r

    def _apply(self, r: HeartbeatResponse) -> None:
        if r.error_code != "NONE":
            return
        self.epoch = r.member_epoch or 0
        self.metadata_epoch = self.state.metadata_epoch
        a = r.assignment
        assert a is not None
        # C1: stop what left assignedShards; C2/C3: take new ones only from OK (or PAUSED, §11).
        self.owned = [s for s in self.owned if s in a.assigned or s in a.revoking]
        if r.status in ("OK", "PAUSED"):
            self.owned = sorted(set(self.owned) | set(a.assigned))


def group_with(
    member_ids: Sequence[str],
    shards: int = 4,
    *,
    settled: bool = True,
    joined_at: datetime = T0,
    settled_at: datetime = T0,
    instance_ids: Sequence[str] | None = None,
    **config: int,
) -> tuple[GroupState, list[Client]]:
    """A group of `shards` shards that these members joined in order (static members when
    `instance_ids` are given), heartbeated until stable unless `settled=False`."""
    state = make_group(shards, **config)
    ids: Sequence[str | None] = instance_ids if instance_ids is not None else [None] * len(member_ids)
    clients = [Client(state, mid, instance_id=iid) for mid, iid in zip(member_ids, ids, strict=True)]
    for c in clients:
        c.join(joined_at)
    if settled:
        settle(clients, settled_at)
    return state, clients


def settle(clients: list[Client], now: datetime = T0, rounds: int = 20) -> None:
    """Heartbeat everyone until the group is stable (revoking clients revoke at once)."""
    for _ in range(rounds):
        for c in clients:
            r = c.beat(now)
            if r.assignment and r.assignment.revoking:
                c.revoke_all(now)
        if engine.group_phase(clients[0].state) == "STABLE":
            return
    raise AssertionError("group did not settle")
