"""A small Celery project and the same project moved to pgtasks.

``celery_version`` is a Celery project as one finds them: a Redis broker and result
backend, tasks called with ``delay`` and ``apply_async``, a task that retries, a chain,
and a ``beat_schedule``. ``pgtasks_version`` is that project moved over by following
docs/migrating-from-celery.md step by step; each step is marked in its source.
``tests/test_celery_migration.py`` runs both, each on its own worker, and compares
their results.
"""
