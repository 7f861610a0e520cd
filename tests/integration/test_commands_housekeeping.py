"""list_streams, list_groups, describe_stream, delete_group, delete_stream (issue 12.5):
what they show, what they delete (and in Redis only when asked), and how each misuse fails."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from dataplane.routing import ShardKeys
from groups.models import Event, Group, Stream
from groups.namespace import default_key_prefix
from groups.resharding import start_reshard
from groups.sweeps import run_all_sweeps
from members.models import Member as MemberRow
from tests import spawn
from tests.redis_keys import delete_keys

from .conftest import ROOT, live_database_url
from .test_resharding import Member, World

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=live_database_url())
    return spawn.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def leave(m: Member) -> None:
    r = m.api.post(f"/api/v1/groups/{m.group}/heartbeat", {"memberId": m.member_id, "memberEpoch": -1},
                   format="json", HTTP_AUTHORIZATION=f"Bearer {m.key}")
    assert r.status_code == 200, r.json()
    assert r.json()["memberEpoch"] == -1, r.json()


@pytest.fixture
def stream_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    yield client
    delete_keys(client, "rsc*:{hk*")
    client.close()


@pytest.fixture
def draining(api: APIClient, stream_redis: redis.Redis) -> World:
    """Stream hk (2 shards → 3, DRAINING, v1 sealed), groups hk-g1 (a, b) and hk-g2 (c);
    hk-g1 drained one shard of v1."""
    w = World(api, "hk", 2)
    w.settle()
    start_reshard("hk", 3)
    run_all_sweeps()
    run_all_sweeps()
    assert Stream.objects.get(name="hk").state == "DRAINING"
    for m in w.members():
        m.beat()
    w.settle()
    w.drain("hk-g1", "hk:1:0")
    return w


def test_housekeeping_list_and_describe_show_versions_state_and_drain_progress(draining: World):
    run("create_stream", "hk-empty", "--shards", "1")
    streams = json.loads(run("list_streams", "--json"))
    assert streams == [
        {"stream": "hk", "state": "DRAINING", "writeVersion": 2, "shards": 3, "groups": 2,
         "keyPrefix": default_key_prefix()},
        {"stream": "hk-empty", "state": "STABLE", "writeVersion": 1, "shards": 1, "groups": 0,
         "keyPrefix": default_key_prefix()},
    ]
    listed = run("list_streams").splitlines()
    assert listed[0].split() == ["STREAM", "STATE", "WRITE-VERSION", "SHARDS", "GROUPS", "KEY-PREFIX"]  # i24.8
    assert listed[1].split()[:3] == ["hk", "DRAINING", "v2"]

    groups = json.loads(run("list_groups", "--stream", "hk", "--json"))
    assert [(g["group"], g["liveMembers"]) for g in groups] == [("hk-g1", 2), ("hk-g2", 1)]
    listed = run("list_groups").splitlines()
    assert listed[0].split() == ["GROUP", "STREAM", "LIVE-MEMBERS", "GROUP-EPOCH", "ASSIGNMENT-EPOCH"]  # i24.8
    assert any(line.split()[1:3] == ["hk", "2"] for line in listed[1:]), listed

    doc = json.loads(run("describe_stream", "hk", "--json"))
    assert (doc["state"], doc["writeVersion"]) == ("DRAINING", 2)
    assert [(v["version"], v["shardCount"], v["state"]) for v in doc["versions"]] == [(1, 2, "SEALED"), (2, 3, "ACTIVE")]
    assert {g["group"]: g["drain"] for g in doc["groups"]} == {
        "hk-g1": {"1": {"drained": 1, "shards": 2}},
        "hk-g2": {"1": {"drained": 0, "shards": 2}},
    }
    text = run("describe_stream", "hk")
    assert "v1 drained 1/2" in text
    assert "v1 drained 0/2" in text
    assert "SEALED" in text


def test_housekeeping_delete_group_refused_while_live_then_purges_only_its_own_redis_keys(
    draining: World, stream_redis: redis.Redis
):
    prefix = default_key_prefix()
    shards = ["hk:1:0", "hk:1:1", "hk:2:0", "hk:2:1", "hk:2:2"]
    for sid in shards:  # what members of both groups leave in Redis
        for group in ("hk-g1", "hk-g2"):
            with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: the coordinator made it
                stream_redis.xgroup_create(ShardKeys(sid, prefix).stream, group, id="0", mkstream=True)
            stream_redis.set(ShardKeys(sid, prefix).fence(group), f"3:{group}-member")

    with pytest.raises(CommandError, match=r"^group 'hk-g1' has 2 live member\(s\) \(a, b\): stop them"):
        run("delete_group", "hk-g1", "--purge-redis")
    assert Group.objects.filter(name="hk-g1").exists()
    assert stream_redis.exists(ShardKeys("hk:1:0", prefix).fence("hk-g1"))

    for m in draining.groups["hk-g1"]:
        leave(m)
    out = run("delete_group", "hk-g1", "--purge-redis", "--actor", "alice")
    assert out.strip() == ("deleted group hk-g1 of stream hk; Redis: 5 consumer groups destroyed, "
                           "5 fence tokens deleted")
    assert not Group.objects.filter(name="hk-g1").exists()
    assert not MemberRow.objects.filter(group__name="hk-g1").exists()
    event = Event.objects.get(kind="group_deleted")
    assert (event.stream.name, event.actor, event.detail["group"]) == ("hk", "alice", "hk-g1")
    for sid in shards:
        assert [g["name"] for g in stream_redis.xinfo_groups(ShardKeys(sid, prefix).stream)] == ["hk-g2"]
        assert not stream_redis.exists(ShardKeys(sid, prefix).fence("hk-g1"))
        assert stream_redis.exists(ShardKeys(sid, prefix).fence("hk-g2"))
    run("create_group", "hk-g1", "--stream", "hk")  # purged: the name is free again

    # Without --purge-redis the keys stay, and so the name stays taken in Redis.
    leave(draining.groups["hk-g2"][0])
    assert "Redis keys kept" in run("delete_group", "hk-g2")
    assert stream_redis.exists(ShardKeys("hk:2:0", prefix).fence("hk-g2"))
    with pytest.raises(CommandError, match=r"already holds .*fence:hk-g2"):
        run("create_group", "hk-g2", "--stream", "hk")


def test_housekeeping_delete_stream_refused_while_groups_exist_then_purges_its_keys(
    draining: World, stream_redis: redis.Redis
):
    prefix = default_key_prefix()
    with pytest.raises(CommandError, match=r"^stream 'hk' still has 2 group\(s\) \(hk-g1, hk-g2\): delete them first"):
        run("delete_stream", "hk")
    for name, members in draining.groups.items():
        for m in members:
            leave(m)
        run("delete_group", name)
    stream_redis.xadd(ShardKeys("hk:2:1", prefix).stream, {"k": "v"})
    stream_redis.xadd(f"{prefix}:{{hk:2:1}}:dlq:hk-g1", {"k": "v"})
    stream_redis.xadd(ShardKeys("hkx:1:0", prefix).stream, {"k": "v"})  # another stream's key: kept
    assert stream_redis.exists(ShardKeys("hk:1:0", prefix).sealed)

    out = run("delete_stream", "hk", "--purge-redis")
    # 2 seal markers, 5 streams (made with their consumer groups by the coordinator), a DLQ
    assert out.strip() == "deleted stream hk (8 Redis keys deleted)"
    assert not Stream.objects.filter(name="hk").exists()
    assert list(stream_redis.scan_iter(f"{prefix}:{{hk:*")) == []
    assert stream_redis.exists(ShardKeys("hkx:1:0", prefix).stream)
    run("create_stream", "hk", "--shards", "2")  # purged: the name is free again


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("describe_stream", "nope"), "stream 'nope' does not exist"),
        (("list_groups", "--stream", "nope"), "stream 'nope' does not exist"),
        (("delete_group", "nope"), "group 'nope' does not exist"),
        (("delete_stream", "nope"), "stream 'nope' does not exist"),
        (("delete_group", "hk-g2"), "group 'hk-g2' has 1 live member(s) (c): stop them (they leave the group) "
                                    "or fence them first"),
        (("delete_stream", "hk"), "stream 'hk' still has 2 group(s) (hk-g1, hk-g2): delete them first "
                                  "(delete_group)"),
    ],
)
def test_housekeeping_misuse_fails_with_one_line_and_changes_nothing(draining: World, args, message):
    before = (list(Stream.objects.values_list("name", "state")), list(Group.objects.values_list("name", flat=True)))
    with pytest.raises(CommandError) as refused:
        run(*args)
    assert str(refused.value) == message
    assert (list(Stream.objects.values_list("name", "state")), list(Group.objects.values_list("name", flat=True))) == before


def test_housekeeping_misuse_exits_non_zero_with_one_line_from_the_shell(draining: World):
    for args, message in [
        (("delete_group", "hk-g1"), "CommandError: group 'hk-g1' has 2 live member(s) (a, b): stop them"),
        (("delete_stream", "hk"), "CommandError: stream 'hk' still has 2 group(s)"),
        (("describe_stream", "nope"), "CommandError: stream 'nope' does not exist"),
    ]:
        done = manage(*args)
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(message), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""
    assert Group.objects.count() == 2
    assert Stream.objects.filter(name="hk").exists()


def test_restore_raise_epochs_puts_new_grants_above_the_fence_tokens_in_redis(api: APIClient, stream_redis: redis.Redis):
    """An older database under a newer Redis: tokens at epoch 57, the group at 2."""
    w = World(api, "hkr", 2)
    w.settle("hkr-g1")
    prefix = default_key_prefix()
    stream_redis.set(ShardKeys("hkr:1:0", prefix).fence("hkr-g1"), "57:m-gone")
    stream_redis.set(ShardKeys("hkr:1:1", prefix).fence("hkr-g1"), "not-a-token")
    stream_redis.set(ShardKeys("hkr:1:1", prefix).fence("hkr-g2"), "9:m-other")  # another group's: not ours
    before = Group.objects.get(name="hkr-g1").assignment_epoch

    out = run("raise_epochs_after_restore", "--dry-run")
    assert f"group hkr-g1: highest fence token epoch 57, assignmentEpoch {before}: would raise" in out
    assert "group hkr-g2: highest fence token epoch 9, assignmentEpoch 1: would raise" in out
    assert Group.objects.get(name="hkr-g1").assignment_epoch == before

    out = run("raise_epochs_after_restore", "--group", "hkr-g1", "--actor", "ops")
    assert out.strip() == (f"group hkr-g1: highest fence token epoch 57, assignmentEpoch {before}: "
                           "raised groupEpoch and assignmentEpoch to 58")
    g = Group.objects.get(name="hkr-g1")
    assert (g.group_epoch, g.assignment_epoch) == (58, 58)
    assert Event.objects.filter(group=g, kind="epochs_raised", actor="ops").exists()
    assert Group.objects.get(name="hkr-g2").assignment_epoch == 1  # only the group asked for
    # The members move to the new epoch; every grant from now on carries it (> 57).
    w.settle("hkr-g1")
    assert {m.epoch for m in w.groups["hkr-g1"]} == {58}
    assert "nothing to do" in run("raise_epochs_after_restore", "--group", "hkr-g1")
    with pytest.raises(CommandError, match=r"^group 'nope' does not exist$"):
        run("raise_epochs_after_restore", "--group", "nope")
