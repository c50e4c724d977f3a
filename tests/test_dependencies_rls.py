"""Job dependencies under the row-level security mode (docs/security.md): a tenant-facing
role that may not delete enqueues dependents, cancels blocked jobs, and its prerequisites'
completions release them; another tenant's job is no prerequisite."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_rls import A, B, roles, setup  # noqa: F401 - fixtures of the mode's tests

from pgtasks.errors import JobNotFound
from pgtasks.testing import run_until_idle


def test_dependencies_work_through_a_tenant_role(setup: dict[str, Any]) -> None:  # noqa: F811
    web, owner = setup["web"], setup["owner"]
    a = web.tenant(A)
    first, other = setup["ids"][A][0], setup["ids"][B][0]
    waiting = a.apply_async("t.work", (1,), depends_on=[first])
    chained = a.apply_async("t.work", (2,), depends_on=[waiting.id])
    cancelled = a.apply_async("t.work", (3,), depends_on=[first])
    after_cancel = a.apply_async("t.work", (4,), depends_on=[cancelled.id])
    assert a.cancel_job(cancelled.id) == "cancelled"  # cascades, with no DELETE right
    assert a.AsyncResult(after_cancel.id).status == "cancelled"
    with pytest.raises(JobNotFound):
        a.apply_async("t.work", (5,), depends_on=[other])
    run_until_idle(owner)  # the fleet runs every tenant's jobs
    assert a.AsyncResult(chained.id).get(timeout=5) == 2
    done_first = a.apply_async("t.work", (6,), depends_on=[first])  # already succeeded
    assert a.AsyncResult(done_first.id).status == "queued"
    with psycopg.connect(setup["dsn"], autocommit=True) as conn:  # the owner, a fleet role
        assert conn.execute("SELECT count(*) FROM pgtasks.job_dependencies").fetchone() == (0,)
