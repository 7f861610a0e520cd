"""Log lines: text (control characters escaped) or JSON (LOG_FORMAT=json) with protocol fields."""
from __future__ import annotations

import json
import logging
import re

# Fields a caller may pass through `extra=` that belong in the JSON line.
EXTRA_FIELDS = ("event", "group", "memberId", "memberEpoch", "groupEpoch", "assignmentEpoch", "stream", "shard")


# C0/C1 controls (newline, ESC, ...) and the Unicode line separators: names from URLs and
# bodies must not start a forged log line or drive a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class TextFormatter(logging.Formatter):
    """The text format with the message's control characters escaped (tracebacks stay as is)."""

    def format(self, record: logging.LogRecord) -> str:
        msg, args = record.msg, record.args
        record.msg, record.args = escape_controls(record.getMessage()), None
        try:
            return super().format(record)
        finally:
            record.msg, record.args = msg, args  # other handlers see the record unchanged


class JsonFormatter(logging.Formatter):
    """One JSON object per line; json.dumps escapes every control character (ensure_ascii)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in EXTRA_FIELDS:
            if hasattr(record, field):
                line[field] = getattr(record, field)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
