"""``--json`` on the inspection commands: one document, stable shapes, the database's values.

Every command runs for real (click's ``CliRunner``) on a real database; the parsed
document is compared with what a side connection reads from the tables. Masking and
``--tenant`` are checked against the table output of the same command; errors leave
stdout empty and say why on stderr. The examples of docs/operations.md ("JSON
output") are compared with real output, key by key.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from apps.secrets_app import APP_SPEC as SECRETS_SPEC
from apps.secrets_app import digest
from apps.secrets_app import make_app as make_secrets_app
from apps.worker_app import rows
from click.testing import CliRunner, Result

import pgtasks
from pgtasks.cli import cli
from pgtasks.errors import Reject
from pgtasks.redaction import MARK
from pgtasks.worker import Worker

DOCS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"

PASSWORD = "pa55-w0rd-xyz"
TOKEN = "tok-8f7e6d5c"
CARD = "4111111111111111"


def run(dsn: str, *args: str, app_spec: str | None = None) -> Result:
    """``pgtasks --dsn DSN [-A SPEC] ARGS`` in process."""
    prefix = ["--dsn", dsn] + (["-A", app_spec] if app_spec else [])
    if app_spec:
        sys.modules.pop(app_spec.partition(":")[0], None)  # a module's app keeps its first database
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, [*prefix, *args], env=env, catch_exceptions=False)


def run_json(dsn: str, *args: str, app_spec: str | None = None) -> Any:
    """The parsed document of a command run with ``--json`` that succeeded."""
    result = run(dsn, *args, "--json", app_spec=app_spec)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return orjson.loads(result.stdout)


def instant(text: str | None) -> dt.datetime | None:
    """An ISO time of the output, checked to carry the UTC offset."""
    if text is None:
        return None
    value = dt.datetime.fromisoformat(text)
    assert value.utcoffset() == dt.timedelta(0), text
    return value


@pytest.fixture
def seeded(app: pgtasks.App) -> pgtasks.App:
    """Jobs of two tenants on two queues: one succeeded, one failed, two queued."""

    @app.task(name="ocr", queue="ocr")
    def ocr(n: int) -> dict[str, int]:
        return {"pages": n}

    @app.task(name="boom", queue="ocr", max_retries=0)
    def boom() -> None:
        raise Reject("broken input")

    @app.task(name="mail", queue="mail")
    def mail(to: str) -> None: ...

    ocr.apply_async(args=(3,), tenant="acme")
    boom.apply_async(tenant="acme")
    Worker(app, queues=("ocr",), burst=True, poll_interval=0.05).run(install_signal_handlers=False)
    mail.apply_async(args=("a@example.com",), tenant="acme")
    mail.apply_async(args=("b@example.com",), tenant="globex", countdown=600)
    return app


# -- jobs list / show -----------------------------------------------------------------------------


def test_jobs_list_gives_every_job_as_the_database_has_it(
    seeded: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    listed = run_json(dsn, "jobs", "list")
    stored = rows(
        conn,
        "SELECT id, task_name, queue, tenant, status, attempt, max_attempts, run_at, finished_at,"
        " error->>'code' FROM pgtasks.jobs ORDER BY id DESC",
    )
    assert [
        (
            j["id"],
            j["task_name"],
            j["queue"],
            j["tenant"],
            j["status"],
            j["attempt"],
            j["max_attempts"],
            instant(j["run_at"]),
            instant(j["finished_at"]),
            j["error_code"],
        )
        for j in listed
    ] == [tuple(r) for r in stored]
    assert all(isinstance(j["id"], int) for j in listed)
    assert {j["status"] for j in listed} == {"succeeded", "failed", "queued"}

    # Filters, paging, tenant scope: the same jobs the SQL finds.
    failed = run_json(dsn, "jobs", "list", "--status", "failed")
    assert [j["id"] for j in failed] == [r[0] for r in stored if r[4] == "failed"]
    page = run_json(dsn, "jobs", "list", "--limit", "2")
    rest = run_json(dsn, "jobs", "list", "--before", str(page[-1]["id"]))
    assert [j["id"] for j in page + rest] == [r[0] for r in stored]
    globex = run_json(dsn, "jobs", "list", "--tenant", "globex")
    assert [j["id"] for j in globex] == [r[0] for r in stored if r[3] == "globex"]
    # A filter that matches nothing: an empty array, exit 0 (as the empty table).
    assert run_json(dsn, "jobs", "list", "--queue", "no-such-queue") == []
    assert run_json(dsn, "jobs", "list", "--tenant", "initech") == []


def test_jobs_show_gives_the_job_with_its_timeline(
    seeded: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (failed_id,) = [r[0] for r in rows(conn, "SELECT id FROM pgtasks.jobs WHERE status = 'failed'")]
    job = run_json(dsn, "jobs", "show", str(failed_id))
    row = rows(
        conn,
        "SELECT task_name, tenant, started_at, finished_at, error->>'message', error->>'code'"
        " FROM pgtasks.jobs WHERE id = %s",
        (failed_id,),
    )[0]
    assert (job["id"], job["task_name"], job["tenant"], job["status"]) == (
        failed_id,
        row[0],
        row[1],
        "failed",
    )
    assert (instant(job["started_at"]), instant(job["finished_at"])) == (row[2], row[3])
    assert (job["error"]["message"], job["error"]["code"]) == (row[4], row[5])
    assert job["args"] == [] and job["kwargs"] == {} and job["result"] is None
    (attempt,) = job["timeline"]
    assert (attempt["kind"], attempt["attempt"], attempt["outcome"]) == ("attempt", 1, "failed")
    assert instant(attempt["finished_at"]) == row[3]

    (done_id,) = [r[0] for r in rows(conn, "SELECT id FROM pgtasks.jobs WHERE status = 'succeeded'")]
    done = run_json(dsn, "jobs", "show", str(done_id))
    assert done["args"] == [3] and done["result"] == {"pages": 3} and done["error"] is None
    assert [(a["kind"], a["outcome"]) for a in done["timeline"]] == [("attempt", "succeeded")]

    # A requeue is an entry of its own.
    assert seeded.requeue(failed_id, by="ops")
    kinds = [(e["kind"], e.get("by")) for e in run_json(dsn, "jobs", "show", str(failed_id))["timeline"]]
    assert kinds == [("attempt", None), ("requeue", "ops")]


def test_unknown_and_other_tenants_ids_fail_with_nothing_on_stdout(
    seeded: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    before = rows(conn, "SELECT id, status, attempt FROM pgtasks.jobs ORDER BY id")
    (globex_id,) = [r[0] for r in rows(conn, "SELECT id FROM pgtasks.jobs WHERE tenant = 'globex'")]
    for args in (["999999"], [str(globex_id), "--tenant", "acme"], ["0"]):
        result = run(dsn, "jobs", "show", *args, "--json")
        assert result.exit_code == 1, (args, result.output)
        assert result.stdout == ""
        assert "no job" in result.stderr or "job id" in result.stderr, result.stderr
    # The owner sees it.
    assert run_json(dsn, "jobs", "show", str(globex_id), "--tenant", "globex")["tenant"] == "globex"
    assert rows(conn, "SELECT id, status, attempt FROM pgtasks.jobs ORDER BY id") == before


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "list", "--status", "lost"],
        ["jobs", "list", "--limit", "0"],
        ["jobs", "list", "--before", "soon"],
        ["jobs", "show", "x"],
        ["schedules", "history", "n", "--page", "0"],
        ["schedules", "next", "n", "-n", "-1"],
    ],
)
def test_bad_option_values_are_usage_errors(dsn: str, args: list[str]) -> None:
    result = run(dsn, *args, "--json")
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Error" in result.stderr


# -- masking --------------------------------------------------------------------------------------


def test_json_masks_what_the_table_masks(wdsn: str, conn: psycopg.Connection[Any]) -> None:
    secrets_app = make_secrets_app(wdsn)
    try:
        leaky = secrets_app.tasks["s.leaky"]
        card = {"number": CARD, "holder": "Ann"}
        expected = digest(PASSWORD + TOKEN + CARD)
        job_id = leaky.delay("backup", PASSWORD, TOKEN, card=card, expected=expected).id
        Worker(secrets_app, burst=True, poll_interval=0.05).run(install_signal_handlers=False)
        secrets_app.schedules.create(
            "nightly",
            "s.leaky",
            "0 2 * * *",
            args=("backup", PASSWORD, TOKEN),
            kwargs={"card": card, "expected": expected},
        )
        secrets_app.schedules.trigger("nightly")
        Worker(secrets_app, burst=True, poll_interval=0.05).run(install_signal_handlers=False)
    finally:
        secrets_app.close()
    assert rows(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'failed'") == [(2,)]

    job = run_json(wdsn, "jobs", "show", str(job_id), app_spec=SECRETS_SPEC)
    assert job["args"] == ["backup", MARK, MARK]
    assert job["kwargs"] == {"card": {"number": MARK, "holder": "Ann"}, "expected": expected}
    assert f"postgresql://backup:{MARK}@db.example/prod" in job["error"]["message"]
    assert "RuntimeError" in job["error"]["traceback"]
    schedule = run_json(wdsn, "schedules", "show", "nightly", app_spec=SECRETS_SPEC)
    assert schedule["args"] == ["backup", MARK, MARK] and schedule["kwargs"]["card"]["number"] == MARK
    (listed,) = run_json(wdsn, "schedules", "list", app_spec=SECRETS_SPEC)
    assert listed == schedule
    (run_entry,) = run_json(wdsn, "schedules", "history", "nightly", app_spec=SECRETS_SPEC)
    assert run_entry["status"] == "failed" and MARK in run_entry["error"]["message"]

    outputs = {
        name: run(wdsn, *args, app_spec=SECRETS_SPEC).stdout
        for name, args in {
            "show": ["jobs", "show", str(job_id)],
            "show --json": ["jobs", "show", str(job_id), "--json"],
            "list --json": ["jobs", "list", "--json"],
            "schedules show --json": ["schedules", "show", "nightly", "--json"],
            "history": ["schedules", "history", "nightly"],
            "history --json": ["schedules", "history", "nightly", "--json"],
        }.items()
    }
    for name, output in outputs.items():
        assert output, name
        for secret in (PASSWORD, TOKEN, CARD):
            assert secret not in output, f"{secret!r} in {name}"


# -- queues, workers ------------------------------------------------------------------------------


def test_queues_and_stats_count_as_the_database_does(
    seeded: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    seeded.stores.workers.register(
        id="h:1:w", host="h", pid=1, queues=["mail"], concurrency=1, pool="threads", lease_timeout=30
    )
    seeded.stores.jobs.claim_batch(
        queues="{mail}", worker_id="h:1:w", limit=1, max_tenants=10, fair=True
    )  # claimed ahead: running, not started
    queues = run_json(dsn, "queues")
    assert run_json(dsn, "stats") == queues
    counted = {
        (q, s): n for q, s, n in rows(conn, "SELECT queue, status, count(*) FROM pgtasks.jobs GROUP BY 1, 2")
    }
    assert [q["queue"] for q in queues] == ["mail", "ocr"]
    for q in queues:
        for status, n in q["counts"].items():
            if status == "claimed":
                continue
            expected = counted.get((q["queue"], status), 0)
            if status == "running":
                expected -= q["counts"]["claimed"]
            assert n == expected, (q["queue"], status)
    mail = queues[0]
    assert (mail["counts"]["claimed"], mail["counts"]["running"], mail["counts"]["queued"]) == (1, 0, 1)
    oldest = rows(conn, "SELECT min(run_at) FROM pgtasks.jobs WHERE queue = 'mail' AND status = 'queued'")
    assert instant(mail["oldest_queued_run_at"]) == oldest[0][0]
    assert queues[1]["oldest_queued_run_at"] is None


def test_workers_gives_each_registered_worker(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert run_json(dsn, "workers") == []
    app.stores.workers.register(
        id="h:7:a", host="h", pid=7, queues=["ocr", "mail"], concurrency=4, pool="processes", lease_timeout=30
    )
    (worker,) = run_json(dsn, "workers")
    row = rows(conn, "SELECT started_at, last_seen_at, lease_expires_at FROM pgtasks.workers")[0]
    assert {k: worker[k] for k in ("id", "host", "pid", "queues", "pool", "concurrency", "state")} == {
        "id": "h:7:a",
        "host": "h",
        "pid": 7,
        "queues": ["ocr", "mail"],
        "pool": "processes",
        "concurrency": 4,
        "state": "alive",
    }
    assert (worker["running"], worker["claimed"]) == (0, 0)
    assert tuple(instant(worker[k]) for k in ("started_at", "last_seen_at", "lease_expires_at")) == row


# -- schedules ------------------------------------------------------------------------------------


def test_schedules_list_show_history_and_next(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    @app.task(name="backup")
    def backup(target: str) -> dict[str, int]:
        return {"bytes": 10}

    app.schedules.create("nightly", "backup", "30 2 * * *", timezone="Europe/Berlin", args=("db",))
    app.schedules.create("after", "backup", None, after=["nightly"], args=("files",))
    shown = run_json(dsn, "schedules", "show", "nightly")
    assert (shown["name"], shown["cron"], shown["timezone"], shown["args"]) == (
        "nightly",
        "30 2 * * *",
        "Europe/Berlin",
        ["db"],
    )
    assert shown["state"] == "active" and shown["last_run"] is None and shown["last_outcome"] is None
    stored_next = rows(conn, "SELECT next_fire_at FROM pgtasks.schedules WHERE name = 'nightly'")[0][0]
    assert instant(shown["next_fire_at"]) == stored_next
    assert [s["name"] for s in run_json(dsn, "schedules", "list")] == ["after", "nightly"]

    run_id = app.schedules.trigger("nightly", requested_by="ops@h").id
    Worker(app, burst=True, poll_interval=0.05).run(install_signal_handlers=False)
    (entry,) = run_json(dsn, "schedules", "history", "nightly")
    row = rows(conn, "SELECT started_at, finished_at FROM pgtasks.jobs WHERE id = %s", (run_id,))[0]
    assert (entry["id"], entry["trigger"], entry["requested_by"], entry["status"], entry["outcome"]) == (
        run_id,
        "manual",
        "ops@h",
        "succeeded",
        "succeeded",
    )
    started: dt.datetime = row[0]
    finished: dt.datetime = row[1]
    assert (instant(entry["started_at"]), instant(entry["finished_at"])) == (started, finished)
    assert entry["duration_seconds"] == pytest.approx((finished - started).total_seconds())
    assert entry["error"] is None
    last = run_json(dsn, "schedules", "show", "nightly")
    assert (last["last_run"]["id"], last["last_run"]["trigger"]) == (run_id, "manual")
    assert run_json(dsn, "schedules", "history", "nightly", "--page", "2") == []

    times = run_json(dsn, "schedules", "next", "nightly", "-n", "3", "--from", "2026-03-27T12:00")
    expected = app.schedules.next_fire_times(
        "nightly", 3, after=dt.datetime(2026, 3, 27, 12, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    )
    assert [instant(t["fire_at"]) for t in times] == expected
    # Across the spring change of 29 March 2026 in Berlin (CET to CEST).
    assert [t["local"][-6:] for t in times] == ["+01:00", "+02:00", "+02:00"]
    assert run_json(dsn, "schedules", "next", "after") == []

    for args in (["show", "nope"], ["history", "nope"], ["next", "nope"]):
        result = run(dsn, "schedules", *args, "--json")
        assert result.exit_code == 1 and result.stdout == "" and "nope" in result.stderr


# -- terminal safety ------------------------------------------------------------------------------


def test_control_characters_are_escaped_and_parse_back(app: pgtasks.App, dsn: str) -> None:
    queue = "q\x1b[2J\u202e\x85end"

    @app.task(name="t\x07", queue="q")
    def marked() -> None: ...

    job_id = marked.delay().id
    # Enqueue refuses such a queue name; a row written by SQL may still hold one.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgtasks.jobs SET queue = %s WHERE id = %s", (queue, job_id))
    result = run(dsn, "queues", "--json")
    assert result.exit_code == 0
    raw = sorted(
        {f"{ord(c):#x}" for c in result.stdout if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}
    )
    assert raw == [] and "\u202e" not in result.stdout
    assert "\\u202e" in result.stdout and "\\u0085" in result.stdout
    assert orjson.loads(result.stdout)[0]["queue"] == queue
    assert run_json(dsn, "jobs", "list")[0]["task_name"] == "t\x07"


# -- the documented examples ---------------------------------------------------------------------

EXAMPLE = re.compile(r"<!--\s*json:\s*(?P<command>[^>]*?)\s*-->\s*\n```json\n(?P<body>.*?)```", re.DOTALL)
FREE_FORM = frozenset({"args", "kwargs", "headers", "progress", "result", "retry_policy"})


def documented_examples() -> dict[str, Any]:
    text = DOCS.read_text(encoding="utf-8")
    return {m.group("command"): orjson.loads(m.group("body")) for m in EXAMPLE.finditer(text)}


def same_shape(example: Any, real: Any, where: str) -> None:
    """The example has the real output's keys at every level and its types where both are set."""
    if example is None or real is None:
        return
    if isinstance(example, dict):
        assert isinstance(real, dict), where
        assert sorted(example) == sorted(real), f"{where}: documented {sorted(example)} != {sorted(real)}"
        for key, value in example.items():
            if key in FREE_FORM:
                continue
            same_shape(value, real[key], f"{where}.{key}")
        return
    if isinstance(example, list):
        assert isinstance(real, list), where
        for i, item in enumerate(example):
            if not real:
                return
            match = real[0]
            for candidate in real:
                if isinstance(item, dict) and isinstance(candidate, dict):
                    key = "kind" if "kind" in item else "name" if "name" in item else None
                    if key is not None and candidate.get(key) == item.get(key):
                        match = candidate
                        break
            same_shape(item, match, f"{where}[{i}]")
        return
    number = (int, float)
    if isinstance(example, number) and isinstance(real, number):
        return
    assert type(example) is type(real), f"{where}: documented {example!r}, real {real!r}"


