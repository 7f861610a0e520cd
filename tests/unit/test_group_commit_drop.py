"""A locked heartbeat dropped while it waits for its group's gate (the request deadline, issue
27.4) leaves the group-commit queue, so no later pass applies what its client was told was not
applied."""
from __future__ import annotations

from typing import Any

import pytest

from assignments import gates, services
from coordination.model import HeartbeatRequest


class _Dropped(BaseException):
    """Stands in for the request deadline raised into the waiting request."""


class _GateHeldElsewhere:
    """A gate another pass holds; waiting on it is where the deadline strikes."""

    def acquire(self, blocking: bool = True) -> bool:
        if not blocking:
            return False
        raise _Dropped

    def release(self) -> None:  # never acquired
        raise AssertionError("released a gate it never held")


def test_i27_4_a_heartbeat_dropped_while_queued_leaves_the_group_commit_queue(monkeypatch: Any) -> None:
    monkeypatch.setattr(gates, "_gates", {"g": _GateHeldElsewhere()})
    mine = services._Queued(HeartbeatRequest(member_id="m-1", member_epoch=0), None)
    with pytest.raises(_Dropped):
        services._locked_in_turn("g", mine)
    assert mine not in services._queues.get("g", ())
