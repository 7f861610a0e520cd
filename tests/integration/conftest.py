"""Fixtures for tests against the real database and, where needed, a live gunicorn server."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

import assignments.fastpath  # noqa: F401 - its state is owned by PROCESS from import on
from coordinator_project.process_state import PROCESS
from dataplane.routing import ShardKeys
from groups.services import create_api_key, create_group, create_stream
from tests import plain_http, spawn
from tests.ports import free_port
from tests.redis_keys import delete_stream_keys

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

    from groups import shardstats

    shardstats.clear_cache()
    stream = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        yield make_group(stream, group.format(stream=stream), shards=shards, **config)
    finally:
        delete_stream_keys(stream)
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


def poll(predicate: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Whether `predicate` came true within `seconds`, asked every `interval` (a poll with a
    deadline; the caller asserts, with what it saw)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def live_database_url() -> str:
    """The URL of the database the tests run in (pytest-django's test_ database)."""
    return server_url(connection.settings_dict["NAME"])


def server_url(name: str) -> str:
    """A URL of database `name` on the server the tests run on."""
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{name}"


@dataclass
class FreshInstall:
    """An empty database of its own and an env file naming it, as an operator starts with."""
    db: str
    url: str  # where BIND puts gunicorn
    env_file: Path
    env: dict[str, str]  # this process's environment without the settings the env file gives

    def sql(self, query: str) -> Any:
        with psycopg.connect(server_url(self.db).replace("postgres://", "postgresql://")) as c:
            return c.execute(query).fetchone()


@contextmanager
def fresh_install(tmp_path: Path, prefix: str, *settings: str) -> Iterator[FreshInstall]:
    """CREATE a database `prefix_<random>`, write SECRET_KEY, DATABASE_URL, REDIS_URL, BIND and
    `settings` (NAME=value lines) to an env file RSC_ENV_FILE names; DROP the database after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = server_url("postgres").replace("postgres://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    port = free_port()
    env_file = tmp_path / "coordinator.env"
    env_file.write_text("\n".join([
        "SECRET_KEY=" + uuid.uuid4().hex * 2, f"DATABASE_URL={server_url(name)}",
        f"REDIS_URL={os.environ.get('REDIS_URL', 'redis://127.0.0.1:6379/0')}", f"BIND=127.0.0.1:{port}",
        *settings, "",
    ]))
    env = {k: v for k, v in os.environ.items()
           if k not in {"SECRET_KEY", "DATABASE_URL", "DEBUG", "DJANGO_SETTINGS_MODULE", "CELERY_NAMESPACE"}}
    env["RSC_ENV_FILE"] = str(env_file)
    try:
        yield FreshInstall(name, f"http://127.0.0.1:{port}", env_file, env)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def running_gunicorn(port: int | None = None, log_file: Path | None = None, quick_stop: bool = False,
                     workers: int = 2, new_interpreter: bool = False, **extra_env: str) -> Iterator[LiveServer]:
    """Real gunicorn with the shipped config (2 gevent workers) on the test database (on
    ``port``: a restart where clients already point; its output to ``log_file`` if given).
    Stopped gracefully (SIGTERM: requests in progress finish), or with ``quick_stop`` at once
    (SIGQUIT), where what is still queued is a flood nobody waits for. ``workers=1`` where
    nothing the test proves spans workers: a worker's start is ~0.8 CPU-s of loading Django,
    and the suite is CPU-bound (docs/decisions/0019)."""
    env = {**os.environ, "DATABASE_URL": live_database_url(), "PYTHONUNBUFFERED": "1", **extra_env}
    log = log_file.open("ab") if log_file is not None else None
    proc, port = start_gunicorn(port, workers, env, log=log, new_interpreter=new_interpreter)
    url = f"http://127.0.0.1:{port}"
    try:
        yield LiveServer(url, proc)
    finally:
        proc.send_signal(signal.SIGQUIT if quick_stop else signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log is not None:
            log.close()


def start_gunicorn(port: int | None, workers: int, env: dict[str, str], *, log: Any = None,
                   new_interpreter: bool = False, new_session: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """gunicorn with the shipped config on `port`, or on a free port, once it answers /healthz
    there: the process and its port. A free port can be taken by another xdist worker's server
    before this one binds it, and that server then answers the readiness poll (seen once in CI:
    a test read another test's database); so the port must be this master's (`listens_on`), or
    another free port is tried. A given port (a restart where clients point) is not moved."""
    for _ in range(1 if port else 3):
        chosen = port or free_port()
        # Forked from the test zygote (tests/spawn.py) unless the test measures the master's
        # own start (new_interpreter): there the libraries are loaded already.
        proc = (subprocess.Popen if new_interpreter else spawn.Popen)(
            [sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py", "-w", str(workers),
             "-b", f"127.0.0.1:{chosen}", "--log-level", "warning", "coordinator_project.wsgi"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT if log is not None else None,
            start_new_session=new_session,
        )
        # A deadline, not an expectation: ~2 s on a quiet machine, but four xdist workers
        # starting servers at once on 2 loaded cores took over 30 s (the suite then erred).
        deadline = time.monotonic() + 90
        while not _answers(chosen):
            if proc.poll() is not None or time.monotonic() > deadline:
                _kill(proc, new_session)
                raise RuntimeError(f"gunicorn on port {chosen} did not start")
            time.sleep(0.05)  # poll interval of a deadline loop
        if listens_on(proc.pid, chosen):
            return proc, chosen
        _kill(proc, new_session)
    raise RuntimeError(f"gunicorn could not listen on {port or 'a free port'}: another process holds it")


def _answers(port: int) -> bool:
    try:
        return plain_http.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False  # not listening yet


def _kill(proc: subprocess.Popen[bytes], group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    proc.wait()


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket that listens on TCP `port` (a gunicorn master
    holds its listener; its workers inherit it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(FileNotFoundError, PermissionError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


@pytest.fixture
def gunicorn_server(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    """The shipped two workers: for what spans workers (R9 under concurrency, caches, slots)."""
    with running_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus")) as server:
        yield server


@pytest.fixture
def one_worker_gunicorn(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    """The shipped config with one worker: a coordinator for members and tools whose tests
    prove nothing about several workers (the end-to-end scenarios)."""
    with running_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"), workers=1) as server:
        yield server
