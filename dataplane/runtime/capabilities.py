"""Which ACK command the server has: XACKDEL (Redis >= 8.2) or XACK."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class AckMode(StrEnum):
    XACKDEL = "XACKDEL"  # acknowledge and delete once every group has acknowledged
    XACK = "XACK"  # acknowledge only: deletion is left to trimming


def ack_mode_from_capabilities(command_info: Any, server_version: str | None = None) -> AckMode:
    """Pick the ACK command: XACKDEL when the server has it (Redis >= 8.2), else XACK.

    ``command_info`` is the reply of ``COMMAND INFO XACKDEL`` (``[None]`` when the server does
    not know the command; ``None`` when the question itself failed, e.g. a proxy that hides
    COMMAND); ``server_version`` is INFO's redis_version, the fallback.
    """
    if isinstance(command_info, list | tuple) and command_info:
        return AckMode.XACKDEL if command_info[0] else AckMode.XACK
    if isinstance(command_info, dict) and command_info:
        return AckMode.XACKDEL if any(command_info.values()) else AckMode.XACK
    if server_version:
        try:
            parts = tuple(int(p) for p in server_version.split(".")[:2])
        except ValueError:
            return AckMode.XACK
        return AckMode.XACKDEL if parts >= (8, 2) else AckMode.XACK
    return AckMode.XACK


def detect_ack_mode(client: Any) -> AckMode:
    """Ask the server which ACK command it has (see :func:`ack_mode_from_capabilities`)."""
    info: Any = None
    version: str | None = None
    try:
        # "COMMAND INFO" as one word bypasses redis-py's reply parser, which chokes on [None].
        info = client.execute_command("COMMAND INFO", "XACKDEL")
    except Exception:
        info = None
    if not info:
        try:
            raw = client.info("server")
            if isinstance(raw, dict) and "redis_version" not in raw:  # cluster: per node
                raw = next(iter(raw.values()), {})
            version = raw.get("redis_version")
        except Exception:
            version = None
    return ack_mode_from_capabilities(info, version)
