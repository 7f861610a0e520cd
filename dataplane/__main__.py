"""Command line: ``python -m dataplane consume|produce|route|dlq`` (PROTOCOL.md §7.1), also
installed as ``rsc-dataplane``.

Each command first checks its configuration (the coordinator accepts the key for the group or
stream; Redis answers PING) and ends with one line on stderr and a documented exit code when
it cannot start (see ``EPILOG``); only then does it start.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

from .preflight import (
    EXIT_CONFIG,
    EXIT_UNREACHABLE,
    PreflightError,
    check_redis,
    describe_group,
    stream_routing,
)

ENV = {"coordinator": "RSC_COORDINATOR_URL", "api_key": "RSC_API_KEY", "redis": "REDIS_URL"}
EXIT_FAILED = 1

EPILOG = f"""\
exit codes:
  0  done (consume: stopped by SIGINT/SIGTERM after leaving the group)
  {EXIT_FAILED}  failed after a successful start (produce/dlq replay: messages not appended)
  {EXIT_CONFIG}  refused, fix the configuration: bad arguments, bad --handler, API key missing,
     unknown or revoked (HTTP 401) or not for this group/stream (403), unknown group or
     stream (404), Redis refused the credentials
  {EXIT_UNREACHABLE}  unreachable at start: the coordinator or Redis cannot be reached
Errors with exit codes 2 and 3 print one line on stderr, never a traceback. After a
successful start, transient coordinator/Redis errors are retried with a warning.

environment: ${ENV["coordinator"]}, ${ENV["api_key"]} and ${ENV["redis"]} stand in for
--coordinator, --api-key and --redis; --api-key-file or ${ENV["api_key"]} keep the key out
of `ps`.
"""


class InputError(Exception):
    """Bad input that is the caller's to fix (exit 2)."""


def _common(p: argparse.ArgumentParser, redis: bool = True) -> None:
    p.add_argument("--coordinator", help=f"coordinator base URL (env {ENV['coordinator']})")
    p.add_argument("--api-key", dest="api_key", help=f"API key (env {ENV['api_key']})")
    p.add_argument(
        "--api-key-file",
        dest="api_key_file",
        metavar="PATH",
        help="read the API key from this file (keeps it out of `ps`)",
    )
    if redis:
        p.add_argument("--redis", help=f"Redis URL (env {ENV['redis']})")
        p.add_argument("--cluster", action="store_true", help="Redis is a Redis Cluster")
    p.add_argument("-v", "--verbose", action="count", default=0)


def _sub(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    script = os.path.basename(sys.argv[0]) == "rsc-dataplane"  # the console script
    parser = argparse.ArgumentParser(
        prog="rsc-dataplane" if script else "python -m dataplane",
        description="Redis Stream Coordinator member data-plane",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = _sub(sub, "consume", "join a group and run a handler on its messages")
    _common(c)
    c.add_argument("--group", required=True)
    c.add_argument(
        "--handler",
        required=True,
        help="module:function taking a Message (the current directory is on sys.path)",
    )
    c.add_argument("--member-id", dest="member_id")
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
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--batch-size", dest="batch_size", type=int, default=100)
    c.add_argument("--block-ms", dest="block_ms", type=int, default=1000)
    c.add_argument("--max-deliveries", dest="max_deliveries", type=int, default=5)
    c.add_argument("--key-field", dest="key_field", default="key")
    c.add_argument("--ack", choices=("after", "before"), default="after")

    p = _sub(
        sub,
        "produce",
        "append messages: one with --key and field=value arguments, or JSON lines from stdin",
    )
    _common(p)
    p.add_argument("--stream", required=True)
    p.add_argument("--key", help="the message key; without it, read one JSON object per stdin line")
    p.add_argument(
        "--key-field",
        dest="key_field",
        default="key",
        help="field holding the key (in stdin objects, and written into each message)",
    )
    p.add_argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        default=500,
        help="stdin lines per send_many call (default 500)",
    )
    p.add_argument("fields", nargs="*", metavar="field=value")

    r = _sub(sub, "route", "print the shard id and Redis key a key routes to")
    _common(r, redis=False)
    r.add_argument("--stream", required=True)
    r.add_argument("key")

    d = _sub(sub, "dlq", "list, replay or purge a group's dead letters")
    dsub = d.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("list", "show dead letters: shard, id, deliveries, key, error"),
        ("replay", "re-append dead letters to the stream (routed by key), then delete them"),
        ("purge", "delete dead letters (needs --yes)"),
    ):
        a = _sub(dsub, name, text)
        _common(a)
        a.add_argument("--group", required=True)
        a.add_argument("--shard", help="only this shard's DLQ, e.g. orders:1:0")
        a.add_argument("--limit", type=int, help="at most N entries (oldest first)")
        a.add_argument("--key-field", dest="key_field", default="key")
        if name == "list":
            a.add_argument("--json", action="store_true", help="one JSON object per line")
        if name == "purge":
            a.add_argument("--yes", action="store_true", help="really delete")
    return parser


