"""Tests of the benchmark harness (``python -m pytest`` collects them from the repository root)."""
