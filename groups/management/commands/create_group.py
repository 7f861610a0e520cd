from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import create_group


class Command(OperatorCommand):
    help = "Create a consumer group over a stream."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--stream", required=True)
        parser.add_argument("--heartbeat-interval-ms", type=int, default=3000)
        parser.add_argument("--session-timeout-ms", type=int, default=30_000)
        parser.add_argument("--rebalance-timeout-ms", type=int, default=60_000)
        parser.add_argument("--max-members", type=int, default=1000)
        parser.add_argument("--start-position", choices=["earliest", "latest"], default="earliest")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            group = create_group(
                opts["name"],
                opts["stream"],
                heartbeat_interval_ms=opts["heartbeat_interval_ms"],
                session_timeout_ms=opts["session_timeout_ms"],
                rebalance_timeout_ms=opts["rebalance_timeout_ms"],
                max_members=opts["max_members"],
                start_position=opts["start_position"],
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"created group {group.name} on stream {group.stream.name}")
