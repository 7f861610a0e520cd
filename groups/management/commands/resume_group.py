"""`manage.py resume_group G`: members of a paused group read again (§11)."""
from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import default_actor, resume_group


class Command(OperatorCommand):
    help = (
        "Resume a paused consumer group: its members read again from where they stopped, at their"
        " next heartbeat. (PROTOCOL §11)"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group")
        parser.add_argument("--actor", default=default_actor(), help="who did it, for the event log (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            changed = resume_group(opts["group"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if changed:
            self.stdout.write(f"resumed group {opts['group']}: members read again at their next heartbeat")
        else:
            self.stdout.write(f"group {opts['group']} was not paused")
