from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.models import Group
from groups.services import ensure_consumer_groups


class Command(OperatorCommand):
    help = (
        "Create the missing Redis consumer groups of every group (or one) on every live shard; "
        "existing ones are kept. The coordinator creates them with each group and shard version, "
        "so members need no xgroup|create (docs/SECURITY.md); run this once for groups made "
        "before it did."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", help="only this group")

    def handle(self, *args: Any, **opts: Any) -> None:
        groups = Group.objects.order_by("name")
        if opts["group"]:
            groups = groups.filter(name=opts["group"])
            if not groups.exists():
                raise CommandError(f"group {opts['group']!r} does not exist")
        total = 0
        for group in groups:
            try:
                n = ensure_consumer_groups(group, required=True)
            except ServiceError as exc:
                raise CommandError(str(exc)) from exc
            total += n
            self.stdout.write(f"{group.name}: {n} consumer groups created")
        self.stdout.write(f"{total} consumer groups created")
