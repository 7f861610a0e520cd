from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.housekeeping import delete_stream
from groups.services import default_actor


class Command(OperatorCommand):
    help = (
        "Delete a stream (refused while it has groups). Its Redis keys stay unless --purge-redis; "
        "until they are gone the name cannot be used again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--purge-redis", action="store_true",
                            help="also delete every key of its shards: streams (messages), seal markers, DLQs")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            done = delete_stream(opts["name"], purge_redis=opts["purge_redis"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        redis_part = f"{done['keysDeleted']} Redis keys deleted" if opts["purge_redis"] else "Redis keys kept"
        self.stdout.write(f"deleted stream {done['stream']} ({redis_part})")
