"""URLconf for the heartbeat benchmark only: the project's routes plus two reference endpoints."""
from django.urls import include, path

from bench.reference_views import CeilingView, NaiveHeartbeatView

urlpatterns = [
    path("bench/ceiling", CeilingView.as_view()),
    path("bench/naive", NaiveHeartbeatView.as_view()),
    path("", include("coordinator_project.urls")),
]
