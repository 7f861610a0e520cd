"""The heartbeat's documents for the membership machine (PROTOCOL.md §3, §4): the request
body it sends, the metadata it keeps, the grants it derives from metadata (a shard's Redis keys
and start position) and the actions of one step for the runtime. Pure. The words themselves
(field names, codes, states, epochs) are in ``protocol``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .protocol import JOIN_EPOCH, RevokeState
from .routing import DEFAULT_KEY_PREFIX, ShardKeys, document_versions, find_shard

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Grant:
    """A shard the runtime may read, with what it needs to start reading it."""

    shard: str
    grant_epoch: int  # memberEpoch of the OK response that granted it
    member_id: str
    redis_key: str
    seal_key: str
    start_id: str  # consumer-group start: "0", or "$" for a first version with "latest"
    key_prefix: str = DEFAULT_KEY_PREFIX

    @property
    def token(self) -> str:
        """Fence token value: ``"grantEpoch:memberId"``; only the epoch is compared."""
        return f"{self.grant_epoch}:{self.member_id}"

    @property
    def keys(self) -> ShardKeys:
        return ShardKeys(self.shard, self.key_prefix)


@dataclass(slots=True)
class Actions:
    """What the runtime must do after a step of the machine."""

    grant: list[Grant] = field(default_factory=list)  # raise fence token, then read
    revoke: list[str] = field(default_factory=list)  # stop reads, finish and ACK in-flight (C1)
    abort: list[str] = field(default_factory=list)  # stop reads and ACKs at once (C4)
    rejoin: bool = False
    left: bool = False

    def __bool__(self) -> bool:
        return bool(self.grant or self.revoke or self.abort or self.rejoin or self.left)


def shard_name(entry: Any) -> str:
    # assignment.revokingShards may list bare ids or {"shard": id, ...} objects.
    return entry["shard"] if isinstance(entry, dict) else str(entry)


def grant_from_metadata(
    metadata: dict[str, Any] | None, shard: str, epoch: int, member_id: str
) -> Grant:
    """The grant of ``shard`` at ``epoch``: keys and start position from the metadata."""
    md = metadata or {}
    prefix = md.get("keyPrefix") or DEFAULT_KEY_PREFIX
    start_position = md.get("startPosition") or "earliest"
    keys = ShardKeys(shard, prefix)
    found = find_shard(document_versions(md), shard)
    if found is not None:
        version, index = found
        keys = version.keys(index)
        return Grant(
            shard=shard,
            grant_epoch=epoch,
            member_id=member_id,
            redis_key=keys.stream,
            seal_key=keys.sealed,
            start_id="$" if version.first and start_position == "latest" else "0",
            key_prefix=version.key_prefix,
        )
    # Not in the metadata we hold (should not happen: R7 syncs metadata first). Derive the
    # keys and start from "0": re-reading is at-least-once, skipping would lose messages.
    log.warning("granted shard %s is not in the metadata held (%s)", shard, md.get("metadataEpoch"))
    return Grant(shard, epoch, member_id, keys.stream, keys.sealed, "0", prefix)


def heartbeat_request(
    member_id: str,
    epoch: int,
    metadata_epoch: int,
    owned: Iterable[str],
    revoking: dict[str, RevokeState],
    drained: Iterable[str],
    *,
    client_id: str | None = None,
    instance_id: str | None = None,
    rebalance_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """The heartbeat body at ``epoch`` (0: join, -1: leave, -2: temporary leave)."""
    req: dict[str, Any] = {"memberId": member_id, "memberEpoch": epoch}
    if client_id:
        req["clientId"] = client_id
    if instance_id:
        req["instanceId"] = instance_id
    if epoch == JOIN_EPOCH and rebalance_timeout_ms is not None:
        req["rebalanceTimeoutMs"] = rebalance_timeout_ms
    req["metadataEpoch"] = metadata_epoch
    if epoch <= JOIN_EPOCH:
        # C5: a join never reports ownership; a leave releases everything anyway.
        req["ownedShards"] = []
        req["revokingShards"] = []
        req["drainedShards"] = []
    else:
        req["ownedShards"] = sorted(owned)
        req["revokingShards"] = [{"shard": s, "state": st} for s, st in sorted(revoking.items())]
        req["drainedShards"] = sorted(drained)
    return req


@dataclass(frozen=True, slots=True)
class HeldMetadata:
    metadata: dict[str, Any] | None
    epoch: int
    heartbeat_interval_ms: int | None = None  # from full metadata, when it has them
    session_timeout_ms: int | None = None


def held_metadata(answer: Any, held: dict[str, Any] | None, held_epoch: int) -> HeldMetadata:
    """What the member holds after an answer's ``metadata``: full metadata (join and
    SYNC_METADATA) replaces what is held; a bare epoch is kept only while nothing is held, so
    that with full metadata a newer epoch brings SYNC_METADATA (R7) and its content."""
    if not isinstance(answer, dict):
        return HeldMetadata(held, held_epoch)
    md_epoch = answer.get("metadataEpoch")
    if "versions" in answer:
        return HeldMetadata(
            answer,
            md_epoch if isinstance(md_epoch, int) else held_epoch,
            _positive(answer.get("heartbeatIntervalMs")),
            _positive(answer.get("sessionTimeoutMs")),
        )
    if isinstance(md_epoch, int) and held is None:
        return HeldMetadata(held, md_epoch)
    return HeldMetadata(held, held_epoch)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
