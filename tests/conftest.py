"""Shared fixtures. Integration tests need PostgreSQL (DATABASE_URL) and Redis (REDIS_URL)."""
from __future__ import annotations

import os
import re

import pytest

# Tests that share something one machine has once run on one xdist worker (`make test` runs
# with `--dist loadgroup`): the browser (its session fixture may apt-get install Chromium) and
# the throw-away Redis Cluster (a session fixture: one cluster, not one per worker).
XDIST_GROUPS = {"browser": "browser", "cluster_url": "redis-cluster"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ())) | {item.nodeid.split("/")[1]}
        group = next((g for key, g in XDIST_GROUPS.items() if key in names), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL (make test does)")
    for item in items:
        if "needs_postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """No statement timeout in the test runner itself (issue 8.4 sets one for production).

    Dropping the test database waits up to 5 s for the backends of gunicorn workers a test
    just stopped; a 5 s statement timeout would cancel that DROP. Live servers started by
    the tests read the environment and keep the shipped timeouts.
    """
    from django.conf import settings

    for db in settings.DATABASES.values():
        options = db.get("OPTIONS", {})
        if "statement_timeout" in options.get("options", ""):
            options["options"] = re.sub(r"statement_timeout=\d+", "statement_timeout=0", options["options"])
