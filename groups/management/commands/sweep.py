from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from coordinator_project.commands import OperatorCommand
from groups.sweeps import LIVENESS, RESHARDING, run_all_sweeps


class Command(OperatorCommand):
    help = (
        "Run one pass of all periodic work: session expiry (L1), rebalance timeout (L2) and resharding "
        "and print what it did. Safe beside Celery beat or another sweep."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        result = run_all_sweeps()
        if opts["json"]:
            self.stdout.write(json.dumps(result, indent=2, sort_keys=True))
            return
        liveness = result[LIVENESS]
        for label in ("expired", "fenced"):
            for group, members in sorted(liveness[label].items()):
                self.stdout.write(f"{label} in group {group}: {', '.join(members)}")
        if not (liveness["expired"] or liveness["fenced"]):
            self.stdout.write("liveness: nothing to expire or fence")
        resharding = result[RESHARDING]
        for stream, steps in sorted(resharding.items()):
            self.stdout.write(f"resharding {stream}: {_describe(steps)}")
        if not resharding:
            self.stdout.write("resharding: no stream is resharding")


def _describe(steps: dict[str, Any]) -> str:
    parts = []
    if "sealed" in steps:
        versions = ", ".join(f"v{v}" for v in steps["sealed"])
        parts.append(f"sealed {versions} ({steps['sealMarkers']} seal markers)")
    if "retired" in steps:
        parts.append("retired " + ", ".join(f"v{v}" for v in steps["retired"]))
    if "waiting" in steps:
        for version, groups in sorted(steps["waiting"].items()):
            pending = ", ".join(f"{g} ({n} shards)" for g, n in sorted(groups.items()))
            parts.append(f"v{version} still draining in {pending}")
    if "error" in steps:
        parts.append(f"error: {steps['error']}")
    if "state" in steps:
        parts.append(f"now {steps['state']}")
    return "; ".join(parts) or "no change"
