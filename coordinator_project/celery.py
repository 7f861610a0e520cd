"""Celery app: the broker is Redis at REDIS_URL; beat runs the sweeps.

Queue, exchanges and every broker key carry this installation's namespace (`rsc-<id8>`,
groups.namespace), so two installations on one Redis never run each other's sweeps. The id
is read from the database once, when the app's configuration is first loaded (worker and beat
start-up); CELERY_NAMESPACE set in the environment skips that read.
"""
from __future__ import annotations

import os
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")

app = Celery("coordinator_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def namespace_settings(namespace: str) -> dict[str, Any]:
    """The Celery settings that keep one installation's tasks apart from another's."""
    return {
        "task_default_queue": namespace,
        "task_default_exchange": namespace,
        "task_default_routing_key": namespace,
        "control_exchange": f"{namespace}.control",
        "event_exchange": f"{namespace}.event",
        # kombu prefixes every key it writes (queues, bindings, unacked) with this.
        "broker_transport_options": {"global_keyprefix": f"{namespace}:"},
    }


def installation_namespace() -> str:
    namespace = os.environ.get("CELERY_NAMESPACE", "")
    if namespace:
        return namespace
    import django

    django.setup()  # idempotent; the celery CLI reads the configuration before its own setup
    from groups.namespace import installation_id, namespace_for

    return namespace_for(installation_id())


@app.on_after_configure.connect
def _use_installation_namespace(sender: Celery, **_: Any) -> None:
    sender.conf.update(namespace_settings(installation_namespace()))
