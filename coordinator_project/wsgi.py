"""WSGI entry point (gunicorn coordinator_project.wsgi)."""
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
django.setup(set_prefix=False)

from coordinator_project.handler import ReleasingWSGIHandler  # noqa: E402  (after setup)
from coordinator_project.wsgi_guard import RequestGuard  # noqa: E402

# RequestGuard: body read and request deadlines, chunked bodies (coordinator_project.wsgi_guard).
application = RequestGuard(ReleasingWSGIHandler())
