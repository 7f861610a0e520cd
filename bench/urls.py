"""URLconf for the heartbeat benchmark only: two reference endpoints beside the project's routes.

The project's routes are spliced in at the same level, not under an include(""): resolved
inside an include, the heartbeat paid a nested resolver and a merged match per request
(~30 µs, a tenth of the gap to the ceiling) that it does not pay in production."""
import os

from django.urls import path

from bench.reference_views import CeilingView, CollectorView, NaiveHeartbeatView
from coordinator_project.urls import urlpatterns as project_urlpatterns

if os.environ.get("RSC_BENCH_NO_FRESHNESS_READ"):  # bench/heartbeat.py's reference server only
    from bench.unsafe import skip_freshness_read

    skip_freshness_read()

urlpatterns = [
    path("bench/ceiling", CeilingView.as_view()),
    path("bench/naive", NaiveHeartbeatView.as_view()),
    path("bench/collector", CollectorView.as_view()),
    *project_urlpatterns,
]
