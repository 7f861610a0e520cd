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
from dataplane.protocol import ErrorCode
from groups.api_errors import error_body

log = logging.getLogger(__name__)


def unavailable_response(exc: BaseException) -> JsonResponse:
    # The class name only: the driver's message can name hosts and users.
    log.warning("database unavailable, answering 503: %s: %s", exc.__class__.__name__, exc)
    response = JsonResponse(
        error_body(ErrorCode.COORDINATOR_UNAVAILABLE, f"the coordinator's database is unavailable "
                   f"({exc.__class__.__name__}); retry later"),
        status=503,
    )
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
        if isinstance(exc, UNAVAILABLE_ERRORS):
            return unavailable_response(exc)
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
