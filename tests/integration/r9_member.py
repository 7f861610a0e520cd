"""A member process for the R9 soak: follows C1–C5 over real HTTP and records, for every
shard, the interval during which it believed it owned it (from the response that granted it
to the send of the heartbeat that gave it up)."""
from __future__ import annotations

import random
import time
from typing import Any

import httpx

from tests.plain_http import TLS


def run_member(url: str, group: str, key: str, member_id: str, seconds: float, seed: int,
               min_heartbeats: int = 0, max_seconds: float = 120.0) -> dict[str, Any]:
    """Runs for `seconds` and until `min_heartbeats` were answered (`max_seconds` at most): a
    loaded machine makes the run longer, not thinner."""
    rng = random.Random(seed)
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=10, verify=TLS)
    epoch, metadata_epoch = 0, None
    owned: dict[str, float] = {}  # shard -> interval start
    to_report: list[str] = []  # released shards to report REVOKED
    intervals: list[tuple[str, str, float, float]] = []
    counts: dict[str, int] = {}
    started = time.monotonic()
    deadline, hard_deadline = started + seconds, started + max_seconds
    answered = 0

    def close_all(at: float) -> None:
        for shard, start in owned.items():
            intervals.append((shard, member_id, start, at))
        owned.clear()
        to_report.clear()

    while (time.monotonic() < deadline or answered < min_heartbeats) and time.monotonic() < hard_deadline:
        roll = rng.random()
        if epoch > 0 and roll < 0.02:  # leave, then rejoin on the next turn
            sent = time.monotonic()
            close_all(sent)
            r = client.post(f"/api/v1/groups/{group}/heartbeat", json={"memberId": member_id, "memberEpoch": -1})
            assert r.status_code == 200, r.text
            counts["leave"] = counts.get("leave", 0) + 1
            epoch = 0
            continue
        if epoch > 0 and roll < 0.03:  # restart: rejoin with epoch 0 (C4/C5)
            epoch = 0
        body: dict[str, Any] = {"memberId": member_id, "memberEpoch": epoch, "metadataEpoch": metadata_epoch}
        sent = time.monotonic()
        if epoch == 0:
            close_all(sent)
            body["ownedShards"] = []
        else:
            body["ownedShards"] = sorted(owned)
            body["revokingShards"] = [{"shard": s, "state": "REVOKED"} for s in to_report]
        r = client.post(f"/api/v1/groups/{group}/heartbeat", json=body)
        received = time.monotonic()
        data = r.json()
        code = data["errorCode"]
        counts[code] = counts.get(code, 0) + 1
        answered += 1
        if code != "NONE":
            assert code in ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"), data
            close_all(sent)
            epoch = 0
            continue
        to_report.clear()
        epoch = data["memberEpoch"]
        metadata_epoch = data["metadata"]["metadataEpoch"]
        assigned = set(data["assignment"]["assignedShards"])
        for shard in sorted(set(owned) - assigned):  # C1: stop; no in-flight here, so REVOKED next
            # The interval ends at the next send (conservative: later than the real stop).
            to_report.append(shard)
        if data["status"] == "OK":  # C2/C3: new shards only from OK
            for shard in assigned - set(owned):
                owned[shard] = received
        time.sleep(rng.uniform(0, 0.01))  # think time, not synchronisation
        now = time.monotonic()
        for shard in to_report:
            if shard in owned:
                intervals.append((shard, member_id, owned.pop(shard), now))
    close_all(time.monotonic())
    client.post(f"/api/v1/groups/{group}/heartbeat", json={"memberId": member_id, "memberEpoch": -1})
    return {"intervals": intervals, "counts": counts}
