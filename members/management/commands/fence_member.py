from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import default_actor
from members.services import fence_member


class Command(OperatorCommand):
    help = (
        "Fence a member: it is removed at once and its shards are released; its next heartbeat is"
        " refused (FENCED_MEMBER_EPOCH), it stops its shards and rejoins at once. A healthy member"
        " is therefore back about one heartbeat later, usually with other shards. To take a process"
        " out, stop it (SIGTERM: it leaves the group); to stop consumption without moving shards,"
        " pause the group (pause_group). Fencing is for a member that is stuck or misbehaving."
        " (rule R8)"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        parser.add_argument("member_id")
        parser.add_argument("--reason", default="", help="shown to the member and in the event log")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            fence_member(opts["group"], opts["member_id"], reason=opts["reason"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"fenced member {opts['member_id']} of group {opts['group']}; its shards are released")
