"""pgtasks' schema with ``manage.py migrate``, and the admin's read-only models.

pgtasks' own numbered migrations (`pgtasks.migrate`) create and upgrade the
``pgtasks`` schema; this migration runs them (`migrate_database`), idempotent and safe
to run concurrently. Unapplying it leaves the schema in place (drop it by hand:
``DROP SCHEMA pgtasks CASCADE``). A newer pgtasks release adds its migrations to the
same call: run ``manage.py pgtasks migrate`` (or ``App.migrate()``) after an upgrade.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def apply_pgtasks_schema(apps: Any, schema_editor: Any) -> None:
    """Run pgtasks' migrations on the database being migrated."""
    from pgtasks.contrib.django.core import migrate_database

    migrate_database(schema_editor.connection)


class Migration(migrations.Migration):
    """pgtasks' schema, then the unmanaged models over its tables."""

    initial = True
    atomic = False  # pgtasks' migrations take their own transactions and advisory lock

    operations = [
        migrations.RunPython(apply_pgtasks_schema, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("task_name", models.TextField()),
                ("queue", models.TextField()),
                ("tenant", models.TextField()),
                ("status", models.TextField()),
                ("priority", models.SmallIntegerField()),
                ("attempt", models.IntegerField()),
                ("max_attempts", models.IntegerField()),
                ("run_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("worker_id", models.TextField(null=True)),
                ("trigger", models.TextField()),
                ("schedule_name", models.TextField(null=True)),
                ("lock_key", models.TextField(null=True)),
                ("unique_key", models.TextField(null=True)),
                ("cancel_requested", models.BooleanField()),
            ],
            options={
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
                "db_table": '"pgtasks"."jobs"',
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("task_name", models.TextField()),
                ("cron", models.TextField(null=True)),
                ("timezone", models.TextField()),
                ("queue", models.TextField()),
                ("tenant", models.TextField()),
                ("paused", models.BooleanField()),
                ("next_fire_at", models.DateTimeField(null=True)),
                ("last_run_at", models.DateTimeField(null=True)),
                ("last_outcome", models.TextField(null=True)),
                ("invalid_reason", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "schedule",
                "verbose_name_plural": "schedules",
                "db_table": '"pgtasks"."schedules"',
                "ordering": ("name",),
                "managed": False,
            },
        ),
    ]
