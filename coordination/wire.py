"""Heartbeat request validation (PROTOCOL.md §3): JSON-decoded body → HeartbeatRequest.

Strict on types (no "5" for 5, no true for 1) and bounds; every problem is reported with the
field's path, e.g. "revokingShards[0].state: must be one of REVOKING, REVOKED". Pure and
cheap: it runs on every heartbeat. `assignments.serializers` describes the same shape for
OpenAPI; a test keeps both in step with `dataplane.protocol.REQUEST_FIELDS`.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any

from coordination.model import HeartbeatRequest, RevokeReport
from dataplane.protocol import (
    MEMBER_ID_RE,
    MEMBER_ID_RULE,
    TEMPORARY_LEAVE_EPOCH,
    RevokeState,
)

MAX_EPOCH = 2**31 - 1
MAX_SHARDS_PER_LIST = 10_000
MAX_SHARD_ID_LENGTH = 240
MAX_CLIENT_ID_LENGTH = 200
REBALANCE_TIMEOUT_MS_RANGE = (100, 24 * 3600 * 1000)
_REVOKE_STATES = {s.value: s for s in RevokeState}
# Control characters (NUL above all: PostgreSQL refuses it in text, a newline forges log
# lines) and lone surrogates (not encodable as UTF-8) never get past validation. Nor do
# format characters (Unicode category Cf: U+202E reverses what the admin and logs show,
# zero-width ones make two ids look alike; issue 27.10).
UNSAFE_CHARS_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def has_unsafe_chars(value: str) -> bool:
    if UNSAFE_CHARS_RE.search(value) is not None:
        return True
    # ASCII has no format character: the usual id skips the per-character walk.
    return not value.isascii() and any(unicodedata.category(c) == "Cf" for c in value)


class InvalidRequest(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Checker:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def integer(self, name: str, lo: int, hi: int, *, required: bool = False) -> int | None:
        value = self.data.get(name)
        if value is None:
            if required:
                self.fail(name, "required")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"must be an integer, got {type(value).__name__}")
            return None
        if not lo <= value <= hi:
            self.fail(name, f"must be between {lo} and {hi}, got {value}")
            return None
        return value

    def string(self, name: str, max_length: int) -> str | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(name, f"must be a string, got {type(value).__name__}")
            return None
        if len(value) > max_length:
            self.fail(name, f"must be at most {max_length} characters")
            return None
        if has_unsafe_chars(value):
            self.fail(name, "must not contain control or format characters")
            return None
        return value

    def shard(self, path: str, value: Any) -> str | None:
        if not isinstance(value, str):
            self.fail(path, f"must be a shard id string, got {type(value).__name__}")
            return None
        if not 0 < len(value) <= MAX_SHARD_ID_LENGTH:
            self.fail(path, f"must be a shard id of 1-{MAX_SHARD_ID_LENGTH} characters")
            return None
        if has_unsafe_chars(value):
            self.fail(path, "must not contain control or format characters")
            return None
        return value

    def items(self, name: str) -> list[Any] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            self.fail(name, f"must be a list, got {type(value).__name__}")
            return None
        if len(value) > MAX_SHARDS_PER_LIST:
            self.fail(name, f"must have at most {MAX_SHARDS_PER_LIST} entries, got {len(value)}")
            return None
        return value

    def shard_list(self, name: str) -> tuple[str, ...] | None:
        values = self.items(name)
        if values is None:
            return None
        # Every heartbeat sends its owned shards: the valid list is checked at once (one
        # pattern search over the joined ids: unsafe characters are single characters); only
        # a list with a problem is walked item by item, for messages naming each.
        if all(type(v) is str and 0 < len(v) <= MAX_SHARD_ID_LENGTH for v in values) and not (
                values and has_unsafe_chars("".join(values))):
            return tuple(dict.fromkeys(values))
        shards = [self.shard(f"{name}[{i}]", v) for i, v in enumerate(values)]
        return tuple(dict.fromkeys(s for s in shards if s is not None))


def parse_heartbeat(data: Any) -> HeartbeatRequest:
    """Validate a decoded heartbeat body; raise InvalidRequest naming every bad field."""
    if not isinstance(data, dict):
        raise InvalidRequest([f"body: must be a JSON object, got {type(data).__name__}"])
    c = _Checker(data)
    member_id = c.string("memberId", 64)
    if data.get("memberId") is None:
        c.fail("memberId", "required")
    elif member_id is not None and not MEMBER_ID_RE.fullmatch(member_id):
        c.fail("memberId", f"must be {MEMBER_ID_RULE}")
    # §9: same charset and length as memberId.
    instance_id = c.string("instanceId", 64)
    if instance_id is not None and not MEMBER_ID_RE.fullmatch(instance_id):
        c.fail("instanceId", f"must be {MEMBER_ID_RULE}")
        instance_id = None
    # -2: temporary leave (§9); whether the member may use it is the core's decision (R2s).
    member_epoch = c.integer("memberEpoch", TEMPORARY_LEAVE_EPOCH, MAX_EPOCH, required=True)
    client_id = c.string("clientId", MAX_CLIENT_ID_LENGTH)
    rebalance_timeout_ms = c.integer("rebalanceTimeoutMs", *REBALANCE_TIMEOUT_MS_RANGE)
    metadata_epoch = c.integer("metadataEpoch", 0, MAX_EPOCH)
    owned = c.shard_list("ownedShards")
    drained = c.shard_list("drainedShards")
    revoking: list[RevokeReport] = []
    for i, entry in enumerate(c.items("revokingShards") or ()):
        path = f"revokingShards[{i}]"
        if not isinstance(entry, dict):
            c.fail(path, f"must be an object with shard and state, got {type(entry).__name__}")
            continue
        shard = c.shard(f"{path}.shard", entry.get("shard"))
        raw_state = entry.get("state")
        state = _REVOKE_STATES.get(raw_state) if isinstance(raw_state, str) else None
        if state is None:
            c.fail(f"{path}.state", f"must be one of {', '.join(_REVOKE_STATES)}")
        if shard is not None and state is not None:
            revoking.append(RevokeReport(shard, state))
    if c.problems:
        raise InvalidRequest(c.problems)
    # Narrowing only: a missing field was a problem above.
    assert member_id is not None  # noqa: S101
    assert member_epoch is not None  # noqa: S101
    return HeartbeatRequest(
        member_id=member_id,
        member_epoch=member_epoch,
        metadata_epoch=metadata_epoch,
        client_id=client_id or "",
        rebalance_timeout_ms=rebalance_timeout_ms,
        owned_shards=owned,
        revoking_shards=tuple(revoking),
        drained_shards=drained or (),
        instance_id=instance_id,
    )


# Issue 25.7: a User-Agent's first product ("rsc-dataplane/0.2.0 python/3.11.9" ->
# "rsc-dataplane/0.2.0"), the token characters of RFC 9110, 64 characters at most.
_PRODUCT_RE = re.compile(r"\s*([A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}/[A-Za-z0-9!#$%&'*+.^_`|~-]{1,23})(?:[\s(]|$)")


def library_version(user_agent: str | None) -> str:
    """The client library and version a member's heartbeat names in its User-Agent (its first
    product, e.g. ``rsc-dataplane/0.2.0``), or "" when it names none; shown per member in
    describe and the admin, as Kafka shows client software names and versions."""
    match = _PRODUCT_RE.match(user_agent or "")
    return match.group(1) if match else ""

