from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.models import Shard
from groups.resharding import start_reshard
from groups.services import default_actor


class Command(OperatorCommand):
    help = (
        "Reshard a stream to N shards (PROTOCOL §6): creates version v+1 and moves the stream to "
        "PREPARING; the sweep (Celery beat or `manage.py sweep`) seals v and retires it once drained."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("stream")
        parser.add_argument("--shards", type=int, required=True)
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            version = start_reshard(opts["stream"], opts["shards"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"stream {opts['stream']}: version {version.version} with {version.shard_count} shards created; "
            f"state PREPARING (the next sweep seals version {version.version - 1})"
        )
        if opts["verbosity"] > 1:
            for shard in Shard.objects.filter(version=version).order_by("index"):
                self.stdout.write(f"  {shard.shard_id} <- {', '.join(shard.parents)}")
