from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import CommandParser

from coordinator_project.commands import OperatorCommand
from groups.retention import apply_retention


class Command(OperatorCommand):
    help = (
        "Delete member tombstones (LEFT/EXPIRED/FENCED) silent longer than the retention age and "
        "the group's session timeout, and events older than the event retention; then, per group, "
        "the oldest beyond MAX_TOMBSTONES_PER_GROUP / MAX_EVENTS_PER_GROUP, and per stream its own "
        "events beyond MAX_EVENTS_PER_STREAM. Safe beside "
        "Celery beat, which runs the same pass every RETENTION_INTERVAL_SECONDS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tombstone-seconds", type=int,
                            help="override MEMBER_TOMBSTONE_RETENTION_SECONDS for this run")
        parser.add_argument("--event-days", type=float, help="override EVENT_RETENTION_DAYS for this run")

    def handle(self, *args: Any, **opts: Any) -> None:
        tomb = opts["tombstone_seconds"]
        days = opts["event_days"]
        result = apply_retention(
            tombstone_age=timedelta(seconds=tomb) if tomb is not None else None,
            event_age=timedelta(days=days) if days is not None else None,
        )
        self.stdout.write(f"deleted {result['tombstones']} member tombstones, {result['events']} events")
