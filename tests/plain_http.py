"""httpx's one-call functions for the tests' plain-http servers, without httpx's per-call TLS set-up.

`httpx.get(...)` and `httpx.Client()` each build a TLS context and load certifi's CA bundle:
~37 ms of CPU, though every URL the tests call is plain http. The suite made thousands of such
calls (each server's readiness poll, floods of joins) on two CPU-bound cores. These take the
member library's one context per process (`TLS`, also for `httpx.Client(verify=TLS)`) and
otherwise behave as httpx's own: a client, and so a connection, per call. `KeepAlive` is a
cheaper client still, for loops whose count, not their duration, is what a test fixes.
"""
from __future__ import annotations

import http.client
import json as json_module
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from dataplane.transport import tls_context

TLS = tls_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", TLS)
    return httpx.request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


class KeepAlive:
    """One HTTP/1.1 keep-alive connection (the standard library's `http.client`) for loops that
    send a fixed number of requests: ~0.5 ms of the test's CPU a request against httpx's ~1.6
    (2026-12-07), so a loop of 7,000 spends the suite's CPU on the server it tests. A request on
    a kept connection the server has closed meanwhile is sent again on a new one."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        parts = urlsplit(base_url)
        self.host, self.port, self.timeout = parts.hostname or "127.0.0.1", parts.port or 80, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, *, json: Any = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        """The answer's status and body."""
        body = None if json is None else json_module.dumps(json).encode()
        sent = dict(headers or {})
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        while True:
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=body, headers=sent)
                response = self.conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused:
                    continue  # the server closed it while it was idle: again, on a new one
                raise
            if response.will_close:
                self.close()
            return response.status, data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> KeepAlive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
