"""Benchmark harness: pgtasks against its peers and a raw-SQL reference.

Run ``python -m benchmarks run --help``. This package's ``__init__`` and
``benchmarks/systems/base.py`` import only the standard library, because drivers
run them inside each peer's own virtual environment.
"""
