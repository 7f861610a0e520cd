from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import default_actor
from members.services import remove_member


class Command(OperatorCommand):
    help = (
        "Remove a member as if it had left: its shards are released and its next heartbeat "
        "gets UNKNOWN_MEMBER_ID (it must rejoin with memberEpoch 0)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        parser.add_argument("member_id")
        parser.add_argument("--reason", default="", help="recorded in the event log")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            remove_member(opts["group"], opts["member_id"], reason=opts["reason"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"removed member {opts['member_id']} from group {opts['group']}; its shards are released")
