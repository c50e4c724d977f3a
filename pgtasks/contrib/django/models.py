"""Read-only Django models over pgtasks' tables, for the admin (`pgtasks.contrib.django.admin`).

Unmanaged (``managed = False``): Django's migrations never create, change or drop
these tables; pgtasks' own migrations own them (``manage.py migrate`` applies those
through this app's migration). Only plain columns are mapped: arguments, results,
errors and progress are read through pgtasks (`pgtasks.App.get_job`) and shown
masked (`pgtasks.redaction`), and every change goes through pgtasks' API.
"""

from __future__ import annotations

from django.db import models

__all__ = ["Job", "Schedule"]


class Job(models.Model):
    """A row of ``pgtasks.jobs`` (the columns an operator filters and sorts on)."""

    id = models.BigIntegerField(primary_key=True)
    task_name = models.TextField()
    queue = models.TextField()
    tenant = models.TextField()
    status = models.TextField()
    priority = models.SmallIntegerField()
    attempt = models.IntegerField()
    max_attempts = models.IntegerField()
    run_at = models.DateTimeField()
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    worker_id = models.TextField(null=True)
    trigger = models.TextField()
    schedule_name = models.TextField(null=True)
    lock_key = models.TextField(null=True)
    unique_key = models.TextField(null=True)
    cancel_requested = models.BooleanField()

    class Meta:
        managed = False
        db_table = '"pgtasks"."jobs"'
        ordering = ("-id",)
        verbose_name = "job"
        verbose_name_plural = "jobs"

    def __str__(self) -> str:
        return f"#{self.id} {self.task_name}"


class Schedule(models.Model):
    """A row of ``pgtasks.schedules``."""

    name = models.TextField(primary_key=True)
    task_name = models.TextField()
    cron = models.TextField(null=True)
    timezone = models.TextField()
    queue = models.TextField()
    tenant = models.TextField()
    paused = models.BooleanField()
    next_fire_at = models.DateTimeField(null=True)
    last_run_at = models.DateTimeField(null=True)
    last_outcome = models.TextField(null=True)
    invalid_reason = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = '"pgtasks"."schedules"'
        ordering = ("name",)
        verbose_name = "schedule"
        verbose_name_plural = "schedules"

    def __str__(self) -> str:
        return str(self.name)
