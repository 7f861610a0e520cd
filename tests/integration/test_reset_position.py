"""reset_position (like `kafka-consumer-groups --reset-offsets`): refused while the group has
live members, a dry run changes nothing, applied when empty; then a real consumer (dataplane
Consumer against gunicorn) starts from the new position."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from dataplane import Consumer
from dataplane.message import Message
from groups.models import Event
from groups.positions import resolve_position
from groups.services import ServiceError

from .conftest import GroupFixture, Hb, LiveServer, group_on_fresh_stream

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


@pytest.mark.parametrize(("to", "expected"), [
    ("earliest", "0-0"),
    ("latest", "$"),
    ("1700000000000-3", "1700000000000-3"),
    ("1700000000000", "1700000000000-0"),
    ("2023-11-14T22:13:20Z", f"1699999999999-{2**64 - 1}"),
    ("2023-11-14T22:13:20", f"1699999999999-{2**64 - 1}"),  # no zone: UTC
    ("2023-11-14T23:13:20+01:00", f"1699999999999-{2**64 - 1}"),
])
def test_reset_target_positions(to: str, expected: str):
    assert resolve_position(to) == expected


@pytest.mark.parametrize("to", ["", "soon", "1-2-3", "-5", "99999999999999999999999-0"])
def test_reset_target_garbage_is_refused_naming_the_field(to: str):
    with pytest.raises(ServiceError, match=r"^to: "):
        resolve_position(to)


@pytest.fixture
def fx() -> Iterator[GroupFixture]:
    with group_on_fresh_stream("rp", "rpg-{stream}", shards=2, heartbeat_interval_ms=200,
                               session_timeout_ms=5000) as fixture:
        yield fixture


def _entries(fx: GroupFixture) -> tuple[redis.Redis, str, str]:
    """Shard 0: ids 1000-0 … 1009-0; shard 1: 1000-0 … 1004-0 (explicit ids: positions are exact)."""
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    k0, k1 = fx.keys(f"{fx.stream}:1:0").stream, fx.keys(f"{fx.stream}:1:1").stream
    for i in range(10):
        r.xadd(k0, {"key": f"a{i}", "n": str(i)}, id=f"{1000 + i}-0")
    for i in range(5):
        r.xadd(k1, {"key": f"b{i}", "n": str(i)}, id=f"{1000 + i}-0")
    fx.drop_consumer_groups(r)  # positions below are set as a member would have
    return r, k0, k1


def _run(*args: str) -> str:
    out = StringIO()
    call_command("reset_position", *args, stdout=out)
    return out.getvalue()


def test_reset_is_refused_while_the_group_has_live_members_and_changes_nothing(api: APIClient, fx: GroupFixture):
    r, k0, _ = _entries(fx)
    r.xgroup_create(k0, fx.group, id="1002-0")
    status, _ = Hb(api, fx)({"memberId": "alive-1", "memberEpoch": 0, "ownedShards": []})
    assert status == 200
    with pytest.raises(CommandError, match=r"has live members \(alive-1\)"):
        _run(fx.group, "--to", "earliest")
    # i24.5: a dry run shows the plan while members are live, and changes nothing.
    plan = _run(fx.group, "--to", "earliest", "--dry-run")
    assert plan.splitlines()[:2] == [f"would reset group {fx.group} to earliest on 2 shard(s)",
                                     f"  {fx.stream}:1:0: 1002-0 → 0-0"]
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1002-0"
    assert len(r.xinfo_groups(fx.keys(f"{fx.stream}:1:1").stream)) == 0  # nothing created
    assert not Event.objects.filter(kind="position_reset").exists()
    r.close()


def test_dry_run_prints_the_plan_and_changes_nothing(fx: GroupFixture):
    r, k0, k1 = _entries(fx)
    r.xgroup_create(k0, fx.group, id="1002-0")
    text = _run(fx.group, "--to", "1004-0", "--dry-run")
    assert text.splitlines() == [
        f"would reset group {fx.group} to 1004-0 on 2 shard(s)",
        f"  {fx.stream}:1:0: 1002-0 → 1004-0",
        f"  {fx.stream}:1:1: create consumer group at 1004-0",
    ]
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1002-0"
    assert r.xinfo_groups(k1) == []
    assert not Event.objects.filter(kind="position_reset").exists()
    with pytest.raises(CommandError, match="is not a live shard"):
        _run(fx.group, "--to", "earliest", "--shard", f"{fx.stream}:9:0")
    r.close()


def test_reset_applied_when_empty_then_a_consumer_starts_from_the_new_position(
    fx: GroupFixture, one_worker_gunicorn: LiveServer,
):
    r, k0, k1 = _entries(fx)
    r.xgroup_create(k0, fx.group, id="1008-0")  # it had read nearly everything
    text = _run(fx.group, "--to", "1004-0", "--actor", "ops-test")
    assert text.splitlines()[0] == f"reset group {fx.group} to 1004-0 on 2 shard(s)"
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1004-0"
    assert r.xinfo_groups(k1)[0]["last-delivered-id"] == "1004-0"
    event = Event.objects.get(kind="position_reset", group__name=fx.group)
    assert event.actor == "ops-test"
    assert event.detail == {"to": "1004-0", "lastDeliveredId": "1004-0", "shards": 2}

    # Only shard 1, back to the start: shard 0 keeps its new position.
    _run(fx.group, "--to", "earliest", "--shard", f"{fx.stream}:1:1")
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1004-0"
    assert r.xinfo_groups(k1)[0]["last-delivered-id"] == "0-0"

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def handler(msg: Message) -> None:
        with lock:
            seen.append((msg.shard, msg.id))

    consumer = Consumer(one_worker_gunicorn.url, fx.group, fx.key, handler, redis_url=settings.STREAM_REDIS_URL,
                        member_id="after-reset", block_ms=100, workers=2)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    expected = {(f"{fx.stream}:1:0", f"{1000 + i}-0") for i in range(5, 10)}
    expected |= {(f"{fx.stream}:1:1", f"{1000 + i}-0") for i in range(5)}
    try:
        deadline = time.monotonic() + 60
        while True:
            with lock:
                done = set(seen) >= expected
            idle = all(
                g["lag"] == 0 and g["pending"] == 0 for k in (k0, k1) for g in r.xinfo_groups(k)
            )
            if done and idle:
                break
            assert time.monotonic() < deadline, f"consumed {sorted(seen)}"
            time.sleep(0.05)  # poll interval of a deadline loop
    finally:
        consumer.stop()
        thread.join(15)
    assert sorted(seen) == sorted(expected)  # nothing at or before 1004-0 on shard 0
    assert not thread.is_alive()  # it left the group
    r.close()


def test_i24_5_shift_by_moves_each_shard_by_entries_within_its_bounds(fx: GroupFixture):
    r, k0, k1 = _entries(fx)
    r.xgroup_create(k0, fx.group, id="1005-0")
    r.xgroup_create(k1, fx.group, id="1001-0")
    text = _run(fx.group, "--shift-by", "-3", "--dry-run")
    assert text.splitlines() == [
        f"would reset group {fx.group} to shift-by -3 on 2 shard(s)",
        f"  {fx.stream}:1:0: 1005-0 → 1002-0",  # 1003, 1004, 1005 delivered again
        f"  {fx.stream}:1:1: 1001-0 → 0-0",  # fewer than 3 before it: from the start
    ]
    text = _run(fx.group, "--shift-by", "2", "--actor", "ops")
    assert text.splitlines()[1:] == [f"  {fx.stream}:1:0: 1005-0 → 1007-0", f"  {fx.stream}:1:1: 1001-0 → 1003-0"]
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1007-0"
    assert r.xinfo_groups(k1)[0]["last-delivered-id"] == "1003-0"
    _run(fx.group, "--shift-by", "100")  # past the end: the last entry
    assert r.xinfo_groups(k0)[0]["last-delivered-id"] == "1009-0"
    assert r.xinfo_groups(k1)[0]["last-delivered-id"] == "1004-0"
    event = Event.objects.filter(kind="position_reset").order_by("id").first()
    assert event is not None
    assert event.detail["to"] == "shift-by +2"
    with pytest.raises(CommandError, match="one of the arguments --to --shift-by is required"):
        _run(fx.group)
    r.close()


def test_i24_5_refusal_names_temporarily_left_static_members_and_how_to_remove_them(
    api: APIClient, fx: GroupFixture,
):
    hb = Hb(api, fx)
    status, _ = hb({"memberId": "st-1", "memberEpoch": 0, "instanceId": "billing-3", "ownedShards": []})
    assert status == 200
    assert hb({"memberId": "st-1", "memberEpoch": -2, "instanceId": "billing-3"})[0] == 200
    with pytest.raises(CommandError) as refused:
        _run(fx.group, "--to", "earliest")
    message = str(refused.value)
    assert re.search(r"st-1 \(instance billing-3, expires in [45] s\)", message), message
    assert f"manage.py remove_member {fx.group} MEMBER_ID" in message
    call_command("remove_member", fx.group, "st-1", stdout=StringIO())
    assert _run(fx.group, "--to", "earliest").startswith(f"reset group {fx.group} to earliest")
