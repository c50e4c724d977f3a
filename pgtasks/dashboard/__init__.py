"""The web dashboard of pgtasks: ``pgtasks dashboard``, or `create_app` to mount it.

Needs the ``dashboard`` extra (``pip install 'pgtasks[dashboard]'``: Starlette,
Jinja2, uvicorn, python-multipart). See docs/operations.md, "Dashboard".
"""

from __future__ import annotations

from pgtasks.dashboard.web import create_app

__all__ = ["create_app"]
