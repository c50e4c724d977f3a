"""Secrets never leave the task: masked in everything shown or stored but its arguments.

A real worker runs tasks given a ``password``, an ``api_token`` and a card number
named by ``redact``, which fail with an error holding a DSN with that password and
the values themselves. Then the secrets must appear in no line of the worker's log,
no output of ``pgtasks jobs show`` / ``jobs list``, and no stored column but the
job's own arguments; and the task must have received the real values (it says so
with a verdict, never the value). A secret passed by reference
(`pgtasks.secret_ref.env`) is stored nowhere at all.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.secrets_app import APP_SPEC, digest, make_app
from apps.worker_app import WorkerProcess, ledger_rows
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry, generate_latest

import pgtasks
from pgtasks import secret_ref
from pgtasks.cli import cli
from pgtasks.errors import ConfigurationError, PgtasksError
from pgtasks.loader import AppLoader
from pgtasks.redaction import MARK, RedactingFilter, Redactor, check_redact, is_sensitive, redact_text
from pgtasks.secret_ref import SecretRef
from pgtasks.serialization import dumps, loads_json
from pgtasks.settings import Settings
from pgtasks_metrics.collector import QueueCollector

PASSWORD = "hunter2-Zq9"
TOKEN = "tok-8c1f55aa"
CARD = "4111111111111111"
REF_SECRET = "s3cret-by-ref-77"
REF_VAR = "PGTASKS_TEST_BACKUP_PASSWORD"
MISSING_VAR = "PGTASKS_TEST_NEVER_SET_SECRET"


@pytest.fixture
def secrets_app(wdsn: str) -> Iterator[pgtasks.App]:
    """The secrets test app on the test database (the side that enqueues)."""
    application = make_app(wdsn)
    yield application
    application.close()


def _run_worker(dsn: str, log_path: Path, pool: str = "threads") -> str:
    """Run a burst worker of the secrets app until the queue is empty; returns its log."""
    args = ["-c", "1", "-P", pool, "--burst", "--poll-interval", "0.1"]
    worker = WorkerProcess(dsn, args, log_path, app_spec=APP_SPEC)
    try:
        assert worker.wait(60) == 0, worker.log()
    finally:
        worker.kill()
    return worker.log()


def _stored_text(conn: psycopg.Connection[Any], *, but_args_of: int | None = None) -> str:
    """Every row of every table of schema ``pgtasks`` as JSON text, leaving out the
    ``args`` and ``kwargs`` of job ``but_args_of`` (the one place a secret given
    directly is kept)."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'pgtasks' AND c.relkind IN ('r', 'p')"
        )
    ]
    assert "jobs" in tables
    parts = []
    for table in tables:
        query = f"SELECT to_jsonb(t)::text FROM pgtasks.{table} t"
        params: tuple[Any, ...] = ()
        if table == "jobs" and but_args_of is not None:
            query = (
                "SELECT CASE WHEN id = %s THEN (to_jsonb(t) - 'args' - 'kwargs') ELSE to_jsonb(t) END::text"
                " FROM pgtasks.jobs t"
            )
            params = (but_args_of,)
        parts += [r[0] for r in conn.execute(query, params)]
    return "\n".join(parts)


def _cli(dsn: str, *args: str) -> Result:
    """``pgtasks --dsn DSN -A secrets app ARGS`` in process, loading the app afresh: a
    module's app keeps the connections of the database it first used."""
    sys.modules.pop(APP_SPEC.partition(":")[0], None)
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, ["--dsn", dsn, "-A", APP_SPEC, *args], env=env, catch_exceptions=False)


# -- a real worker ------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_failing_job_shows_and_stores_its_secrets_nowhere_but_in_its_args(
    secrets_app: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path, pool: str
) -> None:
    leaky = secrets_app.tasks["s.leaky"]
    card = {"number": CARD, "holder": "Ann"}
    # Positional: the worker names them from the signature (password, api_token).
    job = leaky.delay("backup", PASSWORD, TOKEN, card=card, expected=digest(PASSWORD + TOKEN + CARD)).job()
    assert job.id is not None

    log = _run_worker(wdsn, tmp_path / "worker.log", pool)

    stored = secrets_app.get_job(job.id)
    assert stored.status == "failed"
    assert [r[4] for r in ledger_rows(conn, job.id)] == ["received"]  # the task got the real values
    # The error is kept, with the secrets masked in place.
    assert stored.error is not None
    message = stored.error["message"]
    assert f"postgresql://backup:{MARK}@db.example/prod" in message
    assert f"api token {MARK}; card {MARK}" in message
    assert "RuntimeError" in stored.error["traceback"]
    # The worker logged the failure and the task's own line, masked.
    assert "s.leaky" in log and f"password={MARK}" in log
    for secret in (PASSWORD, TOKEN, CARD):
        assert secret not in log, f"{secret!r} in the worker's log"
    # Stored: only in the job's own arguments (the task needs them; documented).
    args = conn.execute("SELECT args::text FROM pgtasks.jobs WHERE id = %s", (job.id,)).fetchone()
    assert args is not None and PASSWORD in args[0]
    everything_else = _stored_text(conn, but_args_of=job.id)
    for secret in (PASSWORD, TOKEN, CARD):
        assert secret not in everything_else, f"{secret!r} stored outside the job's args"
    # Shown: masked in `jobs show` (args, error, history) and `jobs list`.
    show = _cli(wdsn, "jobs", "show", str(job.id))
    listing = _cli(wdsn, "jobs", "list")
    assert show.exit_code == 0 and listing.exit_code == 0, show.output + listing.output
    assert '"holder":"Ann"' in show.output and MARK in show.output and str(job.id) in listing.output
    for secret in (PASSWORD, TOKEN, CARD):
        assert secret not in show.output and secret not in listing.output
    # Metrics: labels are queue, status, worker and state, never a job's arguments.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(secrets_app))
    metrics = generate_latest(registry).decode()
    assert 'status="failed"' in metrics
    assert not any(secret in metrics for secret in (PASSWORD, TOKEN, CARD))


