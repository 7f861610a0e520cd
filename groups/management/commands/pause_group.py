"""`manage.py pause_group G`: stop a whole group's consumption without moving a shard (§11)."""
from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import default_actor, pause_group


class Command(OperatorCommand):
    help = (
        "Pause a consumer group: its members finish and acknowledge what they are handling, then"
        " read nothing (no new entries, no pending recovery) while they keep their shards and keep"
        " heartbeating. Undo with resume_group. (PROTOCOL §11)"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        parser.add_argument("--actor", default=default_actor(), help="who did it, for the event log (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            changed = pause_group(opts["group"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if changed:
            self.stdout.write(f"paused group {opts['group']}: members stop reading at their next heartbeat")
        else:
            self.stdout.write(f"group {opts['group']} was already paused")
