"""``produce``: append one message (``--key`` and field=value arguments) or JSON lines from
stdin, in batches, through the routing- and seal-aware producer."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from ..preflight import EXIT_CONFIG, check_redis, stream_routing
from .common import EXIT_FAILED, InputError, add_common, add_sub

NEEDS = ("coordinator", "api_key", "redis")

Item = tuple[str, dict[str, str]]  # (key, fields)


def add_parser(sub: Any) -> None:
    p = add_sub(
        sub,
        "produce",
        "append messages: one with --key and field=value arguments, or JSON lines from stdin",
    )
    add_common(p)
    p.add_argument("--stream", required=True, help="the stream to append to")
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
    p.add_argument(
        "fields", nargs="*", metavar="field=value", help="the message's fields (with --key)"
    )


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


def read_json_lines(lines: Iterable[str], key_field: str) -> Iterator[Item]:
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


def _batches(items: Iterator[Item], size: int) -> Iterator[tuple[list[Item], InputError | None]]:
    """Batches of ``size``; a bad line ends the input after the batch read before it."""
    batch: list[Item] = []
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


def run(
    args: argparse.Namespace, parser: argparse.ArgumentParser, stdin: TextIO | None = None
) -> int:
    from ..producer import Producer

    stdin = stdin or sys.stdin
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
