"""docs/redis-acl.example.acl works and isolates what Redis 7 ACLs can isolate (issues 8.9, 27.6).

A private Redis 7 (never the shared one: ACL users are server-wide) is loaded with exactly the
shipped file. The real coordinator (gunicorn and the services, on its `coordinator` user)
creates the stream, the groups and their consumer groups, reshards and seals; the library's
producer, a member (`Consumer`: read, fenced ACK, DLQ, idempotency marker, drain) and the DLQ
tools (`python -m dataplane dlq`) run with their users; each role is refused what
docs/SECURITY.md says it cannot do, and what it still can is asserted as such. SECURITY.md
prints this very file.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis

from dataplane import Consumer, RedisPermissionError
from dataplane.message import Message
from dataplane.producer import Producer
from dataplane.routing import ShardKeys
from groups.describe import describe_group
from groups.namespace import installation_id
from groups.resharding import start_reshard
from groups.services import ServiceError, create_api_key, create_group, create_stream
from groups.sweeps import run_all_sweeps
from tests import spawn

from ..consumer_thread import run_consumer
from .conftest import ROOT, free_port, running_gunicorn

ACL_FILE = ROOT / "docs" / "redis-acl.example.acl"
SHARD = "orders:1:0"
KEYS = ShardKeys(SHARD, "rsc")
NEXT = [ShardKeys("orders:2:0", "rsc"), ShardKeys("orders:2:1", "rsc")]
GROUP_CONFIG = {"heartbeat_interval_ms": 250, "session_timeout_ms": 5000, "rebalance_timeout_ms": 20_000}
# The member line docs/SECURITY.md printed before issue 27.6 (not the file then shipped): no
# WATCH/MULTI/EXEC/MGET for the fenced read. A member on it must stop, not heartbeat on.
OLD_PRINTED_MEMBER = (
    "on >{pw} resetchannels -@all +ping +info +command|info +client|id +client|unblock +script|load "
    "+xreadgroup +xgroup|create +xgroup|createconsumer +xautoclaim +xclaim +xpending +xack +xinfo|groups "
    "+xrange +xrevrange %RW~rsc:{{orders:*}} (+exists %R~rsc:{{orders:*}}:sealed) (+evalsha "
    "%RW~rsc:{{orders:*}} %RW~rsc:{{orders:*}}:sealed %RW~rsc:{{orders:*}}:fence:billing "
    "%RW~rsc:{{orders:*}}:dlq:billing) (+get +set %RW~rsc:{{orders:*}}:fence:billing) "
    "(+xadd %RW~rsc:{{orders:*}}:dlq:billing) (+set %RW~rsc:{{orders:*}}:idem:billing:*)"
    # Issue 25.4's identity GET, so that the refusal met is the fenced read's, as it was.
    " (+get %R~rsc:identity)"
)

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary"),
    pytest.mark.needs_postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private Redis with the file's users, plus an admin for the test's own look."""
    workdir: Path = tmp_path_factory.mktemp("acl-redis")
    users = workdir / "users.acl"
    users.write_text(ACL_FILE.read_text() + "user admin on >admin-secret ~* &* +@all\n")
    p = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--aclfile", str(users), "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    admin = redis.Redis(port=p, username="admin", password="admin-secret")
    try:
        for _ in range(200):
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None:
                    pytest.fail("redis-server refused the ACL file")
                threading.Event().wait(0.025)  # poll interval of a deadline loop
        yield p
    finally:
        admin.close()
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def admin(port: int) -> Iterator[redis.Redis]:
    r = client(port, "admin", "admin-secret")
    yield r
    r.flushall()  # the private server: this test's keys only
    r.close()


def client(port: int, user: str, password: str) -> redis.Redis:
    return redis.Redis(port=port, username=user, password=password, decode_responses=True)


