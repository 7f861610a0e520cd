"""Issue 12 point 3, library side, against the real coordinator (gunicorn): before the first
join a refused key or an unknown group is a ConfigurationError that ``Consumer.run()`` raises
after cleaning up, instead of retrying forever."""

from __future__ import annotations

import threading

import pytest

from dataplane import AuthenticationError, Consumer, GroupNotFoundError

from .conftest import World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


def run_until_it_raises(consumer: Consumer, timeout: float = 30.0) -> BaseException | None:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # the test inspects it
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        consumer.stop()
        t.join(15)
        return None
    return raised[0] if raised else None


@pytest.mark.parametrize(
    ("what", "error", "http"),
    [
        ("a wrong key", AuthenticationError, "401"),
        ("the key of another group", AuthenticationError, "403"),
        ("an unknown group", GroupNotFoundError, "404 GROUP_ID_NOT_FOUND"),
    ],
)
def test_fatal_configuration_errors_before_the_first_join(world: World, what, error, http) -> None:
    world.create(2)
    group, key = world.group, world.group_key
    other = World(world.server, world.r, world.log_dir)
    if what == "a wrong key":
        key = "not-a-key"
    elif what == "the key of another group":
        other.create(1)
        key = other.group_key
    else:
        group = f"nope-{world.uid}"
    consumer = Consumer(world.server.url, group, key, lambda m: None, redis_url=world.redis_url)
    try:
        exc = run_until_it_raises(consumer)
    finally:
        other.close()
    assert isinstance(exc, error), f"{what}: {exc!r}"
    assert f"HTTP {http}" in str(exc)
    assert world.describe()["members"] == []  # nothing joined
