from django.apps import AppConfig


class GroupsConfig(AppConfig):
    name = "groups"
    verbose_name = "Streams and consumer groups"

    def ready(self) -> None:
        # The failed-login line (issue 27.2): its signal receiver connects on import.
        import coordinator_project.admin_login  # noqa: F401
        from groups import schema  # noqa: F401 - registers the API key's OpenAPI description
