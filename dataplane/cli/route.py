"""``route``: the shard id and Redis key a message key routes to (no Redis needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..preflight import stream_routing
from .common import add_common, add_sub

NEEDS = ("coordinator", "api_key")


def add_parser(sub: Any) -> None:
    r = add_sub(sub, "route", "print the shard id and Redis key a key routes to")
    add_common(r, redis=False)
    r.add_argument("--stream", required=True, help="the stream whose routing is asked")
    r.add_argument("key", help="the message key to route")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..producer import RoutingTable

    table = RoutingTable(stream_routing(args.coordinator, args.api_key, args.stream))
    route = table.route(args.key)
    out = {"shard": route.shard, "redisKey": route.stream, "version": table.write_version}
    print(json.dumps(out))
    return 0
