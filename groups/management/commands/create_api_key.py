from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.models import KeyRole
from groups.services import create_api_key


class Command(OperatorCommand):
    help = (
        "Create an API key for a group (members), or for a stream: scope 'produce' (routing, the "
        "default) or 'admin' (routing and reshard). The key is printed last."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--group")
        target.add_argument("--stream")
        parser.add_argument("--scope", choices=[KeyRole.PRODUCE, KeyRole.ADMIN],
                            help="for --stream: produce (default) or admin")
        parser.add_argument("--name", default="", help="a label for operators")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["group"] and opts["scope"]:
            raise CommandError("--scope applies to stream keys only (a group key has scope 'group')")
        try:
            key = create_api_key(group=opts["group"], stream=opts["stream"], name=opts["name"],
                                 scope=opts["scope"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        what = f"group {opts['group']}" if opts["group"] else f"stream {opts['stream']} ({opts['scope'] or 'produce'})"
        self.stdout.write(f"API key for {what} (shown once; store it now):")
        self.stdout.write(key)
