from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.housekeeping import list_groups
from groups.management.commands.describe_group import table


class Command(OperatorCommand):
    help = "List the consumer groups: stream, live members, epochs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stream", help="only the groups of this stream")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            rows = list_groups(opts["stream"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no groups")
        lines = table(("GROUP", "STREAM", "LIVE-MEMBERS", "GROUP-EPOCH", "ASSIGNMENT-EPOCH"),
                      [(r["group"], r["stream"], r["liveMembers"], r["groupEpoch"], r["assignmentEpoch"])
                       for r in rows]) if rows else []
        for line in lines:  # one write per line: `| head` stops it early
            self.stdout.write(line)
