from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import create_stream


class Command(OperatorCommand):
    help = "Create a stream with N shards (version 1)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--shards", type=int, required=True)
        parser.add_argument(
            "--key-prefix", default=None,
            help="prefix of every Redis key (default: this installation's namespace, rsc-<id8>)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            stream = create_stream(opts["name"], opts["shards"], key_prefix=opts["key_prefix"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"created stream {stream.name} with {opts['shards']} shards (version 1)")