def _resolve(args: argparse.Namespace, parser: argparse.ArgumentParser, *names: str) -> None:
    """Fill flags from the environment (the API key also from --api-key-file); usage error
    when one is still missing."""
    for name in names:
        if name == "api_key" and not args.api_key and args.api_key_file:
            args.api_key = _read_key_file(args.api_key_file, parser)
        elif name == "api_key" and args.api_key and args.api_key_file:
            parser.error("--api-key and --api-key-file are mutually exclusive")
        if not getattr(args, name, None):
            setattr(args, name, os.environ.get(ENV[name]))
        if not getattr(args, name):
            flag = "--" + name.replace("_", "-")
            extra = ", --api-key-file" if name == "api_key" else ""
            parser.error(f"{args.command}: {flag}{extra} or ${ENV[name]} is required")


def _read_key_file(path: str, parser: argparse.ArgumentParser) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        parser.error(f"--api-key-file: cannot read {path}: {exc.strerror or exc}")
    if not key or len(key.split()) != 1:
        parser.error(f"--api-key-file: {path} must hold exactly one key")
    return key


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


def _field_text(value: Any) -> str | None:
    """A JSON value as a stream field: strings as they are, numbers and booleans as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return None


def read_json_lines(lines: Iterable[str], key_field: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(key, fields) per non-blank line; InputError naming the line for anything else."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"stdin line {n}: not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise InputError(f"stdin line {n}: must be a JSON object of fields")
        fields: dict[str, str] = {}
        for name, value in obj.items():
            text = _field_text(value)
            if text is None:
                raise InputError(
                    f"stdin line {n}: field {name!r} must be a string or number, "
                    f"not {type(value).__name__}"
                )
            fields[name] = text
        key = fields.get(key_field)
        if not key:
            raise InputError(
                f"stdin line {n}: no {key_field!r} field holding the key (--key-field)"
            )
        yield key, fields


def _batches(
    items: Iterator[tuple[str, dict[str, str]]], size: int
) -> Iterator[tuple[list[tuple[str, dict[str, str]]], InputError | None]]:
    """Batches of ``size``; a bad line ends the input after the batch read before it."""
    batch: list[tuple[str, dict[str, str]]] = []
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except InputError as exc:
            yield batch, exc
            return
        batch.append(item)
        if len(batch) >= size:
            yield batch, None
            batch = []
    if batch:
        yield batch, None


# ---- commands ------------------------------------------------------------------------------


def cmd_route(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .producer import RoutingTable

    table = RoutingTable(stream_routing(args.coordinator, args.api_key, args.stream))
    route = table.route(args.key)
    out = {"shard": route.shard, "redisKey": route.stream, "version": table.write_version}
    print(json.dumps(out))
    return 0


def cmd_produce(args: argparse.Namespace, parser: argparse.ArgumentParser, stdin: TextIO) -> int:
    from .producer import Producer

    if args.key is None and args.fields:
        parser.error("produce: field=value arguments need --key (without it, stdin is read)")
    if args.batch_size < 1:
        parser.error("produce: --batch-size must be at least 1")
    try:
        fields = parse_fields(args.fields)
    except ValueError as exc:
        parser.error(str(exc))
    stream_routing(args.coordinator, args.api_key, args.stream)
    check_redis(args.redis, args.cluster)
    with Producer(
        args.coordinator,
        args.stream,
        args.api_key,
        redis_url=args.redis,
        key_field=args.key_field,
        cluster=args.cluster,
    ) as producer:
        count = 0
        try:
            if args.key is not None:
                sent = producer.send(args.key, fields)
                print(json.dumps({"shard": sent.shard, "id": sent.id}))
                return 0
            if stdin.isatty():
                print("reading JSON lines from stdin (end with Ctrl-D)", file=sys.stderr)
            for batch, bad in _batches(read_json_lines(stdin, args.key_field), args.batch_size):
                if batch:
                    producer.send_many(batch)
                    count += len(batch)
                if bad is not None:
                    print(json.dumps({"sent": count}))
                    print(f"error: {bad}; sent {count} messages before it", file=sys.stderr)
                    return EXIT_CONFIG
        except Exception as exc:  # after the start (e.g. ShardSealedError): one line
            print(f"error: after {count} messages: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(json.dumps({"sent": count}))
        return 0


def cmd_consume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .consumer import Consumer

    try:
        handler = load_handler(args.handler)
    except Exception as exc:  # import errors of the handler's module included
        raise PreflightError(
            f"cannot load handler {args.handler!r}: {type(exc).__name__}: {exc}"
        ) from exc
    describe_group(args.coordinator, args.api_key, args.group)
    check_redis(args.redis, args.cluster)
    try:
        consumer = Consumer(
            args.coordinator,
            args.group,
            args.api_key,
            handler,
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
        )
    except ValueError as exc:
        raise PreflightError(str(exc)) from exc
    print(f"member {consumer.member_id} consuming group {args.group}", file=sys.stderr)
    consumer.run()
    return 0


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def cmd_dlq(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .dlq import DeadLetters

    if args.limit is not None and args.limit < 1:
        parser.error("dlq: --limit must be at least 1")
    check_redis(args.redis, args.cluster)
    # The constructor asks the coordinator (key, group, stream, key prefix).
    with DeadLetters(
        args.coordinator,
        args.group,
        args.api_key,
        args.redis,
        key_field=args.key_field,
        cluster=args.cluster,
    ) as dl:
        if args.action == "list":
            letters = dl.list(args.shard, args.limit)
            if args.json:
                for letter in letters:
                    print(json.dumps(letter.as_dict()))
            elif letters:
                rows = [["SHARD", "ID", "SOURCE-ID", "DELIVERIES", "KEY", "ERROR"]]
                for x in letters:
                    error = x.error if len(x.error) <= 80 else x.error[:77] + "..."
                    rows.append([x.shard, x.id, x.source_id, str(x.deliveries), x.key, error])
                print(_table(rows))
            total = sum(dl.counts(args.shard).values())
            print(
                f"{len(letters)} shown of {total} dead letters of group {args.group}",
                file=sys.stderr,
            )
            return 0
        if args.action == "purge":
            if not args.yes:
                total = sum(dl.counts(args.shard).values())
                n = total if args.limit is None else min(total, args.limit)
                print(
                    f"error: refusing to purge {n} dead letters of group {args.group} "
                    "without --yes (nothing deleted)",
                    file=sys.stderr,
                )
                return EXIT_CONFIG
            n = dl.purge(args.shard, args.limit)
            print(f"purged {n} dead letters of group {args.group}", file=sys.stderr)
            print(json.dumps({"purged": n}))
            return 0
        try:
            done = dl.replay(args.shard, args.limit)
        except Exception as exc:  # after the start: the DLQ still holds what was not appended
            print(
                f"error: replay stopped: {type(exc).__name__}: {exc} "
                "(what was not appended is still in the DLQ)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        for letter, sent in done:
            print(
                f"{letter.shard} {letter.id} key={letter.key} -> {sent.shard} {sent.id}",
                file=sys.stderr,
            )
        print(json.dumps({"replayed": len(done)}))
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The member's own lifecycle (grants, revocations, drains, fences, rejoins) at INFO; the
    # per-request HTTP lines of httpx only with -v.
    # consume: INFO by default; produce/route/dlq print their result, so their stderr stays quiet.
    quiet = logging.INFO if args.command == "consume" else logging.WARNING
    logging.basicConfig(
        level=quiet - 10 * min(args.verbose, 1),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.INFO if args.verbose else logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.DEBUG if args.verbose > 1 else logging.WARNING)
    from .errors import ConfigurationError, RedisUnavailableError
    from .transport import CoordinatorError, CoordinatorUnavailable

    try:
        if args.command == "route":
            _resolve(args, parser, "coordinator", "api_key")
            return cmd_route(args, parser)
        _resolve(args, parser, "coordinator", "api_key", "redis")
        if args.command == "produce":
            return cmd_produce(args, parser, sys.stdin)
        if args.command == "dlq":
            return cmd_dlq(args, parser)
        return cmd_consume(args, parser)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except RedisUnavailableError as exc:  # Consumer.run() before its first join
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ConfigurationError as exc:  # refused key or unknown group before the first join
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CoordinatorError as exc:
        print(f"error: coordinator refused: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CoordinatorUnavailable as exc:
        print(f"error: coordinator unavailable: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
