"""Heartbeat service: the shell around `coordination.engine.heartbeat` (load, lock, call, persist)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from assignments import fastpath
from assignments.store import load_state, lock_group, save_state
from coordination import engine
from coordination.model import (
    Assignment,
    ErrorCode,
    HeartbeatRequest,
    HeartbeatResponse,
    Status,
)
from groups.api_errors import error_body
from groups.describe import describe_group  # noqa: F401 - the describe document lives there (§10)
from groups.metadata import group_metadata
from groups.models import Group


@dataclass(frozen=True)
class HeartbeatResult:
    response: HeartbeatResponse
    metadata: dict[str, Any] | None  # None on errors


def heartbeat(group_name: str, req: HeartbeatRequest, now: datetime) -> HeartbeatResult:
    if fastpath.available() and fastpath.eligible(req):
        steady = fastpath.steady_heartbeat(group_name, req, now)
        if steady is not None:
            return HeartbeatResult(
                HeartbeatResponse(
                    error_code=ErrorCode.NONE,
                    status=Status.OK,
                    member_id=req.member_id,
                    member_epoch=req.member_epoch,
                    assignment_epoch=steady.assignment_epoch,
                    heartbeat_interval_ms=steady.heartbeat_interval_ms,
                    assignment=Assignment(assigned=steady.assigned),
                ),
                {"metadataEpoch": steady.metadata_epoch},
            )
    with transaction.atomic():
        group = lock_group(group_name)
        if group is None:
            return HeartbeatResult(
                HeartbeatResponse(
                    error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                    error_message=f"group {group_name!r} does not exist",
                    member_id=req.member_id,
                ),
                None,
            )
        if engine.needs_full_state(req):
            state, loaded = load_state(group, also_members=(req.member_id,))
        else:
            claimed = (req.owned_shards or ()) + tuple(r.shard for r in req.revoking_shards)
            state, loaded = load_state(group, only_member=req.member_id, claimed=claimed)
        response = engine.heartbeat(state, req, now)
        if response.error_code != ErrorCode.NONE:
            return HeartbeatResult(response, None)  # R8: a refused heartbeat changes nothing
        save_state(state, loaded, now)
    if response.full_metadata:
        metadata = group_metadata(group)
    else:
        metadata = {"metadataEpoch": group.metadata_epoch}
    return HeartbeatResult(response, metadata)


def response_body(result: HeartbeatResult) -> dict[str, Any]:
    """The wire form: every field present, lists full (§3); an error is errorCode,
    errorMessage and memberId only."""
    r = result.response
    a = r.assignment
    if r.error_code != ErrorCode.NONE:
        return error_body(r.error_code.value, r.error_message or "", r.member_id)
    return {
        "errorCode": r.error_code.value,
        "errorMessage": r.error_message,
        "status": r.status.value if r.status else None,
        "memberId": r.member_id,
        "memberEpoch": r.member_epoch,
        "assignmentEpoch": r.assignment_epoch,
        "heartbeatIntervalMs": r.heartbeat_interval_ms,
        "assignment": None if a is None else {
            "assignedShards": list(a.assigned),
            "pendingShards": list(a.pending),
            "revokingShards": list(a.revoking),
        },
        "metadata": result.metadata,
    }


def group_exists(name: str) -> bool:
    return Group.objects.filter(name=name).exists()
