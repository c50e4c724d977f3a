"""The web dashboard over HTTP (Starlette's TestClient) against a real database and worker:
every page, every action, and the bad input (unknown ids, empty filters, missing or wrong
tokens, forged forms, actions that do not apply), tenant scoping, mounting and a replica."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from apps.dashboard_app import NIGHTLY, make_app
from helpers import scratch_database
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

pytest.importorskip("starlette")
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient

import pgtasks
from pgtasks.cli.dashboard_cmd import TOKEN_ENV, read_token
from pgtasks.dashboard import create_app
from pgtasks.errors import ConfigurationError
from pgtasks.worker import Worker, WorkerConfig

TOKEN = "correct horse battery staple"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def dapp(dsn: str) -> Iterator[pgtasks.App]:
    app = make_app(dsn)
    yield app
    app.close()


def work(app: pgtasks.App, queues: tuple[str, ...] = ("default", "mail", "backup")) -> None:
    """Run every due job with a real worker until none is left."""
    worker = Worker(
        app, WorkerConfig(queues=queues, concurrency=2, burst=True, poll_interval=0.05, listen=False)
    )
    assert worker.run(install_signal_handlers=False) == 0


def client(app: pgtasks.App, **options: Any) -> TestClient:
    return TestClient(create_app(app, **options))


def csrf_of(tc: TestClient, path: str = "/", **options: Any) -> str:
    """The session's CSRF token, from a page that has a form."""
    page = tc.get(path, **options)
    match = CSRF.search(page.text)
    assert match, page.text
    return match.group(1)