def test_every_inspection_command_has_a_documented_example() -> None:
    assert sorted(documented_examples()) == [
        "check",
        "jobs list",
        "jobs show",
        "queues",
        "schedules history",
        "schedules next",
        "schedules show",
        "workers",
    ]


def test_the_documented_examples_have_the_real_shapes(app: pgtasks.App, dsn: str) -> None:
    @app.task(
        name="ocr_document", queue="ocr", max_retries=1, autoretry_for=(OSError,), default_retry_delay=0
    )
    def ocr_document(document_id: int) -> dict[str, int]:
        raise OSError("scanner busy")

    @app.task(name="nightly_backup", max_retries=0)
    def nightly_backup() -> None:
        raise Reject("disk full")

    app.schedules.create("nightly-backup", "nightly_backup", "0 2 * * *", timezone="Europe/Berlin")
    app.schedules.trigger("nightly-backup")
    job_id = ocr_document.apply_async(args=(42,), tenant="acme").id
    Worker(app, queues=("default", "ocr"), burst=True, poll_interval=0.05).run(install_signal_handlers=False)
    app.requeue(job_id, by="cli:ops")
    app.stores.workers.register(
        id="h:1:w", host="h", pid=1, queues=["ocr"], concurrency=4, pool="threads", lease_timeout=30
    )
    examples = documented_examples()
    real = {
        "jobs list": run_json(dsn, "jobs", "list"),
        "jobs show": run_json(dsn, "jobs", "show", str(job_id)),
        "queues": run_json(dsn, "queues"),
        "workers": run_json(dsn, "workers"),
        "schedules show": run_json(dsn, "schedules", "show", "nightly-backup"),
        "schedules history": run_json(dsn, "schedules", "history", "nightly-backup"),
        "schedules next": run_json(dsn, "schedules", "next", "nightly-backup", "-n", "2"),
    }
    checked = run(dsn, "check", "--json", "--max-wait", "60")
    real["check"] = orjson.loads(checked.stdout)
    for command, example in examples.items():
        same_shape(example, real[command], command)
    # A list's example shows every kind of entry it can hold.
    kinds = {e["kind"] for e in examples["jobs show"]["timeline"]}
    assert kinds == {"attempt", "requeue"}


