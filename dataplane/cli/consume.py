"""``consume``: join a group and run a handler on its messages until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ..preflight import PreflightError, check_redis, describe_group
from .common import add_common, add_sub

NEEDS = ("coordinator", "api_key", "redis")


def add_parser(sub: Any) -> None:
    c = add_sub(sub, "consume", "join a group and run a handler on its messages")
    add_common(c)
    c.add_argument("--group", required=True, help="the consumer group to join")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--handler",
        help="module:function taking a Message (the current directory is on sys.path)",
    )
    which.add_argument(
        "--batch-handler",
        dest="batch_handler",
        metavar="MODULE:FUNCTION",
        help="instead of --handler: module:function taking a list of one shard's Messages",
    )
    c.add_argument(
        "--member-id",
        dest="member_id",
        help="this process's memberId (default: host-pid-random, new for each process)",
    )
    c.add_argument(
        "--instance-id",
        dest="instance_id",
        default=os.environ.get("RSC_INSTANCE_ID") or None,
        help="static membership (PROTOCOL §9): a restart with the same id gets the same shards "
        "back; stopping sends a temporary leave (-2). Default: $RSC_INSTANCE_ID",
    )
    c.add_argument(
        "--max-concurrency",
        dest="max_concurrency",
        type=int,
        default=16,
        help="async handlers: coroutines in flight at most",
    )
    c.add_argument(
        "--workers", type=int, default=4, help="sync handlers: worker threads (default 4)"
    )
    c.add_argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        default=100,
        help="entries read per shard and read (default 100)",
    )
    c.add_argument(
        "--block-ms",
        dest="block_ms",
        type=int,
        default=1000,
        help="longest wait for new entries before the reader looks again (default 1000)",
    )
    c.add_argument(
        "--max-deliveries",
        dest="max_deliveries",
        type=int,
        default=5,
        help="deliveries of a failing message before it goes to the DLQ (default 5)",
    )
    c.add_argument(
        "--key-field",
        dest="key_field",
        default="key",
        help="field holding the message key; per-key order is kept (default key)",
    )
    c.add_argument(
        "--shutdown-timeout",
        dest="shutdown_timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long in-flight work may take to finish and be ACKed; "
        "what still runs after it is abandoned, not ACKed (default 30)",
    )
    c.add_argument(
        "--refusal-timeout",
        dest="refusal_timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="after a successful start, exit 2 once the coordinator has refused the key "
        "(401/403) or the group (404) for this long and the session is lost (default 30)",
    )
    c.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        metavar="PORT",
        help="serve Prometheus /metrics and /healthz on this port (needs prometheus-client: "
        "pip install 'rsc-dataplane[metrics]'); off by default",
    )
    c.add_argument(
        "--ack",
        choices=("after", "before"),
        default="after",
        help="after: ACK once the handler succeeded (at-least-once, default); "
        "before: ACK, then run (at-most-once)",
    )


def load_handler(spec: str) -> Callable[[Any], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--handler must look like module:function, got {spec!r}")
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        module = module_name.removesuffix(".py").lstrip("./").replace("/", ".")
        raise ValueError(
            f"--handler takes module:function, not a path: for {module_name} run from its"
            f" directory with --handler {module or 'module'}:{attr}"
            " (the current directory is on sys.path)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # handlers usually live next to where we are run
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")
    return obj


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..consumer import Consumer

    try:
        handler = load_handler(args.handler or args.batch_handler)
    except Exception as exc:  # import errors of the handler's module included
        raise PreflightError(
            f"cannot load handler {args.handler or args.batch_handler!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    describe_group(args.coordinator, args.api_key, args.group)
    check_redis(args.redis, args.cluster)
    try:
        consumer = Consumer(
            args.coordinator,
            args.group,
            args.api_key,
            None if args.batch_handler else handler,
            redis_url=args.redis,
            member_id=args.member_id,
            instance_id=args.instance_id,
            max_concurrency=args.max_concurrency,
            workers=args.workers,
            batch_size=args.batch_size,
            block_ms=args.block_ms,
            max_deliveries=args.max_deliveries,
            key_field=args.key_field,
            ack=args.ack,
            cluster=args.cluster,
            shutdown_timeout_s=args.shutdown_timeout,
            refusal_timeout_s=args.refusal_timeout,
            batch_handler=handler if args.batch_handler else None,
            metrics_port=args.metrics_port,
        )
    except ValueError as exc:
        raise PreflightError(str(exc)) from exc
    print(f"member {consumer.member_id} consuming group {args.group}", file=sys.stderr)
    print_status_on_sigusr1(consumer)
    # This process is ours: what start-up loaded (modules, the handler's imports) never becomes
    # garbage, so the collector's full passes stop walking it. Messages in flight survive into
    # the oldest generation and trigger full passes that hold the GIL over every thread: 15-25 %
    # of a no-op consumer's time without this (bench/dataplane.py --gc default). The
    # coordinator's workers do the same (gunicorn_conf.py); an application embedding Consumer
    # decides for its own process (dataplane/README.md, "Garbage collector").
    gc.freeze()
    consumer.run()
    return 0


def print_status_on_sigusr1(consumer: Any) -> None:
    """``kill -USR1 <pid>`` prints ``Consumer.status()`` as one JSON line on stderr."""
    if not hasattr(signal, "SIGUSR1"):  # not on Windows
        return

    def show(*_: object) -> None:
        line = json.dumps({"status": consumer.status().as_dict()}, sort_keys=True)
        print(line, file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, show)
