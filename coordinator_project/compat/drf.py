"""Django REST framework internals the coordinator uses (checked by tests/unit/test_compat.py)."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework.request import Request


def http_request(request: Request) -> HttpRequest:
    """The Django request a DRF Request wraps (`Request._request`): reading it directly skips
    DRF's attribute proxy, which is slow on the heartbeat path."""
    return request._request


def parsed_data(request: Request | None) -> Any:
    """The body DRF parsed for this request, or None if the view never parsed it (an
    unauthenticated body is never parsed for a log line): `Request._full_data`, set only by
    parsing (reading `request.data` would parse it)."""
    data = getattr(request, "_full_data", None)
    return None if data is _EMPTY else data


def _empty_marker() -> object:
    from rest_framework.request import Empty

    return Empty


_EMPTY = _empty_marker()


def problems() -> list[str]:
    """What this module relies on and the installed DRF lacks."""
    from django.test import RequestFactory

    found = []
    raw = RequestFactory().post("/", data=b"{}", content_type="application/json")
    request = Request(raw)
    if getattr(request, "_request", None) is not raw:
        found.append("rest_framework.request.Request._request no longer holds the Django request")
    if not hasattr(request, "_full_data"):
        found.append("rest_framework.request.Request._full_data is gone")
    return found
