"""What an accepted heartbeat answer does to the shards a member holds (PROTOCOL.md §1 C1–C3,
§4 R5), one function per rule, the way ``coordination.engine`` names R1–R9.

Pure: each changes the ``owned`` (shard → grant) and ``revoking`` (shard → state until an
answer accepted REVOKED) maps the membership machine passes in, and adds what the runtime must
do to its ``Actions``. The machine calls them in this order for every accepted answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .heartbeat import Actions, Grant, grant_from_metadata, shard_name
from .protocol import RevokeState

log = logging.getLogger(__name__)

Owned = dict[str, Grant]
Revoking = dict[str, RevokeState]


def answer_assignment(body: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The answer's ``assignedShards`` and the shards the coordinator is revoking from us."""
    assignment = body.get("assignment") or {}
    assigned = set(assignment.get("assignedShards") or [])
    return assigned, {shard_name(e) for e in assignment.get("revokingShards") or []}


def c1_stop_missing(owned: Owned, revoking: Revoking, assigned: set[str], actions: Actions) -> None:
    """C1: an owned shard missing from assignedShards stops; REVOKED once in-flight is 0."""
    for shard in sorted(owned):
        if shard not in assigned:
            del owned[shard]
            revoking[shard] = RevokeState.REVOKING
            actions.revoke.append(shard)
            log.info("shard %s revoked: no new reads, finishing what is in flight", shard)


def revoked_never_held(owned: Owned, revoking: Revoking, coord_revoking: set[str]) -> bool:
    """A shard the coordinator is revoking from us that we never held (its grant was in a lost
    answer): nothing to drain, so it is REVOKED at once instead of timing out. True when there
    is such a shard (report it now)."""
    new = sorted(s for s in coord_revoking if s not in owned and s not in revoking)
    for shard in new:
        revoking[shard] = RevokeState.REVOKED
    return bool(new)


def r5_forget_processed_revoked(
    revoking: Revoking, sent: Iterable[dict[str, Any]], coord_revoking: set[str]
) -> None:
    """R5: the REVOKED entries the accepted request carried (``sent``, its revokingShards) are
    processed: stop reporting them."""
    for entry in sent:
        shard = entry["shard"]
        if (
            entry["state"] == RevokeState.REVOKED
            and revoking.get(shard) == RevokeState.REVOKED
            and shard not in coord_revoking
        ):
            del revoking[shard]


def c2_c3_take_new(
    owned: Owned,
    revoking: Revoking,
    assigned: set[str],
    actions: Actions,
    *,
    metadata: dict[str, Any] | None,
    epoch: int,
    member_id: str,
) -> None:
    """C2/C3: new shards only from OK (the caller checks; SYNC_METADATA and REVOKE_PENDING are
    drain-only), at the grant epoch of this answer (``epoch``), with the keys ``metadata`` names."""
    for shard in sorted(assigned):
        if shard in owned:
            continue
        # Granted again while we were still revoking it: the coordinator resolved the
        # revocation, so the pending report is moot and the shard is ours again.
        revoking.pop(shard, None)
        owned[shard] = grant_from_metadata(metadata, shard, epoch, member_id)
        actions.grant.append(owned[shard])
