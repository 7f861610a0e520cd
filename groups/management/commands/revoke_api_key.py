from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import KEY_CACHE_SECONDS, revoke_api_key


class Command(OperatorCommand):
    help = f"Revoke an API key by its prefix (see list_api_keys); every web worker refuses it within {KEY_CACHE_SECONDS:g} s."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="the key's prefix, e.g. rsc_AbCdEfGh")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            key = revoke_api_key(opts["prefix"], actor="manage.py revoke_api_key")
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"revoked {key.prefix}… ({key.scope}) at {key.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
