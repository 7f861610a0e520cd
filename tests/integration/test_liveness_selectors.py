"""One liveness classifier: the member list filter (SQL on `liveness.cutoffs`) and the
dashboard/metrics counts put every member where `coordination.liveness.liveness` does,
including members exactly on a threshold."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from django.utils import timezone

from coordination.liveness import Liveness, late_after, liveness
from coordination.model import MemberStatus
from groups.models import Group
from members import selectors
from members.models import Member

from .conftest import make_group


def _members_around_the_thresholds() -> datetime:
    """Per group, live members silent just under, exactly at and just over each threshold."""
    now = timezone.now()
    make_group("s1", "fast", heartbeat_interval_ms=1000, session_timeout_ms=10_000)
    make_group("s2", "slow", heartbeat_interval_ms=5000, session_timeout_ms=30_000)
    tick = timedelta(microseconds=1)
    for g in Group.objects.all():
        late = late_after(g.heartbeat_interval_ms)
        expired = timedelta(milliseconds=g.session_timeout_ms)
        silences = [timedelta(0), late - tick, late, late + tick, expired - tick, expired, expired + tick,
                    expired * 3]
        for i, silent in enumerate(silences):
            Member.objects.create(group=g, member_id=f"{g.name}-{i}", status=MemberStatus.STABLE,
                                  last_heartbeat_at=now - silent)
        Member.objects.create(group=g, member_id=f"{g.name}-never", status=MemberStatus.STABLE)
        Member.objects.create(group=g, member_id=f"{g.name}-gone", status=MemberStatus.EXPIRED,
                              last_heartbeat_at=now - expired * 3)
    return now


def test_liveness_list_filter_classifies_every_member_as_the_classifier_does(db: None) -> None:
    now = _members_around_the_thresholds()
    live = Member.objects.exclude(status=MemberStatus.EXPIRED).select_related("group")
    expected: dict[Liveness, set[str]] = {state: set() for state in Liveness}
    for m in live:
        _, state = liveness(m.last_heartbeat_at, now, m.group.heartbeat_interval_ms, m.group.session_timeout_ms)
        expected[state].add(m.member_id)
    assert all(expected[s] for s in Liveness)  # the fixture reaches every state
    for state in Liveness:
        got = set(selectors.filter_by_liveness(Member.objects.all(), state, now).values_list("member_id", flat=True))
        assert got == expected[state], state


def test_liveness_counts_per_group_are_the_classifiers(db: None) -> None:
    now = _members_around_the_thresholds()
    expected: dict[int, Counter[Liveness]] = {}
    for m in Member.objects.exclude(status=MemberStatus.EXPIRED).select_related("group"):
        _, state = liveness(m.last_heartbeat_at, now, m.group.heartbeat_interval_ms, m.group.session_timeout_ms)
        expected.setdefault(m.group_id, Counter())[state] += 1
    assert selectors.liveness_by_group(now) == expected
