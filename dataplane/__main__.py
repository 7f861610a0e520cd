"""Command line: ``python -m dataplane consume|produce|route`` (PROTOCOL.md §7.1).

RSC_COORDINATOR_URL, RSC_API_KEY and REDIS_URL stand in for --coordinator, --api-key, --redis.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

ENV = {"coordinator": "RSC_COORDINATOR_URL", "api_key": "RSC_API_KEY", "redis": "REDIS_URL"}


def _common(p: argparse.ArgumentParser, redis: bool = True) -> None:
    p.add_argument("--coordinator", help=f"coordinator base URL (env {ENV['coordinator']})")
    p.add_argument("--api-key", dest="api_key", help=f"API key (env {ENV['api_key']})")
    if redis:
        p.add_argument("--redis", help=f"Redis URL (env {ENV['redis']})")
        p.add_argument("--cluster", action="store_true", help="Redis is a Redis Cluster")
    p.add_argument("-v", "--verbose", action="count", default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dataplane", description="Redis Stream Coordinator member data-plane"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("consume", help="join a group and run a handler on its messages")
    _common(c)
    c.add_argument("--group", required=True)
    c.add_argument("--handler", required=True, help="module:function taking a Message")
    c.add_argument("--member-id", dest="member_id")
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--batch-size", dest="batch_size", type=int, default=100)
    c.add_argument("--block-ms", dest="block_ms", type=int, default=1000)
    c.add_argument("--max-deliveries", dest="max_deliveries", type=int, default=5)
    c.add_argument("--key-field", dest="key_field", default="key")
    c.add_argument("--ack", choices=("after", "before"), default="after")

    p = sub.add_parser("produce", help="append one message to a stream")
    _common(p)
    p.add_argument("--stream", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--key-field", dest="key_field", default="key")
    p.add_argument("fields", nargs="*", metavar="field=value")

    r = sub.add_parser("route", help="print the shard id and Redis key a key routes to")
    _common(r, redis=False)
    r.add_argument("--stream", required=True)
    r.add_argument("key")
    return parser


def _require(args: argparse.Namespace, parser: argparse.ArgumentParser, *names: str) -> None:
    for name in names:
        if not getattr(args, name, None):
            setattr(args, name, os.environ.get(ENV[name]))
        if not getattr(args, name):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{args.command}: {flag} or ${ENV[name]} is required")


def load_handler(spec: str) -> Callable[[Any], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--handler must look like module:function, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # handlers usually live next to where we are run
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")
    return obj


def parse_fields(items: Sequence[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"field {item!r} must look like name=value")
        fields[name] = value
    return fields


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from .transport import CoordinatorError, CoordinatorUnavailable

    try:
        if args.command == "route":
            _require(args, parser, "coordinator", "api_key")
            from .producer import RoutingTable
            from .transport import Transport

            with Transport(args.coordinator, args.api_key) as t:
                table = RoutingTable(t.routing(args.stream))
            route = table.route(args.key)
            print(
                json.dumps(
                    {"shard": route.shard, "redisKey": route.stream, "version": table.write_version}
                )
            )
            return 0

        _require(args, parser, "coordinator", "api_key", "redis")
        if args.command == "produce":
            from .producer import Producer

            try:
                fields = parse_fields(args.fields)
            except ValueError as exc:
                parser.error(str(exc))
            with Producer(
                args.coordinator,
                args.stream,
                args.api_key,
                redis_url=args.redis,
                key_field=args.key_field,
                cluster=args.cluster,
            ) as producer:
                sent = producer.send(args.key, fields)
            print(json.dumps({"shard": sent.shard, "id": sent.id}))
            return 0

        from .consumer import Consumer

        try:
            handler = load_handler(args.handler)
        except (ImportError, AttributeError, ValueError) as exc:
            parser.error(f"cannot load handler {args.handler!r}: {exc}")
        consumer = Consumer(
            args.coordinator,
            args.group,
            args.api_key,
            handler,
            redis_url=args.redis,
            member_id=args.member_id,
            workers=args.workers,
            batch_size=args.batch_size,
            block_ms=args.block_ms,
            max_deliveries=args.max_deliveries,
            key_field=args.key_field,
            ack=args.ack,
            cluster=args.cluster,
        )
        print(f"member {consumer.member_id} consuming group {args.group}", file=sys.stderr)
        consumer.run()
        return 0
    except CoordinatorError as exc:
        print(f"error: coordinator refused: {exc}", file=sys.stderr)
        return 2
    except CoordinatorUnavailable as exc:
        print(f"error: coordinator unavailable: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
