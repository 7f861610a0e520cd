"""The CLI's start-up checks (``dataplane.preflight``) against real Redis and the stub
coordinator: which problem gets exit 2 (refused) and which exit 3 (unreachable), in one line.
(Against the real coordinator, through the CLI: tests/e2e/test_cli_exit_codes.py.)"""

from __future__ import annotations

import pytest

from dataplane.preflight import (
    EXIT_CONFIG,
    EXIT_UNREACHABLE,
    PreflightError,
    check_redis,
    describe_group,
    redact,
    stream_routing,
)
from tests.ports import refused_port


def refusal(fn, *args) -> PreflightError:
    with pytest.raises(PreflightError) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return info.value


def test_redis_unreachable_is_exit_3_and_misconfigured_redis_exit_2(redis_url) -> None:
    check_redis(redis_url)  # reachable: no error
    with refused_port() as port:
        err = refusal(check_redis, f"redis://user:pw@127.0.0.1:{port}/0")
    assert err.exit_code == EXIT_UNREACHABLE
    assert str(err).startswith(f"cannot reach Redis at redis://user:***@127.0.0.1:{port}/0: ")
    assert refusal(check_redis, f"redis://127.0.0.1:{port}/0", True).exit_code == EXIT_UNREACHABLE
    err = refusal(check_redis, "http://127.0.0.1:6379")
    assert err.exit_code == EXIT_CONFIG
    assert str(err).startswith("bad Redis URL")
    base = redis_url.rsplit("/", 1)[0]
    err = refusal(check_redis, f"{base}/999")
    assert err.exit_code == EXIT_CONFIG
    assert "refused: DB index is out of range" in str(err)
    err = refusal(check_redis, f"{base}/0", True)  # a standalone server is no cluster
    assert err.exit_code == EXIT_CONFIG
    assert "not usable as a cluster" in str(err)


def test_coordinator_refusals_are_exit_2_and_unreachable_exit_3(coordinator) -> None:
    err = refusal(describe_group, coordinator.url, "k", "nope")  # the stub answers 404
    assert err.exit_code == EXIT_CONFIG
    assert str(err) == (f"group 'nope' does not exist on the coordinator at {coordinator.url} "
                        f"(HTTP 404 NOT_FOUND: /api/v1/groups/nope)")
    with refused_port() as port:
        err = refusal(stream_routing, f"http://127.0.0.1:{port}", "k", "orders")
    assert err.exit_code == EXIT_UNREACHABLE
    assert str(err).startswith("cannot reach the coordinator at http://127.0.0.1:")
    err = refusal(stream_routing, "ftp://x", "k", "orders")
    assert err.exit_code == EXIT_CONFIG
    assert str(err).startswith("bad coordinator URL 'ftp://x'")


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("redis://u:secret@h/1") == "redis://u:***@h/1"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
