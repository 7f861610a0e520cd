"""Simulated members for the multi-host test (issue 23.8).

Each member follows C1–C5 over real HTTP, sends every heartbeat to a coordinator host picked
at random (another one if that host does not answer: a restart), and records into a shared
`Timeline`: every exchange (times, HTTP status, errorCode, epochs) and, per shard, the
interval during which it believed it owned the shard — from the answer that granted it to
the send of the heartbeat that gave it up (REVOKED, a leave), or to the moment the member
stopped reading (frozen, gone silent). A frozen process reads nothing, so a member that
freezes closes its intervals when it freezes, as the data-plane library's own session check
does.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.plain_http import TLS  # one TLS context, not one per member (~37 ms of CPU each)

LEAVE, TEMPORARY_LEAVE = -1, -2


@dataclass(frozen=True)
class Exchange:
    member: str
    sent: float
    received: float
    http: int
    code: str
    sent_epoch: int
    member_epoch: int | None  # of an accepted answer
    assignment_epoch: int | None
    status: str | None
    host: str
    message: str | None = None  # errorMessage of a refusal
    resent: bool = False  # an earlier send of this body got no answer (a host went down)


@dataclass
class Timeline:
    lock: threading.Lock = field(default_factory=threading.Lock)
    exchanges: list[Exchange] = field(default_factory=list)
    intervals: list[tuple[str, str, float, float]] = field(default_factory=list)  # shard, member, start, end
    unanswered: int = 0  # requests no host answered (connection refused or reset: a restart)
    scripted: list[tuple[str, str, str]] = field(default_factory=list)  # member, expected, got

    def record(self, exchange: Exchange) -> None:
        with self.lock:
            self.exchanges.append(exchange)

    def close(self, shard: str, member: str, start: float, end: float) -> None:
        with self.lock:
            self.intervals.append((shard, member, start, end))


class Hosts:
    """The coordinator hosts' URLs; a request goes to one picked at random."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def order(self, rng: random.Random) -> list[str]:
        urls = list(self.urls)
        rng.shuffle(urls)
        return urls


def version_of(shard: str) -> int:
    return int(shard.rsplit(":", 2)[1])


