from django.apps import AppConfig


class GroupsConfig(AppConfig):
    name = "groups"
    verbose_name = "Streams and consumer groups"

    def ready(self) -> None:
        from groups import schema  # noqa: F401 - registers the API key's OpenAPI description
