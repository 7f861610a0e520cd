"""Shared fixtures. Integration tests need PostgreSQL (DATABASE_URL) and Redis (REDIS_URL)."""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL (make test does)")
    for item in items:
        if "needs_postgres" in item.keywords:
            item.add_marker(skip)
