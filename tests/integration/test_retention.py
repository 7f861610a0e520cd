"""Issue 8.5 retention against PostgreSQL: old tombstones and events go, in batches; a removed
process heartbeating after its tombstone is gone still gets the protocol's answer (R8, L1)."""
from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from assignments import services
from coordination.model import HeartbeatRequest, MemberStatus
from groups import tasks
from groups.models import Event
from groups.retention import apply_retention
from members.models import Member
from members.services import fence_member, sweep_liveness

from .conftest import GroupFixture, Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

DAY = timedelta(days=1)


def beat(member: str, epoch: int, at: datetime, group: str = "g1") -> tuple[int, str]:
    result = services.heartbeat(group, HeartbeatRequest(member, epoch, metadata_epoch=1), at)
    return result.response.member_epoch or 0, result.response.error_code.value


def statuses() -> dict[str, str]:
    return dict(Member.objects.values_list("member_id", "status"))


@pytest.fixture
def history(orders: GroupFixture) -> datetime:
    """Three days ago: a left, b expired, c fenced; now: d left, e live."""
    now = timezone.now()
    old = now - 3 * DAY
    for m in ("a", "b", "c"):
        beat(m, 0, old)
    beat("a", -1, old)
    fence_member("g1", "c", reason="test", now=old)
    sweep_liveness(old + timedelta(minutes=5))  # b silent past the 30 s session: EXPIRED
    beat("d", 0, now)
    beat("d", -1, now)
    beat("e", 0, now)
    s = statuses()
    assert {m: s[m] for m in "abcd"} == {"a": "LEFT", "b": "EXPIRED", "c": "FENCED", "d": "LEFT"}
    assert s["e"] in {"STABLE", "PENDING"}
    return now


def test_retention_deletes_old_tombstones_and_keeps_young_ones_and_live_members(history: datetime):
    result = apply_retention(history, tombstone_age=DAY, event_age=timedelta(0))
    assert result == {"tombstones": 3, "events": 0}
    assert set(statuses()) == {"d", "e"}
    assert statuses()["d"] == MemberStatus.LEFT


@pytest.mark.parametrize("member", ["a", "b", "c"])
def test_stale_member_after_retention_gets_unknown_member_id_over_http(history: datetime, hb: Hb, member: str):
    apply_retention(history, tombstone_age=DAY, event_age=timedelta(0))
    status, body = hb({"memberId": member, "memberEpoch": 2, "metadataEpoch": 1, "ownedShards": []})
    assert status == 409
    assert body["errorCode"] == "UNKNOWN_MEMBER_ID"
    assert body["memberId"] == member
    status, body = hb({"memberId": member, "memberEpoch": 0, "ownedShards": []})  # C4: rejoin works
    assert status == 200
    assert body["errorCode"] == "NONE"


def test_fenced_tombstone_is_kept_while_its_member_could_still_be_live(orders: GroupFixture, hb: Hb):
    now = timezone.now()
    beat("f", 0, now - timedelta(seconds=10))
    fence_member("g1", "f", reason="test", now=now - timedelta(seconds=10))
    # Retention age 1 s, but the group's session timeout (30 s) has not passed since f was heard.
    assert apply_retention(now, tombstone_age=timedelta(seconds=1), event_age=timedelta(0))["tombstones"] == 0
    status, body = hb({"memberId": "f", "memberEpoch": 2, "metadataEpoch": 1})
    assert status == 409
    assert body["errorCode"] == "FENCED_MEMBER_EPOCH"
    later = now + timedelta(seconds=30)
    assert apply_retention(later, tombstone_age=timedelta(seconds=1), event_age=timedelta(0))["tombstones"] == 1


def test_retention_works_in_batches(orders: GroupFixture):
    old = timezone.now() - 3 * DAY
    for i in range(7):
        beat(f"m{i}", 0, old)
        beat(f"m{i}", -1, old)
    assert apply_retention(timezone.now(), tombstone_age=DAY, event_age=timedelta(0), batch=2)["tombstones"] == 7
    assert not Member.objects.exists()


