from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from groups.services import ServiceError, create_api_key


class Command(BaseCommand):
    help = "Create an API key for a group (members) or a stream (producers). The key is printed last."

    def add_arguments(self, parser: CommandParser) -> None:
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--group")
        scope.add_argument("--stream")
        parser.add_argument("--name", default="", help="a label for operators")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            key = create_api_key(group=opts["group"], stream=opts["stream"], name=opts["name"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        scope = f"group {opts['group']}" if opts["group"] else f"stream {opts['stream']}"
        self.stdout.write(f"API key for {scope} (shown once; store it now):")
        self.stdout.write(key)
