"""Rolling-restart figure (issue 11, PROTOCOL.md §9): how many shards a rolling restart of N
members hands to *other* members. Goal with instance ids: 0.

Each member is the data plane's own heartbeat state machine (``dataplane.membership``) over
its ``Transport``, against a live coordinator; members finish revocations at once (no
in-flight work, as the heartbeat benchmark's members do), and the machines run on a virtual
clock so a round of heartbeats does not wait for the heartbeat interval. A restart is what a
``Consumer`` does: stop (drain, then ``memberEpoch -2`` with an instance id, ``-1`` without),
and a new process (a new memberId) with the same instance id joins. "Moved" counts every
grant of a shard to a member of another instance than the one holding it before the restarts.

    rolling_restart(url, group, api_key, members=8)     # from another benchmark (group empty)
    python bench/rolling_restart.py                     # standalone: own database and gunicorn
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.membership import Membership  # noqa: E402
from dataplane.transport import Transport  # noqa: E402


@dataclass
class _Member:
    instance: str
    machine: Membership
    clock_ms: int = 0


@dataclass
class RollingResult:
    members: int
    static: bool
    moved: int  # grants to a member of another instance than the shard's holder at the start
    seconds: float  # the restarts, from the first stop to the last settle
    heartbeats: int
    moved_shards: list[tuple[str, str]] = field(default_factory=list)  # (shard, instance)


class _Group:
    def __init__(self, transport: Transport, describe: httpx.Client, group: str, static: bool) -> None:
        self.transport, self.group, self.static = transport, group, static
        self._describe = describe
        self.members: dict[str, _Member] = {}  # memberId -> member
        self.holder: dict[str, str] = {}  # shard -> instance holding it before the restarts
        self.moved: list[tuple[str, str]] = []
        self.heartbeats = 0
        self.counting = False

    def start(self, member_id: str, instance: str) -> None:
        machine = Membership(member_id, instance_id=instance if self.static else None)
        self.members[member_id] = _Member(instance, machine)

    def step(self, m: _Member) -> None:
        """One heartbeat of one member, its answer applied as a data plane would."""
        m.clock_ms += m.machine.heartbeat_interval_ms
        req = m.machine.poll(m.clock_ms)
        if req is None:
            return
        status, body = self.transport.heartbeat(self.group, req)
        self.heartbeats += 1
        actions = m.machine.on_response(m.clock_ms, status, body)
        for shard in actions.revoke:
            m.machine.revocation_finished(shard)  # no in-flight work
        for grant in actions.grant:
            if self.counting and self.holder.get(grant.shard, m.instance) != m.instance:
                self.moved.append((grant.shard, m.instance))

    def stop(self, member_id: str) -> None:
        m = self.members.pop(member_id)
        m.machine.leave()
        for shard in m.machine.revoking_in_progress:
            m.machine.revocation_finished(shard)
        while not m.machine.left:
            self.step(m)

    def describe(self) -> dict[str, Any]:
        r = self._describe.get(f"/api/v1/groups/{quote(self.group, safe='')}")
        r.raise_for_status()
        return r.json()

    def settle(self, timeout_s: float = 120.0) -> None:
        """Heartbeat rounds until the coordinator describes the group STABLE with our members."""
        deadline = time.monotonic() + timeout_s
        while True:
            for m in list(self.members.values()):
                self.step(m)
            doc = self.describe()
            live = {d["memberId"] for d in doc["members"]}
            if (doc["state"] == "STABLE" and live == set(self.members)
                    and not any(d["pendingShards"] or d["revokingShards"] for d in doc["members"])):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"group did not settle: {doc['state']}")


def rolling_restart(url: str, group: str, api_key: str, members: int = 8, *, static: bool = True) -> RollingResult:
    """Join `members` members into the (empty) group, settle, restart each in turn (settling
    after each), and count the shards handed to another member meanwhile."""
    auth = {"Authorization": f"Bearer {api_key}"}
    with Transport(url, api_key) as transport, httpx.Client(base_url=url, headers=auth) as client:
        g = _Group(transport, client, group, static)
        for i in range(members):
            g.start(f"{group}-m{i}-0", f"{group}-{i}")
        g.settle()
        g.holder = {s: m.instance for m in g.members.values() for s in m.machine.readable}
        g.counting = True
        started, before = time.monotonic(), g.heartbeats
        for i in range(members):
            g.stop(f"{group}-m{i}-0")
            g.start(f"{group}-m{i}-1", f"{group}-{i}")
            g.settle()
        seconds = time.monotonic() - started
        for member_id in list(g.members):
            g.stop(member_id)
        return RollingResult(members, static, len(g.moved), seconds, g.heartbeats - before, g.moved)


def report(url: str, static_group: tuple[str, str], plain_group: tuple[str, str] | None = None,
           members: int = 8) -> RollingResult:
    """Print the figure: "shards moved to other members: X" for static members (goal 0) and,
    given a second empty group, for members without instance ids, for contrast. Each group is
    (name, api key)."""
    runs = [(static_group, True)] + ([(plain_group, False)] if plain_group else [])
    results = []
    for (group, key), static in runs:
        r = rolling_restart(url, group, key, members, static=static)
        results.append(r)
        label = "with instance ids" if static else "without instance ids"
        print(f"   rolling restart of {members} members {label}: shards moved to other members: {r.moved}"
              f"  ({r.seconds:.1f} s, {r.heartbeats} heartbeats)" + ("  (goal 0)" if static else ""))
    return results[0]


def main() -> None:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rsc_bench_rolling")
    from bench.heartbeat import recreate_database, serving

    members = int(os.environ.get("BENCH_ROLLING_MEMBERS", 8))
    shards = int(os.environ.get("BENCH_ROLLING_SHARDS", 64))
    recreate_database(os.environ["DATABASE_URL"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
    os.environ.setdefault("SECRET_KEY", "bench-insecure-key")  # the settings refuse to load without one
    import django

    django.setup()
    from django.core.management import call_command

    from groups.services import create_api_key, create_group, create_stream

    call_command("migrate", verbosity=0)
    create_stream("rolling", shards)
    groups = []
    for name in ("rolling-static", "rolling-plain"):
        create_group(name, "rolling", session_timeout_ms=60_000, rebalance_timeout_ms=60_000)
        groups.append((name, create_api_key(group=name)))
    with serving(wait=30) as url:
        print(f"== rolling restart: {members} members over {shards} shards, one restart at a time")
        result = report(url, groups[0], groups[1], members)
    if result.moved:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
