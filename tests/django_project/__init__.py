"""A small Django project that runs on pgtasks (tests/test_django.py); its packages are
imported as ``django_project.*`` with tests/ on the path."""
