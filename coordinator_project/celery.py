"""Celery app: the broker is Redis at REDIS_URL; beat runs the sweeps.

Queue, exchanges and every broker key carry this installation's namespace (`rsc-<id8>`,
groups.namespace), so two installations on one Redis never run each other's sweeps. The id
is read from the database once, when the app's configuration is first loaded (worker and beat
start-up); CELERY_NAMESPACE set in the environment skips that read.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery, signals

from coordinator_project.preflight import exit_on_environment_problem

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")


def _run_by_celery() -> bool:
    """The celery command line (`celery -A coordinator_project worker|beat`, or `python -m
    celery`), not another program importing this package (manage.py, gunicorn, tests)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return argv0.name == "celery" or (argv0.name == "__main__.py" and argv0.parent.name == "celery")


if _run_by_celery():
    exit_on_environment_problem("celery")  # issue 24.3: one line, not a traceback

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
    from coordinator_project.preflight import EXIT_UNAVAILABLE, database_problem
    from groups.namespace import installation_id, namespace_for

    try:
        return namespace_for(installation_id())
    except Exception as exc:
        line = database_problem(exc)
        if line is None or not _run_by_celery():
            raise  # in a web worker (which publishes tasks) the caller handles it, as before
        print(f"celery: error: {line}", file=sys.stderr, flush=True)
        os._exit(EXIT_UNAVAILABLE)  # a SystemExit here would be printed as a traceback


@app.on_after_configure.connect
def _use_installation_namespace(sender: Celery, **_: Any) -> None:
    sender.conf.update(namespace_settings(installation_namespace()))


@signals.worker_ready.connect
@signals.beat_init.connect
def _publish_identity(**_: Any) -> None:
    # Issue 25.4: the installation id in the stream Redis for members to check, at each start
    # of the coordinator's background side (not on a request path). A failure is logged: the
    # sweeps matter more, and stream/group creation and reshards write it too.
    import logging

    from groups.errors import ServiceError
    from groups.namespace import publish_identity

    try:
        publish_identity()
    except ServiceError as exc:  # Redis unreachable: an operator's matter, one line (issue 24.3)
        logging.getLogger(__name__).error(
            "%s; check STREAM_REDIS_URL (default REDIS_URL) and that Redis is running", str(exc).rstrip("."))
    except Exception:
        logging.getLogger(__name__).exception("cannot publish the installation identity")


@signals.worker_process_init.connect
def _start_process_state(**_: Any) -> None:
    # Issue 23.1: each Celery worker process starts its process state fresh (prefork: not
    # cooperative).
    from coordinator_project.process_state import PROCESS

    PROCESS.start(cooperative=False)


@signals.worker_process_shutdown.connect
def _close_process_state(**_: Any) -> None:
    # Issue 23.1: what this worker process keeps is flushed and closed (process_state.PROCESS).
    from coordinator_project.process_state import PROCESS

    PROCESS.close()
