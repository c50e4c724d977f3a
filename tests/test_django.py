"""The Django integration, in a real Django project (tests/django_project) on PostgreSQL.

The project is set up once for this module (Django's settings and app registry are
process-wide): ``DJANGO_SETTINGS_MODULE`` and the project's database are set for this
module only, on a database cloned from the migrated template, and Django's own
``migrate`` (which applies pgtasks' schema through the integration's migration)
creates the project's tables. Each test starts from empty tables. Requests go through
Django's test client; jobs run on a real pgtasks worker (in-process, burst).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("django")

from helpers import scratch_database

from pgtasks.errors import ConfigurationError
from pgtasks.worker import Worker, WorkerConfig

PROJECT = Path(__file__).resolve().parent / "django_project"
QUEUES = ("default", "emails")


@pytest.fixture(scope="module")
def django_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """The project's database for this module: a clone of the migrated template."""
    with scratch_database(admin_dsn, template=template_db, prefix="pgtasks_dj") as url:
        yield url


@pytest.fixture(scope="module")
def project(django_dsn: str) -> Iterator[str]:
    """Django set up on the test project, its tables migrated; yields the database's DSN."""
    import django
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import setup_test_environment, teardown_test_environment

    saved = {key: os.environ.get(key) for key in ("DJANGO_SETTINGS_MODULE", "PGTASKS_DJANGO_DSN")}
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_project.mysite.settings"
    os.environ["PGTASKS_DJANGO_DSN"] = django_dsn
    try:
        django.setup()
        setup_test_environment()
        call_command("migrate", verbosity=0)
        connections.close_all()
        yield django_dsn
        teardown_test_environment()
    finally:
        connections.close_all()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def shop(project: str) -> Iterator[str]:
    """Empty job and order tables; afterwards the app's pool and Django's connections
    are closed (no thread of theirs outlives the test)."""
    from django.db import connections

    from pgtasks.contrib.django import get_app

    with psycopg.connect(project, autocommit=True) as conn:
        conn.execute("TRUNCATE pgtasks.jobs, shop_order, auth_user CASCADE")
    yield project
    get_app().close()
    connections.close_all()


def _jobs(dsn: str) -> list[tuple[int, str, str]]:
    """(id, task name, status) of every job, seen from a connection of its own."""
    with psycopg.connect(dsn) as conn:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT id, task_name, status FROM pgtasks.jobs ORDER BY id")
        ]


def _run_worker(timeout: float = 60.0, concurrency: int = 2) -> None:
    """A burst worker of the project's app on its queues, in a thread, until no job is left."""
    from pgtasks.contrib.django import get_app

    worker = Worker(
        get_app(),
        WorkerConfig(queues=QUEUES, concurrency=concurrency, burst=True, poll_interval=0.1, lease_timeout=30),
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="django-worker")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        thread.join(30)
        raise AssertionError(f"the worker did not finish within {timeout:g} s")
    assert codes == [0]


# -- settings and start-up -----------------------------------------------------------


def test_tasks_modules_are_autodiscovered(shop: str) -> None:
    from pgtasks.contrib.django import app, get_app

    assert app is get_app()
    assert app.name == "shop"
    names = set(get_app().tasks)
    # pgtasks' own decorator and Django's @task (made pgtasks tasks when defined)
    assert {
        "django_project.shop.tasks.mark_paid",
        "django_project.shop.tasks.charge_card",
        "django_project.shop.tasks.add",
        "django_project.shop.tasks.whoami",
    } <= names
    assert "pgtasks_dj_" in str(get_app().settings.dsn)


def test_settings_are_checked() -> None:
    from pgtasks.contrib.django.conf import dsn_of_database, read_settings

    assert read_settings(None).queues == ("default",)
    assert read_settings({"QUEUES": ["a", "b"], "DATABASE": None}).database is None
    bad: object
    for bad in ({"QUEUE": ["a"]}, {"QUEUES": "a"}, {"QUEUES": []}, {"AUTODISCOVER": "yes"}, {"APP_NAME": ""},
                {"TASKS_MODULE": "my-tasks"}, ["APP_NAME"]):  # fmt: skip
        with pytest.raises(ConfigurationError):
            read_settings(bad)
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        dsn_of_database({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})
    dsn = dsn_of_database(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "shop",
            "USER": "web",
            "PASSWORD": "pw",
            "HOST": "db.internal",
            "PORT": 6432,
            "OPTIONS": {"sslmode": "require", "isolation_level": 2, "pool": True},
        }
    )
    assert psycopg.conninfo.conninfo_to_dict(dsn) == {
        "dbname": "shop", "user": "web", "password": "pw", "host": "db.internal", "port": "6432",
        "sslmode": "require",
    }  # fmt: skip


