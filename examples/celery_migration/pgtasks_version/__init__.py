"""The project moved to pgtasks (see `examples.celery_migration`)."""
