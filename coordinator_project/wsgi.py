"""WSGI entry point (gunicorn coordinator_project.wsgi)."""
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
django.setup(set_prefix=False)

from coordinator_project.handler import ReleasingWSGIHandler  # noqa: E402  (after setup)
from coordinator_project.wsgi_guard import RequestGuard  # noqa: E402

# RequestGuard: body read and request deadlines, chunked bodies (coordinator_project.wsgi_guard).
application = RequestGuard(ReleasingWSGIHandler())

# The URL conf (every view module, the OpenAPI views) imported here too: where gunicorn loads
# the app in its master (decision 0020), each worker inherits it instead of importing it at
# its first request (~0.13 CPU-s per worker).
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018
