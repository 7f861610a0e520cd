from django.apps import AppConfig


class GroupsConfig(AppConfig):
    name = "groups"
    verbose_name = "Streams and consumer groups"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        # The failed-login line (issue 27.2): its signal receiver connects on import.
        import coordinator_project.admin_login  # noqa: F401
        from groups.vacuum import warn_after_migrate

        # Once per migrate (installation, upgrade): say so if PostgreSQL will not vacuum the
        # tables every heartbeat updates (groups.vacuum).
        post_migrate.connect(warn_after_migrate, sender=self, dispatch_uid="groups.vacuum")
        # groups.schema (the API key's OpenAPI description) is imported by the URLconf, beside
        # the schema views: drf-spectacular (~0.1 s, it pulls in rest_framework.test) is then
        # not imported by every manage.py command, which never builds a schema.
