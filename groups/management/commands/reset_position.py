"""`manage.py reset_position G (--to earliest|latest|ID|ISO-time | --shift-by N) [--shard S] [--dry-run]`."""
from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.positions import reset_position
from groups.services import default_actor


class Command(OperatorCommand):
    help = (
        "Set a group's last-delivered ID on its live shards (like kafka-consumer-groups --reset-offsets): "
        "XGROUP SETID, or XGROUP CREATE where the group has not read a shard yet. Applying it is "
        "refused while the group has live members; --dry-run shows the plan at any time."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument(
            "--to",
            help="earliest (all entries again), latest (only new ones), an entry ID (resume after it) "
                 "or an ISO-8601 date-time (resume at the first entry at or after it; UTC if no zone)",
        )
        where.add_argument(
            "--shift-by", type=int, metavar="N",
            help="move each shard's position N entries: negative delivers the last N again, positive "
                 "skips the next N (like --reset-offsets --shift-by)",
        )
        parser.add_argument("--shard", help="only this shard id (<stream>:<version>:<index>)")
        parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            plan = reset_position(
                opts["group"], opts["to"], shift_by=opts["shift_by"], shard=opts["shard"],
                dry_run=opts["dry_run"], actor=opts["actor"],
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("\n".join(plan.lines()))
