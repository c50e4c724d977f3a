"""The project's settings and URLs."""
