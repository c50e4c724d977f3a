"""Benchmark harness: pgtasks against its peers and a raw-SQL reference.

Run ``python -m benchmarks run --help``. This package's ``__init__`` and the
driver-side modules of ``benchmarks/systems/`` (all but the ``*_system.py`` and
``*_app.py`` of a system) import only the standard library, because drivers run them
inside each peer's own virtual environment.
"""