def logged_in(app: pgtasks.App, **options: Any) -> TestClient:
    tc = client(app, token=TOKEN, **options)
    token = csrf_of(tc, "/login")
    response = tc.post("/login", data={"csrf_token": token, "token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303
    return tc


def status_of(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT status FROM pgtasks.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every job's status, attempt and history, to show that nothing changed."""
    return conn.execute(
        "SELECT id, status, attempt, attempts, run_at FROM pgtasks.jobs ORDER BY id"
    ).fetchall()


def make_running(conn: psycopg.Connection[Any], job_id: int) -> None:
    """Have a (pretend) worker hold the job and start it, as a claim does."""
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'running', worker_id = 'host:1:x', started_at = now(),"
        " heartbeat_at = now(), attempt = attempt + 1 WHERE id = %s AND status = 'queued'",
        (job_id,),
    )


# -- pages ---------------------------------------------------------------------------


def test_overview_shows_depth_wait_throughput_and_failure_rate(dapp: pgtasks.App) -> None:
    echo, fail = dapp.tasks["dash.echo"], dapp.tasks["dash.fail"]
    for i in range(3):
        echo.delay(i)
    fail.delay("bob", "pw-1234567890")
    work(dapp)
    echo.delay("waiting")
    echo.apply_async(args=("later",), countdown=3600)
    tc = client(dapp)
    page = tc.get("/")
    assert page.status_code == 200
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', page.text, re.S)
    assert row is not None
    cells = re.findall(r'data-status="(\w+)">(\d+)<', row.group(1))
    assert dict(cells)["queued"] == "2" and dict(cells)["succeeded"] == "3"
    mail = re.search(r'<tr data-queue="mail">(.*?)</tr>', page.text, re.S)
    assert mail is not None and 'data-status="failed">1<' in mail.group(1)
    assert "100.0 %" in mail.group(1)  # every finished mail job failed
    assert "4 finished, 1 failed" in page.text
    assert page.text.count('class="bar-') >= 2 + 3  # bars drawn, plus the legend
    # htmx asks for the refreshing part alone.
    fragment = tc.get("/", headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and "<html" not in fragment.text and 'id="queues"' in fragment.text


def test_jobs_filters_by_status_queue_task_tenant_and_time(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    echo, fail = dapp.tasks["dash.echo"], dapp.tasks["dash.fail"]
    a = echo.apply_async(args=(1,), tenant="acme")
    b = echo.apply_async(args=(2,), tenant="globex")
    c = fail.apply_async(args=("x", "y"), tenant="acme")
    conn.execute("UPDATE pgtasks.jobs SET created_at = '2020-01-01T00:00Z' WHERE id = %s", (a.id,))
    tc = client(dapp)

    def ids(query: str) -> set[int]:
        page = tc.get(f"/jobs?{query}")
        assert page.status_code == 200, page.text
        return {int(i) for i in re.findall(r'<tr data-job="(\d+)">', page.text)}

    assert ids("") == {a.id, b.id, c.id}
    assert ids("tenant=acme") == {a.id, c.id}
    assert ids("queue=mail") == {c.id}
    assert ids("task=dash.echo&tenant=globex") == {b.id}
    assert ids("status=queued&queue=default") == {a.id, b.id}
    assert ids("until=2021-01-01T00:00") == {a.id}
    assert ids("since=2021-01-01T00:00%2B00:00&tenant=acme") == {c.id}
    assert ids("limit=1") == {c.id}
    page = tc.get("/jobs?limit=1")
    older = re.search(r'href="([^"]+)" id="next-page"', page.text)
    assert older is not None and f"before={c.id}" in older.group(1)
    empty = tc.get("/jobs?queue=nothing-here")
    assert empty.status_code == 200 and "No jobs match these filters." in empty.text


@pytest.mark.parametrize(
    ("query", "says"),
    [("status=lost", "status must be one of"), ("since=yesterday", "since must be a date"),
     ("limit=0", "limit must be in 1..")],
)  # fmt: skip
def test_a_bad_filter_is_a_400_with_the_reason(dapp: pgtasks.App, query: str, says: str) -> None:
    page = client(dapp).get(f"/jobs?{query}")
    assert page.status_code == 400
    assert says in page.text


def test_job_detail_masks_secrets_escapes_markup_and_shows_every_attempt(dapp: pgtasks.App) -> None:
    fail = dapp.tasks["dash.fail"]
    r = fail.delay("<b>bob</b>", "pw-s3cr3t-value")
    work(dapp)
    page = client(dapp).get(f"/jobs/{r.id}")
    assert page.status_code == 200
    assert "pw-s3cr3t-value" not in page.text  # masked in args, error and tracebacks
    assert "<b>bob</b>" not in page.text and "&lt;b&gt;bob&lt;/b&gt;" in page.text
    timeline = re.search(r'<ol class="timeline" id="timeline">(.*?)</ol>', page.text, re.S)
    assert timeline is not None
    attempts = re.findall(r"<b>attempt (\d+)</b> · trigger (\w+)", timeline.group(1))
    assert attempts == [("1", "api"), ("2", "retry")]
    assert timeline.group(1).count("Traceback") == 2
    assert "login refused for" in timeline.group(1) and "ValueError" in timeline.group(1)


def test_a_queued_jobs_page_says_why_it_is_not_running(dapp: pgtasks.App) -> None:
    later = dapp.tasks["dash.fail"].apply_async(("bob", "pw"), countdown=3600)
    page = client(dapp).get(f"/jobs/{later.id}")
    waiting = re.search(r'<ul class="waiting" id="job-waiting">(.*?)</ul>', page.text, re.S)
    assert waiting is not None
    codes = re.findall(r"<code>(\w+)</code>", waiting.group(1))
    assert codes == dapp.explain(later.id).codes == ["not_due", "no_worker"]
    work(dapp)  # nothing is due: the job stays queued
    assert "Why is it not running?" in client(dapp).get(f"/jobs/{later.id}").text
    done = dapp.tasks["dash.fail"].delay("bob", "pw")
    work(dapp)
    assert "Why is it not running?" not in client(dapp).get(f"/jobs/{done.id}").text


def test_requeue_shows_in_the_timeline(dapp: pgtasks.App) -> None:
    fail = dapp.tasks["dash.fail"]
    r = fail.delay("bob", "pw")
    work(dapp)
    dapp.requeue(r.id, by="admin:alice")
    page = client(dapp).get(f"/jobs/{r.id}")
    assert "requeued</b> from failed by admin:alice" in page.text


@pytest.mark.parametrize(
    "path", ["/jobs/987654", "/jobs/99999999999999999999", "/schedules/nope", "/nowhere"]
)
def test_unknown_ids_are_404(dapp: pgtasks.App, path: str) -> None:
    page = client(dapp).get(path)
    assert page.status_code == 404
    assert 'id="problem"' in page.text


def test_workers_page_shows_alive_and_lost_workers_with_their_jobs(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    workers = dapp.stores.workers
    workers.register(id="web-1:101:a", host="web-1", pid=101, queues=["default", "mail"], concurrency=4,
                     pool="threads", lease_timeout=60)  # fmt: skip
    workers.register(id="web-2:202:b", host="web-2", pid=202, queues=["backup"], concurrency=1,
                     pool="processes", lease_timeout=60)  # fmt: skip
    conn.execute("UPDATE pgtasks.workers SET lease_expires_at = now() - interval '1 minute' WHERE pid = 202")
    r = dapp.tasks["dash.echo"].delay(1)
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'running', worker_id = 'web-1:101:a', started_at = now(),"
        " heartbeat_at = now(), attempt = 1 WHERE id = %s",
        (r.id,),
    )
    page = client(dapp).get("/workers")
    assert page.status_code == 200
    alive = re.search(r'<tr data-worker="web-1:101:a">(.*?)</tr>', page.text, re.S)
    lost = re.search(r'<tr data-worker="web-2:202:b">(.*?)</tr>', page.text, re.S)
    assert alive is not None and lost is not None
    assert re.findall(r'<td class="num">(\d+)</td>', alive.group(1)) == ["101", "4", "1", "0"]
    assert "default, mail" in alive.group(1) and ">alive<" in alive.group(1)
    assert ">lost<" in lost.group(1)
    # A tenant's dashboard counts only that tenant's jobs on each worker.
    scoped = client(dapp, tenant="nobody").get("/workers")
    row = re.search(r'<tr data-worker="web-1:101:a">(.*?)</tr>', scoped.text, re.S)
    assert row is not None
    assert re.findall(r'<td class="num">(\d+)</td>', row.group(1)) == ["101", "4", "0", "0"]


def test_schedules_pages_show_next_fires_history_progress_and_partial_failure(dapp: pgtasks.App) -> None:
    run = dapp.schedules.trigger(NIGHTLY, requested_by="ops")
    work(dapp)
    tc = client(dapp)
    listing = tc.get("/schedules")
    assert listing.status_code == 200
    row = re.search(rf'<tr data-schedule="{NIGHTLY}">(.*?)</tr>', listing.text, re.S)
    assert row is not None and "0 2 * * *" in row.group(1) and "Europe/Berlin" in row.group(1)
    page = tc.get(f"/schedules/{NIGHTLY}")
    assert page.status_code == 200
    fires = re.search(r'<ul id="next-fires">(.*?)</ul>', page.text, re.S)
    assert fires is not None and len(re.findall("<li>", fires.group(1))) == 5
    # 02:00 in Berlin is 00:00 or 01:00 UTC.
    assert all(
        t in ("00:00:00", "01:00:00")
        for t in re.findall(r"\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d) UTC", fires.group(1))
    )
    runs = re.search(rf'<tr data-run="{run.id}">(.*?)</tr>', page.text, re.S)
    assert runs is not None
    assert "manual" in runs.group(1) and "by ops" in runs.group(1)
    assert 'status-partial_failure">partial failure<' in runs.group(1)
    assert "bytes_processed=4096" in runs.group(1) and "files_failed=1" in runs.group(1)
    assert "status-succeeded" not in runs.group(1)
    assert tc.get(f"/schedules/{NIGHTLY}?page=2").text.count("No runs on this page.") == 1
    assert tc.get(f"/schedules/{NIGHTLY}?page=0").status_code == 400


def test_tenants_page_shows_backlog_and_share(dapp: pgtasks.App) -> None:
    echo = dapp.tasks["dash.echo"]
    for _ in range(3):
        echo.apply_async(args=(1,), tenant="acme")
    echo.apply_async(args=(1,), tenant="globex", countdown=600)
    page = client(dapp).get("/tenants")
    assert page.status_code == 200
    acme = re.search(r'<tr data-tenant="acme">(.*?)</tr>', page.text, re.S)
    globex = re.search(r'<tr data-tenant="globex">(.*?)</tr>', page.text, re.S)
    assert acme is not None and globex is not None
    assert re.findall(r'<td class="num">(\d+)</td>', acme.group(1)) == ["3", "3", "0", "3"]
    assert re.findall(r'<td class="num">(\d+)</td>', globex.group(1)) == ["1", "0", "0", "1"]
    assert "75.0 %" in acme.group(1) and "25.0 %" in globex.group(1)
    assert "No tenant has a backlog." in client(dapp, tenant="initech").get("/tenants").text


def test_values_are_escaped_and_control_characters_shown(dapp: pgtasks.App, dsn: str) -> None:
    queue = '<img src=x onerror="alert(1)">\x1b[2J'
    r = dapp.tasks["dash.echo"].apply_async(args=("<script>alert('x')</script>",), queue="q",
                                            tenant="<i>t</i>")  # fmt: skip
    # Enqueue refuses a queue name with a control character; a row written by SQL may hold one.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgtasks.jobs SET queue = %s WHERE id = %s", (queue, r.id))
    tc = client(dapp)
    for path in ("/", "/jobs", f"/jobs/{r.id}", "/tenants"):
        page = tc.get(path)
        assert page.status_code == 200
        assert (
            "<img src=x" not in page.text and "<script>alert" not in page.text and "<i>t</i>" not in page.text
        )
        assert "\x1b" not in page.text
    assert "&lt;script&gt;alert(" in tc.get(f"/jobs/{r.id}").text
    assert "\\x1b[2J" in tc.get("/").text


# -- actions -------------------------------------------------------------------------


def test_read_only_dashboard_refuses_every_action(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    r = dapp.tasks["dash.echo"].delay(1)
    tc = client(dapp)
    assert CSRF.search(tc.get("/").text) is None  # no form to act with
    token = "0" * 64
    before = snapshot(conn)
    for path in (f"/jobs/{r.id}/cancel", f"/jobs/{r.id}/retry", "/jobs/requeue-failed",
                 f"/schedules/{NIGHTLY}/trigger", f"/schedules/{NIGHTLY}/pause"):  # fmt: skip
        response = tc.post(path, data={"csrf_token": token}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 403, path
        assert "read-only" in response.text
    assert snapshot(conn) == before
    assert not dapp.schedules.get(NIGHTLY).paused
    assert "Cancel" not in tc.get(f"/jobs/{r.id}").text


def test_actions_need_the_token_and_the_form_token(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    r = dapp.tasks["dash.echo"].delay(1)
    before = snapshot(conn)
    tc = client(dapp, token=TOKEN)
    form = csrf_of(tc, "/login")
    no_login = tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": form})
    assert no_login.status_code == 403 and "log in" in no_login.text
    wrong = tc.post(f"/jobs/{r.id}/cancel", headers={"Authorization": "Bearer guess"})
    assert wrong.status_code == 403 and "wrong token" in wrong.text
    bad_login = tc.post("/login", data={"csrf_token": form, "token": "guess"})
    assert bad_login.status_code == 403 and "wrong token" in bad_login.text
    forged_login = tc.post("/login", data={"csrf_token": "forged", "token": TOKEN})
    assert forged_login.status_code == 403
    assert snapshot(conn) == before
    # Logged in, an action still needs the session's form token (a cross-site form has none).
    tc = logged_in(dapp)
    forged = tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": "0" * 64})
    assert forged.status_code == 403 and "security token" in forged.text
    missing = tc.post(f"/jobs/{r.id}/cancel")
    assert missing.status_code == 403
    other_session = csrf_of(client(dapp, token=TOKEN), "/login")
    assert tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": other_session}).status_code == 403
    assert snapshot(conn) == before
    # The cookies are HttpOnly and SameSite=Strict.
    cookies = client(dapp, token=TOKEN).get("/").headers.get_list("set-cookie")
    assert cookies and all("httponly" in c.lower() and "samesite=strict" in c.lower() for c in cookies)


def test_cancel_and_retry_through_the_login(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    r = dapp.tasks["dash.echo"].delay(1)
    tc = logged_in(dapp)
    page = tc.get(f"/jobs/{r.id}")
    assert 'id="cancel"' in page.text and 'id="retry"' not in page.text
    form = CSRF.search(page.text)
    assert form is not None
    response = tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": form.group(1), "next": f"/jobs/{r.id}"},
                       follow_redirects=False)  # fmt: skip
    assert response.status_code == 303 and response.headers["location"] == f"/jobs/{r.id}"
    assert status_of(conn, r.id) == "cancelled"
    shown = tc.get(f"/jobs/{r.id}")
    assert f"job {r.id} cancelled" in shown.text  # the flash message, once
    assert f"job {r.id} cancelled" not in tc.get(f"/jobs/{r.id}").text
    assert 'id="retry"' in shown.text
    retry = tc.post(f"/jobs/{r.id}/retry", data={"csrf_token": form.group(1)}, follow_redirects=False)
    assert retry.status_code == 303
    assert status_of(conn, r.id) == "queued"
    row = conn.execute("SELECT attempts FROM pgtasks.jobs WHERE id = %s", (r.id,)).fetchone()
    assert row is not None and row[0][-1]["by"] == "dashboard"
    # After logging out, the same session may no longer act.
    assert tc.post("/logout", data={"csrf_token": form.group(1)}, follow_redirects=False).status_code == 303
    refused = tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": form.group(1)})
    assert refused.status_code == 403 and status_of(conn, r.id) == "queued"


def test_cancel_of_a_finished_job_and_retry_of_a_running_one_change_nothing(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    done = dapp.tasks["dash.echo"].delay(1)
    work(dapp)
    running = dapp.tasks["dash.echo"].delay(2)
    make_running(conn, running.id)
    queued = dapp.tasks["dash.echo"].delay(3)
    tc = logged_in(dapp)
    form = csrf_of(tc)
    before = snapshot(conn)
    cancel = tc.post(f"/jobs/{done.id}/cancel", data={"csrf_token": form})
    assert cancel.status_code == 409 and "already finished (succeeded); nothing changed" in cancel.text
    retry = tc.post(f"/jobs/{running.id}/retry", data={"csrf_token": form})
    assert retry.status_code == 409 and "is running" in retry.text and "nothing changed" in retry.text
    assert tc.post(f"/jobs/{queued.id}/retry", data={"csrf_token": form}).status_code == 409
    assert tc.post("/jobs/987654/retry", data={"csrf_token": form}).status_code == 404
    assert tc.post("/jobs/987654/cancel", data={"csrf_token": form}).status_code == 404
    assert snapshot(conn) == before
    # Cancelling a running job asks its worker to stop it.
    asked = tc.post(f"/jobs/{running.id}/cancel", data={"csrf_token": form}, follow_redirects=False)
    assert asked.status_code == 303
    row = conn.execute("SELECT cancel_requested FROM pgtasks.jobs WHERE id = %s", (running.id,)).fetchone()
    assert row == (True,)


def test_bulk_requeue_of_failed_jobs_honours_the_filter(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    fail = dapp.tasks["dash.fail"]
    acme = [fail.apply_async(args=("a", "p"), tenant="acme").id for _ in range(3)]
    globex = fail.apply_async(args=("g", "p"), tenant="globex").id
    work(dapp)
    assert {status_of(conn, i) for i in [*acme, globex]} == {"failed"}
    tc = client(dapp, token=TOKEN)
    response = tc.post(
        "/jobs/requeue-failed", data={"tenant": "acme", "next": "/jobs?tenant=acme"},
        headers={"Authorization": f"Bearer {TOKEN}"}, follow_redirects=False,
    )  # fmt: skip
    assert response.status_code == 303 and response.headers["location"] == "/jobs?tenant=acme"
    assert [status_of(conn, i) for i in acme] == ["queued"] * 3
    assert status_of(conn, globex) == "failed"
    again = tc.post(
        "/jobs/requeue-failed", data={"tenant": "acme"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert "no failed job matches these filters; nothing changed" in again.text
    bad = tc.post(
        "/jobs/requeue-failed", data={"since": "soon"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bad.status_code == 400
    assert status_of(conn, globex) == "failed"


def test_trigger_pause_and_resume_a_schedule(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    tc = logged_in(dapp)
    form = csrf_of(tc, f"/schedules/{NIGHTLY}")
    triggered = tc.post(f"/schedules/{NIGHTLY}/trigger", data={"csrf_token": form})
    assert triggered.status_code == 200 and "triggered: run" in triggered.text
    runs = conn.execute(
        "SELECT trigger, headers->>'requested_by' FROM pgtasks.jobs WHERE schedule_name = %s", (NIGHTLY,)
    ).fetchall()
    assert runs == [("manual", "dashboard")]
    busy = tc.post(f"/schedules/{NIGHTLY}/trigger", data={"csrf_token": form})
    assert busy.status_code == 409 and "already" in busy.text.lower()
    assert conn.execute(
        "SELECT count(*) FROM pgtasks.jobs WHERE schedule_name = %s", (NIGHTLY,)
    ).fetchone() == (1,)
    paused = tc.post(f"/schedules/{NIGHTLY}/pause", data={"csrf_token": form})
    assert paused.status_code == 200 and f"schedule '{NIGHTLY}' paused" in paused.text.replace("&#39;", "'")
    assert dapp.schedules.get(NIGHTLY).paused
    assert 'id="resume"' in paused.text
    resumed = tc.post(f"/schedules/{NIGHTLY}/resume", data={"csrf_token": form})
    assert resumed.status_code == 200 and not dapp.schedules.get(NIGHTLY).paused
    assert tc.post("/schedules/nope/trigger", data={"csrf_token": form}).status_code == 404


def test_auth_callback_decides_who_may_act(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    def admins(request: Request) -> bool:
        return request.headers.get("x-user") == "admin"

    r = dapp.tasks["dash.echo"].delay(1)
    tc = client(dapp, auth=admins)
    assert CSRF.search(tc.get(f"/jobs/{r.id}").text) is None  # no action offered to others
    form = csrf_of(tc, f"/jobs/{r.id}", headers={"x-user": "admin"})
    assert tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": form}).status_code == 403
    assert tc.post(f"/jobs/{r.id}/cancel", headers={"x-user": "admin"}).status_code == 403  # no form token
    assert status_of(conn, r.id) == "queued"
    ok = tc.post(f"/jobs/{r.id}/cancel", data={"csrf_token": form}, headers={"x-user": "admin"})
    assert ok.status_code == 200 and status_of(conn, r.id) == "cancelled"
    with pytest.raises(ConfigurationError):
        create_app(dapp, token=TOKEN, auth=admins)
    with pytest.raises(ConfigurationError):
        create_app(dapp, token="  ")
    with pytest.raises(ConfigurationError):
        create_app(dapp, refresh_seconds=-1)


# -- tenants, mounting, replica ------------------------------------------------------


def test_a_tenant_dashboard_never_crosses_its_tenant(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    echo, fail = dapp.tasks["dash.echo"], dapp.tasks["dash.fail"]
    mine = fail.apply_async(args=("a", "p"), tenant="acme")
    theirs = fail.apply_async(args=("g", "p"), tenant="globex")
    queued_theirs = echo.apply_async(args=(1,), tenant="globex")
    work(dapp)
    dapp.schedules.create("globex-report", "dash.echo", "@daily", args=(1,), tenant="globex")
    dapp.schedules.create("acme-report", "dash.echo", "@daily", args=(1,), tenant="acme")
    tc = logged_in(dapp, tenant="acme")
    form = csrf_of(tc)
    assert {int(i) for i in re.findall(r'<tr data-job="(\d+)">', tc.get("/jobs").text)} == {mine.id}
    assert re.findall(r'<tr data-job="(\d+)">', tc.get("/jobs?tenant=globex").text) == []
    assert tc.get(f"/jobs/{theirs.id}").status_code == 404
    assert tc.get(f"/jobs/{mine.id}").status_code == 200
    assert 'data-queue="default"' not in tc.get("/").text  # globex's echo jobs are not counted
    assert re.findall(r'<tr data-tenant="([^"]*)">', tc.get("/tenants").text) == []  # acme has no backlog
    schedules = re.findall(r'<tr data-schedule="([^"]+)">', tc.get("/schedules").text)
    assert schedules == ["acme-report"]
    assert tc.get("/schedules/globex-report").status_code == 404
    before = snapshot(conn)
    assert tc.post(f"/jobs/{theirs.id}/retry", data={"csrf_token": form}).status_code == 404
    assert tc.post(f"/jobs/{queued_theirs.id}/cancel", data={"csrf_token": form}).status_code == 404
    assert tc.post("/schedules/globex-report/trigger", data={"csrf_token": form}).status_code == 404
    assert tc.post("/schedules/globex-report/pause", data={"csrf_token": form}).status_code == 404
    assert snapshot(conn) == before and not dapp.schedules.get("globex-report").paused
    # The bulk requeue, even when asked for another tenant, touches only the dashboard's.
    tc.post("/jobs/requeue-failed", data={"csrf_token": form})
    tc.post("/jobs/requeue-failed", data={"csrf_token": form, "tenant": "globex"})
    assert (status_of(conn, mine.id), status_of(conn, theirs.id)) == ("queued", "failed")
    assert 'data-queue="mail"' in tc.get("/").text
    with pytest.raises(ConfigurationError):
        create_app(dapp, tenant="")


def test_mounted_inside_another_asgi_app(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    r = dapp.tasks["dash.echo"].delay(1)
    host = Starlette(routes=[Mount("/ops/tasks", app=create_app(dapp, token=TOKEN))])
    tc = TestClient(host)
    page = tc.get("/ops/tasks/jobs")
    assert page.status_code == 200
    assert f'href="http://testserver/ops/tasks/jobs/{r.id}"' in page.text
    assert 'src="http://testserver/ops/tasks/static/htmx.min.js"' in page.text
    assert tc.get("/ops/tasks/static/htmx.min.js").status_code == 200
    assert "path=/ops/tasks/" in page.headers["set-cookie"].lower()
    form = csrf_of(tc, "/ops/tasks/login")
    assert tc.post("/ops/tasks/login", data={"csrf_token": form, "token": TOKEN}).status_code == 200
    done = tc.post(f"/ops/tasks/jobs/{r.id}/cancel", data={"csrf_token": form}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/ops/tasks/jobs/{r.id}"
    assert status_of(conn, r.id) == "cancelled"


@pytest.fixture
def second_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """Another fresh, migrated database (a stand-in replica that differs from the primary)."""
    with scratch_database(admin_dsn, template=template_db, prefix="pgtasks_r") as url:
        yield url


def test_reads_go_to_the_read_dsn_and_actions_to_the_primary(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], second_dsn: str
) -> None:
    primary_job = dapp.tasks["dash.echo"].delay("on the primary")
    replica = make_app(second_dsn)
    try:
        replica_job = replica.tasks["dash.echo"].apply_async(args=("on the replica",), tenant="r")
        tc = logged_in(dapp, read_app=replica)
        page = tc.get("/jobs")
        assert re.findall(r'<tr data-job="(\d+)">', page.text) == [str(replica_job.id)]
        assert "reading from a replica" in page.text
        assert 'data-tenant="r"' in tc.get("/tenants").text
        form = csrf_of(tc)
        tc.post(f"/jobs/{primary_job.id}/cancel", data={"csrf_token": form})
        assert status_of(conn, primary_job.id) == "cancelled"
        assert replica.get_job(replica_job.id).status == "queued"
    finally:
        replica.close()


# -- command line --------------------------------------------------------------------


def test_the_token_comes_from_a_file_or_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert read_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, " from-env ")
    assert read_token(None) == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\n", encoding="utf-8")
    assert read_token(path) == "from-file"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="empty"):
        read_token(path)
    with pytest.raises(ConfigurationError, match="cannot read"):
        read_token(tmp_path / "missing")


def test_the_command_takes_no_token_on_its_command_line() -> None:
    from click.testing import CliRunner

    from pgtasks.cli import cli

    result = CliRunner().invoke(cli, ["dashboard", "--help"])
    assert result.exit_code == 0
    assert "--token-file" in result.output and "--read-dsn" in result.output and "--tenant" in result.output
    assert "--token " not in result.output
    refused = CliRunner().invoke(cli, ["dashboard", "--token", "x"])
    assert refused.exit_code == 2


def test_now_is_shown_in_utc() -> None:
    from pgtasks.dashboard.web import _when

    berlin = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert _when(berlin) == "2026-01-01 02:00:00 UTC"
    assert _when("2026-01-01T03:00:00+01:00") == "2026-01-01 02:00:00 UTC"  # as a history stores it
    assert _when("not a time") == "not a time"


# -- row-level security --------------------------------------------------------------


@pytest.fixture
def web_role(admin_dsn: str) -> Iterator[str]:
    """A login role of this test alone for the tenant-facing dashboard: not a superuser,
    not in the fleet, granted with `pgtasks.isolation.grant_tenant_role` under the mode."""
    role = f"pgtasks_dash_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(role)))
    yield role
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_under_row_level_security_a_tenant_dashboard_sees_its_rows_only(
    web_role: str, dapp: pgtasks.App, conn: psycopg.Connection[Any], dsn: str
) -> None:
    from pgtasks import isolation

    echo = dapp.tasks["dash.echo"]
    mine = [echo.apply_async(args=(i,), tenant="acme").id for i in range(2)]
    theirs = echo.apply_async(args=(9,), tenant="globex", queue="globex-only").id
    dapp.schedules.sync()
    owner = conn.execute("SELECT current_user").fetchone()
    assert owner is not None
    isolation.enable(dapp.stores, [str(owner[0])])
    isolation.grant_tenant_role(dapp.stores, web_role)
    params = conninfo_to_dict(dsn)
    params["user"] = web_role
    web = make_app(make_conninfo("", **params))
    try:
        tc = client(web, tenant="acme")
        listed = {int(i) for i in re.findall(r'<tr data-job="(\d+)">', tc.get("/jobs").text)}
        assert listed == set(mine)
        assert tc.get(f"/jobs/{theirs}").status_code == 404
        overview = tc.get("/").text
        assert 'data-queue="default"' in overview and 'data-queue="globex-only"' not in overview
        assert re.findall(r'<tr data-tenant="([^"]*)">', tc.get("/tenants").text) == ["acme"]
        # The schedule API first writes the app's code-defined schedules, which this role
        # may not: the page says so (and nothing of another tenant shows).
        refused = tc.get("/schedules")
        assert refused.status_code == 503 and "row-level security" in refused.text
        # Without a tenant, this role's transactions name none: the database shows it nothing.
        assert "No jobs yet." in client(web).get("/jobs").text
    finally:
        web.close()
