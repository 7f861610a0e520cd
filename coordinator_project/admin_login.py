"""Admin login protection (issue 27.2): password hashing off the gevent loop, throttled lines for
failed and locked-out logins, and the lockout answer. Decision: docs/decisions/0017-admin-login-hashing.md.

- `OffLoopPBKDF2PasswordHasher` is Django's PBKDF2 hasher (same algorithm name, same hashes)
  whose key derivation runs in a small pool of real OS threads when the process is a gevent
  worker. A check (~250 ms of CPU) used to run on the worker's loop: every heartbeat of that
  worker waited behind it, and 40 concurrent wrong passwords took a heartbeat's p50 to 22 s.
  hashlib releases the GIL while it derives, so the loop keeps serving. Before it waits, the
  request hands its pooled database connections back (coordinator_project.dbpool): a login
  no longer holds one of the worker's two "default" connections for the length of a hash.
  The pool's threads run at a lower CPU priority (nice ADMIN_HASH_THREAD_NICE): on a busy
  machine the loop's short bursts come first, the hashes wait. Everywhere else (manage.py,
  Celery, the sync worker, tests) it hashes inline, as Django does.
- Throttling is django-axes (settings: LOGIN_FAILURE_LIMIT, LOGIN_COOLOFF_MINUTES): its backend
  refuses a locked-out account or address before any hash is computed.
- `log_failed_login` writes one WARNING line per failed login with the username and the client
  address, at most one per address per 10 s with the count of the lines held back (the same
  throttle as the other refusal lines); a lockout is one line per address per 10 s too.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.signals import user_login_failed
from django.db import connections
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from gevent import monkey

from coordinator_project import dbpool
from coordinator_project.logging import LogThrottle
from coordinator_project.process_state import PROCESS
from dataplane.protocol import ErrorCode

log = logging.getLogger("coordinator_project.admin_login")

T = TypeVar("T")


class _HashThreads:
    """This process's hashing threads: created on first use (after gunicorn forked the worker),
    ADMIN_HASH_THREADS of them."""

    def __init__(self) -> None:
        self.pool: Any = None

    def get(self) -> Any:
        if self.pool is None:
            from gevent.threadpool import ThreadPool

            self.pool = ThreadPool(maxsize=max(1, settings.ADMIN_HASH_THREADS))
        return self.pool

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.kill()


_hash_threads = _HashThreads()
_threads = PROCESS.own(
    "password hashing threads", _hash_threads,
    "Real OS threads that derive password hashes off the gevent loop (issue 27.2)."
    " key: none (one pool); bound: ADMIN_HASH_THREADS threads, callers queue; invalidated: never"
    " (they hold no data; reset and close stop them, a login waiting on one then meets its deadline);"
    " N hosts: per process by design (CPU work, no shared state).",
    reset=_hash_threads.close, close=_hash_threads.close,
)

_login_lines = PROCESS.own(
    "failed login log throttle", LogThrottle(every=10.0),
    "One line per client address per 10 s for failed and locked-out admin logins."
    " key: ('failed' or 'locked', client address) -> when its last line was logged, lines held since;"
    " bound: 1,000 keys, then emptied; invalidated: every 10 s per key; N hosts: per process by design"
    " (each logs its own lines).",
)


def _cooperative() -> bool:
    return bool(monkey.is_module_patched("socket"))


def _low_priority(fn: Callable[..., T], *args: Any) -> T:
    nice = settings.ADMIN_HASH_THREAD_NICE
    if nice:
        try:
            # Linux: PRIO_PROCESS with who=0 sets the calling thread's nice value (per thread).
            current = os.getpriority(os.PRIO_PROCESS, 0)
            if current < nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            pass
    return fn(*args)


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a hashing thread under a gevent worker (after handing back this request's
    pooled database connections), inline elsewhere."""
    if not _cooperative():
        return fn(*args)
    for alias in connections:
        dbpool.release(alias)
    result: T = _threads.get().apply(_low_priority, (fn, *args))
    return result


class OffLoopPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2-SHA256 hasher (algorithm "pbkdf2_sha256": stored hashes stay valid), with
    the derivation off the gevent loop. verify(), make_password() and the dummy hash that Django
    computes for an unknown username all go through encode()."""

    def encode(self, password: str, salt: str, iterations: int | None = None) -> str:
        return off_loop(super().encode, password, salt, iterations)


def client_address(request: HttpRequest | None) -> str:
    """REMOTE_ADDR (behind a proxy, the proxy's address, as for the join limits)."""
    if request is None:
        return "-"
    return str(request.META.get("REMOTE_ADDR") or "-")


def _log(kind: str, address: str, message: str, *args: Any) -> None:
    held = _login_lines.allow((kind, address))
    if held is not None:
        suffix = f" ({held} more from this address not logged in the last {_login_lines.every:g} s)" if held else ""
        log.warning(message + "%s", *args, suffix)


@receiver(user_login_failed, dispatch_uid="rsc-failed-login-line")
def log_failed_login(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None,
                     **kwargs: Any) -> None:
    username = str(credentials.get("username", ""))[:150]
    address = client_address(request)
    if request is not None and getattr(request, "axes_locked_out", False):
        _log("locked", address, "admin login refused, locked out: username=%r client=%s", username, address)
    else:
        _log("failed", address, "admin login failed: username=%r client=%s", username, address)


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """axes' AXES_LOCKOUT_CALLABLE: 429 with Retry-After; JSON (errorCode RATE_LIMITED) for a
    client that asks for JSON, else a short HTML page."""
    retry_after = int(settings.LOGIN_COOLOFF_MINUTES * 60) or None
    message = ("Too many failed logins for this account or from this address. "
               + (f"Try again in {settings.LOGIN_COOLOFF_MINUTES:g} minutes." if retry_after
                  else "An administrator must unlock it (manage.py axes_reset_username or axes_reset_ip)."))
    accept = request.META.get("HTTP_ACCEPT", "")
    response: HttpResponse
    if "application/json" in accept or request.META.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest":
        response = JsonResponse({"errorCode": ErrorCode.RATE_LIMITED.value, "errorMessage": message}, status=429)
    else:
        response = HttpResponse(render_to_string("admin/login_locked_out.html", {"message": message}, request),
                                status=429)
    if retry_after:
        response["Retry-After"] = str(retry_after)
    return response
