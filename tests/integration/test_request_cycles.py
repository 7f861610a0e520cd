"""Finished requests are freed by reference counting, not left to the cyclic collector
(coordinator_project.handler): under gevent, requests still in flight at a collection reach the
older generations, whose collections stall every request of the worker."""
from __future__ import annotations

import gc
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from coordinator_project.handler import ReleasingWSGIHandler
from tests.integration.conftest import GroupFixture


@contextmanager
def _in_test_transaction() -> Iterator[None]:
    # As Django's test client does: the handler's signals would close the test's connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _call(app: WSGIHandler, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[str, bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_NAME": "testserver", "SERVER_PORT": "80",
        "HTTP_HOST": "testserver", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(), "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
        **headers,
    }
    status: list[str] = []
    result = app(environ, lambda s, h, exc_info=None: status.append(s))
    try:
        content = b"".join(result)
    finally:
        result.close()  # as every WSGI server does once the response is sent
    return status[0], content


def _unreachable_after(app: WSGIHandler, requests: int, send: Any) -> int:
    """Objects the collector finds unreachable after `requests` requests, with it disabled."""
    send(app)  # first-use caches (snapshots, URL resolvers) are not garbage
    gc.collect()
    gc.disable()
    try:
        for _ in range(requests):
            send(app)
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.django_db
def test_finished_heartbeat_is_freed_without_the_collector(orders: GroupFixture) -> None:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {orders.key}"}
    join = json.dumps({"memberId": "m-cycles", "memberEpoch": 0, "ownedShards": []}).encode()
    with _in_test_transaction():
        status, content = _call(ReleasingWSGIHandler(), "POST", orders.url(), join, **auth)
        assert status.startswith("200"), content
        epoch = json.loads(content)["memberEpoch"]
        body = json.dumps({"memberId": "m-cycles", "memberEpoch": epoch, "ownedShards": []}).encode()

        def heartbeat(app: WSGIHandler) -> None:
            status, content = _call(app, "POST", orders.url(), body, **auth)
            assert status.startswith("200"), content
            assert json.loads(content)["errorCode"] == "NONE", content

        released = _unreachable_after(ReleasingWSGIHandler(), 20, heartbeat)
        stock = _unreachable_after(WSGIHandler(), 20, heartbeat)
    # Django's own handler leaves each heartbeat's objects to the collector (~60 per request):
    # the control shows this test can tell the two apart.
    assert stock >= 20 * 20, stock
    assert released < 20, released


@pytest.mark.django_db
def test_released_admin_page_is_answered_in_full_with_fewer_cycles() -> None:
    # Sessions, messages and the lazy user (the middleware's cycles) on a page that renders.
    def login_page(app: WSGIHandler) -> None:
        status, content = _call(app, "GET", "/admin/login/")
        assert status.startswith("200"), status
        assert b"</html>" in content

    with _in_test_transaction():
        released = _unreachable_after(ReleasingWSGIHandler(), 5, login_page)
        stock = _unreachable_after(WSGIHandler(), 5, login_page)
    # Template rendering makes cycles of its own (left to the collector: the admin is not a
    # hot path); the request's are gone.
    assert released < stock, (released, stock)
