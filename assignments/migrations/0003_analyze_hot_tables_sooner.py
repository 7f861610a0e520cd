"""Per-table autovacuum settings for the tables every heartbeat reads.

A join storm writes a group's member and slot rows in seconds; with the default thresholds
(analyze after 10 % + 50 rows changed) the planner may plan on statistics of an empty table
until autovacuum gets there. The steady path's hot statements no longer depend on them (one
read of the group row by its unique name; stamps by primary key), but the locked path's and
the metrics' queries do: analyze these tables after every 200 changed rows, 2 % of the table.
"""
from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

_SETTINGS = ("autovacuum_analyze_threshold = 200, autovacuum_analyze_scale_factor = 0.02,"
             " autovacuum_vacuum_scale_factor = 0.05")


def _tables(apps: Apps) -> list[str]:
    return [apps.get_model(app, model)._meta.db_table
            for app, model in (("members", "Member"), ("assignments", "ShardAssignment"))]


def forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite has no autovacuum; its planner does not need statistics here
    for table in _tables(apps):
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET ({_SETTINGS})")


def backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in _tables(apps):
        schema_editor.execute(
            f"ALTER TABLE {schema_editor.quote_name(table)} RESET (autovacuum_analyze_threshold,"
            " autovacuum_analyze_scale_factor, autovacuum_vacuum_scale_factor)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("assignments", "0002_shardassignment_state_version"),
        ("members", "0004_member_state_version"),
    ]

    operations = [migrations.RunPython(forward, backward)]