# -- transactional enqueue -------------------------------------------------------------


def test_a_request_commits_the_row_and_its_jobs_and_the_worker_runs_them(shop: str) -> None:
    from django.test import Client
    from django_project.shop.models import Order
    from django_project.shop.tasks import receipt_text

    response = Client().post("/orders/", {"customer": "ada", "total": "30"})
    assert response.status_code == 200, response.content
    body = response.json()
    order = Order.objects.get(pk=body["order"])
    assert not order.paid
    assert _jobs(shop) == [
        (body["job"], "django_project.shop.tasks.mark_paid", "queued"),
        (int(body["receipt"]), "django_project.shop.tasks.receipt_text", "queued"),
    ]

    _run_worker()

    order.refresh_from_db()
    assert order.paid  # the pgtasks task ran on the worker and wrote through Django's ORM
    result = receipt_text.get_result(body["receipt"])
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "ada paid 30"
    assert [status for _, _, status in _jobs(shop)] == ["succeeded", "succeeded"]


def test_a_failed_request_rolls_back_its_jobs_with_its_row(shop: str) -> None:
    from django.test import Client
    from django_project.shop.models import Order

    response = Client(raise_request_exception=False).post(
        "/orders/", {"customer": "bob", "total": "5", "fail": "1"}
    )
    assert response.status_code == 500
    assert Order.objects.count() == 0
    assert _jobs(shop) == []


def test_each_job_closes_django_connections_past_their_age(shop: str) -> None:
    """With ``CONN_MAX_AGE = 0`` (Django's default) a job's connection is closed after
    it, as after a request: two jobs on one worker thread open two connections."""
    from django.db.backends.signals import connection_created
    from django_project.shop.models import Order
    from django_project.shop.tasks import mark_paid

    order = Order.objects.create(customer="eve", total=2)
    mark_paid.delay_many([(order.pk,), (order.pk,)])
    opened: list[str] = []

    def note(sender: object, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection.alias)

    connection_created.connect(note)
    try:
        _run_worker(concurrency=1)
    finally:
        connection_created.disconnect(note)
    assert opened == ["default", "default"]


def test_enqueue_joins_atomic_blocks_and_savepoints(shop: str) -> None:
    from django.db import connection, transaction
    from django_project.shop.models import Order
    from django_project.shop.tasks import mark_paid

    with transaction.atomic():
        order = Order.objects.create(customer="cy", total=1)
        kept = mark_paid.delay(order.pk)
        assert _jobs(shop) == []  # not committed yet: another connection sees nothing
        with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint
            mark_paid.delay(order.pk + 1000)
            raise RuntimeError("inner block fails")
    assert _jobs(shop) == [(kept.id, "django_project.shop.tasks.mark_paid", "queued")]

    from pgtasks.contrib.django.models import Job

    with transaction.atomic():  # the ORM reads on Django's connection: it sees its own jobs
        pending = mark_paid.delay(order.pk)
        assert Job.objects.get(pk=pending.id).status == "queued"
        assert pending.id not in [job_id for job_id, _, _ in _jobs(shop)]

    with pytest.raises(RuntimeError), transaction.atomic():
        mark_paid.delay_many([(order.pk,), (order.pk,)])
        raise RuntimeError("outer block fails")
    assert len(_jobs(shop)) == 2
    assert connection.get_autocommit()


def test_a_tenant_handle_enqueues_in_the_same_transaction(shop: str) -> None:
    from django.db import transaction

    from pgtasks.contrib.django import get_app

    acme = get_app().tenant("acme")
    with pytest.raises(RuntimeError), transaction.atomic():
        acme.send_task("django_project.shop.tasks.mark_paid", args=(1,))
        raise RuntimeError("rolled back")
    assert _jobs(shop) == []
    with transaction.atomic():
        kept = acme.send_task("django_project.shop.tasks.mark_paid", args=(2,))
    assert [job.id for job in acme.list_jobs()] == [kept.id]
    assert get_app().tenant("other").list_jobs() == []


