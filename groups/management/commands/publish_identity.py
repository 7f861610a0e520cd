from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.namespace import installation_id, publish_identity


class Command(OperatorCommand):
    help = (
        "Write this installation's id to <keyPrefix>:identity in the stream Redis for every "
        "stream's key prefix (and the installation's default one). Members compare it with the "
        "installationId of their heartbeat metadata before their first read and refuse a Redis "
        "where it differs or is missing (issue 25.4). The coordinator writes it with each stream "
        "and group, at each reshard and when a Celery worker or beat starts; run this after "
        "restoring or moving the stream Redis."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            keys = publish_identity()
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if not keys:
            raise CommandError("the stream Redis refused the identity keys (see the warning above)")
        for key in keys:
            self.stdout.write(f"{key} = {installation_id()}")