def test_a_secret_by_reference_is_stored_nowhere_and_reaches_the_task(
    secrets_app: pgtasks.App,
    wdsn: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REF_VAR, REF_SECRET)  # the worker process inherits it
    monkeypatch.delenv(MISSING_VAR, raising=False)
    by_ref = secrets_app.tasks["s.by_ref"]
    ok = by_ref.delay("db1", secret_ref.env(REF_VAR), digest(REF_SECRET))
    missing = by_ref.delay("db1", secret_ref.env(MISSING_VAR), digest(REF_SECRET))
    refused = by_ref.delay("refuse", secret_ref.env(REF_VAR), digest(REF_SECRET))

    log = _run_worker(wdsn, tmp_path / "worker.log")

    assert ok.get(timeout=10) is True  # the task compared the real value
    assert ok.job().args[1] == SecretRef("env", REF_VAR)  # the job keeps the reference
    gone = secrets_app.get_job(missing.id)
    assert gone.status == "failed" and gone.attempt == 1
    assert gone.error is not None and gone.error["code"] == "SECRET_UNAVAILABLE"
    assert gone.error["class"] == "permanent" and MISSING_VAR in gone.error["message"]
    failed = secrets_app.get_job(refused.id)
    assert failed.status == "failed" and failed.error is not None
    assert f"login with {MARK} refused" in failed.error["message"]
    stored = _stored_text(conn)
    assert REF_VAR in stored  # the reference is stored ...
    assert REF_SECRET not in stored  # ... the value nowhere, arguments included
    assert REF_SECRET not in log and "login with" in log


