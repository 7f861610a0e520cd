"""The describe document of a group (GET /api/v1/groups/{group}, `describe_group`), §10.

What `kafka-consumer-groups --describe` shows: per member its shards and how long since its
last heartbeat; per live shard its owner, last-delivered ID, lag, pending and DLQ length
(from `groups.shardstats`, cached ≤ 2 s), and the group's totals. Read-only, no lock: a
snapshot of committed rows plus Redis figures at most a cache period old.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from assignments.selectors import GroupPage, read_group_page, read_group_state
from coordination import engine
from coordination.liveness import cutoffs
from coordination.model import LIVE_STATUSES, GroupState, ShardSlot, ShardState
from dataplane.routing import shard_sort_key
from groups import selectors, shardstats
from groups.models import Group
from groups.namespace import observe_generation
from members import selectors as member_selectors


def shard_state(slot: ShardSlot | Any) -> ShardState:
    """One word per shard, as `rsc_group_shards` counts them: drained, revoking, granted, unowned.

    Anything with `drained`, `owner` and `revoking` (a core slot, a matrix column)."""
    if slot.drained:
        return ShardState.DRAINED
    if slot.owner is None:
        return ShardState.UNOWNED
    return ShardState.REVOKING if slot.revoking else ShardState.GRANTED


def _ms_since(then: datetime | None, now: datetime) -> int | None:
    return None if then is None else max(0, int((now - then).total_seconds() * 1000))


# Issue 26.3: describe answers one page of members and of shards; the counts are the group's.
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 5000


@dataclass(frozen=True)
class Page:
    group: GroupPage
    number: int
    size: int


def describe_document(
    group: Group, state: GroupState, stats: shardstats.GroupStats, now: datetime,
    versions: dict[str, str] | None = None, page: Page | None = None,
) -> dict[str, Any]:
    """The document for the members and shards of `page` (every one of `state` when None).
    ``versions``: memberId -> library version (members.selectors.library_versions)."""
    versions = versions or {}
    if page is None:
        member_ids = sorted(m.member_id for m in state.live_members())
        keys = {sid: shard_sort_key(sid) for sid in state.shards}
        shard_ids = sorted(keys, key=keys.__getitem__)
        phase = engine.group_phase(state)
    else:
        member_ids, shard_ids, phase = page.group.member_ids, page.group.shard_ids, page.group.phase
    # Natural shard order computed once; member lists sort by rank (thousands of shards).
    keys = {sid: shard_sort_key(sid) for sid in state.shards}
    rank = {sid: i for i, sid in enumerate(sorted(keys, key=keys.__getitem__))}

    def in_order(shards: set[str] | frozenset[str]) -> list[str]:
        return sorted(shards, key=rank.__getitem__)

    members = []
    classify = cutoffs(now, state.heartbeat_interval_ms, state.session_timeout_ms).classify
    for mid in member_ids:
        m = state.members[mid]
        granted = state.granted_to(m.member_id)
        target = state.target_of(m.member_id)
        alive = classify(m.last_heartbeat_at)
        members.append({
            "memberId": m.member_id,
            "instanceId": m.instance_id,  # static membership (§9)
            "clientId": m.client_id,
            # Issue 25.7: its client library and version ("rsc-dataplane/0.2.0"), "" if unnamed.
            "libraryVersion": versions.get(m.member_id, ""),
            "memberEpoch": m.member_epoch,
            "state": m.status.value,
            "liveness": alive.value,
            "assignedShards": in_order(granted),
            "pendingShards": in_order(target - granted),
            "revokingShards": in_order(state.revoking_from(m.member_id)),
            "targetShards": in_order(target),
            "lastHeartbeatAt": m.last_heartbeat_at.isoformat() if m.last_heartbeat_at else None,
            "sinceLastHeartbeatMs": _ms_since(m.last_heartbeat_at, now),
            # A temporarily left member (§9) expires in (L1s):
            "expiresInS": None if (left := engine.l1s_expires_in_s(state, m, now)) is None else round(left),
        })
    shards = []
    for sid in shard_ids:
        slot = state.shards[sid]
        owner = state.members.get(slot.owner) if slot.owner else None
        if owner is not None and not owner.live:
            owner = None
        fig = stats.shard(slot.shard_id)
        shards.append({
            "shardId": slot.shard_id,
            "version": keys[sid][1],
            "state": shard_state(slot),
            "sealed": slot.sealed,
            "owner": slot.owner,
            "clientId": owner.client_id if owner else None,
            "instanceId": owner.instance_id if owner else None,
            "lag": fig.lag,
            "lagExact": fig.lag_exact,
            "pending": fig.pending,
            "lastDeliveredId": fig.last_delivered_id,
            "entriesRead": fig.entries_read,
            "dlqLength": fig.dlq_length,
        })
    if page is None:
        member_counts = dict.fromkeys(sorted(s.value for s in LIVE_STATUSES), 0)
        member_counts.update(Counter(state.members[mid].status.value for mid in member_ids))
        shard_counts = dict.fromkeys([s.value for s in ShardState], 0)
        shard_counts.update(Counter(shard_state(state.shards[sid]).value for sid in shard_ids))
        paging = {"page": 1, "pageSize": None, "members": len(member_ids), "shards": len(shard_ids), "lastPage": 1}
    else:
        member_counts, shard_counts = page.group.member_counts, page.group.shard_counts
        totals = max(page.group.members_total, page.group.shards_total)
        paging = {"page": page.number, "pageSize": page.size, "members": page.group.members_total,
                  "shards": page.group.shards_total, "lastPage": max(1, -(-totals // page.size))}
    return {
        "group": group.name,
        "stream": group.stream.name,
        "state": phase.value,
        "streamState": group.stream.state,
        "groupEpoch": state.group_epoch,
        "assignmentEpoch": state.assignment_epoch,
        "metadataEpoch": state.metadata_epoch,
        # §11: a paused group's members hold their shards but read nothing.
        "paused": group.paused_at is not None,
        "pausedAt": group.paused_at.isoformat() if group.paused_at else None,
        "pausedBy": group.paused_by or None,
        # Issue 26.3: counts of the whole group; `members` and `shards` are one page of it.
        "memberCounts": member_counts,
        "shardCounts": shard_counts,
        "paging": paging,
        "members": members,
        "shards": shards,
        "totals": {"lag": stats.lag, "pending": stats.pending, "dlq": stats.dlq},
        "redis": stats.redis_doc(),
    }


def describe_group(
    name: str, now: datetime | None = None, *, page: int = 1, page_size: int | None = DEFAULT_PAGE_SIZE,
) -> dict[str, Any] | None:
    """GET /api/v1/groups/{group} and `describe_group`: who holds what, how far behind. One page
    of `page_size` members and of shards (1-based `page`; the counts are the group's), or
    everything with `page_size=None` (reads the whole group: for tools, not for pages)."""
    observe_generation()  # after a restore, no cached catalogue or figure of the old history
    group = selectors.group_with_stream(name)
    if group is None:
        return None
    stats = selectors.group_shard_stats(group)
    if page_size is None:
        versions = member_selectors.library_versions(group)
        return describe_document(group, read_group_state(group), stats, now or timezone.now(), versions)
    view = read_group_page(group, page, page_size)
    versions = member_selectors.library_versions(group, view.member_ids)
    return describe_document(group, view.state, stats, now or timezone.now(), versions,
                             Page(view, page, page_size))
