"""Start-up checks of the CLI and the DLQ tools: one read-only call to the coordinator with the
API key, one PING to Redis, each failure turned into one line an operator can act on.

They run before anything starts so that a wrong key, an unknown group or a wrong Redis URL
ends the process at once with a documented exit code (``EXIT_CONFIG``/``EXIT_UNREACHABLE``)
instead of a library retrying forever or a traceback. After a successful start, transient
errors are the library's business (retry with backoff and a warning).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from .protocol import answer_body

# httpx and redis are imported by the check that uses each: `rsc-dataplane --help`, `route`
# and a start refused by the coordinator never load redis-py (~0.3 s: it imports the
# OpenTelemetry SDK where that is installed), and the CLI's --help loads neither.

EXIT_CONFIG = 2  # refused or misconfigured: retrying will not help (401/403/404, bad arguments)
EXIT_UNREACHABLE = 3  # the coordinator or Redis cannot be reached: retrying later may help


class PreflightError(Exception):
    """A problem found before start: ``str(exc)`` is the one line to print, ``exit_code``
    the process's exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_CONFIG) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the cause said
        self.exit_code = exit_code


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _refusal(status: int, body: dict[str, Any], what: str, url: str) -> PreflightError:
    detail = f"HTTP {status} {body.get('errorCode') or ''}: {body.get('errorMessage') or ''}"
    if status == 401:
        hint = (
            "the API key is missing, unknown or revoked (--api-key, --api-key-file or $RSC_API_KEY)"
        )
    elif status == 403:
        hint = f"the API key does not grant access to {what}: use a key of that {what.split()[0]}"
    elif status == 404:
        hint = f"{what} does not exist on the coordinator at {redact(url)}"
    else:
        hint = f"the coordinator at {redact(url)} refused to describe {what}"
    return PreflightError(f"{hint} ({detail.strip()})")


def coordinator_get(url: str, api_key: str | None, path: str, what: str) -> dict[str, Any]:
    """GET one read-only document; PreflightError for anything but 200."""
    import httpx

    from . import __version__
    from .transport import tls_context

    headers = {"Accept": "application/json", "User-Agent": f"rsc-dataplane/{__version__}"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        # retries=2: connection attempts only (a coordinator that is just starting).
        with httpx.Client(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(5.0, connect=2.0),
            transport=httpx.HTTPTransport(retries=2, verify=tls_context()),
        ) as client:
            resp = client.get(path)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise PreflightError(f"bad coordinator URL {redact(url)!r}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise PreflightError(
            f"cannot reach the coordinator at {redact(url)}: {exc or type(exc).__name__}",
            EXIT_UNREACHABLE,
        ) from exc
    try:
        decoded = resp.json()
    except ValueError:
        decoded = None
    body = answer_body(decoded, resp.text)
    if resp.status_code >= 500:
        raise PreflightError(
            f"the coordinator at {redact(url)} answered HTTP {resp.status_code} for {what}",
            EXIT_UNREACHABLE,
        )
    if resp.status_code != 200:
        raise _refusal(resp.status_code, body, what, url)
    return body


def describe_group(url: str, api_key: str | None, group: str) -> dict[str, Any]:
    """``GET /api/v1/groups/{group}``: proves the key and the group (§3 error table)."""
    return coordinator_get(
        url, api_key, f"/api/v1/groups/{quote(group, safe='')}", f"group {group!r}"
    )


def stream_routing(url: str, api_key: str | None, stream: str) -> dict[str, Any]:
    """``GET /api/v1/streams/{stream}/routing`` (a stream key, or a key of a group on it)."""
    return coordinator_get(
        url, api_key, f"/api/v1/streams/{quote(stream, safe='')}/routing", f"stream {stream!r}"
    )


def _unreachable_redis(url: str, exc: Exception) -> PreflightError:
    return PreflightError(
        f"cannot reach Redis at {redact(url)}: {exc or type(exc).__name__}", EXIT_UNREACHABLE
    )


def check_redis(url: str, cluster: bool = False) -> None:
    """PING Redis once with short timeouts."""
    import redis
    from redis.exceptions import RedisClusterException

    kwargs: dict[str, Any] = {"socket_timeout": 3.0, "socket_connect_timeout": 3.0}
    try:
        if cluster:
            from redis.cluster import RedisCluster

            client: Any = RedisCluster.from_url(url, **kwargs)
        else:
            client = redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise PreflightError(f"bad Redis URL {redact(url)!r}: {exc}") from exc
    except RedisClusterException as exc:  # a cluster client connects at once
        text = str(exc)
        # redis-py says so only in words: no node answered, or one answered but is no cluster
        if "cannot be connected" in text and "Cluster mode is not enabled" not in text:
            raise _unreachable_redis(url, exc) from exc
        raise PreflightError(f"Redis at {redact(url)} is not usable as a cluster: {text}") from exc
    except redis.RedisError as exc:
        raise _unreachable_redis(url, exc) from exc
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise PreflightError(f"Redis at {redact(url)} refused the credentials: {exc}") from exc
    except redis.ResponseError as exc:  # e.g. NOAUTH, or a db index the server does not have
        raise PreflightError(f"Redis at {redact(url)} refused: {exc}") from exc
    except redis.RedisError as exc:
        raise _unreachable_redis(url, exc) from exc
    finally:
        client.close()


__all__ = [
    "EXIT_CONFIG",
    "EXIT_UNREACHABLE",
    "PreflightError",
    "check_redis",
    "coordinator_get",
    "describe_group",
    "redact",
    "stream_routing",
]
