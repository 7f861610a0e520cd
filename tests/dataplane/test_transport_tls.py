"""The member library builds one TLS context per process, not one per client: httpx builds one
per client otherwise, loading the CA bundle each time (~37 ms of CPU)."""

from __future__ import annotations

import ssl

from dataplane.transport import Transport, tls_context


def _context(transport: Transport) -> ssl.SSLContext:
    # httpx's default transport keeps the context on its httpcore pool.
    return transport._client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_transports_share_the_process_tls_context_which_verifies_certificates():
    with Transport("http://127.0.0.1:9", "k") as a, Transport("https://127.0.0.1:9", "k") as b:
        assert _context(a) is tls_context()
        assert _context(b) is tls_context()
    assert tls_context().verify_mode == ssl.CERT_REQUIRED
    assert tls_context().check_hostname
