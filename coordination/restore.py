"""After a database restore (docs/OPERATING.md): grant epochs must only rise (PROTOCOL §7).

A member raises a shard's fence token to `grantEpoch:memberId` before reading it, and the fence
script refuses a lower epoch. An older database can hold epochs below the tokens already in
Redis; its grants would be refused until rejoins pushed the epochs past them.
"""
from __future__ import annotations

from coordination import engine
from coordination.model import GroupState


def parse_fence_epoch(token: str) -> int | None:
    """The grant epoch of a fence token `grantEpoch:memberId`; None for anything else."""
    epoch, sep, _member = token.partition(":")
    return int(epoch) if sep and epoch.isdigit() else None


def raise_epochs_above(state: GroupState, floor: int) -> bool:
    """Make every later grant carry an epoch above `floor` (the highest fence token epoch).

    Grants happen at the assignment epoch, which only rises from here; so a new group epoch of
    floor + 1 (a rebalance at it) is enough. Returns whether anything changed.
    """
    if state.assignment_epoch > floor:
        return False
    previous = state.group_epoch
    state.group_epoch = max(state.group_epoch, floor)
    engine.bump_group_epoch(state)  # floor + 1, target recomputed, assignment epoch with it
    state.emit("epochs_raised", fromGroupEpoch=previous, fenceTokenEpoch=floor)
    return True
