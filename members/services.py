"""Removing members: operator fence/remove (R8) and the liveness sweeps (L1, L2).

Every path takes the group's row lock and lets the core decide, so the admin, the command
line and Celery beat all apply the same rules, and two sweeps at once do the work once.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from assignments.fastpath import STAMP_ALLOWANCE_S
from assignments.rows import load_state, lock_group
from assignments.writer import save_state
from coordination import engine
from coordination.model import LIVE_STATUSES, GroupState, MemberStatus
from groups.errors import ServiceError
from groups.models import Group
from members.intake import current_intake
from members.models import Member

_ONE_MS = timedelta(milliseconds=1)


@dataclass
class SweepResult:
    expired: dict[str, list[str]] = field(default_factory=dict)  # group -> member ids
    fenced: dict[str, list[str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(map(len, self.expired.values())) + sum(map(len, self.fenced.values()))


def _in_locked_group(
    group_name: str, work: Callable[[GroupState], list[str]], now: datetime, actor: str = ""
) -> list[str]:
    with transaction.atomic():
        group = lock_group(group_name)
        if group is None:
            raise ServiceError(f"group {group_name!r} does not exist")
        state, loaded = load_state(group, lock_members=True)
        removed = work(state)
        if removed:
            save_state(state, loaded, now, actor=actor)
        return removed


def fence_member(
    group: str, member_id: str, *, reason: str = "", actor: str = "operator", now: datetime | None = None
) -> None:
    """R8 operator fence: removed at once; its next heartbeat gets FENCED_MEMBER_EPOCH."""
    _remove(group, member_id, MemberStatus.FENCED, reason or "fenced by operator", actor, now)


def remove_member(
    group: str, member_id: str, *, reason: str = "", actor: str = "operator", now: datetime | None = None
) -> None:
    """Operator remove: like a leave on the member's behalf; its next heartbeat gets UNKNOWN_MEMBER_ID."""
    _remove(group, member_id, MemberStatus.LEFT, reason or "removed by operator", actor, now)


def _remove(
    group: str, member_id: str, status: MemberStatus, reason: str, actor: str, now: datetime | None
) -> None:
    now = now or timezone.now()

    def work(state: GroupState) -> list[str]:
        member = state.members.get(member_id)
        if member is None or not member.live:
            raise ServiceError(f"group {group!r} has no live member {member_id!r}")
        return engine.r8_remove_members(state, [member_id], status=status, reason=reason, actor=actor)

    _in_locked_group(group, work, now, actor)


def sweep_liveness(now: datetime | None = None) -> SweepResult:
    """One pass of L1 (session expiry) and L2 (rebalance timeout) over every group.

    Both count only silence the heartbeat intake could have heard (the beacon, members.intake).
    """
    now = now or timezone.now()
    result = SweepResult()
    sweep_rebalances(now)
    intake = current_intake()
    if not intake.up_at(now):
        return result  # the core would expire and fence nobody: skip the locks
    # Steady heartbeats stamp last-seen in batches (assignments.fastpath): a stamp may reach
    # the database up to STAMP_ALLOWANCE_S late on any node (derived from the cap every node's
    # period obeys, not from this process's setting), so silence is counted that much later.
    heard_by = now - timedelta(seconds=STAMP_ALLOWANCE_S)
    for name in groups_due_for_sweep(now, intake):
        expired = _in_locked_group(
            name, lambda s: engine.l1_expire_silent_members(s, heard_by, intake), now, "sweeper"
        )
        fenced = _in_locked_group(
            name, lambda s: engine.l2_fence_overdue_revocations(s, now, intake), now, "sweeper"
        )
        if expired:
            result.expired[name] = expired
        if fenced:
            result.fenced[name] = fenced
    return result


def sweep_rebalances(now: datetime) -> list[str]:
    """R1b: run the target recomputes that joins or leaves deferred and no heartbeat has run
    since its due time (e.g. every member temporarily left). Returns the groups."""
    done = []
    for name in Group.objects.filter(rebalance_due_at__lte=now).values_list("name", flat=True):
        if _in_locked_group(name, lambda s: [s.name] if engine.r1b_rebalance_if_due(s, now) else [], now,
                            "sweeper"):
            done.append(name)
    return done


def groups_due_for_sweep(now: datetime, intake: engine.Intake = engine.UNRECORDED_INTAKE) -> list[str]:
    """Groups with a live member past its session or revocation deadline (cheap, no locks).

    Only a hint: the locked pass re-checks through the core, so a heartbeat that lands in
    between simply makes that pass a no-op. One query; the per-group session cutoff is
    computed here (SQLite has no interval arithmetic). A group whose session started again
    when the intake came back is not due for L1 until that session has passed.
    """
    due = Q(revocation_deadline__lt=now) | Q(last_heartbeat_at__isnull=True)
    for group_id, timeout_ms in Group.objects.values_list("id", "session_timeout_ms"):
        cutoff = now - timeout_ms * _ONE_MS
        if intake.up_since is None or intake.up_since < cutoff:
            due |= Q(group_id=group_id, last_heartbeat_at__lt=cutoff)
    names = (
        Member.objects.filter(status__in=[s.value for s in LIVE_STATUSES])
        .filter(due)
        .values_list("group__name", flat=True)
        .distinct()
    )
    return sorted(set(names))
