"""API keys get a scope (group / produce / admin), an expiry for rotation grace and a last-used stamp.

Stream keys made before scopes existed could reshard; they become `admin` keys so nothing
that works today breaks (docs/SECURITY.md). New stream keys default to `produce`.
"""
from __future__ import annotations

from typing import Any

from django.db import migrations, models


def assign_scopes(apps: Any, schema_editor: Any) -> None:
    ApiKey = apps.get_model("groups", "ApiKey")
    ApiKey.objects.filter(group__isnull=False).update(scope="group")
    ApiKey.objects.filter(stream__isnull=False).update(scope="admin")


class Migration(migrations.Migration):

    dependencies = [
        ("groups", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scope",
            field=models.CharField(
                choices=[("group", "Group"), ("produce", "Produce"), ("admin", "Admin")],
                default="group", editable=False, max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.RunPython(assign_scopes, migrations.RunPython.noop),
        migrations.AddField(
            model_name="apikey",
            name="expires_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="apikey",
            name="last_used_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="apikey",
            name="revoked_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="apikey",
            name="prefix",
            field=models.CharField(db_index=True, editable=False, max_length=16),
        ),
        migrations.AlterModelOptions(
            name="apikey",
            options={"verbose_name": "API key"},
        ),
        migrations.RemoveConstraint(
            model_name="apikey",
            name="apikey_group_xor_stream",
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("group__isnull", False), ("scope", "group"), ("stream__isnull", True)),
                    models.Q(("group__isnull", True), ("scope__in", ["produce", "admin"]), ("stream__isnull", False)),
                    _connector="OR",
                ),
                name="apikey_group_xor_stream_scope",
            ),
        ),
    ]
