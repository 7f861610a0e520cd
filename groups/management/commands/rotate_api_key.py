from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordinator_project.commands import OperatorCommand
from groups.errors import ServiceError
from groups.services import rotate_api_key


class Command(OperatorCommand):
    help = (
        "Replace an API key by a new one with the same scope. The old key stays valid for "
        "--grace-seconds (default 0: revoked now). The new key is printed last."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="the old key's prefix, e.g. rsc_AbCdEfGh")
        parser.add_argument("--grace-seconds", type=int, default=0,
                            help="how long the old key keeps working (default 0)")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            raw, old = rotate_api_key(opts["prefix"], grace_seconds=opts["grace_seconds"],
                                      actor="manage.py rotate_api_key")
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        if old.expires_at:
            self.stdout.write(f"old key {old.prefix}… valid until {old.expires_at:%Y-%m-%d %H:%M:%S} UTC")
        else:
            self.stdout.write(f"old key {old.prefix}… revoked")
        self.stdout.write(f"new {old.scope} key (shown once; store it now):")
        self.stdout.write(raw)
