from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.housekeeping import delete_group, purge_deleted_group
from groups.services import default_actor


class Command(OperatorCommand):
    help = (
        "Delete a consumer group (refused while it has live members). Its Redis consumer groups and "
        "fence tokens stay unless --purge-redis; until they are gone the name cannot be used again. "
        "For a group already deleted without --purge-redis: delete_group NAME --stream S --purge-redis "
        "clears what it left on stream S."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--purge-redis", action="store_true",
                            help="also XGROUP DESTROY it on every shard and delete its fence tokens (DLQs stay)")
        parser.add_argument("--stream", help="with --purge-redis: clear the Redis keys a group of this name,"
                            " already deleted, left on this stream")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["stream"] is not None:
            if not opts["purge_redis"]:
                raise CommandError("--stream clears a deleted group's Redis keys: give --purge-redis too")
            try:
                done = purge_deleted_group(opts["name"], opts["stream"], actor=opts["actor"])
            except ServiceError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(
                f"cleared what deleted group {done['group']} left on stream {done['stream']}: "
                f"{done['consumerGroupsDestroyed']} consumer groups destroyed, "
                f"{done['fenceTokensDeleted']} fence tokens deleted; the name can be used again"
            )
            return
        try:
            done = delete_group(opts["name"], purge_redis=opts["purge_redis"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if opts["purge_redis"]:
            self.stdout.write(
                f"deleted group {done['group']} of stream {done['stream']}; Redis: "
                f"{done['consumerGroupsDestroyed']} consumer groups destroyed, "
                f"{done['fenceTokensDeleted']} fence tokens deleted"
            )
        else:
            self.stdout.write(f"deleted group {done['group']} of stream {done['stream']} (Redis keys kept)")
