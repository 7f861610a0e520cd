"""A locked heartbeat whose request is dropped (the request deadline, issue 27.4, a
BaseException raised where the request waits) is either not applied, with its client told so,
or applied with its client told so: never applied while its client was told it was not."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from assignments import gates, services
from assignments.group_commit import Queued
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
    with pytest.raises(_Dropped):
        services._GROUP_COMMIT.apply("g", HeartbeatRequest(member_id="m-1", member_epoch=0), None)
    assert services._GROUP_COMMIT.queued("g") == 0


class _GateDroppingOne:
    """A real gate, except that `victim`'s request is dropped while it waits for it, once a
    running pass has taken its heartbeat into the batch (`taken`)."""

    def __init__(self, victim: str, taken: threading.Event, dropped: threading.Event) -> None:
        self.lock = threading.Lock()
        self.victim, self.taken, self.dropped = victim, taken, dropped

    def acquire(self, blocking: bool = True) -> bool:
        if blocking and threading.current_thread().name == self.victim:
            assert self.taken.wait(10)
            self.dropped.set()
            raise _Dropped
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()


def test_i27_4_a_heartbeat_dropped_after_a_running_pass_took_it_answers_what_that_pass_did(monkeypatch: Any) -> None:
    """The window left by 9784091: the pass that took it into its batch commits it, so its
    client gets that answer (late), not a 503 that says "not applied"."""
    taken, dropped = threading.Event(), threading.Event()
    gate = _GateDroppingOne("victim", taken, dropped)
    monkeypatch.setattr(gates, "_gates", {"g": gate})
    applied: list[str] = []

    def run_pass(group: str, batch: list[Queued[Any]]) -> None:
        taken.set()
        assert dropped.wait(10)  # the victim's request is dropped while this pass runs
        for queued in batch:
            applied.append(queued.req.member_id)
        for queued in batch:  # committed: the answers
            queued.result = f"applied {queued.req.member_id}"

    monkeypatch.setattr(services._GROUP_COMMIT, "_run_pass", run_pass)
    outcome: dict[str, object] = {}

    def send(member: str) -> None:
        try:
            outcome[member] = services._GROUP_COMMIT.apply("g", HeartbeatRequest(member_id=member, member_epoch=0),
                                                           None)
        except _Dropped:
            outcome[member] = "503 not applied"

    gate.lock.acquire()  # a pass of another request runs: both queue behind it
    victim = threading.Thread(target=send, args=("victim",), name="victim")
    victim.start()
    _until(lambda: services._GROUP_COMMIT.queued("g") == 1)
    leader = threading.Thread(target=send, args=("leader",), name="leader")
    leader.start()
    _until(lambda: services._GROUP_COMMIT.queued("g") == 2)
    gate.lock.release()
    victim.join(10)
    leader.join(10)
    assert applied == ["leader", "victim"]
    assert outcome == {"leader": "applied leader", "victim": "applied victim"}


def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.001)  # poll interval of a deadline loop