class SimMember:
    """One member process (one memberId); a static member's next process is a new SimMember
    with the same instanceId."""

    def __init__(self, member_id: str, hosts: Hosts, group: str, key: str, timeline: Timeline,
                 rng: random.Random, instance_id: str | None = None) -> None:
        self.member_id, self.hosts, self.group, self.timeline, self.rng = member_id, hosts, group, timeline, rng
        self.instance_id = instance_id
        self.client = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=10, verify=TLS)
        self.epoch = 0
        self.metadata_epoch: int | None = None
        self.sealed_versions: set[int] = set()
        self.owned: dict[str, float] = {}  # shard → when this member started to own it
        self.to_report: list[str] = []  # given up, REVOKED on the next heartbeat
        self.assigned: set[str] = set()  # the last accepted answer's assignedShards
        self.last_code = "NONE"
        self.last_status: str | None = None  # of the last accepted answer

    # --- what the member believes it owns ----------------------------------------------
    def stop_reading(self, at: float) -> None:
        """Every shard given up at `at` (a leave sent, a freeze, a refusal, a crash)."""
        for shard, start in self.owned.items():
            self.timeline.close(shard, self.member_id, start, at)
        self.owned.clear()
        self.to_report.clear()

    # --- requests ---------------------------------------------------------------------
    def _post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], float, float, str, bool] | None:
        """Send `body` to a random host, to the others if it does not answer; None if no host
        answered within 20 s. A lost answer is re-sent as it was: R3 accepts the previous
        epoch, a join or leave may repeat."""
        deadline = time.monotonic() + 20
        resent = False
        while time.monotonic() < deadline:
            for url in self.hosts.order(self.rng):
                sent = time.monotonic()
                try:
                    r = self.client.post(f"{url}/api/v1/groups/{self.group}/heartbeat", json=body)
                except httpx.TransportError:
                    resent = True
                    with self.timeline.lock:
                        self.timeline.unanswered += 1
                    continue
                try:
                    data = r.json()
                except ValueError:
                    data = {"errorCode": f"non-JSON answer {r.text[:200]!r}"}
                return r.status_code, data, sent, time.monotonic(), url, resent
            time.sleep(0.1)  # every host down at once: wait for one, with a deadline
        return None

    def _exchange(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], float, float] | None:
        answer = self._post(body)
        if answer is None:
            return None
        status, data, sent, received, url, resent = answer
        code = str(data.get("errorCode"))
        ok = code == "NONE"
        self.timeline.record(Exchange(
            self.member_id, sent, received, status, code, body["memberEpoch"],
            data.get("memberEpoch") if ok else None, data.get("assignmentEpoch") if ok else None,
            data.get("status") if ok else None, url, None if ok else data.get("errorMessage"), resent))
        self.last_code = code
        return status, data, sent, received

    def join(self) -> bool:
        self.stop_reading(time.monotonic())
        self.epoch = 0
        body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": 0, "ownedShards": []}
        if self.instance_id:
            body["instanceId"] = self.instance_id
        return self._accept(self._exchange(body))

    def heartbeat(self) -> bool:
        """One regular heartbeat; False if it was refused (the caller decides: C4/C5 rejoin)."""
        if self.epoch <= 0:
            return self.join()
        return self._accept(self._exchange(self.request()))

    def request(self) -> dict[str, Any]:
        now = time.monotonic()
        for shard in self.to_report:  # given up as this request leaves (C1: nothing in flight)
            start = self.owned.pop(shard, None)
            if start is not None:
                self.timeline.close(shard, self.member_id, start, now)
        body: dict[str, Any] = {
            "memberId": self.member_id, "memberEpoch": self.epoch, "metadataEpoch": self.metadata_epoch,
            "ownedShards": sorted(self.owned),
            "revokingShards": [{"shard": s, "state": "REVOKED"} for s in self.to_report],
            "drainedShards": sorted(s for s in self.owned if version_of(s) in self.sealed_versions),
        }
        if self.instance_id:
            body["instanceId"] = self.instance_id
        return body

    def send(self, body: dict[str, Any]) -> str:
        """Send a prepared (possibly stale) body; the errorCode of the answer."""
        self._accept(self._exchange(body))
        return self.last_code

    def leave(self, temporarily: bool = False) -> None:
        epoch = TEMPORARY_LEAVE if temporarily else LEAVE
        self.stop_reading(time.monotonic())
        if self.epoch > 0:
            body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": epoch}
            if self.instance_id:
                body["instanceId"] = self.instance_id
            self._exchange(body)
        self.epoch = 0

    def _accept(self, exchanged: tuple[int, dict[str, Any], float, float] | None) -> bool:
        if exchanged is None:
            return False
        _, data, sent, received = exchanged
        if data.get("errorCode") != "NONE":
            self.stop_reading(sent)  # C4: stop, clear, rejoin at 0
            self.epoch = 0
            return False
        if data.get("memberEpoch", 0) < 0:
            return True  # a leave's answer
        self.to_report.clear()
        self.last_status = data["status"]
        self.epoch = data["memberEpoch"]
        metadata = data.get("metadata") or {}
        if "versions" in metadata:  # full metadata (join, SYNC_METADATA)
            self.metadata_epoch = metadata["metadataEpoch"]
            self.sealed_versions = {v["version"] for v in metadata["versions"] if v["state"] == "SEALED"}
        assigned = set(data["assignment"]["assignedShards"])
        self.assigned = assigned
        self.to_report = sorted(set(self.owned) - assigned)  # C1: stop now, REVOKED next time
        if data["status"] == "OK":  # C2/C3: new shards only from OK
            for shard in assigned - set(self.owned):
                self.owned[shard] = received
        return True

    def close(self) -> None:
        self.client.close()
