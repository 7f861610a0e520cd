"""Heartbeat service: the shell around `coordination.engine.heartbeat` (load, lock, call, persist)."""
from __future__ import annotations

from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from assignments import fastpath
from assignments.answers import HeartbeatResult
from assignments.gates import group_gate
from assignments.rows import load_state, lock_group
from assignments.snapshot_cache import clearly_has_room, live_member_counts, lock_and_load, snapshots_enabled
from assignments.writer import save_state
from coordination import engine
from coordination.model import (
    Changes,
    HeartbeatRequest,
    HeartbeatResponse,
)
from coordinator_project import waiting
from coordinator_project.named_locks import NamedLocks
from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.protocol import JOIN_EPOCH, ErrorCode
from groups.metadata import group_metadata


def heartbeat(group_name: str, req: HeartbeatRequest, now: datetime | None = None) -> HeartbeatResult:
    """`now`: the heartbeat's time; None (the API) reads the clock when the heartbeat is
    applied: after the group's gate and lock on the locked path. In a join storm every request
    arrives within a second and the joins apply over several: with arrival times, R1b's
    window (a window after the last change) ended while most joins still queued, and the
    target was recomputed each second of the storm instead of once after it, each recompute
    moving shards that had just been granted."""
    if fastpath.available() and fastpath.eligible(req):
        steady = fastpath.steady_heartbeat(group_name, req, now or timezone.now())
        if steady is not None:
            return HeartbeatResult(steady.response, {"metadataEpoch": steady.metadata_epoch}, "fast",
                                   steady.memo)
    fastpath.flush_stamps()  # the locked pass below reads this process's latest stamps
    if req.member_epoch == JOIN_EPOCH:
        refused = _refused_join(group_name, req)
        if refused is not None:
            return HeartbeatResult(refused, None)  # decided without the lock or a snapshot
    if not snapshots_enabled():
        return _locked_alone(group_name, req, now)
    return _locked_in_turn(group_name, _Queued(req, now))


def _locked_alone(group_name: str, req: HeartbeatRequest, now: datetime | None) -> HeartbeatResult:
    """One heartbeat under the group lock on the whole group loaded fresh, no snapshot kept
    (RSC_GROUP_SNAPSHOTS off: what a process without snapshots would do; the differential
    tests' reference and "another process", the bench's comparison)."""
    with group_gate(group_name), transaction.atomic():
        group = lock_group(group_name)
        applied = now or timezone.now()
        if group is None:
            return _no_group(group_name, req)
        state, loaded = load_state(group, req.member_id)
        response = engine.heartbeat(state, req, applied)
        if response.error_code != ErrorCode.NONE:
            return HeartbeatResult(response, None)  # R8: a refused heartbeat changes nothing
        save_state(state, loaded, applied, commit=True)
    return _result(group, response)


# --- group commit --------------------------------------------------------------------------
# A group's locked passes run one at a time (its row lock; this process's gate). While one
# runs, the process's other locked heartbeats of the group queue; the next pass applies every
# queued one (up to BATCH_MAX), in arrival order, to the one state it loaded, then saves and
# commits once: exactly what the same heartbeats would do in passes of their own, one after
# the other (each is applied at the time its turn comes), with one lock, one load, one write
# batch and one commit for all. A join storm is a queue of hundreds of joins, then of
# hundreds of heartbeats collecting their grants (Kafka's coordinator, single-threaded per
# group, works the same way).
BATCH_MAX = 64


@dataclass(eq=False)
class _Queued:
    req: HeartbeatRequest
    now: datetime | None
    result: HeartbeatResult | None = None
    error: BaseException | None = None


_queues: ProcessCache[str, deque[_Queued]] = PROCESS.own(
    "group queues", ProcessCache(),
    "Locked heartbeats waiting for this process's next pass of their group. key: group name ->"
    " queued heartbeats; bound: one queue per group, each emptied by the passes (BATCH_MAX at a"
    " time); invalidated: each pass takes what it applies; N hosts: the group's row lock"
    " serialises passes across processes.",
)


def _locked_in_turn(group_name: str, mine: _Queued) -> HeartbeatResult:
    queue = _queues.setdefault(group_name, deque())
    queue.append(mine)
    try:
        with group_gate(group_name):
            if mine.result is None and mine.error is None:  # nobody applied it while it waited
                batch = [mine]
                while queue and len(batch) < BATCH_MAX:
                    queued = queue.popleft()
                    if queued is not mine:
                        batch.append(queued)
                with suppress(ValueError):
                    queue.remove(mine)  # in the queue still if a full batch left it there
                _apply_batch(group_name, batch)
    except BaseException:
        # Dropped while it waited (the request deadline is a BaseException raised where the
        # request waits): its client is told "not applied", so no later pass may apply it.
        with suppress(ValueError):
            queue.remove(mine)
        raise
    if mine.error is not None:
        raise mine.error
    assert mine.result is not None  # noqa: S101 - _apply_batch answers every one
    return mine.result


