"""The API's JSON parser: bounded in size and nesting, so a hostile body is a 4xx, never a 500."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant

# The deepest body the API takes is 3 levels (heartbeat → revokingShards → entry).
MAX_JSON_DEPTH = 32


class PayloadTooLarge(APIException):
    """A body over DATA_UPLOAD_MAX_MEMORY_SIZE: 413 with the JSON error body (api_errors)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


def payload_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body: larger than the limit of {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)")


def nested_too_deep(raw: bytes, data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if `data` (decoded from `raw`) nests lists/objects deeper than `limit`.

    The bracket count bounds the depth from above at C speed, so ordinary bodies skip the walk.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, Mapping) else value
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
    return False


class BoundedJSONParser(JSONParser):
    """DRF's strict JSON parser plus a size limit (413) and a nesting limit (400).

    Django enforces DATA_UPLOAD_MAX_MEMORY_SIZE only through `request.body`; DRF reads the
    stream itself, so the limit is applied here too. json.loads raises RecursionError (a
    500) on ~1,000 levels; the depth check turns anything past MAX_JSON_DEPTH into a 400.
    """

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        if stream is None:
            raise ParseError("empty body")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise payload_too_large(limit)
        try:
            data = json.loads(raw, parse_constant=strict_constant)
        except RecursionError as exc:
            raise ParseError(f"nested deeper than {MAX_JSON_DEPTH} levels") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
            raise ParseError(str(exc)) from exc
        if nested_too_deep(raw, data):
            raise ParseError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return data
