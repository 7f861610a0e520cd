"""The gunicorn worker class (webserver.worker) and what it shares with the WSGI layer
(webserver.phases). Outside coordinator_project on purpose: gunicorn's master imports the
worker class before gevent patches threading, and importing coordinator_project there would
load Django and Celery (and query the database) unpatched. Imports no Django."""
