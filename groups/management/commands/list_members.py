"""`manage.py list_members G [--json]`: the group's live members (like describe's member table)."""
from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.describe import MAX_PAGE_SIZE, describe_group
from groups.management.commands.describe_group import member_rows, table


class Command(OperatorCommand):
    help = "List a consumer group's live members: instance, client, epoch, shards, last heartbeat."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        parser.add_argument("--json", action="store_true", help="the members of the describe API document")

    def handle(self, *args: Any, **opts: Any) -> None:
        # Every member, a describe page at a time (each read is bounded; issue 26.3).
        doc = describe_group(opts["group"], page_size=MAX_PAGE_SIZE)
        if doc is None:
            raise CommandError(f"group {opts['group']!r} does not exist")
        members = list(doc["members"])
        for page in range(2, doc["paging"]["lastPage"] + 1):
            more = describe_group(opts["group"], page=page, page_size=MAX_PAGE_SIZE)
            members.extend(more["members"] if more else [])
        if opts["json"]:
            self.stdout.write(json.dumps(members, indent=2))
            return
        if not members:
            self.stdout.write(f"group {doc['group']} has no live members")
            return
        self.stdout.write("\n".join(table(*member_rows(members))))
