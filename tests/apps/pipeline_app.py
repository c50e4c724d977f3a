"""The document pipeline the plugin tests run: OCR → index → search → delete.

The app loads the built-in plugins the way any installation does, through the
``pgtasks`` entry-point group (nothing is registered by hand). Worker processes can
load it with ``pgtasks -A tests.apps.pipeline_app:app worker -Q ocr,index`` (DSN from
``PGTASKS_DSN``); tests build their own with `make_app` and run a real `Worker` in
a thread with `run_worker`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pgtasks
import pgtasks_ocr
from pgtasks.result import AsyncResult
from pgtasks.worker import Worker, WorkerConfig

__all__ = ["CORPUS", "QUEUES", "app", "enqueue_file", "make_app", "run_worker"]

#: The shared corpus of real files (see its README for the right results).
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "documents"
#: Queues of the built-in plugins' tasks.
QUEUES = ("ocr", "index")


def make_app(dsn: str | None) -> pgtasks.App:
    """An app with the built-in plugins from their entry points (auto-loading forced on),
    whose OCR task may read the corpus."""
    application = pgtasks.App("pipeline", dsn=dsn, load_entry_points=True)
    pgtasks_ocr.configure(application, roots=[CORPUS])
    return application


def enqueue_file(
    application: pgtasks.App, path: Path, *, tenant: str, kind: str | None = None, **kwargs: Any
) -> AsyncResult:
    """Enqueue ``pgtasks.ocr`` for ``path`` (key: its name; kind ``mail`` for ``.eml``)."""
    kind = kind or ("mail" if path.suffix == ".eml" else "document")
    return application.get_task("pgtasks.ocr").apply_async(
        (str(path),), {"kind": kind, "key": path.name, **kwargs}, tenant=tenant
    )


def run_worker(application: pgtasks.App, *, concurrency: int = 2, timeout: float = 240.0) -> int:
    """Run a burst worker on `QUEUES` in a thread until no job is left; returns its exit code.

    Raises:
        TimeoutError: it did not finish within ``timeout`` seconds (it is stopped first).
    """
    worker = Worker(
        application,
        WorkerConfig(queues=QUEUES, concurrency=concurrency, burst=True, poll_interval=0.1, lease_timeout=30),
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="pipeline-worker")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        thread.join(60)
        raise TimeoutError(f"the pipeline worker did not finish within {timeout:g} s")
    return codes[0]


app = make_app(os.environ.get("PGTASKS_DSN"))
