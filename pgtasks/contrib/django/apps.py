"""The Django application ``pgtasks.contrib.django`` (label ``pgtasks``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgtasksConfig(AppConfig):
    """Checks ``settings.PGTASKS``, imports ``tasks.py`` of every installed app at start-up,
    and has the app follow its Django database's settings (`follow_django_database`).

    Raises:
        ConfigurationError: (in ``ready``) a bad ``PGTASKS`` setting.
    """

    name = "pgtasks.contrib.django"
    label = "pgtasks"
    verbose_name = "pgtasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Read the settings (a mistake fails the start), connect the receiver, and
        autodiscover the task modules."""
        from django.db.backends.signals import connection_created

        from pgtasks.contrib.django.core import follow_django_database, loaded_settings

        conf = loaded_settings()
        connection_created.connect(follow_django_database, dispatch_uid="pgtasks.follow_django_database")
        if conf.autodiscover:
            autodiscover_modules(conf.tasks_module)
