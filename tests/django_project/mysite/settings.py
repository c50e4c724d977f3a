"""Settings of the test project: one PostgreSQL database, named by ``PGTASKS_DJANGO_DSN``."""

from __future__ import annotations

import os
from importlib.util import find_spec

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("PGTASKS_DJANGO_DSN", "postgresql://postgres@127.0.0.1:5432/test"))

SECRET_KEY = "test-only, not a secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
ROOT_URLCONF = "django_project.mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "pgtasks.contrib.django",
    "django_project.shop",
]
if find_spec("django.tasks") is None:  # Django before 6.0: the django-tasks package
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}

PGTASKS = {"APP_NAME": "shop", "QUEUES": ["default", "emails"], "LOAD_ENTRY_POINTS": False}

TASKS = {
    "default": {
        "BACKEND": "pgtasks.contrib.django.backend.PgtasksBackend",
        "QUEUES": ["default", "emails"],
    }
}
