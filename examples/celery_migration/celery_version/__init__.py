"""The Celery project (see `examples.celery_migration`)."""
