"""Tests of the chaos harness (``python -m pytest`` collects them from the repository root)."""
