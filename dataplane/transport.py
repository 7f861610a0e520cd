"""HTTP client for the coordinator: heartbeat and routing (PROTOCOL.md §3, §6)."""

from __future__ import annotations

import functools
import logging
import platform
import ssl
from typing import Any
from urllib.parse import quote

import httpx

from . import __version__
from .backoff import Backoff, retry_call
from .protocol import answer_body

log = logging.getLogger(__name__)

# The coordinator records it per member (describe, admin): which library version each runs.
USER_AGENT = f"rsc-dataplane/{__version__} python/{platform.python_version()}"


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built
    once per process for every client the library makes: httpx builds one per client otherwise,
    ~37 ms of CPU each to load the bundle, even for a plain-http coordinator."""
    return httpx.create_ssl_context()


class CoordinatorUnavailable(Exception):
    """The coordinator could not be reached (or kept answering 5xx) within the retry budget."""


class CoordinatorError(Exception):
    """A 4xx answer where the caller needed a result (routing)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('errorCode')}: {body.get('errorMessage')}")
        self.status = status
        self.body = body


class Transport:
    """One pooled ``httpx.Client`` to one coordinator.

    Retries connection errors and 5xx with jittered exponential backoff, never 4xx: a 4xx is
    a decision of the coordinator (e.g. FENCED_MEMBER_EPOCH) that the caller must act on.
    The total retry time stays well under a heartbeat interval so a slow coordinator does not
    hold the member's state machine hostage; the machine itself retries on its own clock.
    """

    def __init__(
        self,
        coordinator_url: str,
        api_key: str | None,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        attempts: int = 3,
        backoff_base: float = 0.1,
        backoff_max: float = 1.0,
        client: httpx.Client | None = None,
    ) -> None:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self._client = client or httpx.Client(
            base_url=coordinator_url.rstrip("/"), headers=headers, timeout=timeout,
            verify=tls_context(),
        )
        self._attempts = max(1, attempts)
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, json: Any = None) -> tuple[int, dict[str, Any]]:
        def attempt() -> httpx.Response:
            resp = self._client.request(method, path, json=json)
            if resp.status_code >= 500:
                raise CoordinatorUnavailable(f"HTTP {resp.status_code} from {path}")
            return resp

        retry_on = (httpx.TransportError, CoordinatorUnavailable)  # connect/read errors, 5xx
        try:
            resp = retry_call(
                attempt,
                retry_on,
                Backoff(self._backoff_base, self._backoff_max),
                log=log,
                what=f"coordinator {method} {path}",
                attempts=self._attempts,
            )
        except retry_on as exc:
            raise CoordinatorUnavailable(f"{method} {path}: {exc!r}") from exc
        try:
            decoded = resp.json()
        except ValueError:
            decoded = None
        return resp.status_code, answer_body(decoded, resp.text)

    def heartbeat(self, group: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST a heartbeat; returns (HTTP status, JSON body) for any 2xx/4xx answer."""
        return self._request("POST", f"/api/v1/groups/{quote(group, safe='')}/heartbeat", body)

    def routing(self, stream: str) -> dict[str, Any]:
        status, body = self._request("GET", f"/api/v1/streams/{quote(stream, safe='')}/routing")
        if status != 200:
            raise CoordinatorError(status, body)
        return body
