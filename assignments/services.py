"""Heartbeat service: the shell around `coordination.engine.heartbeat` (load, lock, call, persist)."""
from __future__ import annotations

import logging
import time
from collections import deque
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from assignments import fastpath
from assignments.answers import HeartbeatResult
from assignments.gates import group_gate
from assignments.group_commit import GroupCommit, Queued
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
    return _GROUP_COMMIT.apply(group_name, req, now)


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


# --- group commit (assignments.group_commit) ------------------------------------------------
_queues: ProcessCache[str, deque[Queued[HeartbeatResult]]] = PROCESS.own(
    "group queues", ProcessCache(),
    "Locked heartbeats waiting for this process's next pass of their group. key: group name ->"
    " queued heartbeats; bound: one queue per group, each emptied by the passes (BATCH_MAX at a"
    " time); invalidated: each pass takes what it applies; N hosts: the group's row lock"
    " serialises passes across processes.",
)


log = logging.getLogger("coordinator.heartbeat")

# A locked pass longer than this is logged with its parts (issue 26.2): in a 10k join storm a
# pass that outlives the request deadline (5 s) is rolled back and every heartbeat in it is
# retried, so where such a pass spends its time is what an operator needs to see.
SLOW_PASS_S = 0.5


def _pass(group_name: str, batch: list[Queued[HeartbeatResult]]) -> None:
    """One locked pass (gate held): lock and load once, apply each heartbeat in turn, save
    and commit once. Answers are set only once the commit succeeded, and nothing yields
    between the commit and the last answer set: every answer, metadata included, is made
    before the commit, so a pass dropped after it still answers every heartbeat it applied."""
    answers: list[HeartbeatResult] = []
    started = time.perf_counter()
    core_s = save_s = 0.0
    shards_changed = 0
    with transaction.atomic():
        group, state, loaded = lock_and_load(group_name, tuple(q.req.member_id for q in batch))
        load_s = time.perf_counter() - started
        if group is None or state is None or loaded is None:
            for queued in batch:
                queued.result = _no_group(group_name, queued.req)
            return
        applied = timezone.now()
        core_started = time.perf_counter()
        for queued in batch:
            applied = queued.now or timezone.now()
            before = _changed(state.changes)
            response = engine.heartbeat(state, queued.req, applied)
            if response.error_code != ErrorCode.NONE and _changed(state.changes) != before:
                # R8: a refused heartbeat changes nothing; the others' changes must not carry
                # a half-applied one.
                raise RuntimeError(f"refused heartbeat changed the state: {queued.req}")
            answers.append(_result(group, response))
        core_s = time.perf_counter() - core_started
        if not state.changes.empty:
            save_started = time.perf_counter()
            shards_changed = len(state.changes.shards)
            save_state(state, loaded, applied, commit=True)
            save_s = time.perf_counter() - save_started
    total_s = time.perf_counter() - started  # the commit included
    for queued, answer in zip(batch, answers, strict=True):
        queued.result = answer
    if total_s > SLOW_PASS_S:
        log.warning("slow locked pass of group %s: %.3f s for %d heartbeats (lock and load %.3f s,"
                    " core %.3f s, save and commit %.3f s, %d shards changed)", group_name,
                    total_s, len(batch), load_s, core_s, save_s, shards_changed)


_GROUP_COMMIT = GroupCommit(_pass, _queues)


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
    joining = 1 + _GROUP_COMMIT.queued(group_name)  # this process's queued heartbeats: joins at most
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
