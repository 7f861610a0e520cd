"""Settings for the test suite: the production settings with a fixed, test-only SECRET_KEY.

Set in os.environ (not only here) so live servers, Celery and commands the tests start as
subprocesses start too; production refuses to start without SECRET_KEY.

Under pytest-xdist (`make test` runs the suite on several workers) each worker gets a
PostgreSQL database of its own (pytest-django adds `_gwN` to the test database's name) and a
Redis database of its own, chosen here: the cleanups of one worker's tests (SCAN + DEL by
pattern), its Celery queues and its streams never meet another worker's.
"""
import os
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("SECRET_KEY", "test-suite-insecure-key")
# The rule tests expect each join's target at once; the join batching tests set a window.
os.environ.setdefault("RSC_REBALANCE_WINDOW_MS", "0")

REDIS_DATABASES = 16  # redis-server's default `databases`


def worker_redis_url(url: str, worker: str, workers: int) -> str:
    """`url` with the database of xdist worker `worker` ("gw0", "gw1", …) of `workers`.

    Worker K uses database (N + K * 16 // workers) mod 16, N being `url`'s own: with two
    workers and REDIS_URL's database 0, databases 0 and 8; engineers who share one Redis and
    give each run its own N below 16 // workers never meet.
    """
    k = int(worker.removeprefix("gw"))
    parts = urlsplit(url)
    base = int(parts.path.lstrip("/") or 0)
    db = (base + k * (REDIS_DATABASES // max(workers, 1))) % REDIS_DATABASES
    return urlunsplit(parts._replace(path=f"/{db}"))


if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("RSC_TEST_REDIS_PER_WORKER"):
    # Once, in the xdist worker: every Redis URL the settings read. The subprocesses it starts
    # (servers, manage.py) inherit the mapped URLs and the marker, and keep any URL a test
    # hands them as it is.
    os.environ["RSC_TEST_REDIS_PER_WORKER"] = "1"
    for _name in ("REDIS_URL", "CELERY_BROKER_URL", "STREAM_REDIS_URL"):
        if _name in os.environ or _name == "REDIS_URL":  # the others default to REDIS_URL
            os.environ[_name] = worker_redis_url(
                os.environ.get(_name, "redis://127.0.0.1:6379/0"), os.environ["PYTEST_XDIST_WORKER"],
                int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

from coordinator_project.settings import *  # noqa: E402, F403
