"""The OpenAPI description of the API-key authentication (drf-spectacular, issue 27.10).

Without it, `manage.py check --deploy` warned W001 once per API view ("could not resolve
authenticator"), and the schema said nothing of how to authenticate. Registered on import by
the URLconf (coordinator_project.urls), which every schema generation loads.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "groups.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "rsc_<43 characters>",
            "description": (
                "An API key made by `manage.py create_api_key`: `Authorization: Bearer rsc_...`. "
                "A group key (heartbeat, describe, pause/resume of its group), a stream produce "
                "key (routing) or a stream admin key (routing, reshard)."
            ),
        }
