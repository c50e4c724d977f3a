"""Prometheus metrics for pgtasks, as a plugin: ``pgtasks metrics`` and a scrape endpoint."""
