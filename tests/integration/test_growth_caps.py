"""Issue 27.9: growth from one key is bounded. Count caps per group on tombstones and events
(the oldest go first), and leaves limited per key like joins."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from assignments import services
from coordination.model import HeartbeatRequest
from groups.models import Event
from groups.ratelimit import _joins as join_buckets
from groups.retention import apply_retention
from groups.sweeps import run_retention
from members.models import Member

from .conftest import GroupFixture, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def beat(member: str, epoch: int, at: datetime, group: str = "g1") -> str:
    result = services.heartbeat(group, HeartbeatRequest(member, epoch, metadata_epoch=1), at)
    return result.response.error_code.value


def churn(member: str, at: datetime, group: str = "g1") -> None:
    """A join and a leave: one LEFT tombstone last heard at `at`."""
    assert beat(member, 0, at, group) == "NONE"
    assert beat(member, -1, at, group) == "NONE"


def tombstones(group: str = "g1") -> list[str]:
    return sorted(Member.objects.filter(group__name=group, status="LEFT").values_list("member_id", flat=True))


@pytest.fixture
def churned(orders: GroupFixture) -> datetime:
    """Ten tombstones heard an hour ago (m0 oldest), two heard just now, one live member."""
    now = timezone.now()
    for i in range(10):
        churn(f"m{i}", now - timedelta(hours=1) + timedelta(seconds=i))
    churn("young0", now)
    churn("young1", now)
    assert beat("live", 0, now) == "NONE"
    return now


def test_i27_9_tombstones_over_the_cap_go_least_recently_heard_first(churned: datetime, settings: Any):
    settings.MAX_TOMBSTONES_PER_GROUP = 4
    # The age rule (a day) deletes none of them; the cap deletes the 8 least recently heard.
    result = run_retention(churned)
    assert result["tombstones"] == 8
    assert tombstones() == ["m8", "m9", "young0", "young1"]
    assert Member.objects.get(member_id="live").status in {"STABLE", "PENDING"}
    # A join after the deletes is answered (every snapshot reloads, no 500).
    assert beat("after", 0, churned) == "NONE"


def test_i27_9_the_cap_never_deletes_a_tombstone_heard_within_the_session(churned: datetime):
    result = apply_retention(churned, max_tombstones=1)
    assert result["tombstones"] == 10
    assert tombstones() == ["young0", "young1"]  # over the cap, but heard within the 30 s session
    # Once their session has passed, the least recently heard goes.
    assert apply_retention(churned + timedelta(seconds=31), max_tombstones=1)["tombstones"] == 1
    assert len(tombstones()) == 1


def test_i27_9_events_over_the_cap_go_oldest_first_per_group(churned: datetime, settings: Any):
    make_group(stream="quiet", group="quiet-g")
    churn("q", churned, group="quiet-g")
    quiet = list(Event.objects.filter(group__name="quiet-g").order_by("id").values_list("id", flat=True))
    stream_events = Event.objects.filter(group__isnull=True).count()
    busy = list(Event.objects.filter(group__name="g1").order_by("id").values_list("id", flat=True))
    cap = len(quiet) + 1
    assert len(busy) > cap
    settings.MAX_EVENTS_PER_GROUP = cap
    result = run_retention(churned)
    assert result["events"] == len(busy) - cap
    assert list(Event.objects.filter(group__name="g1").order_by("id").values_list("id", flat=True)) == busy[-cap:]
    assert list(Event.objects.filter(group__name="quiet-g").order_by("id").values_list("id", flat=True)) == quiet
    assert Event.objects.filter(group__isnull=True).count() == stream_events


def test_i27_10_a_streams_own_events_over_the_cap_go_oldest_first_per_stream(churned: datetime, settings: Any):
    # Events of no group: reshard steps, stream key events, group deletions (27.9 left them uncapped).
    from groups.models import Stream

    orders = Stream.objects.get(name="orders")
    quiet = Stream.objects.get(name=make_group(stream="quiet", group="quiet-g").stream)
    for i in range(30):
        Event.objects.create(kind="reshard_sealing", stream=orders, actor="sweeper", detail={"i": i})
    for i in range(2):
        Event.objects.create(kind="reshard_sealing", stream=quiet, actor="sweeper", detail={"i": i})
    for i in range(12):
        Event.objects.create(kind="installation_note", actor="test", detail={"i": i})

    def ids(**which: Any) -> list[int]:
        return list(Event.objects.filter(group__isnull=True, **which).order_by("id").values_list("id", flat=True))

    own, quiet_own, neither = ids(stream=orders), ids(stream=quiet), ids(stream__isnull=True)
    group_events = Event.objects.filter(group__isnull=False).count()
    cap = 5
    assert len(quiet_own) <= cap < len(neither) < len(own)
    settings.MAX_EVENTS_PER_STREAM = cap
    result = run_retention(churned)
    assert result["events"] == len(own) - cap + len(neither) - cap
    assert ids(stream=orders) == own[-cap:]
    assert ids(stream__isnull=True) == neither[-cap:]
    assert ids(stream=quiet) == quiet_own
    assert Event.objects.filter(group__isnull=False).count() == group_events  # per group: its own cap


def test_i27_9_a_zero_cap_keeps_everything(churned: datetime):
    before = Event.objects.count()
    assert apply_retention(churned, max_tombstones=0, max_events=0, max_stream_events=0) == {"tombstones": 0, "events": 0}
    assert len(tombstones()) == 12
    assert Event.objects.count() == before


@pytest.fixture
def fresh_limits() -> Iterator[None]:
    join_buckets.clear()
    yield
    join_buckets.clear()


def leave(api: APIClient, fx: GroupFixture, member: str, epoch: int = -1, **headers: str) -> Any:
    return api.post(fx.url(), {"memberId": member, "memberEpoch": epoch}, format="json",
                    HTTP_AUTHORIZATION=f"Bearer {fx.key}", **headers)


@override_settings(LEAVE_RATE_PER_KEY=1, LEAVE_BURST_PER_KEY=2)
def test_i27_9_leaves_beyond_the_per_key_rate_get_429_and_change_nothing(
    api: APIClient, orders: GroupFixture, fresh_limits: None
):
    for m in ("a", "b", "c"):
        assert leave(api, orders, m, epoch=0).status_code == 200  # joins: their own bucket
    assert leave(api, orders, "a").status_code == 200
    assert leave(api, orders, "b").status_code == 200
    r = leave(api, orders, "c")
    assert r.status_code == 429
    assert int(r["Retry-After"]) >= 1
    assert r.json() == {"errorCode": "RATE_LIMITED", "errorMessage": r.json()["errorMessage"], "memberId": "c"}
    assert "leaves" in r.json()["errorMessage"]
    assert Member.objects.get(member_id="c").status in {"STABLE", "PENDING"}  # not half-applied
    assert leave(api, orders, "d", epoch=0).status_code == 200  # joins are not used up by leaves


@override_settings(LEAVE_RATE_PER_KEY=0, LEAVE_RATE_PER_IP=1, LEAVE_BURST_PER_IP=1)
def test_i27_9_leaves_beyond_the_per_address_rate_get_429(api: APIClient, orders: GroupFixture, fresh_limits: None):
    for m in ("a", "b"):
        assert leave(api, orders, m, epoch=0).status_code == 200
    assert leave(api, orders, "a", REMOTE_ADDR="10.0.0.1").status_code == 200
    assert leave(api, orders, "b", REMOTE_ADDR="10.0.0.1").status_code == 429
    assert leave(api, orders, "b", REMOTE_ADDR="10.0.0.2").status_code == 200
