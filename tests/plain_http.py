"""httpx's one-call functions for the tests' plain-http servers, without httpx's per-call TLS set-up.

`httpx.get(...)` and `httpx.Client()` each build a TLS context and load certifi's CA bundle:
~37 ms of CPU, though every URL the tests call is plain http. The suite made thousands of such
calls (each server's readiness poll, floods of joins) on two CPU-bound cores. These take the
member library's one context per process (`TLS`, also for `httpx.Client(verify=TLS)`) and
otherwise behave as httpx's own: a client, and so a connection, per call.
"""
from __future__ import annotations

from typing import Any

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
