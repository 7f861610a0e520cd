from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.utils import timezone

from coordinator_project.commands import OperatorCommand
from groups.services import api_key_rows, key_is_active


class Command(OperatorCommand):
    help = "List API keys: prefix, scope, group/stream, created, last used, revoked/expires. Never the key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="include revoked and expired keys")

    def handle(self, *args: Any, **opts: Any) -> None:
        now = timezone.now()
        rows = [k for k in api_key_rows() if opts["all"] or key_is_active(k, now)]
        if not rows:
            self.stdout.write("no API keys" if opts["all"] else "no active API keys (--all shows revoked ones)")
            return

        def stamp(value: Any) -> str:
            return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"

        header = ("PREFIX", "SCOPE", "FOR", "CREATED", "LAST USED", "STATE", "NAME")
        table = [header]
        for k in rows:
            target = k.target()
            if k.revoked_at:
                state = f"revoked {stamp(k.revoked_at)}"
            elif k.expires_at and k.expires_at <= now:
                state = f"expired {stamp(k.expires_at)}"
            elif k.expires_at:
                state = f"expires {stamp(k.expires_at)}"
            else:
                state = "active"
            table.append((k.prefix, k.scope, target, stamp(k.created_at), stamp(k.last_used_at), state, k.name))
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
