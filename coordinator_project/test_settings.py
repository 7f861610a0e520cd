"""Settings for the test suite: the production settings with a fixed, test-only SECRET_KEY.

Set in os.environ (not only here) so live servers, Celery and commands the tests start as
subprocesses start too; production refuses to start without SECRET_KEY.
"""
import os

os.environ.setdefault("SECRET_KEY", "test-suite-insecure-key")
# The rule tests expect each join's target at once; the join batching tests set a window.
os.environ.setdefault("RSC_REBALANCE_WINDOW_MS", "0")

from coordinator_project.settings import *  # noqa: F403