def url(port: int, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{port}/0"


def refused(call: Callable[[], Any]) -> bool:
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = threading.Event()
    for _ in range(int(timeout / 0.05)):
        value = pred()
        if value:
            return value
        deadline.wait(0.05)  # poll interval of a deadline loop
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("RSC_") and k != "REDIS_URL"}
    full.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **env)
    return spawn.run([sys.executable, "-m", "dataplane", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)


def test_i27_6_security_md_prints_the_tested_acl_file():
    doc = (ROOT / "docs" / "SECURITY.md").read_text()
    blocks = re.findall(r"```acl\n(.*?)```", doc, flags=re.S)
    assert blocks == [ACL_FILE.read_text()]


def running_member(server_url: str, group_key: str, redis_url: str, handler: Callable[[Message], None],
                   member_id: str) -> tuple[Consumer, threading.Thread, list[BaseException]]:
    consumer = Consumer(server_url, "billing", group_key, handler, redis_url=redis_url, member_id=member_id,
                        block_ms=100, workers=2, max_deliveries=2, retry_backoff_ms=1)
    running = run_consumer(consumer)
    return consumer, running.thread, running.raised


def test_i27_6_acl_roles_run_the_library_and_refuse_the_rest(
    port: int, admin: redis.Redis, settings: Any, tmp_path: Path
):
    coordinator_url = url(port, "coordinator", "coordinator-secret")
    settings.STREAM_REDIS_URL = coordinator_url  # the services' Redis user
    create_stream("orders", 1, key_prefix="rsc")
    create_group("billing", "orders", **GROUP_CONFIG)
    create_group("payments", "orders", **GROUP_CONFIG)
    # The coordinator made the consumer groups: members need no xgroup|create.
    assert sorted(g["name"] for g in admin.xinfo_groups(KEYS.stream)) == ["billing", "payments"]
    group_key, stream_key = create_api_key(group="billing"), create_api_key(stream="orders")

    with running_gunicorn(workers=1, STREAM_REDIS_URL=coordinator_url, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom")) as server:
        producer = Producer(server.url, "orders", stream_key, redis_url=url(port, "producer-orders", "producer-secret"))
        producer.send_many([(f"k{i}", {"n": str(i)}) for i in range(20)])
        assert admin.xlen(KEYS.stream) == 20

        handled: list[str] = []
        marker_first: list[bool] = []
        done = threading.Event()
        consumer: Consumer

        def handle(msg: Message) -> None:
            if msg.key == "k3" and "dlq:replay-for" not in msg.fields:
                raise RuntimeError("poison")  # -> retried, then the group's DLQ
            if msg.key == "k0":
                marker_first.append(consumer.idempotency_marker(msg, "k0", 60_000))
            handled.append(msg.key)
            if len(handled) >= 19:
                done.set()

        member_url = url(port, "member-billing", "member-secret")
        consumer, thread, errors = running_member(server.url, group_key, member_url, handle, "m-1")
        try:
            assert done.wait(30), f"handled {len(handled)} of 19; {errors}"
            wait_for(lambda: admin.xpending(KEYS.stream, "billing")["pending"] == 0
                     and admin.exists(KEYS.dlq("billing")), 20, "ACKs and the dead letter")
            assert admin.xlen(KEYS.dlq("billing")) == 1
            assert marker_first == [True]
            assert admin.get(KEYS.fence("billing")) is not None

            # The DLQ tools' role: list (SCAN), replay (through the producer path), purge.
            dlq_env = {"RSC_API_KEY": group_key}
            dlq_url = url(port, "dlq-billing", "dlq-secret")
            base = ["--coordinator", server.url, "--group", "billing", "--redis", dlq_url]
            out = cli(["dlq", "list", *base, "--json"], tmp_path, **dlq_env)
            assert out.returncode == 0, out.stderr
            assert [json.loads(line)["key"] for line in out.stdout.splitlines()] == ["k3"]
            out = cli(["dlq", "replay", *base], tmp_path, **dlq_env)
            assert out.returncode == 0, out.stderr
            wait_for(lambda: "k3" in handled, 20, "the replayed k3 handled")
            out = cli(["dlq", "purge", *base, "--yes"], tmp_path, **dlq_env)
            assert out.returncode == 0, out.stderr
            assert admin.xlen(KEYS.dlq("billing")) == 0
        finally:
            consumer.stop()
            thread.join(30)
        assert not errors, errors

        member = client(port, "member-billing", "member-secret")
        producer_client = client(port, "producer-orders", "producer-secret")
        dlq_client = client(port, "dlq-billing", "dlq-secret")
        coordinator = client(port, "coordinator", "coordinator-secret")

        # A member: no XADD into a stream, no seal marker, no other group's fence token, no
        # key of another stream, no consumer group creation (a future group's, at $) and no
        # key of a version not made yet (it would block the reshard), no CLIENT UNBLOCK.
        assert refused(lambda: member.xadd(KEYS.stream, {"forged": "1"}))
        assert refused(lambda: member.set(KEYS.sealed, "x"))
        assert refused(lambda: member.delete(KEYS.sealed))
        assert refused(lambda: member.set(KEYS.fence("payments"), "99"))
        assert refused(lambda: member.set(KEYS.stream, "clobbered"))
        assert refused(lambda: member.xadd(ShardKeys("payments:1:0", "rsc").stream, {"x": "1"}))
        assert refused(lambda: member.xgroup_create(KEYS.stream, "future-group", id="$"))
        assert refused(lambda: member.xgroup_create(NEXT[0].stream, "billing", id="0", mkstream=True))
        assert refused(lambda: member.xadd(NEXT[0].stream, {"x": "1"}))
        assert refused(lambda: member.xadd(KEYS.dlq("payments"), {"x": "1"}))
        assert refused(lambda: member.execute_command("CLIENT", "UNBLOCK", 1))
        assert refused(lambda: member.execute_command("CLIENT", "ID"))
        # Issue 25.4: the member reads the coordinator's identity and cannot forge it.
        assert member.get("rsc:identity") == installation_id()
        assert refused(lambda: member.set("rsc:identity", "forged"))
        assert refused(lambda: producer_client.set("rsc:identity", "forged"))
        # What ACLs cannot stop (docs/SECURITY.md): groups of one stream share its key, and a
        # command's group name is not a key, so a member may read and ACK as another group.
        assert not refused(lambda: member.xreadgroup("payments", "intruder", {KEYS.stream: ">"}, count=1))
        assert not refused(lambda: member.xack(KEYS.stream, "payments", "0-1"))

        # The DLQ tools: their group's DLQs only, and the producer's XADD.
        assert refused(lambda: dlq_client.xadd(KEYS.dlq("payments"), {"x": "1"}))
        assert refused(lambda: dlq_client.xrange(KEYS.dlq("payments")))
        assert refused(lambda: dlq_client.xreadgroup("billing", "d", {KEYS.stream: ">"}))
        assert refused(lambda: dlq_client.set(KEYS.fence("billing"), "99"))
        assert refused(lambda: dlq_client.xdel(KEYS.stream, "0-1"))

        # A producer: no reading, ACKing or fence tokens. It can XADD directly (the append
        # script needs +xadd), past the seal check, and into a stream key of a version not
        # made yet: the reshard then refuses, naming the key to delete.
        assert refused(lambda: producer_client.xack(KEYS.stream, "billing", "0-1"))
        assert refused(lambda: producer_client.xreadgroup("billing", "p", {KEYS.stream: ">"}))
        assert refused(lambda: producer_client.set(KEYS.fence("billing"), "99"))
        assert refused(lambda: producer_client.xgroup_create(KEYS.stream, "future-group", id="$"))
        assert not refused(lambda: producer_client.xadd(NEXT[0].stream, {"stray": "1"}))
        with pytest.raises(ServiceError, match=re.escape(f"redis-cli DEL '{NEXT[0].stream}'")):
            start_reshard("orders", 2)
        admin.delete(NEXT[0].stream)

        # The coordinator: seal markers, consumer groups, existence checks; no messages.
        assert refused(lambda: coordinator.xadd(KEYS.stream, {"x": "1"}))
        assert refused(lambda: coordinator.set(KEYS.fence("billing"), "99"))
        assert refused(lambda: coordinator.xreadgroup("billing", "c", {KEYS.stream: ">"}))
        assert refused(lambda: coordinator.delete(KEYS.stream))
        with pytest.raises(redis.exceptions.AuthenticationError):  # no password, no access
            redis.Redis(port=port).ping()

        # A reshard on the coordinator's user: the new version's consumer groups made by it,
        # the old version sealed; the member (no xgroup|create) drains v1 and reads v2.
        start_reshard("orders", 2)
        run_all_sweeps()  # PREPARING -> SEALING
        run_all_sweeps()  # consumer groups of v2, seal markers of v1
        assert admin.exists(KEYS.sealed)
        for keys in NEXT:
            assert sorted(g["name"] for g in admin.xinfo_groups(keys.stream)) == ["billing", "payments"]
        after: list[str] = []
        consumer, thread, errors = running_member(server.url, group_key, member_url,
                                                  lambda m: after.append(m.shard), "m-2")
        try:
            producer.send_many([(f"n{i}", {"n": str(i)}) for i in range(10)])

            def moved_on() -> bool:
                run_all_sweeps()
                doc = describe_group("billing")
                assigned = {s for m in doc["members"] for s in m["assignedShards"]} if doc else set()
                return len(after) >= 10 and assigned == {"orders:2:0", "orders:2:1"}

            wait_for(moved_on, 40, "v1 drained and retired, v2 read by the member")
            assert set(after) <= {"orders:2:0", "orders:2:1"}
        finally:
            consumer.stop()
            thread.join(30)
        producer.close()
        assert not errors, errors


def test_i27_6_a_member_that_may_not_read_stops_loudly(port: int, admin: redis.Redis, settings: Any, tmp_path: Path):
    """The member line SECURITY.md used to print (no WATCH/MULTI/EXEC): the fenced read is
    refused. Before issue 27.6 the member heartbeated on holding its shards and handled
    nothing; now Consumer.run() leaves the group and raises, and the CLI exits 2 with one line."""
    settings.STREAM_REDIS_URL = url(port, "coordinator", "coordinator-secret")
    create_stream("orders", 1, key_prefix="rsc")
    create_group("billing", "orders", **GROUP_CONFIG)
    group_key, stream_key = create_api_key(group="billing"), create_api_key(stream="orders")
    user, password = f"old-member-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", user, "reset", *OLD_PRINTED_MEMBER.format(pw=password).split())
    try:
        with running_gunicorn(workers=1, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom")) as server:
            producer = Producer(server.url, "orders", stream_key,
                                redis_url=url(port, "producer-orders", "producer-secret"))
            producer.send_many([(f"k{i}", {"n": str(i)}) for i in range(5)])
            producer.close()
            handled: list[str] = []
            _consumer, thread, errors = running_member(server.url, group_key, url(port, user, password),
                                                       lambda m: handled.append(m.key), "m-old")
            thread.join(30)
            assert not thread.is_alive(), "run() heartbeats on although it cannot read"
            assert len(errors) == 1, errors
            assert isinstance(errors[0], RedisPermissionError), errors
            assert "NOPERM" in str(errors[0]) or "permission" in str(errors[0]).lower()
            assert handled == []
            wait_for(lambda: describe_group("billing")["members"] == [], 10, "the member left")

            out = cli(["consume", "--coordinator", server.url, "--group", "billing", "--redis",
                       url(port, user, password), "--handler", "json:dumps", "--member-id", "m-cli",
                       "--block-ms", "100"], tmp_path, RSC_API_KEY=group_key)
            assert out.returncode == 2, out.stderr
            last = out.stderr.strip().splitlines()[-1]
            assert last.startswith("error: the Redis user may not read or set up its shards: "), out.stderr
            assert "Traceback" not in out.stderr, out.stderr
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_i27_6_a_missing_consumer_group_stops_the_member_and_ensure_consumer_groups_makes_it(
    port: int, admin: redis.Redis, settings: Any, tmp_path: Path
):
    """A group made before the coordinator created consumer groups has none on a shard nobody
    read; the member may not create it: it stops naming the command, which then makes it."""
    from django.core.management import CommandError, call_command

    settings.STREAM_REDIS_URL = url(port, "coordinator", "coordinator-secret")
    create_stream("orders", 1, key_prefix="rsc")
    create_group("billing", "orders", **GROUP_CONFIG)
    admin.xgroup_destroy(KEYS.stream, "billing")  # as an older coordinator left it
    group_key, stream_key = create_api_key(group="billing"), create_api_key(stream="orders")
    with running_gunicorn(workers=1, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom")) as server:
        producer = Producer(server.url, "orders", stream_key, redis_url=url(port, "producer-orders", "producer-secret"))
        producer.send_many([(f"k{i}", {"n": str(i)}) for i in range(5)])
        member_url = url(port, "member-billing", "member-secret")
        handled: list[str] = []
        _consumer, thread, errors = running_member(server.url, group_key, member_url,
                                                   lambda m: handled.append(m.key), "m-1")
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 1, errors
        assert isinstance(errors[0], RedisPermissionError), errors
        assert "manage.py ensure_consumer_groups --group billing" in str(errors[0])

        settings.STREAM_REDIS_URL = url(port, "producer-orders", "producer-secret")  # may not
        with pytest.raises(CommandError, match=r"may not create consumer groups"):
            call_command("ensure_consumer_groups", "--group", "billing")
        settings.STREAM_REDIS_URL = url(port, "coordinator", "coordinator-secret")
        out = StringIO()
        call_command("ensure_consumer_groups", stdout=out)
        assert out.getvalue().splitlines() == ["billing: 1 consumer groups created", "1 consumer groups created"]

        consumer, thread, errors = running_member(server.url, group_key, member_url,
                                                  lambda m: handled.append(m.key), "m-2")
        try:
            wait_for(lambda: len(handled) == 5, 30, "the 5 messages handled")
        finally:
            consumer.stop()
            thread.join(30)
            producer.close()
        assert not errors, errors
