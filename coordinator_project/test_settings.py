"""Settings for the test suite: the production settings with a fixed, test-only SECRET_KEY.

Set in os.environ (not only here) so live servers, Celery and commands the tests start as
subprocesses start too; production refuses to start without SECRET_KEY.
"""
import os

os.environ.setdefault("SECRET_KEY", "test-suite-insecure-key")

from coordinator_project.settings import *  # noqa: F403
