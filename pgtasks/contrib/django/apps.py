"""The Django application ``pgtasks.contrib.django`` (label ``pgtasks``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgtasksConfig(AppConfig):
    """Checks ``settings.PGTASKS`` and imports ``tasks.py`` of every installed app at start-up.

    Raises:
        ConfigurationError: (in ``ready``) a bad ``PGTASKS`` setting.
    """

    name = "pgtasks.contrib.django"
    label = "pgtasks"
    verbose_name = "pgtasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Read the settings (a mistake fails the start) and autodiscover the task modules."""
        from pgtasks.contrib.django.core import loaded_settings

        conf = loaded_settings()
        if conf.autodiscover:
            autodiscover_modules(conf.tasks_module)
