"""JSON log lines (LOG_FORMAT=json) carrying event names and protocol fields."""
from __future__ import annotations

import json
import logging

# Fields a caller may pass through `extra=` that belong in the JSON line.
EXTRA_FIELDS = ("event", "group", "memberId", "memberEpoch", "groupEpoch", "assignmentEpoch", "stream", "shard")


class JsonFormatter(logging.Formatter):
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
