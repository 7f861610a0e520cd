"""``dlq list|replay|purge``: a group's dead letters (``dataplane.dlq.DeadLetters``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..preflight import EXIT_CONFIG, check_redis
from .common import EXIT_FAILED, add_common, add_sub

if TYPE_CHECKING:
    from ..dlq import DeadLetters

NEEDS = ("coordinator", "api_key", "redis")


def add_parser(sub: Any) -> None:
    d = add_sub(sub, "dlq", "list, replay or purge a group's dead letters")
    dsub = d.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("list", "show dead letters: shard, id, deliveries, key, error"),
        ("replay", "re-append dead letters to the stream (routed by key), then delete them"),
        ("purge", "delete dead letters (needs --yes)"),
    ):
        a = add_sub(dsub, name, text)
        add_common(a)
        a.add_argument("--group", required=True, help="the consumer group whose DLQ this is")
        a.add_argument("--shard", help="only this shard's DLQ, e.g. orders:1:0")
        a.add_argument("--limit", type=int, help="at most N entries (oldest first)")
        a.add_argument(
            "--key-field",
            dest="key_field",
            default="key",
            help="field holding the message key (default key)",
        )
        if name == "list":
            a.add_argument("--json", action="store_true", help="one JSON object per line")
        if name == "purge":
            a.add_argument("--yes", action="store_true", help="really delete")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..dlq import DeadLetters

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
            return _list(args, dl)
        if args.action == "purge":
            return _purge(args, dl)
        return _replay(args, dl)


def _list(args: argparse.Namespace, dl: DeadLetters) -> int:
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
    print(f"{len(letters)} shown of {total} dead letters of group {args.group}", file=sys.stderr)
    return 0


def _purge(args: argparse.Namespace, dl: DeadLetters) -> int:
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


def _replay(args: argparse.Namespace, dl: DeadLetters) -> int:
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