def test_a_retried_attempt_keeps_its_secret_out_of_the_history_and_the_log(
    secrets_app: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    r = secrets_app.tasks["s.retry_once"].delay(PASSWORD)

    log = _run_worker(wdsn, tmp_path / "worker.log")

    assert r.get(timeout=10) == 2
    (first, *_) = r.job().history()
    assert first.error is not None and first.error["message"] == f"login refused for {MARK}"
    assert "retry in" in log and PASSWORD not in log
    assert PASSWORD not in _stored_text(conn, but_args_of=r.id)


# -- pieces -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("connect postgresql://u:pw%40x@host:5432/db", f"connect postgresql://u:{MARK}@host:5432/db"),
        ("host=h password=hunter2 user=u", f"host=h password={MARK} user=u"),
        ("host=h password='hun ter2' user=u", f"host=h password='{MARK}' user=u"),
        ("PGPASSWORD=hunter2 pg_dump", f"PGPASSWORD={MARK} pg_dump"),
        ("{'password': 'x1', 'apiToken': 'y2'}", f"{{'password': '{MARK}', 'apiToken': '{MARK}'}}"),
        (
            '{"client_secret": "abc", "X-Api-Key": "k"}',
            f'{{"client_secret": "{MARK}", "X-Api-Key": "{MARK}"}}',
        ),
        ("Authorization: Bearer abc.def", f"Authorization: {MARK}"),
        # not secrets: pgtasks' own keys, counts, ports, a mail address, a user without password
        ("lock_key=doc:42 unique_key=u1 key=k", "lock_key=doc:42 unique_key=u1 key=k"),
        ("token_count=5 password_hash=ab public_key=pk", "token_count=5 password_hash=ab public_key=pk"),
        ("redis://cache:6379/0 mail a@b.example", "redis://cache:6379/0 mail a@b.example"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
    ],
)
def test_text_masking(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_literal_values_of_at_least_four_characters_are_masked() -> None:
    assert redact_text("a pin 1234 and an id 12", values=["1234", "12"]) == f"a pin {MARK} and an id 12"
    assert redact_text("repr 'two\\nlines'", values=["two\nlines"]) == f"repr '{MARK}'"  # as a repr shows it


SENSITIVE = ["password", "db_password", "PGPASSWORD", "apiToken", "api_key", "auth", "pwd", "X-Api-Key"]
NOT_SENSITIVE = [
    "key",
    "lock_key",
    "unique_key",
    "concurrency_key",
    "tokens",
    "author",
    "path",
    "secret_name",
]


@pytest.mark.parametrize("name", SENSITIVE)
def test_sensitive_names(name: str) -> None:
    assert is_sensitive(name)


@pytest.mark.parametrize("name", NOT_SENSITIVE)
def test_not_sensitive_names(name: str) -> None:
    assert not is_sensitive(name)


def test_shown_arguments_mask_names_keys_and_dotted_paths_but_not_references() -> None:
    def task(path: str, password: str, card: dict[str, Any], *, options: dict[str, Any]) -> None: ...

    redactor = Redactor.of(task, ["card.number"])
    ref = secret_ref.env("X")
    args, kwargs = redactor.call(
        ["/a", "pw12", [{"number": "4111", "cvc": "1"}]],
        {"options": {"token": "t", "lock_key": "l", "password": ref}},
    )
    assert args == ["/a", MARK, [{"number": MARK, "cvc": "1"}]]
    assert kwargs == {"options": {"token": MARK, "lock_key": "l", "password": ref}}
    assert redactor.secrets(["/a", "pw12", {"number": "4111"}], {}) == {"pw12", "4111"}


def test_redact_option_refuses_bad_input_and_registers_nothing(secrets_app: pgtasks.App) -> None:
    for bad, words in [("password", "list"), (["a..b"], "dotted"), (["x"] * 101, "100"), ([1], "names")]:
        with pytest.raises(ConfigurationError, match="redact") as info:
            secrets_app.task(name="s.bad", redact=bad)(lambda: None)
        assert isinstance(info.value, PgtasksError) and words in str(info.value)
        assert "s.bad" not in secrets_app.tasks
    assert check_redact(["password", "card.number"]) == ("password", "card.number")


def test_secret_reference_names_are_checked_and_round_trip() -> None:
    for bad in ["", "1X", "A=B", "A B", "X" * 257, 7]:
        with pytest.raises(ConfigurationError, match=r"secret_ref\.env"):
            secret_ref.env(bad)  # type: ignore[arg-type]
    text = dumps({"pw": secret_ref.env("BACKUP_PASSWORD")})
    assert text == '{"pw":{"$pgtasks":"secret","v":"env:BACKUP_PASSWORD"}}'
    assert loads_json(text.encode()) == {"pw": SecretRef("env", "BACKUP_PASSWORD")}
    assert repr(secret_ref.env("BACKUP_PASSWORD")) == "<secret env:BACKUP_PASSWORD>"
    with pytest.raises(PgtasksError, match="secret reference"):
        loads_json(b'{"$pgtasks":"secret","v":"file:/etc/shadow"}')


def test_settings_and_app_reprs_show_no_password(wdsn: str) -> None:
    for dsn in (f"postgresql://u:{PASSWORD}@h/db", f"host=h password={PASSWORD} user=u"):
        settings = Settings(dsn=dsn)
        assert PASSWORD not in repr(settings) and MARK in repr(settings)
        app = pgtasks.App("repr-test", dsn=dsn, load_entry_points=False)
        assert PASSWORD not in repr(app) and PASSWORD not in repr(app.settings)
        assert app.settings.dsn == dsn  # the connection still gets the real one
        assert PASSWORD not in repr(AppLoader("apps.secrets_app:app", dsn, ()))  # --dsn


def test_log_filter_masks_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("pgtasks.test_secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connecting to %s with password=%s", f"postgresql://u:{PASSWORD}@h/db", PASSWORD)
        try:
            raise RuntimeError(f"refused: {{'api_token': '{TOKEN}'}}")
        except RuntimeError:
            logger.exception("job failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    out = stream.getvalue()
    assert "connecting to postgresql://u:***@h/db" in out and "RuntimeError" in out
    assert PASSWORD not in out and TOKEN not in out


def test_schedules_show_masks_the_arguments_it_will_run_with(secrets_app: pgtasks.App, wdsn: str) -> None:
    secrets_app.schedules.create(
        "nightly-backup", "s.by_ref", "0 2 * * *", args=["db1", PASSWORD], kwargs={"expected": "e1"}
    )
    shown = _cli(wdsn, "schedules", "show", "nightly-backup")
    assert shown.exit_code == 0, shown.output
    assert f'["db1","{MARK}"]' in shown.output and '"expected":"e1"' in shown.output
    assert PASSWORD not in shown.output
    assert PASSWORD in str(secrets_app.schedules.get("nightly-backup").args)  # stored as given
