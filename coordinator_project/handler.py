"""The WSGI handler: heartbeats through the middleware they use (HEARTBEAT_SKIPS, decision 0022),
and each finished request's reference cycles released.

Every Django request is a knot of reference cycles: the lazy ``request.user`` closes over the
request, the message storage holds it, a DRF view and its Request point at each other, and a
DRF Response's ``renderer_context`` holds the response itself. So no request is freed when it
ends; the cyclic collector frees it later. A gevent worker keeps many requests in flight,
and a request that is still in flight at a collection survives into an older generation:
measured at 1,000 members, every heartbeat left ~67 objects for the collector, gen-1 and
gen-2 collections took ~8 % of a worker, and each gen-2 pass (~40 ms) stalled every request
of the worker. Releasing the cycles once the response is closed lets reference counting free
the request at once.
"""
from __future__ import annotations

import functools
import re
from typing import Any

from django.conf import settings
from django.core.handlers.base import BaseHandler
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponseBase

from coordinator_project.compat.django import add_closer, load_middleware_of


def release_cycles(request: HttpRequest, response: HttpResponseBase) -> None:
    """Empties the finished request's objects, which breaks the cycles through them. Runs as
    the response's last closer: after Django's own (``request.close`` closes uploaded files),
    when the server has sent the response and nothing reads these objects again."""
    context: dict[str, Any] | None = getattr(response, "renderer_context", None)  # DRF's
    if context:
        for obj in (context.get("view"), context.get("request")):
            if obj is not None:
                vars(obj).clear()
        context.clear()
    vars(request).clear()


# What the heartbeat route skips of settings.MIDDLEWARE: the admin's sessions, CSRF checks,
# users, messages, frame options and login lockouts, and static files. A heartbeat uses none of
# them (API keys authenticate it, its view is CSRF-exempt, its answer is JSON), and it is nearly
# every request a coordinator serves: they were ~10 % of its CPU (bench/RESULTS.md, 2026-12-06).
# Every other middleware, an operator's own included, runs on it as configured.
HEARTBEAT_SKIPS = frozenset({
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
})
# coordinator_project.urls' heartbeat route, matched whole (test_heartbeat_lane posts to the
# route's URL and fails if the two part).
HEARTBEAT_PATH = re.compile(r"/api/v1/groups/[^/]+/heartbeat")


def heartbeat_middleware() -> list[str]:
    """settings.MIDDLEWARE without HEARTBEAT_SKIPS, in its order."""
    return [path for path in settings.MIDDLEWARE if path not in HEARTBEAT_SKIPS]


class _Lane(BaseHandler):
    """A second middleware chain of the same handler, for one route."""

    def __init__(self, middleware: list[str]) -> None:
        super().__init__()
        load_middleware_of(self, middleware)


class ReleasingWSGIHandler(WSGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async)
        self._heartbeat_lane = _Lane(heartbeat_middleware())

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        if HEARTBEAT_PATH.fullmatch(request.path_info):
            response = self._heartbeat_lane.get_response(request)
        else:
            response = super().get_response(request)
        # After Django's request.close; close() clears its closers, which also ends the
        # cycle this partial makes through the response.
        add_closer(response, functools.partial(release_cycles, request, response))
        return response
