"""docs/redis-acl.example.acl works (issue 8.9): a private Redis 7 loaded with exactly those
users runs the library's producer, a member's runtime (read, ACK, fence, DLQ, idempotency
marker) and the coordinator's seal step, and refuses each role what the doc says it cannot do."""
from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dataplane.membership import Grant
from dataplane.message import Message
from dataplane.producer import Producer
from dataplane.routing import ShardKeys
from dataplane.runtime import Runtime, RuntimeConfig

from .conftest import ROOT, free_port

ACL_FILE = ROOT / "docs" / "redis-acl.example.acl"
SHARD = "orders:1:0"
KEYS = ShardKeys(SHARD, "rsc")

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private Redis (never the shared one: ACL users are server-wide) with the doc's users."""
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


def client(port: int, user: str, password: str) -> redis.Redis:
    return redis.Redis(port=port, username=user, password=password, decode_responses=True)


def url(port: int, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{port}/0"


class Routing:
    """The producer's transport: the coordinator's routing document for one shard."""

    def routing(self, stream: str) -> dict[str, Any]:
        return {"stream": "orders", "writeVersion": 1, "metadataEpoch": 1, "state": "STABLE",
                "hash": "blake2b-64", "keyPrefix": "rsc",
                "versions": [{"stream": "orders", "version": 1, "state": "ACTIVE", "shardCount": 1,
                              "parentVersion": None, "parentShardCount": None, "keyPrefix": "rsc"}]}

    def close(self) -> None:
        pass


def refused(call: Any) -> bool:
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_acl_roles_run_the_library_and_refuse_the_rest(port: int):
    admin = client(port, "admin", "admin-secret")
    producer = Producer("http://unused", "orders", None, redis_url=url(port, "producer-orders", "producer-secret"),
                        transport=Routing())  # type: ignore[arg-type]
    producer.send_many([(f"k{i}", {"n": str(i)}) for i in range(20)])
    assert admin.xlen(KEYS.stream) == 20

    handled: list[str] = []
    marker_first: list[bool] = []
    done = threading.Event()
    rt: Runtime

    def handle(msg: Message) -> None:
        if msg.key == "k3":
            raise RuntimeError("poison")  # → retried, then the group's DLQ
        if msg.key == "k0":
            marker_first.append(rt.idempotency_marker(msg, "k0", 60_000))
        handled.append(msg.key)
        if len(handled) == 19:
            done.set()

    rt = Runtime(url(port, "member-billing", "member-secret"), "billing", "m-1", handle,
                 RuntimeConfig(block_ms=100, retry_backoff_ms=1, max_deliveries=2, workers=2))
    rt.start()
    try:
        rt.grant(Grant(SHARD, 1, "m-1", KEYS.stream, KEYS.sealed, "0", "rsc"))
        assert done.wait(20), f"handled {len(handled)} of 19"
        deadline = threading.Event()
        for _ in range(400):
            if admin.xpending(KEYS.stream, "billing")["pending"] == 0 and admin.exists(KEYS.dlq("billing")):
                break
            deadline.wait(0.05)  # poll interval of a deadline loop
        assert admin.xpending(KEYS.stream, "billing")["pending"] == 0  # ACKed through the fence script
        assert admin.xlen(KEYS.dlq("billing")) == 1
        assert marker_first == [True]
        assert admin.get(KEYS.fence("billing")) is not None
    finally:
        rt.stop(timeout=5.0)
        producer.close()

    coordinator = client(port, "coordinator", "coordinator-secret")
    assert coordinator.set(KEYS.sealed, "v2", nx=True)

    member = client(port, "member-billing", "member-secret")
    assert refused(lambda: member.xadd(KEYS.stream, {"forged": "1"}))
    assert refused(lambda: member.set(KEYS.sealed, "x"))
    assert refused(lambda: member.delete(KEYS.sealed))
    assert refused(lambda: member.set(KEYS.fence("other"), "99"))
    assert refused(lambda: member.set(KEYS.stream, "clobbered"))
    assert refused(lambda: member.xadd(ShardKeys("payments:1:0", "rsc").stream, {"x": "1"}))
    producer_client = client(port, "producer-orders", "producer-secret")
    # What ACLs cannot stop (docs/SECURITY.md): the script's XADD needs +xadd on the stream, so a
    # producer can also XADD directly, past the seal check, into a sealed shard.
    assert not refused(lambda: producer_client.xadd(KEYS.stream, {"direct": "1"}))
    assert refused(lambda: producer_client.xack(KEYS.stream, "billing", "0-1"))
    assert refused(lambda: producer_client.xreadgroup("billing", "p", {KEYS.stream: ">"}))
    assert refused(lambda: producer_client.set(KEYS.fence("billing"), "99"))
    assert refused(lambda: coordinator.xadd(KEYS.stream, {"x": "1"}))
    assert refused(lambda: coordinator.set(KEYS.fence("billing"), "99"))
    with pytest.raises(redis.exceptions.AuthenticationError):  # no password, no access
        redis.Redis(port=port).ping()
