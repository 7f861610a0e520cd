from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from assignments.services import describe_group


class Command(BaseCommand):
    help = "Show a group's epochs, members and their shards."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        doc = describe_group(opts["name"])
        if doc is None:
            raise CommandError(f"group {opts['name']!r} does not exist")
        if opts["json"]:
            self.stdout.write(json.dumps(doc, indent=2))
            return
        self.stdout.write(
            f"group {doc['group']} on stream {doc['stream']} ({doc['streamState']}): {doc['state']}  "
            f"groupEpoch={doc['groupEpoch']} assignmentEpoch={doc['assignmentEpoch']} "
            f"metadataEpoch={doc['metadataEpoch']}"
        )
        if not doc["members"]:
            self.stdout.write("  no live members")
        for m in doc["members"]:
            self.stdout.write(
                f"  {m['memberId']:<24} epoch={m['memberEpoch']:<5} {m['state']:<9} "
                f"assigned={len(m['assignedShards'])} pending={len(m['pendingShards'])} "
                f"revoking={len(m['revokingShards'])} last={m['lastHeartbeatAt']}"
                + (f" instance={m['instanceId']}" if m["instanceId"] else "")
                + (f" temporarily left (expires in {m['expiresInS']} s)" if m["expiresInS"] is not None else "")
            )
            for label in ("assignedShards", "pendingShards", "revokingShards"):
                if m[label]:
                    self.stdout.write(f"      {label}: {', '.join(m[label])}")