def test_enqueue_outside_atomic_commits_at_once(shop: str) -> None:
    from django.db import connection
    from django_project.shop.tasks import mark_paid

    result = mark_paid.delay(7)
    assert _jobs(shop) == [(result.id, "django_project.shop.tasks.mark_paid", "queued")]
    raw = connection.connection
    assert connection.get_autocommit() and raw is not None
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # nothing left open
    assert result.status == "queued"  # read back through pgtasks' own connections


def test_async_enqueue_without_a_connection_commits_on_pgtasks_connections(shop: str) -> None:
    import asyncio

    from django.db.backends.signals import connection_created
    from django_project.shop.tasks import mark_paid

    opened: list[str] = []

    def note(sender: object, connection: Any, **kwargs: Any) -> None:
        opened.append(connection.alias)

    connection_created.connect(note)
    try:
        result = asyncio.run(mark_paid.apply_async_async((3,)))
    finally:
        connection_created.disconnect(note)
    assert _jobs(shop) == [(result.id, "django_project.shop.tasks.mark_paid", "queued")]
    assert opened == []  # no Django connection, in any thread


def test_an_explicit_connection_wins(shop: str) -> None:
    from django_project.shop.tasks import mark_paid

    with psycopg.connect(shop) as conn:  # a transaction of the caller's own, rolled back
        mark_paid.apply_async((1,), connection=conn)
        conn.rollback()
    assert _jobs(shop) == []


# -- Django's task framework -------------------------------------------------------------


def test_django_tasks_run_on_a_pgtasks_worker(shop: str) -> None:
    from django.utils import timezone
    from django_project.shop.tasks import add, explode, shout, whoami

    from pgtasks.contrib.django import get_app

    summed = add.enqueue(2, 3)
    loud = shout.enqueue("hey")
    failing = explode.enqueue("no ink")
    context = whoami.enqueue("ctx")
    later = add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    assert summed.status == "READY" and summed.backend == "default"
    job = get_app().get_job(int(summed.id))
    assert (job.task_name, job.queue, job.priority, job.args) == (
        "django_project.shop.tasks.add",
        "default",
        10,
        [2, 3],
    )
    deferred = get_app().get_job(int(later.id))
    assert deferred.run_at > timezone.now() + timedelta(minutes=59)

    _run_worker()

    summed.refresh()
    assert summed.status == "SUCCESSFUL" and summed.is_finished
    assert summed.return_value == 5
    assert summed.worker_ids and summed.started_at is not None and summed.finished_at is not None
    assert add.get_result(summed.id).return_value == 5

    failed = explode.get_result(failing.id)
    assert failed.status == "FAILED"
    assert [e.exception_class for e in failed.errors] == [ValueError]  # OPTIONS MAX_RETRIES: 0
    assert "no ink" in failed.errors[0].traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value

    shouted: object = shout.get_result(
        loud.id
    ).return_value  # typed as the coroutine; the value is its result
    assert shouted == "HEY"

    ran = whoami.get_result(context.id)
    assert ran.return_value == {"label": "ctx", "id": context.id, "attempt": 1}

    assert add.get_result(later.id).status == "READY"  # not due yet: the burst worker left it


def test_backend_options_are_checked(shop: str) -> None:
    from pgtasks.contrib.django.backend import PgtasksBackend

    backend = PgtasksBackend(
        "other", {"OPTIONS": {"MAX_RETRIES": 2, "AUTORETRY_FOR": ["builtins.ValueError", KeyError]}}
    )
    assert (backend.max_retries, backend.autoretry_for) == (2, (ValueError, KeyError))
    for options in ({"RETRIES": 1}, {"AUTORETRY_FOR": "builtins.ValueError"}, {"AUTORETRY_FOR": [int]}):
        with pytest.raises(ConfigurationError):
            PgtasksBackend("other", {"OPTIONS": options})


def test_get_result_of_what_is_no_django_task(shop: str) -> None:
    from django_project.shop.tasks import add, mark_paid

    backend = add.get_backend()
    native = mark_paid.delay(1)
    for result_id in ("999999", "not-a-number", str(native.id), "-1"):
        with pytest.raises(Exception) as raised:
            backend.get_result(result_id)
        assert type(raised.value).__name__ == "TaskResultDoesNotExist"


