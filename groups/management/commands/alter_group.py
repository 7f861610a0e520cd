"""`manage.py alter_group G [--heartbeat-interval-ms N] ...`: change a group's settings."""
from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import default_actor, update_group_config


class Command(OperatorCommand):
    help = (
        "Change a consumer group's settings, with the same checks as the admin. Members pick the"
        " change up at their next heartbeat: the group's metadata epoch rises and they are sent the"
        " new settings (SYNC_METADATA, rule R7). Settings not given stay as they are."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--heartbeat-interval-ms", type=int, help="how often members heartbeat")
        parser.add_argument("--session-timeout-ms", type=int,
                            help="a member silent this long is expired and its shards move (rule L1)")
        parser.add_argument("--rebalance-timeout-ms", type=int,
                            help="a member that has not given a revoked shard back within this is fenced (rule L2)")
        parser.add_argument("--max-members", type=int, help="joins beyond this many live members are refused")
        parser.add_argument("--start-position", choices=["earliest", "latest"],
                            help="where members start on the stream's first version where the group has not read yet")
        parser.add_argument("--actor", default=default_actor(), help="who did it, for the event log (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        fields = {f: opts[f] for f in ("heartbeat_interval_ms", "session_timeout_ms", "rebalance_timeout_ms",
                                       "max_members", "start_position") if opts[f] is not None}
        if not fields:
            raise CommandError("nothing to change: give at least one setting (see --help)")
        try:
            group = update_group_config(opts["name"], actor=opts["actor"], **fields)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        shown = ", ".join(f"{f}={getattr(group, f)}" for f in fields)
        self.stdout.write(f"group {group.name}: {shown} (metadataEpoch {group.metadata_epoch})")
