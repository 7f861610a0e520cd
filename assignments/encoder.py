"""The heartbeat's wire form, in one place (issue 23.5): the body as the protocol spells it
(§3), a memoized steady answer's body built and rendered once, and the metadata document's
cached JSON text spliced into the bytes instead of being serialized again (joins and R7
answers carry the whole document, the same until its metadataEpoch changes)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from assignments.answers import HeartbeatResult, WireBody
from dataplane.protocol import ErrorCode
from groups.api_errors import error_body
from groups.metadata import rendered


def response_body(result: HeartbeatResult) -> WireBody:
    """The wire form: every field present, lists full (§3); an error is errorCode,
    errorMessage and memberId only. A memoized steady answer's body is built once."""
    memo = result.memo
    if memo is None:
        return WireBody(_body(result))
    if memo.body is None:
        memo.body = WireBody(_body(result))
    return memo.body


def _body(result: HeartbeatResult) -> dict[str, Any]:
    r = result.response
    a = r.assignment
    if r.error_code != ErrorCode.NONE:
        return error_body(r.error_code, r.error_message or "", r.member_id)
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
        "metadata": result.metadata,  # last: render() splices the document's text here
    }


def render(body: WireBody, to_json: Callable[[dict[str, Any]], bytes]) -> bytes:
    """The body's bytes (`to_json` serializes a dict): kept on the body, so a memoized
    answer is rendered once; a whole metadata document goes in as its cached text."""
    if body.rendered is not None:
        return body.rendered
    metadata = body.get("metadata")
    text = rendered(metadata) if isinstance(metadata, dict) and next(reversed(body)) == "metadata" else None
    if text is None:
        out = to_json(body)
    else:
        head = to_json({k: v for k, v in body.items() if k != "metadata"})
        out = b"".join((head[:-1], b',"metadata":', text, b"}"))  # one copy of the text
    body.rendered = out
    return out
