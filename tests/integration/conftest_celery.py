"""Fixtures of the sweep/resharding tests: a real Celery worker and beat, in this process, on
the real Redis broker; and the stream Redis (seal markers), cleaned after each test.

The app is configured from the project's settings (so the real CELERY_BEAT_SCHEDULE and task
names are what runs), with two changes: a queue of its own on the test Redis database, so no
other worker consumes these tasks, and a short tick so tests finish quickly.
Use with `pytest_plugins = ["tests.integration.conftest_celery"]`.
"""
from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.beat import EmbeddedService
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connections

import groups.tasks  # noqa: F401  (registers the shared tasks before the app is finalised)
import members.tasks  # noqa: F401
from tests.redis_keys import delete_keys

TICK_SECONDS = 0.3


@pytest.fixture
def stream_redis() -> Iterator[redis.Redis]:
    """The Redis at STREAM_REDIS_URL; test streams are named rs-*, their keys (under each test
    database's own prefix, rsc-<id8>) removed after."""
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    yield client
    delete_keys(client, "rsc*:{rs-*")
    client.close()


@dataclass
class CeleryRig:
    app: Celery
    queue: str
    tick: float


def _close_thread_connections(**_: Any) -> None:
    # The worker thread's connections would outlive the test and keep the test database busy.
    connections.close_all()


@pytest.fixture
def celery_beat_worker(transactional_db: None) -> Iterator[CeleryRig]:
    queue = f"rsc-test-{uuid.uuid4().hex[:12]}"
    app = Celery("rsc-test", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    schedule = copy.deepcopy(settings.CELERY_BEAT_SCHEDULE)
    for entry in schedule.values():
        entry["schedule"] = TICK_SECONDS
        entry["options"] = {**entry.get("options", {}), "expires": 5 * TICK_SECONDS}
    app.conf.update(
        broker_url=settings.REDIS_URL,
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        worker_enable_remote_control=False,
        beat_schedule=schedule,
    )
    signals.task_postrun.connect(_close_thread_connections, weak=False)
    beat = EmbeddedService(app, thread=True, scheduler_cls="celery.beat:Scheduler")
    try:
        with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                          loglevel="WARNING", queues=[queue], shutdown_timeout=15):
            beat.start()
            try:
                yield CeleryRig(app, queue, TICK_SECONDS)
            finally:
                beat.stop()
                beat.join(10)
    finally:
        signals.task_postrun.disconnect(_close_thread_connections)
        client = redis.Redis.from_url(settings.REDIS_URL)
        delete_keys(client, f"*{queue}*")
        client.close()
