"""Which group a request's API key may use (the heartbeat and describe views).

Not in groups.auth: DRF imports that module (DEFAULT_AUTHENTICATION_CLASSES) while
`rest_framework.views` is itself being imported, so it must not import anything that needs
`rest_framework.views` (groups.api_errors does).
"""
from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from dataplane.protocol import ErrorCode
from groups.api_errors import error_body
from groups.auth import require_scope
from groups.selectors import group_exists
from groups.services import KeyScope, url_name_problem


def authorize_group(request: Request, group: str) -> Response | None:
    """401 without a key, 400 for a name no group can have, 404 for no such group, 403 for
    another group's key."""
    scope: KeyScope = require_scope(request)
    if scope.group == group:
        return None
    problem = url_name_problem("group", group)
    if problem is not None:
        return Response(error_body(ErrorCode.INVALID_REQUEST, problem), 400)
    if not group_exists(group):
        return Response(error_body(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist"), 404)
    return Response(
        error_body(ErrorCode.AUTHORIZATION_FAILED, f"this API key does not grant access to group {group!r}"), 403
    )
