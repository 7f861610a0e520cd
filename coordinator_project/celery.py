"""Celery app: the broker is Redis at REDIS_URL; beat runs the sweeps."""
from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")

app = Celery("coordinator_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
