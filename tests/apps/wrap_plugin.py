"""A ``--plugin`` module for worker tests: a `pgtasks_execute_job` wrapper that marks results.

Every job's result comes back as ``{"result": <the task's result>, "wrapped_in":
<pid>}``, the pid of the process the wrapper ran in. A test reads from the job's
result alone whether the wrapper ran around the task body, and in which process:
the worker's own for the threads pool, the child's for the processes pool.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

from pgtasks import hookimpl


@hookimpl(wrapper=True)
def pgtasks_execute_job() -> Generator[None, Any, dict[str, Any]]:
    """Run the task, then wrap its result with this process's pid."""
    result = yield
    return {"result": result, "wrapped_in": os.getpid()}
