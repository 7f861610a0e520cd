"""Fixtures for tests against the real database and, where needed, a live gunicorn server."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from rest_framework.test import APIClient

import assignments.fastpath  # noqa: F401 - its state is owned by PROCESS from import on
from coordinator_project.process_state import PROCESS
from dataplane.routing import ShardKeys
from groups.services import create_api_key, create_group, create_stream

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    # Every per-process cache starts empty (coordinator_project.process_state); afterwards
    # the batched last-seen stamps (assignments.fastpath) land in the test that caused them.
    PROCESS.reset()
    yield
    PROCESS.reset()


@pytest.fixture(scope="session", autouse=True)
def _process_closed(django_db_setup: None) -> Iterator[None]:
    # The stamp thread's database connection would keep the test database from being dropped.
    yield
    PROCESS.close()


@dataclass
class GroupFixture:
    stream: str
    group: str
    key: str
    stream_key: str  # produce: routing only
    admin_key: str  # stream admin: routing and reshard

    def url(self, suffix: str = "/heartbeat") -> str:
        return f"/api/v1/groups/{self.group}{suffix}"

    def keys(self, shard: str) -> ShardKeys:
        """A shard's Redis keys under the stream's key prefix (the installation's namespace)."""
        from groups.models import Stream

        return ShardKeys(shard, Stream.objects.get(name=self.stream).key_prefix)

    def drop_consumer_groups(self, r: Any) -> None:
        """XGROUP DESTROY the consumer groups the coordinator made with the group (issue 27.6):
        Redis as members left it before the coordinator made them (a shard nobody read has
        none), for tests that set positions up by hand."""
        from groups.models import Shard

        for sid in Shard.objects.filter(version__stream__name=self.stream).values_list("shard_id", flat=True):
            r.xgroup_destroy(self.keys(sid).stream, self.group)


def make_group(stream: str = "orders", group: str = "g1", shards: int = 4, **config: Any) -> GroupFixture:
    create_stream(stream, shards)
    create_group(group, stream, **config)
    return GroupFixture(stream, group, create_api_key(group=group), create_api_key(stream=stream),
                        create_api_key(stream=stream, scope="admin"))


@contextmanager
def group_on_fresh_stream(prefix: str, group: str, shards: int = 4, **config: Any) -> Iterator[GroupFixture]:
    """A group on a uniquely named stream; afterwards its Redis keys and the per-process shard
    figures are dropped (no FLUSHDB: other tests share the Redis database)."""
    import redis
    from django.conf import settings

    from groups import shardstats

    shardstats.clear_cache()
    stream = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        yield make_group(stream, group.format(stream=stream), shards=shards, **config)
    finally:
        client = redis.Redis.from_url(settings.STREAM_REDIS_URL)
        for key in client.scan_iter(f"rsc*:{{{stream}:*"):
            client.delete(key)
        client.close()
        shardstats.clear_cache()


@pytest.fixture
def orders(db: None) -> GroupFixture:
    return make_group()


@pytest.fixture
def api() -> APIClient:
    return APIClient()


class Hb:
    """Heartbeat helper over the Django test client."""

    def __init__(self, client: APIClient, fx: GroupFixture) -> None:
        self.client, self.fx = client, fx

    def __call__(self, body: Any, key: str | None = None, raw: bool = False) -> tuple[int, dict[str, Any]]:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key or self.fx.key}"}
        if raw:
            r = self.client.generic("POST", self.fx.url(), body, content_type="application/json", **headers)
        else:
            r = self.client.post(self.fx.url(), body, format="json", **headers)
        return r.status_code, r.json()


@pytest.fixture
def hb(api: APIClient, orders: GroupFixture) -> Hb:
    return Hb(api, orders)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_database_url() -> str:
    """The URL of the database the tests run in (pytest-django's test_ database)."""
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def running_gunicorn(port: int | None = None, log_file: Path | None = None, **extra_env: str) -> Iterator[LiveServer]:
    """Real gunicorn with the shipped config (2 gevent workers) on the test database (on
    ``port``: a restart where clients already point; its output to ``log_file`` if given)."""
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": live_database_url(), "PYTHONUNBUFFERED": "1", **extra_env}
    log = log_file.open("ab") if log_file is not None else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py", "-w", "2",
         "-b", f"127.0.0.1:{port}", "--log-level", "warning", "coordinator_project.wsgi"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT if log is not None else None,
    )
    url = f"http://127.0.0.1:{port}"
    # A deadline, not an expectation: ~2 s on a quiet machine, but four xdist workers starting
    # servers at once on 2 loaded cores took over 30 s (the suite then erred in setup).
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass  # not listening yet
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("gunicorn did not start")
        time.sleep(0.05)  # poll interval of a deadline loop
    try:
        yield LiveServer(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log is not None:
            log.close()


@pytest.fixture
def gunicorn_server(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    with running_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus")) as server:
        yield server