# -- plugins and the embedded server -------------------------------------------------------------


def test_plugins_lists_the_loaded_plugins(dsn: str) -> None:
    document = run_json(dsn, "--plugin", "pgtasks_index.plugin", "plugins")
    assert document["autoload"] is False  # PGTASKS_DISABLE_PLUGIN_AUTOLOAD in run()
    names = [p["name"] for p in document["plugins"]]
    assert names == sorted(names)
    (index,) = [p for p in document["plugins"] if "pgtasks_index" in p["source"]]
    assert "pgtasks_add_commands" in index["hooks"]
    assert all(set(ep) == {"name", "value", "dist", "loaded"} for ep in document["entry_points"])


def test_embedded_status_says_not_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_EMBEDDED_DIR", str(tmp_path / "pg"))
    result = CliRunner().invoke(cli, ["embedded", "status", "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    assert orjson.loads(result.stdout) == {
        "running": False,
        "pid": None,
        "data_dir": str(tmp_path / "pg"),
        "socket_dir": None,
        "port": None,
    }


def _keys(value: Any) -> set[str]:
    """Every key of the objects in a document, at any depth (free-form values left out)."""
    if isinstance(value, dict):
        found = set(value)
        for key, item in value.items():
            if key not in FREE_FORM:
                found |= _keys(item)
        return found
    if isinstance(value, list):
        return set().union(*(_keys(item) for item in value)) if value else set()
    return set()


def test_every_documented_field_is_described() -> None:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## JSON output")
    end = text.index("\n## ", text.index("## Health checks"))
    prose = EXAMPLE.sub("", text[start:end])  # the tables and lists, not the examples themselves
    for command, example in documented_examples().items():
        missing = sorted(k for k in _keys(example) if not re.search(rf"[`.\"]{re.escape(k)}[`\"]", prose))
        assert missing == [], f"{command}: fields without a description: {missing}"
