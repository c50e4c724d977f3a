#!/usr/bin/env python
"""The test project's manage.py (``PGTASKS_DJANGO_DSN`` names its database)."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the project's packages
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_project.mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
