from django.apps import AppConfig


class GroupsConfig(AppConfig):
    name = "groups"
    verbose_name = "Streams and consumer groups"

    def ready(self) -> None:
        # The failed-login line (issue 27.2): its signal receiver connects on import.
        import coordinator_project.admin_login  # noqa: F401
        # groups.schema (the API key's OpenAPI description) is imported by the URLconf, beside
        # the schema views: drf-spectacular (~0.1 s, it pulls in rest_framework.test) is then
        # not imported by every manage.py command, which never builds a schema.
