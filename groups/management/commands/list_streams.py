from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from coordinator_project.commands import OperatorCommand
from groups.housekeeping import list_streams
from groups.management.commands.describe_group import table


class Command(OperatorCommand):
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
        lines = table(("STREAM", "STATE", "WRITE-VERSION", "SHARDS", "GROUPS", "KEY-PREFIX"),
                      [(r["stream"], r["state"], f"v{r['writeVersion']}", r["shards"], r["groups"], r["keyPrefix"])
                       for r in rows]) if rows else []
        for line in lines:  # one write per line: `| head` stops it early
            self.stdout.write(line)
