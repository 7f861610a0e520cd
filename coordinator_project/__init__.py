"""Redis Stream Coordinator: Django project package.

The Celery app (coordinator_project.celery) is not imported here: web workers and manage.py
commands publish no task, and importing Celery and kombu cost each of them ~0.1 s of start-up.
`celery -A coordinator_project` finds it in the `celery` submodule; `celery_app` still names
it, imported on first use.
"""
from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from .celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
