"""Log lines: text (control characters escaped) or JSON (LOG_FORMAT=json) with protocol fields."""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Hashable

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


class LogThrottle:
    """At most one line per key per `every` seconds; counts what it held back."""

    def __init__(self, every: float = 10.0, max_keys: int = 1_000) -> None:
        self.every = every
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}
        self._max_keys = max_keys

    def allow(self, key: Hashable, now: float | None = None) -> int | None:
        """None: suppress this line. Otherwise the number of lines suppressed since the last one."""
        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if last is None and len(self._last) >= self._max_keys:
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        return self._held.pop(key, 0)

    def clear(self) -> None:
        self._last.clear()
        self._held.clear()


# Loggers whose lines any client can cause at will (issue 27.10): Django's 4xx warnings
# ("Not Found: /x", "Bad Request: /y") and its security lines (a bad Host header logged an
# ERROR with a 15-line traceback per request). coordinator_project.settings.LOGGING puts
# RefusalThrottle on each; a logger filter, so every handler sees the same lines.
REFUSAL_LOGGERS = (
    "django.request",
    "django.security.DisallowedHost",
    "django.security.DisallowedRedirect",
    "django.security.RequestDataTooBig",
    "django.security.TooManyFieldsSent",
    "django.security.TooManyFilesSent",
    "django.security.SuspiciousOperation",
    "django.security.SuspiciousMultipartForm",
    "django.security.SuspiciousFileOperation",
    "django.security.csrf",
)
MAX_REFUSAL_LINE = 300  # characters of a refusal's message kept (a Host header can be 8 KB)


def refusal_throttle() -> LogThrottle:
    # Made on first use: settings load this module before the process state is wanted.
    global _THROTTLE
    if _THROTTLE is None:
        from coordinator_project.process_state import PROCESS

        _THROTTLE = PROCESS.own(
            "django refusal log throttle", LogThrottle(every=10.0),
            "One line per 10 s per (logger, status) for Django's 4xx and security lines."
            " key: (logger name, HTTP status) -> when its last line was logged, lines held since;"
            " bound: 1,000 kinds, then emptied; invalidated: every 10 s per kind; N hosts: per"
            " process by design (each logs its own lines).",
        )
    return _THROTTLE


_THROTTLE: LogThrottle | None = None


class RefusalThrottle(logging.Filter):
    """One short line per kind per 10 s, with how many were held back: 4xx answers of
    django.request (5xx pass untouched) and django.security's lines, which lose their
    traceback and become WARNINGs (a refused request is not the server's error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if record.name == "django.request":
            if not isinstance(status, int) or status >= 500:
                return True
        else:
            record.exc_info = record.exc_text = record.stack_info = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        throttle = refusal_throttle()
        held = throttle.allow((record.name, status))
        if held is None:
            return False
        message = record.getMessage()
        if len(message) > MAX_REFUSAL_LINE:
            message = message[:MAX_REFUSAL_LINE] + "…"
        if held:
            message += f" ({held} more not logged in the last {throttle.every:g} s)"
        record.msg, record.args = message, None
        return True