def test_django_task_arguments_are_checked_at_enqueue(shop: str) -> None:
    from django.utils import timezone
    from django_project.shop.tasks import add

    from pgtasks.errors import SerializationError

    with pytest.raises(ConfigurationError):
        add.enqueue(1)  # type: ignore[call-arg]  # a missing argument
    with pytest.raises(SerializationError):
        add.enqueue(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="JSON"):
        add.enqueue(timezone.now(), 1)  # type: ignore[arg-type]  # pgtasks stores it; Django refuses it
    assert _jobs(shop) == []


# -- admin ---------------------------------------------------------------------------------


def _admin_client(*, superuser: bool = True) -> Any:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    if superuser:
        user = User.objects.create_superuser("root", "root@example.org", "pw")
    else:
        user = User.objects.create_user("viewer", "viewer@example.org", "pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client = Client()
    client.force_login(user)
    return client


def _action(client: Any, action: str, ids: list[int]) -> Any:
    return client.post(
        "/admin/pgtasks/job/", {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True
    )


def test_admin_retries_and_cancels_jobs_through_pgtasks(shop: str) -> None:
    from django_project.shop.tasks import charge_card, mark_paid

    from pgtasks.contrib.django import get_app

    declined = charge_card.delay(4, password="hunter2-secret")
    _run_worker()
    queued = mark_paid.delay(4)
    app = get_app()
    assert app.get_job(declined.id).status == "failed"

    client = _admin_client()
    listing = client.get("/admin/pgtasks/job/")
    assert listing.status_code == 200
    assert b"django_project.shop.tasks.charge_card" in listing.content

    def listed(page: Any) -> set[int]:
        return {
            i for i in (declined.id, queued.id) if f"/admin/pgtasks/job/{i}/change/".encode() in page.content
        }

    assert listed(listing) == {declined.id, queued.id}
    assert listed(client.get("/admin/pgtasks/job/", {"status": "failed"})) == {declined.id}
    assert listed(client.get("/admin/pgtasks/job/", {"q": "emails"})) == {declined.id}

    page = client.get(f"/admin/pgtasks/job/{declined.id}/change/")
    assert page.status_code == 200
    assert b"hunter2-secret" not in page.content  # the argument and the error's text, masked
    assert b"***" in page.content and b"card declined for order 4" in page.content

    response = _action(client, "cancel_jobs", [queued.id])
    assert response.status_code == 200
    assert app.get_job(queued.id).status == "cancelled"

    response = _action(client, "retry_jobs", [declined.id, queued.id])
    assert b"2 job(s) requeued" in response.content
    retried = app.get_job(declined.id)
    assert retried.status == "queued"
    assert [getattr(e, "by", None) for e in retried.timeline() if getattr(e, "kind", "") == "requeue"] == [
        "admin:root"
    ]


def test_admin_job_list_counts_at_most_its_cap(shop: str) -> None:
    from django_project.shop.tasks import mark_paid

    from pgtasks.contrib.django.admin import COUNT_CAP, CappedPaginator
    from pgtasks.contrib.django.models import Job

    mark_paid.delay_many([(i,) for i in range(5)])
    assert CappedPaginator(Job.objects.all(), 2, cap=3).count == 3
    assert CappedPaginator(Job.objects.all(), 2, cap=3).num_pages == 2
    assert CappedPaginator(Job.objects.all(), 2).count == 5 < COUNT_CAP


def test_admin_actions_need_the_change_permission(shop: str) -> None:
    from django_project.shop.tasks import mark_paid

    from pgtasks.contrib.django import get_app

    queued = mark_paid.delay(4)
    client = _admin_client(superuser=False)
    assert client.get("/admin/pgtasks/job/").status_code == 200  # may look
    _action(client, "cancel_jobs", [queued.id])
    assert get_app().get_job(queued.id).status == "queued"  # may not act
    assert client.get(f"/admin/pgtasks/job/{queued.id}/delete/").status_code == 403


def test_admin_escapes_what_it_shows(shop: str) -> None:
    from django_project.shop.tasks import mark_paid

    job = mark_paid.apply_async((1,), queue="<script>alert(1)</script>")
    page = _admin_client().get(f"/admin/pgtasks/job/{job.id}/change/")
    assert b"<script>alert(1)</script>" not in page.content
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in page.content


def test_admin_runs_pauses_and_resumes_schedules(shop: str) -> None:
    from pgtasks.contrib.django import get_app

    app = get_app()
    app.schedules.create("nightly-charge", "django_project.shop.tasks.charge_card", "0 3 * * *",
                         kwargs={"order_id": 1, "password": "sched-secret-pw"})  # fmt: skip
    client = _admin_client()
    page = client.get("/admin/pgtasks/schedule/nightly-charge/change/")
    assert page.status_code == 200
    assert b"sched-secret-pw" not in page.content and b"***" in page.content
    for action in ("run_now", "pause"):
        client.post("/admin/pgtasks/schedule/", {"action": action, "_selected_action": ["nightly-charge"]})
    assert app.schedules.get("nightly-charge").paused
    assert [(name, status) for _, name, status in _jobs(shop)] == [
        ("django_project.shop.tasks.charge_card", "queued")
    ]
    client.post("/admin/pgtasks/schedule/", {"action": "resume", "_selected_action": ["nightly-charge"]})
    assert not app.schedules.get("nightly-charge").paused
    app.schedules.delete("nightly-charge")


# -- manage.py -------------------------------------------------------------------------------


def test_manage_py_pgtasks_runs_the_command_line(shop: str, capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django_project.shop.tasks import mark_paid

    from pgtasks.contrib.django.management.commands.pgtasks import pgtasks_argv

    first = mark_paid.apply_async((1,), tenant="acme")
    mark_paid.apply_async((2,), tenant="other")
    call_command("pgtasks", "jobs", "list", "--tenant", "acme", "--json")
    listed = json.loads(capsys.readouterr().out)
    assert [job["id"] for job in listed] == [first.id]  # the tenant scope of the CLI

    assert pgtasks_argv(["worker", "--burst"]) == [
        "-A", "pgtasks.contrib.django:app", "worker", "-Q", "default,emails", "--burst",
    ]  # fmt: skip
    assert pgtasks_argv(["worker", "-Q", "emails"])[-2:] == ["-Q", "emails"]
    with pytest.raises(CommandError):
        call_command("pgtasks", "jobs", "show", "999999")


def test_manage_py_pgtasks_worker_in_its_own_process(shop: str) -> None:
    """``manage.py pgtasks worker`` re-executes itself as pgtasks' worker, which sets
    Django up again from ``DJANGO_SETTINGS_MODULE`` and runs the project's tasks."""
    from django_project.shop.models import Order
    from django_project.shop.tasks import add, mark_paid

    order = Order.objects.create(customer="dee", total=3)
    mark_paid.delay(order.pk)
    summed = add.enqueue(20, 22)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "django_project.mysite.settings",
        "PGTASKS_DJANGO_DSN": shop,
    }
    env.pop("PGTASKS_DSN", None)
    done = subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), "pgtasks", "worker", "--burst",
         "--poll-interval", "0.1"],
        cwd=PROJECT.parent, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    order.refresh_from_db()
    assert order.paid
    assert add.get_result(summed.id).return_value == 42


def test_migrate_applies_pgtasks_schema_and_the_app_follows_the_database(shop: str, empty_dsn: str) -> None:
    """Django's test runner renames the database and runs ``migrate`` there: pgtasks'
    schema is created in it, and the app reads its jobs where Django writes them."""
    from django.core.management import call_command
    from django.db import connection
    from django_project.shop.tasks import mark_paid

    from pgtasks.contrib.django import get_app

    other = psycopg.conninfo.conninfo_to_dict(empty_dsn)["dbname"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["NAME"] = other
    try:
        call_command("migrate", "pgtasks", verbosity=0)
        assert f"dbname={other}" in str(get_app().settings.dsn)
        moved = mark_paid.delay(1)  # on Django's connection, in the other database
        assert get_app().get_job(moved.id).task_name == "django_project.shop.tasks.mark_paid"
        assert _jobs(shop) == []
    finally:
        connection.close()
        connection.settings_dict.update(saved)
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone()
    assert row == (1,)
    connection.ensure_connection()
    assert f"dbname={saved['NAME']}" in str(get_app().settings.dsn)  # back with Django
    get_app().close()
