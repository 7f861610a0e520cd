"""``status``: what a running member is doing, asked over its ``--metrics-port``.

``rsc-dataplane status --metrics-port 9100`` GETs ``http://127.0.0.1:9100/status`` from the
member (``consume --metrics-port 9100``) and prints one JSON line: ``healthy``, ``reason``
(why not, as ``/healthz`` says) and ``status`` (``Consumer.status()``: member id, epoch,
state, owned and revoking shards, in flight, last heartbeat, last error). Exit 0 when the
member is healthy, 1 when it answers but is not (the reason is on stderr too), 3 when nothing
answers on that port. ``kill -USR1 <pid>`` prints the same snapshot on the member's own
stderr instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..preflight import EXIT_CONFIG, EXIT_UNREACHABLE, PreflightError
from .common import EXIT_FAILED, add_sub

NEEDS: tuple[str, ...] = ()


def add_parser(sub: Any) -> None:
    s = add_sub(
        sub, "status", "print a running member's status and health (from its --metrics-port)"
    )
    s.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        required=True,
        metavar="PORT",
        help="the member's --metrics-port (it serves /status there)",
    )
    s.add_argument("--host", default="127.0.0.1", help="the member's host (default 127.0.0.1)")
    s.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)"
    )
    s.add_argument("-v", "--verbose", action="count", default=0, help="more logging")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import httpx

    url = f"http://{args.host}:{args.metrics_port}/status"
    try:
        resp = httpx.get(url, timeout=args.timeout)
    except httpx.HTTPError as exc:
        raise PreflightError(
            f"no member answers at {url}: {exc or type(exc).__name__} (is it running with "
            f"--metrics-port {args.metrics_port}?)",
            EXIT_UNREACHABLE,
        ) from exc
    if resp.status_code != 200:
        raise PreflightError(
            f"{url} answered HTTP {resp.status_code}: not a member of this library version "
            "(status needs rsc-dataplane 0.2.0 or later on the member)",
            EXIT_CONFIG,
        )
    try:
        doc = resp.json()
    except ValueError as exc:
        raise PreflightError(f"{url} answered something that is not JSON") from exc
    print(json.dumps(doc, sort_keys=True))
    if doc.get("healthy"):
        return 0
    print(f"unhealthy: {doc.get('reason')}", file=sys.stderr)
    return EXIT_FAILED
