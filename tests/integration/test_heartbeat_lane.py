"""The heartbeat route passes only the middleware it uses (coordinator_project.handler): not the
admin's sessions, CSRF checks, users, messages, frame options, login lockouts or static files,
~10 % of a heartbeat's CPU. Every other request, and every other middleware, runs as configured.
Through the shipped WSGI handler, in this process, against the test database."""
from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.test import override_settings

from coordinator_project.handler import HEARTBEAT_SKIPS, ReleasingWSGIHandler, heartbeat_middleware

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def call(handler: ReleasingWSGIHandler, method: str, path: str, body: bytes = b"",
         key: str = "") -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_NAME": "localhost", "SERVER_PORT": "80",
        "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": f"Bearer {key}",
    }
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=status, headers={k.lower(): v for k, v in headers})

    response = handler(environ, start_response)
    try:
        content = b"".join(response)
    finally:
        response.close()
    return started["status"], started["headers"], content


def test_a_heartbeat_skips_the_admins_middleware_and_keeps_the_rest(orders):
    handler = ReleasingWSGIHandler()
    body = json.dumps({"memberId": "a", "memberEpoch": 0}).encode()
    status, headers, content = call(handler, "POST", orders.url(), body, orders.key)
    assert status.startswith("200"), content
    assert json.loads(content)["errorCode"] == "NONE"
    assert "x-frame-options" not in headers  # XFrameOptionsMiddleware: skipped
    assert "set-cookie" not in headers  # sessions, CSRF: skipped
    assert "vary" not in headers
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware: kept
    assert headers["content-length"] == str(len(content))  # CommonMiddleware: kept
    # The JSON error pages run on the heartbeat route too: a wrong method is a JSON 405.
    status, _h, content = call(handler, "GET", orders.url(), key=orders.key)
    assert status.startswith("405"), content
    assert json.loads(content)["errorCode"], content
    # Every other route passes the whole chain.
    status, headers, _c = call(handler, "GET", "/admin/login/")
    assert status.startswith("200")
    assert headers["x-frame-options"] == "DENY"
    assert "csrftoken" in headers.get("set-cookie", "")


def test_the_heartbeat_lane_keeps_every_middleware_it_does_not_skip_in_its_order():
    custom = "tests.integration.test_heartbeat_lane.Custom"
    with override_settings(MIDDLEWARE=["django.middleware.security.SecurityMiddleware", *sorted(HEARTBEAT_SKIPS),
                                       custom, "django.middleware.common.CommonMiddleware"]):
        assert heartbeat_middleware() == ["django.middleware.security.SecurityMiddleware", custom,
                                          "django.middleware.common.CommonMiddleware"]
