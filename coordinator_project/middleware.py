"""A database that is down, wrong or too slow answers 503 with Retry-After.

The request could not be served now and may well be later: the data-plane library retries
5xx with backoff, and a load balancer sees the 503. Not a 500 (nothing is wrong with the
request or the code) and not a hang (connect and statement timeouts in settings).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

from coordinator_project import errors
from coordinator_project.logging import LogThrottle
from coordinator_project.migration_state import is_not_migrated
from coordinator_project.process_state import PROCESS
from dataplane.protocol import ErrorCode
from groups.api_errors import error_body

log = logging.getLogger(__name__)


_not_migrated_lines = PROCESS.own(
    "not-migrated log throttle", LogThrottle(every=10.0),
    "One warning line per 10 s while the database lacks this release's tables."
    " key: one constant -> when its last line was logged, lines held since; bound: one key;"
    " invalidated: every 10 s; N hosts: per process by design (each logs its own lines).",
)


def unavailable_response(exc: BaseException, *, not_migrated: bool = False) -> JsonResponse:
    """The 503; `not_migrated`: the cause is this release's schema missing (`is_not_migrated`)."""
    if not_migrated:
        held = _not_migrated_lines.allow("not-migrated")
        if held is not None:
            log.warning("database not migrated, answering 503: run manage.py migrate (%s: %s)%s",
                        exc.__class__.__name__, str(exc).splitlines()[0] if str(exc) else "",
                        f" ({held} more not logged in the last 10 s)" if held else "")
        message = "the coordinator's database is not migrated: run manage.py migrate; retry later"
    else:
        log.warning("database unavailable, answering 503: %s: %s", exc.__class__.__name__, exc)
        # The class name only: the driver's message can name hosts and users.
        message = f"the coordinator's database is unavailable ({exc.__class__.__name__}); retry later"
    response = JsonResponse(error_body(ErrorCode.COORDINATOR_UNAVAILABLE, message), status=503)
    response["Retry-After"] = str(settings.DB_RETRY_AFTER_SECONDS)
    return response


# Connection refused or lost, no such database, connect or statement timeout, deadlock: the
# request may succeed later. Other database errors (bad data) are not the database's outage.
UNAVAILABLE_ERRORS = (OperationalError, InterfaceError)


class DatabaseUnavailableMiddleware:
    """Turns a view's database outage (DRF re-raises it, see groups.api_errors) into the 503."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        # Decided once per request: for a missing column it reads the applied migrations.
        not_migrated = is_not_migrated(exc)
        if not_migrated or isinstance(exc, UNAVAILABLE_ERRORS):
            return unavailable_response(exc, not_migrated=not_migrated)
        return None


class JsonErrorPagesMiddleware:
    """A 405 from a function view (Django's empty HTML answer) becomes the JSON error body;
    the admin keeps Django's. Unknown URLs and other error pages: coordinator_project.errors."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (response.status_code == 405 and not request.path.startswith(errors.ADMIN_PREFIX)
                and not response.get("Content-Type", "").startswith("application/json")):
            return errors.method_not_allowed(response)
        return response
