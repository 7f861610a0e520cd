"""WSGI entry point (gunicorn coordinator_project.wsgi)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
application = get_wsgi_application()
