from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from groups.housekeeping import list_streams


class Command(BaseCommand):
    help = "List the streams: state, write version and its shard count, groups, key prefix."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        rows = list_streams()
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no streams (create one: manage.py create_stream NAME --shards N)")
        for r in rows:
            self.stdout.write(
                f"{r['stream']:<30} {r['state']:<10} v{r['writeVersion']:<4} shards={r['shards']:<6} "
                f"groups={r['groups']:<4} prefix={r['keyPrefix']}"
            )
