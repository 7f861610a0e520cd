"""`manage.py describe_group G`: like `kafka-consumer-groups --describe` (§10)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError, CommandParser

from coordination.model import ShardState
from coordinator_project.commands import OperatorCommand
from groups.describe import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, describe_group
from groups.models import Group, Stream


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned columns two spaces apart, `-` for empty values (as kafka-consumer-groups)."""
    cells = [list(headers)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def _seconds(ms: int | None) -> str | None:
    return None if ms is None else f"{ms / 1000:.1f}"


MEMBER_HEADERS = ("MEMBER", "INSTANCE", "CLIENT", "EPOCH", "STATE", "LIBRARY", "ASSIGNED", "PENDING", "REVOKING",
                  "SECONDS-SINCE-HEARTBEAT", "LIVENESS")


def member_rows(members: list[dict[str, Any]]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The member table of describe_group and list_members: headers and rows."""
    return MEMBER_HEADERS, [
        (m["memberId"], m["instanceId"], m["clientId"], m["memberEpoch"], m["state"], m["libraryVersion"] or "-",
         len(m["assignedShards"]), len(m["pendingShards"]), len(m["revokingShards"]),
         _seconds(m["sinceLastHeartbeatMs"]),
         f"temporarily left (expires in {m['expiresInS']} s)" if m["expiresInS"] is not None
         else m["liveness"])
        for m in members
    ]


def summary(doc: dict[str, Any]) -> str:
    """The group's counts on one line: members by state, shards by state (issue 26.3)."""
    members = " ".join(f"{k} {v}" for k, v in doc["memberCounts"].items() if v)
    shards = " ".join(f"{k} {v}" for k, v in doc["shardCounts"].items() if v)
    return (f"COUNTS  members {doc['paging']['members']}{f' ({members})' if members else ''}  "
            f"shards {doc['paging']['shards']}{f' ({shards})' if shards else ''}")


class Command(OperatorCommand):
    help = (
        "Show a group's shards (owner, last-delivered ID, lag, pending, DLQ) and members; with --all"
        " or --stream S, every group (of that stream) one after the other."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="the group (or --all, or --stream)")
        parser.add_argument("--all", action="store_true", help="every group")
        parser.add_argument("--stream", help="every group of this stream")
        parser.add_argument("--json", action="store_true",
                            help="print the describe API document (a list of them with --all/--stream)")
        parser.add_argument("--page", type=int, default=1,
                            help="which page of members and shards to list, from 1 (the counts are the group's)")
        parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                            help=f"members and shards per page, 1 to {MAX_PAGE_SIZE} (default {DEFAULT_PAGE_SIZE})")

    def handle(self, *args: Any, **opts: Any) -> None:
        chosen = [bool(opts["name"]), opts["all"], opts["stream"] is not None]
        if sum(chosen) != 1:
            raise CommandError("name one group, or give --all or --stream S")
        if opts["page"] < 1 or not 1 <= opts["page_size"] <= MAX_PAGE_SIZE:
            raise CommandError(f"--page must be 1 or more and --page-size from 1 to {MAX_PAGE_SIZE}")
        if opts["name"]:
            names = [opts["name"]]
        else:
            groups = Group.objects.order_by("name")
            if opts["stream"] is not None:
                if not Stream.objects.filter(name=opts["stream"]).exists():
                    raise CommandError(f"stream {opts['stream']!r} does not exist")
                groups = groups.filter(stream__name=opts["stream"])
            names = list(groups.values_list("name", flat=True))
        docs = []
        for name in names:
            doc = describe_group(name, page=opts["page"], page_size=opts["page_size"])
            if doc is None:
                if opts["name"]:
                    raise CommandError(f"group {name!r} does not exist")
                continue  # deleted meanwhile
            docs.append(doc)
        if opts["json"]:
            self.stdout.write(json.dumps(docs[0] if opts["name"] else docs, indent=2))
            return
        if not docs:
            self.stdout.write("no groups")
        for i, doc in enumerate(docs):
            if i:
                self.stdout.write("")
            self._print(doc)

    def _print(self, doc: dict[str, Any]) -> None:
        out = self.stdout.write
        out(
            f"GROUP {doc['group']}  STREAM {doc['stream']} ({doc['streamState']})  STATE {doc['state']}  "
            f"groupEpoch={doc['groupEpoch']} assignmentEpoch={doc['assignmentEpoch']} "
            f"metadataEpoch={doc['metadataEpoch']}"
        )
        if doc["paused"]:
            out(f"PAUSED since {doc['pausedAt']} by {doc['pausedBy'] or '-'}: members read nothing until"
                f" resume_group {doc['group']}")
        redis, totals = doc["redis"], doc["totals"]
        if redis["ok"]:
            out(f"TOTAL LAG {totals['lag']}  PENDING {totals['pending']}  DLQ {totals['dlq']}  (as of {redis['asOf']})")
        else:
            out(f"TOTAL LAG -  PENDING -  DLQ -  (Redis not readable: {redis['error']})")
        out(summary(doc))
        paging = doc["paging"]
        if paging["lastPage"] > 1 or paging["page"] > 1:
            more = (f"; --page {paging['page'] + 1} for the next" if paging["page"] < paging["lastPage"] else "")
            out(f"PAGE {paging['page']} of {paging['lastPage']} ({paging['pageSize']} members and shards a page{more})")
        out("")
        out("\n".join(table(
            ("SHARD", "STATE", "OWNER", "CLIENT", "LAST-DELIVERED", "LAG", "PENDING", "DLQ"),
            [
                (s["shardId"], s["state"] + (" (sealed)" if s["sealed"] and s["state"] != ShardState.DRAINED else ""),
                 s["owner"], s["clientId"], s["lastDeliveredId"],
                 None if s["lag"] is None else f"{s['lag']}{'' if s['lagExact'] else '+'}",
                 s["pending"], s["dlqLength"])
                for s in doc["shards"]
            ],
        )))
        out("")
        if not doc["members"]:
            out("no live members")
            return
        out("\n".join(table(*member_rows(doc["members"]))))
