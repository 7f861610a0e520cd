"""gunicorn and gevent internals the worker relies on (checked by tests/unit/test_compat.py):
the response class `gunicorn.http.wsgi.create` makes for an HTTP/1 request (a module name the
async workers do not let a worker pass), the methods `webserver.response.OneWriteResponse`
overrides, and the count of gevent's event-loop iterations (libev's, not in gevent's loop
interface). Named here so that an upgrade that renames any of it fails by name."""
from __future__ import annotations

import inspect
from typing import Any

from gunicorn.http import wsgi  # type: ignore[import-untyped]

# gunicorn.http.wsgi.Response methods OneWriteResponse overrides (their role must stay).
RESPONSE_METHODS = ("send_headers", "write", "_emit_body", "close")
# Attributes of a response that it reads or swaps (set in gunicorn's __init__).
RESPONSE_ATTRIBUTES = ("sock", "headers_sent", "chunked")


def problems() -> list[str]:
    """What the worker relies on and the installed gunicorn lacks."""
    found = [f"gunicorn.http.wsgi.Response.{name} is gone" for name in RESPONSE_METHODS
             if not callable(getattr(wsgi.Response, name, None))]
    init = inspect.signature(wsgi.Response.__init__).parameters
    if list(init)[:4] != ["self", "req", "sock", "cfg"]:
        found.append("gunicorn.http.wsgi.Response(req, sock, cfg) changed")
    made = inspect.getsource(wsgi.Response.__init__)
    found += [f"a gunicorn.http.wsgi.Response has no {name}" for name in RESPONSE_ATTRIBUTES
              if f"self.{name} = " not in made]
    create = inspect.signature(wsgi.create).parameters.get("response_class")
    if create is None or create.default is not None or "response_class = Response" not in inspect.getsource(wsgi.create):
        found.append("gunicorn.http.wsgi.create no longer defaults to the module's Response")
    import gevent

    loop = gevent.get_hub().loop
    if not isinstance(getattr(loop, "iteration", None), int):
        found.append(f"gevent's event loop ({type(loop).__name__}) no longer counts its iterations")
    return found


def loop_iteration(loop: Any) -> int:
    """How many times gevent's event loop has polled for I/O (libev's ev_iteration, which
    gevent's libev loop exposes as `iteration`)."""
    return int(loop.iteration)


def use_response_class(cls: type) -> None:
    """Have gunicorn make `cls` for every HTTP/1 response of this process."""
    wsgi.Response = cls
