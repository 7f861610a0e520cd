from django.conf import settings
from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from assignments.views import HeartbeatView
from coordinator_project import views
from coordinator_project.metrics import metrics_view
from groups import schema  # noqa: F401 - registers the API key's OpenAPI description
from groups.stream_views import ReshardView, RoutingView
from groups.views import DescribeGroupView, PauseGroupView, ResumeGroupView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/groups/<str:group>/heartbeat", HeartbeatView.as_view(), name="heartbeat"),
    path("api/v1/groups/<str:group>", DescribeGroupView.as_view(), name="describe-group"),
    # group pause (§11), with the stream admin key
    path("api/v1/groups/<str:group>/pause", PauseGroupView.as_view(), name="pause-group"),
    path("api/v1/groups/<str:group>/resume", ResumeGroupView.as_view(), name="resume-group"),
    # producer routing and resharding (§6)
    path("api/v1/streams/<str:stream>/routing", RoutingView.as_view(), name="stream-routing"),
    path("api/v1/streams/<str:stream>/reshard", ReshardView.as_view(), name="stream-reshard"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/OBSERVABILITY.md)
    path("favicon.ico", views.favicon, name="favicon"),
]
# The OpenAPI schema and its Swagger UI: open by default (the contract is public in
# docs/PROTOCOL.md; they hold no installation data); SERVE_API_SCHEMA=0 leaves them out (404).
if settings.SERVE_API_SCHEMA:
    urlpatterns += [
        path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
        path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    ]

# Unknown URLs and Django's other error pages answer the protocol's JSON error body; the
# admin keeps its HTML pages (coordinator_project.errors, issue 27.10).
handler400 = "coordinator_project.errors.bad_request"
handler403 = "coordinator_project.errors.permission_denied"
handler404 = "coordinator_project.errors.not_found"
handler500 = "coordinator_project.errors.server_error"
