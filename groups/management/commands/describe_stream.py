from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.housekeeping import describe_stream


class Command(OperatorCommand):
    help = "Show a stream's state, its shard versions and each group's drain progress on sealed versions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            doc = describe_stream(opts["name"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(doc, indent=2))
            return
        self.stdout.write(
            f"stream {doc['stream']}: {doc['state']} since {doc['stateChangedAt']}  write version "
            f"{doc['writeVersion']}  metadataEpoch={doc['metadataEpoch']}  key prefix {doc['keyPrefix']}"
        )
        for v in doc["versions"]:
            when = ", ".join(f"{k[:-2]} {v[k]}" for k in ("createdAt", "sealedAt", "retiredAt") if v[k])
            self.stdout.write(f"  v{v['version']:<4} {v['shardCount']:>5} shards  {v['state']:<8} {when}")
        if not doc["groups"]:
            self.stdout.write("  no groups")
        for g in doc["groups"]:
            drain = "; ".join(f"v{v} drained {d['drained']}/{d['shards']}" for v, d in g["drain"].items())
            self.stdout.write(
                f"  group {g['group']:<28} live members={g['liveMembers']:<5} groupEpoch={g['groupEpoch']}"
                + (f"  {drain}" if drain else "")
            )