def _apply_batch(group_name: str, batch: list[_Queued]) -> None:
    """Apply `batch` in one pass; if that fails, each heartbeat in a pass of its own, so one
    that fails (a bug, a row the database refuses) fails alone. Not when the database is
    unavailable: that fails them all at once (503, the members retry), as their own passes
    would, instead of each waiting out the pool's timeout in turn while holding the gate."""
    try:
        _pass(group_name, batch)
        return
    except (OperationalError, InterfaceError) as exc:
        for queued in batch:
            queued.error = exc
        return
    except Exception as exc:
        if len(batch) == 1:
            batch[0].error = exc
            return
    for queued in batch:
        try:
            _pass(group_name, [queued])
        except Exception as exc:
            queued.error = exc


def _pass(group_name: str, batch: list[_Queued]) -> None:
    """One locked pass (gate held): lock and load once, apply each heartbeat in turn, save
    and commit once. Answers are set only once the commit succeeded."""
    answers: list[HeartbeatResponse] = []
    with transaction.atomic():
        group, state, loaded = lock_and_load(group_name, tuple(q.req.member_id for q in batch))
        if group is None or state is None or loaded is None:
            for queued in batch:
                queued.result = _no_group(group_name, queued.req)
            return
        applied = timezone.now()
        for queued in batch:
            applied = queued.now or timezone.now()
            before = _changed(state.changes)
            response = engine.heartbeat(state, queued.req, applied)
            if response.error_code != ErrorCode.NONE and _changed(state.changes) != before:
                # R8: a refused heartbeat changes nothing; the others' changes must not carry
                # a half-applied one.
                raise RuntimeError(f"refused heartbeat changed the state: {queued.req}")
            answers.append(response)
        if not state.changes.empty:
            save_state(state, loaded, applied, commit=True)
    for queued, response in zip(batch, answers, strict=True):
        queued.result = _result(group, response)


def _changed(changes: Changes) -> tuple[object, ...]:
    return (changes.group, len(changes.members), len(changes.shards), len(changes.events), changes.granted)


def _no_group(group_name: str, req: HeartbeatRequest) -> HeartbeatResult:
    return HeartbeatResult(
        HeartbeatResponse(
            error_code=ErrorCode.GROUP_ID_NOT_FOUND,
            error_message=f"group {group_name!r} does not exist",
            member_id=req.member_id,
        ),
        None,
    )


def _result(group: Any, response: HeartbeatResponse) -> HeartbeatResult:
    if response.error_code != ErrorCode.NONE:
        return HeartbeatResult(response, None)
    metadata = group_metadata(group) if response.full_metadata else {"metadataEpoch": group.metadata_epoch}
    return HeartbeatResult(response, metadata)


_counting = PROCESS.own(
    "join count gates", NamedLocks(),
    "One lock-free member count per group and process at a time. key: group name -> lock;"
    " bound: one per group this process served; invalidated: never (a lock holds no data);"
    " N hosts: the count only refuses a join R1 would refuse under the lock.",
)


def _refused_join(group_name: str, req: HeartbeatRequest) -> HeartbeatResponse | None:
    """R1's maxMembers refusal from two counts, before the group lock and the snapshot.

    A refusal changes nothing, so it needs no lock: the counts come from one statement (one
    consistent view), and the core would give the same answer at that moment. Joins that
    carry ownedShards are left to the core (C5 is checked before capacity).
    """
    if req.owned_shards or getattr(req, "instance_id", None):
        return None  # a static member (§9) may replace its old incarnation: the core decides
    joining = 1 + len(_queues.get(group_name, ()))  # this process's queued heartbeats: joins at most
    if clearly_has_room(group_name, joining):
        return None  # a seat for each: a count would refuse nothing (a join storm's joins, one join)
    # One count per group at a time in this process: a storm's joins all arrive before the
    # first count has answered; the others wait for its figure instead of each queueing for
    # one of the worker's two connections (ahead of the locked passes that need them).
    with waiting.held(_counting[group_name]):
        if clearly_has_room(group_name, joining):
            return None
        counts = live_member_counts(group_name, req.member_id)
    if counts is None:
        return None  # no such group: the locked path answers
    max_members, live, rejoin = counts
    full = engine.r1_check_capacity(group_name, max_members, live, rejoin=rejoin)
    if full is None:
        return None
    return HeartbeatResponse(error_code=full.code, error_message=full.message, member_id=req.member_id)
