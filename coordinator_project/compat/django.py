"""Django internals the coordinator uses (checked by tests/unit/test_compat.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.handlers.base import BaseHandler
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpResponseBase


def add_closer(response: HttpResponseBase, closer: Callable[[], None]) -> None:
    """Run `closer` when the server closes `response`, after Django's own closers
    (`HttpResponseBase._resource_closers`: close() runs them in order, then clears the list)."""
    response._resource_closers.append(closer)  # type: ignore[attr-defined]


def mark_logged(response: HttpResponseBase) -> None:
    """Tell django.utils.log.log_response that this response was logged already (its
    `_has_been_logged` flag), so django.request writes no second line for it."""
    response._has_been_logged = True  # type: ignore[attr-defined]


def outermost_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the innermost atomic block open on `connection` is its only one: ending it ends
    the transaction (`BaseDatabaseWrapper.atomic_blocks`, the stack of open atomic blocks)."""
    blocks: list[Any] = connection.atomic_blocks
    return len(blocks) == 1


def load_middleware_of(handler: BaseHandler, middleware: list[str]) -> None:
    """`handler.load_middleware()` over `middleware` instead of settings.MIDDLEWARE, which
    `BaseHandler.load_middleware` reads: the setting is swapped while it runs (at process
    start, before any request)."""
    from django.conf import settings

    configured = settings.MIDDLEWARE
    settings.MIDDLEWARE = middleware
    try:
        handler.load_middleware()
    finally:
        settings.MIDDLEWARE = configured


def problems() -> list[str]:
    """What this module relies on and the installed Django lacks."""
    found = []
    if not isinstance(getattr(HttpResponseBase(), "_resource_closers", None), list):
        found.append("HttpResponseBase._resource_closers (a list) is gone")
    import inspect

    from django.utils import log

    if "_has_been_logged" not in inspect.getsource(log.log_response):
        found.append("django.utils.log.log_response no longer reads response._has_been_logged")
    from django.db import connection

    if not isinstance(getattr(connection, "atomic_blocks", None), list):
        found.append("BaseDatabaseWrapper.atomic_blocks (a list) is gone")
    if "settings.MIDDLEWARE" not in inspect.getsource(BaseHandler.load_middleware):
        found.append("django.core.handlers.base.BaseHandler.load_middleware no longer reads settings.MIDDLEWARE")
    return found
