"""Fixtures for the data-plane tests: real Redis (db 9, unique key prefixes), no Django."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.redis_keys import delete_keys

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_URL = os.environ.get("DATAPLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"the data-plane tests need Redis at {REDIS_URL}: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(r: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards (never FLUSHALL)."""
    p = f"t-{uuid.uuid4().hex[:10]}"
    yield p
    delete_keys(r, f"{p}:*")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "") -> None:
    """Poll ``predicate`` until it is true, failing after ``timeout`` seconds (no blind sleeps)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def group_info(r: redis.Redis, stream: str, group: str = "g") -> dict | None:
    """XINFO GROUPS entry of ``group``, or None while the stream or group does not exist yet
    (the runtime creates both after a grant): for poll predicates, which must not raise."""
    try:
        groups = r.xinfo_groups(stream)
    except redis.ResponseError:  # no such key
        return None
    return next((g for g in groups if g["name"] == group), None)


def pending(r: redis.Redis, stream: str, group: str = "g") -> int:
    """Entries pending in ``group``; -1 while the group does not exist (never equal to a
    count a test waits for, and no exception inside a poll)."""
    info = group_info(r, stream, group)
    return -1 if info is None else int(info["pending"])


def make_grant(prefix: str, shard: str, epoch: int = 1, member: str = "m-1", start: str = "0"):
    from dataplane.membership import Grant
    from dataplane.routing import ShardKeys

    keys = ShardKeys(shard, prefix)
    return Grant(shard, epoch, member, keys.stream, keys.sealed, start, prefix)


@pytest.fixture
def runtimes(redis_url: str) -> Iterator[list]:
    """Runtimes started by a test; all stopped afterwards."""
    started: list = []
    yield started
    for rt in started:
        rt.stop(timeout=5.0)


@pytest.fixture
def start_runtime(redis_url: str, runtimes: list):
    from dataplane.runtime import Runtime, RuntimeConfig

    def _start(handler, group: str = "g", consumer: str = "m-1", **cfg) -> Runtime:
        cfg.setdefault("block_ms", 200)
        cfg.setdefault("retry_backoff_ms", 1)
        rt = Runtime(redis_url, group, consumer, handler, RuntimeConfig(**cfg))
        rt.start()
        runtimes.append(rt)
        return rt

    return _start


class FakeCoordinator:
    """A tiny local HTTP server that speaks just enough of the coordinator API for the
    producer (routing) and the consumer driver (heartbeats) — not the real coordinator."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.routing: dict = {}
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        self.user_agents: list[str | None] = []
        self.heartbeat = self.default_heartbeat
        self.metadata: dict = {}
        self.epoch = 0
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.auth.append(self.headers.get("Authorization"))
                if self.path.endswith("/routing") and fake.routing:
                    self._send(200, fake.routing)
                elif self.path.startswith("/api/v1/groups/") and fake.metadata:
                    # describe (the CLI's start-up check): just enough of it
                    md = fake.metadata
                    self._send(200, {"group": md["group"], "stream": md["stream"], "members": []})
                else:
                    self._send(404, {"errorCode": "NOT_FOUND", "errorMessage": self.path})

            def do_POST(self) -> None:
                fake.auth.append(self.headers.get("Authorization"))
                fake.user_agents.append(self.headers.get("User-Agent"))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                status, resp = fake.heartbeat(body)
                self._send(status, resp)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def default_heartbeat(self, req: dict) -> tuple[int, dict]:
        """Grant every shard of the metadata to the (single) member; leave answers -1."""
        if req["memberEpoch"] == -1:
            return 200, self.response(req, -1, [], {"metadataEpoch": 1})
        if req["memberEpoch"] == 0:
            self.epoch += 1
        from dataplane.routing import document_versions

        shards = [s for v in document_versions(self.metadata) for s in v.shard_ids()]
        md = self.metadata if req["memberEpoch"] == 0 else {"metadataEpoch": 1}
        return 200, self.response(req, self.epoch, shards, md)

    @staticmethod
    def response(req: dict, epoch: int, assigned: list[str], md: dict, status: str = "OK"):
        return {
            "errorCode": "NONE",
            "errorMessage": None,
            "status": status,
            "memberId": req["memberId"],
            "memberEpoch": epoch,
            "assignmentEpoch": epoch,
            "heartbeatIntervalMs": 100,
            "assignment": {"assignedShards": assigned, "pendingShards": [], "revokingShards": []},
            "metadata": md,
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def routing_doc(stream: str, prefix: str, *versions: dict, write: int) -> dict:
    """The coordinator's routing document (GET /api/v1/streams/{s}/routing)."""
    return {
        "stream": stream,
        "writeVersion": write,
        "metadataEpoch": write,
        "state": "STABLE",
        "hash": "blake2b-64",
        "keyPrefix": prefix,
        "versions": list(versions),
    }


def version_doc(stream: str, version: int, count: int, prefix: str, parents: bool = False):
    """A version entry as the coordinator writes it (§3): its shape, not its shards."""
    from dataplane.routing import ShardVersion

    parent = (version - 1, 1) if parents else (None, None)
    return ShardVersion(stream, version, count, "ACTIVE", *parent, key_prefix=prefix).document()


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    fake = FakeCoordinator()
    yield fake
    fake.close()


def _free_port() -> int:
    """A loopback port that is free, and whose cluster bus port (port + 10000) is free too."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 55000:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:  # taken (an outgoing connection's port, say): another one
                continue
        return port


def _start_cluster_node(tmp_path_factory) -> tuple[int, subprocess.Popen]:
    """A cluster-enabled redis-server on a free port, answering PING. Between choosing a port
    and binding it another process of the machine may take the port or its bus port: then
    the server exits, and another port is tried (its last words are in the failure)."""
    for _attempt in range(10):
        port = _free_port()
        d = tmp_path_factory.mktemp(f"cluster-{port}")
        log = d / "redis.log"
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", str(d / "nodes.conf"), "--dir", str(d), "--save", "",
             "--appendonly", "no", "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def up(p: int = port, server: subprocess.Popen = proc) -> bool:
            if server.poll() is not None:  # exited: no use waiting
                return True
            ping = subprocess.run(["redis-cli", "-p", str(p), "ping"], capture_output=True,
                                  text=True)
            return ping.stdout.strip() == "PONG"

        wait_until(up, timeout=20, interval=0.05, what=f"node {port}")
        if proc.poll() is None:
            return port, proc
    raise AssertionError(f"no cluster node started; the last one said: {log.read_text()[-500:]}")


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory) -> Iterator[str]:
    """A throw-away 3-primary Redis Cluster on loopback, started from the local redis-server
    binary for this test session only (skipped where there is no redis-server)."""
    import shutil
    import subprocess
    import time

    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("redis-server / redis-cli not installed")
    procs: list[subprocess.Popen] = []
    ports: list[int] = []
    try:
        for _ in range(3):
            port, proc = _start_cluster_node(tmp_path_factory)
            ports.append(port)
            procs.append(proc)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

        def ok() -> bool:
            return all(
                "cluster_state:ok"
                in subprocess.run(
                    ["redis-cli", "-p", str(p), "cluster", "info"], capture_output=True, text=True
                ).stdout
                for p in ports
            )

        wait_until(ok, timeout=30, interval=0.1, what="cluster_state:ok")
        time.sleep(0)  # (no blind sleeps: readiness is polled above)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
