from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.housekeeping import raise_epochs_after_restore
from groups.services import default_actor


class Command(OperatorCommand):
    help = (
        "After restoring an older database: raise each group's epochs above the fence tokens its "
        "members left in Redis, so new grants are not refused (docs/OPERATING.md). Stop the members first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", help="only this group (default: every group)")
        parser.add_argument("--dry-run", action="store_true", help="only show what would be raised")
        parser.add_argument("--actor", default=default_actor(), help="who did it (default cli:<user>)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            report = raise_epochs_after_restore(opts["group"], dry_run=opts["dry_run"], actor=opts["actor"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        for r in report:
            if r["raised"]:
                what = f"raised groupEpoch and assignmentEpoch to {r['raisedTo']}"
            elif r["needed"]:
                what = f"would raise groupEpoch above {r['fenceTokenEpoch']} (dry run)"
            elif r["fenceTokenEpoch"] is None:
                what = "no fence tokens in Redis: nothing to do"
            else:
                what = "epochs already above every fence token: nothing to do"
            self.stdout.write(
                f"group {r['group']}: highest fence token epoch {r['fenceTokenEpoch']}, "
                f"assignmentEpoch {r['assignmentEpoch']}: {what}"
            )
        if not report:
            self.stdout.write("no groups")