def test_retention_deletes_old_events_only(history: datetime):
    total = Event.objects.count()
    cutoff = history - 2 * DAY
    old = Event.objects.filter(created_at__lt=cutoff).count()  # auto_now_add: all are "now"
    assert old == 0
    ids = list(Event.objects.order_by("id").values_list("id", flat=True)[:5])
    Event.objects.filter(id__in=ids).update(created_at=history - 10 * DAY)  # test setup: age five events
    result = apply_retention(history, tombstone_age=timedelta(0), event_age=timedelta(days=7), batch=2)
    assert result == {"tombstones": 0, "events": 5}
    assert Event.objects.count() == total - 5


def test_zero_in_the_settings_keeps_everything(history: datetime, settings):
    settings.MEMBER_TOMBSTONE_RETENTION_SECONDS = 0
    settings.EVENT_RETENTION_DAYS = 0
    assert apply_retention(history + 30 * DAY) == {"tombstones": 0, "events": 0}


def test_apply_retention_command_and_beat_task(history: datetime):
    out = StringIO()
    call_command("apply_retention", "--tombstone-seconds", str(2 * 86_400), "--event-days", "7", stdout=out)
    assert out.getvalue().strip() == "deleted 3 member tombstones, 0 events"
    entry = settings.CELERY_BEAT_SCHEDULE["apply-retention"]
    assert entry["task"] == tasks.apply_retention.name == "groups.tasks.apply_retention"
    assert tasks.apply_retention() == {"tombstones": 0, "events": 0}  # nothing left past the defaults


def test_retention_waits_for_the_group_lock_and_spares_a_tombstone_rejoined_meanwhile(orders: GroupFixture):
    import threading

    from django.db import connection, connections, transaction

    from assignments.rows import lock_group

    old = timezone.now() - 3 * DAY
    beat("a", 0, old)
    beat("a", -1, old)
    result: dict[str, object] = {}

    def retention() -> None:
        try:
            result.update(apply_retention(timezone.now(), tombstone_age=DAY, event_age=timedelta(0)))
        except Exception as exc:  # reported by the assertion below
            result["error"] = repr(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=retention)
    with transaction.atomic():
        lock_group("g1")  # as a locked heartbeat holds it between loading "a" and saving it
        worker.start()
        with connection.cursor() as cursor:
            for _ in range(400):  # until retention waits on the group's row lock
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # else fixed for this transaction
                # Blocked by this connection (not by the query's text: pg_stat_activity cuts it
                # at track_activity_query_size, and the group's new columns made it longer).
                cursor.execute("SELECT count(*) FROM pg_stat_activity"
                               " WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))")
                if cursor.fetchone()[0]:
                    break
                threading.Event().wait(0.025)  # poll interval of a deadline loop
            else:
                pytest.fail(f"retention never waited for the group lock: {result}")
        assert beat("a", 0, timezone.now())[1] == "NONE"  # the rejoin, in the lock holder's transaction
    worker.join(30)
    assert result == {"tombstones": 0, "events": 0}
    assert statuses()["a"] in {"PENDING", "STABLE"}


def test_i27_5_joins_after_retention_deleted_a_snapshots_member_never_answer_500(orders: GroupFixture, hb: Hb):
    """A process's snapshot lists a member as live; another pass (the sweep, which does not use
    snapshots) expires it and retention deletes its tombstone. The next locked passes here must
    not assign shards to the deleted row (a foreign key violation: HTTP 500)."""
    old = timezone.now() - timedelta(minutes=3)
    beat("gone", 0, old)
    beat("gone", 1, old)  # this process's snapshot now holds "gone" as a live member
    assert sweep_liveness(old + timedelta(minutes=1)).expired == {"g1": ["gone"]}
    assert apply_retention(timezone.now(), tombstone_age=timedelta(seconds=1), event_age=timedelta(0)) == {
        "tombstones": 1, "events": 0}
    for i in range(6):
        status, body = hb({"memberId": f"new{i}", "memberEpoch": 0, "ownedShards": []})
        assert status == 200, body
        assert body["errorCode"] == "NONE"
