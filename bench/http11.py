"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for the join storm's simulated
members.

One bench process stands for 1,000 members, each in production a process of its own with its
own connection. Through httpx (httpcore's pool checks every pooled connection's socket on each
request) the simulated members spent ~11 s of CPU per storm on this 2-core machine, about as
much as the coordinator's workers, and so set the pace the benchmark meant to measure. This
client does only what the members' requests need: POST with a JSON body on one persistent
connection, a Content-Length or chunked answer, and a reconnect when the server closed the
connection. It is not a general HTTP client and the data plane does not use it.
"""
from __future__ import annotations

import asyncio
import contextlib

# A join answer carries the whole metadata document (~800 KB for 4,096 shards): read it in
# large pieces instead of pausing the transport every 128 KB (asyncio's default limit × 2).
_READ_LIMIT = 4 * 1024 * 1024


class TransportError(Exception):
    """The connection failed before an answer was read (the member retries, as the data
    plane does)."""


class Connection:
    """One member's persistent connection: requests are sent one at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{host}:{port}", **headers}.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of one POST."""
        if self._writer is None:
            try:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=_READ_LIMIT)
            except OSError as exc:
                raise TransportError(repr(exc)) from exc
        assert self._reader is not None
        assert self._writer is not None
        head = (f"POST {path} HTTP/1.1\r\n{self._fixed}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self._writer.write(head + body)
            status, headers = _parse_head(await self._reader.readuntil(b"\r\n\r\n"))
            if "content-length" in headers:
                data = await self._reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                data = await self._read_chunked()
            else:  # the body ends with the connection
                data = await self._reader.read(-1)
                headers["connection"] = "close"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            await self.close()
            raise TransportError(repr(exc)) from exc
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, data

    async def _read_chunked(self) -> bytes:
        assert self._reader is not None
        parts = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers are sent to these requests
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    version, status, *_ = lines[0].split(" ", 2)
    if not version.startswith("HTTP/1."):
        raise TransportError(f"not an HTTP/1.x answer: {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status), headers
