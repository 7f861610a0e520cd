"""Issue 8.8: a beat tick published during a Redis restart is retried, not dropped.

Uses a redis-server of its own on a free port (never the shared one): the broker goes away,
a sweep task is published meanwhile (as beat would), Redis comes back — first refusing
connections, then loading its dataset — and the message arrives.
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from .conftest import free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

QUEUE = "rsc-publish-retry"
OUTAGE_SECONDS = 3.0  # longer than Celery's default publish retry (3 retries, ~0.6 s)


class OwnRedis:
    def __init__(self, port: int, workdir: Path) -> None:
        self.port, self.workdir = port, workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.workdir),
             "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no", "--enable-debug-command", "local"],
            stdout=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=60)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(free_port(), tmp_path)
    server.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            server.client().ping()
            break
        except redis.RedisError:
            assert time.monotonic() < deadline, "own redis-server did not start"
            time.sleep(0.05)  # poll interval of a deadline loop
    yield server
    server.stop()


def project_app(broker_url: str) -> Celery:
    """The project's Celery settings (retry policy included), on our own broker."""
    app = Celery("rsc-publish-retry", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(broker_url=broker_url, task_default_queue=QUEUE)
    return app


def test_beat_publish_outlasts_a_redis_restart(own_redis: OwnRedis):
    # A dataset big enough that the restarted server spends a moment loading it.
    own_redis.client().execute_command("DEBUG", "POPULATE", "500000", "k", "64")
    own_redis.client().save()
    app = project_app(f"redis://127.0.0.1:{own_redis.port}/0")
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
    own_redis.stop()

    outcome: dict[str, object] = {}

    def publish() -> None:
        try:
            app.send_task("members.tasks.sweep_liveness", expires=60)
            outcome["ok"] = True
        except Exception as exc:  # the test reports what the publisher saw
            outcome["error"] = repr(exc)

    publisher = threading.Thread(target=publish)
    publisher.start()
    time.sleep(OUTAGE_SECONDS)  # the outage itself (the publisher retries meanwhile)
    own_redis.start()
    publisher.join(60)
    assert outcome == {"ok": True}
    assert own_redis.client().llen(QUEUE) == 1

