"""The command line is safe for any data, and asks before it destroys.

* Values from the database or the app (task and queue names, tenants, arguments,
  results, errors, schedule names, worker ids) are printed literally: rich markup
  in them is text, and control characters (an ANSI "clear screen" in an error
  message) are shown as escapes instead of reaching the terminal.
* ``purge``, ``schedules delete``, ``embedded stop`` and bulk ``jobs cancel`` /
  ``jobs retry`` ask at a terminal, refuse off a terminal without ``--yes`` (exit 1,
  nothing touched), and print what they would touch with ``--dry-run``.
* ``jobs cancel`` says what happened to each job.

Every command runs for real (click's ``CliRunner``, or a subprocess on a
pseudo-terminal for the questions) against a real database.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

import pgtasks
from pgtasks.cli import cli
from pgtasks.errors import Reject
from pgtasks.worker import Worker

REPO = Path(__file__).resolve().parents[1]

# Values a careless console would read as markup, emoji codes or terminal commands.
MARKUP = "[/]"
RED = "[red]alarm[/red]"
LINK = "[link=https://evil.example]click me[/link]"
BOLD = "[bold]loud"
EMOJI = ":thumbs_up:"
CLEAR = "\x1b[2J"
BELL = "\x07"
RTL = "\u202e"


def run(dsn: str, *args: str, app_spec: str | None = None, stdin: str | None = None) -> Result:
    """``pgtasks --dsn DSN [-A SPEC] ARGS`` in process; stdin is not a terminal."""
    prefix = ["--dsn", dsn] + (["-A", app_spec] if app_spec else [])
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, [*prefix, *args], input=stdin, env=env, catch_exceptions=False)


def assert_terminal_safe(output: str) -> None:
    """No control character but newlines reached the output."""
    raw = sorted({f"{ord(c):#x}" for c in output if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0})
    assert raw == [], f"raw control characters in the output: {raw}"
    assert RTL not in output


@pytest.fixture
def weird(app: pgtasks.App) -> pgtasks.App:
    """The test app, with tasks whose names, queues and failures hold markup and escapes."""

    @app.task(name=f"mail{RED}{CLEAR}", queue=f"q{MARKUP}{LINK}")
    def marked(*args: Any, **kwargs: Any) -> dict[str, str]:
        return {"result": f"{BOLD}{EMOJI}"}

    @app.task(name=f"boom{BOLD}", queue=f"fail{MARKUP}", max_retries=0)
    def boom() -> None:
        raise Reject(f"{CLEAR}{BELL}screen cleared {RED} {RTL}reversed")

    return app


def _jobs(conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
    return [(int(i), str(s)) for i, s in conn.execute("SELECT id, status FROM pgtasks.jobs ORDER BY id")]


# -- literal output ---------------------------------------------------------------------


def test_jobs_list_show_and_queues_print_data_literally(weird: pgtasks.App, dsn: str) -> None:
    marked = weird.tasks[f"mail{RED}{CLEAR}"]
    job = marked.apply_async(args=(MARKUP, LINK), kwargs={"k": f"{EMOJI}{CLEAR}"}, tenant=f"acme{BOLD}")
    listed = run(dsn, "jobs", "list")
    assert listed.exit_code == 0, listed.output
    for text in (f"mail{RED}\\x1b[2J", f"q{MARKUP}{LINK}", f"acme{BOLD}"):
        assert text in listed.output
    assert_terminal_safe(listed.output)

    shown = run(dsn, "jobs", "show", str(job.id))
    assert shown.exit_code == 0, shown.output
    for text in (f"mail{RED}\\x1b[2J", f"q{MARKUP}{LINK}", f"acme{BOLD}", EMOJI, '"[link=https://evil'):
        assert text in shown.output
    assert_terminal_safe(shown.output)

    queues = run(dsn, "queues")
    assert queues.exit_code == 0 and f"q{MARKUP}{LINK}" in queues.output


def test_a_failed_job_s_error_and_result_cannot_act_on_the_terminal(weird: pgtasks.App, dsn: str) -> None:
    failed = weird.tasks[f"boom{BOLD}"].delay()
    done = weird.tasks[f"mail{RED}{CLEAR}"].delay()
    queues = (f"fail{MARKUP}", f"q{MARKUP}{LINK}")
    Worker(weird, queues=queues, burst=True, poll_interval=0.05).run(install_signal_handlers=False)
    assert weird.get_job(failed.id).status == "failed"

    shown = run(dsn, "jobs", "show", str(failed.id))
    assert shown.exit_code == 0, shown.output
    assert "\\x1b[2J\\x07screen cleared [red]alarm[/red] \\u202ereversed" in shown.output
    assert f"boom{BOLD}" in shown.output
    assert_terminal_safe(shown.output)

    result = run(dsn, "jobs", "show", str(done.id))
    assert result.exit_code == 0 and f"{BOLD}{EMOJI}" in result.output

    weird.stores.workers.register(
        id=f"w{LINK}{CLEAR}",
        host="h",
        pid=1,
        queues=[f"fail{MARKUP}"],
        concurrency=1,
        pool="threads",
        lease_timeout=30,
    )
    workers = run(dsn, "workers")
    assert workers.exit_code == 0, workers.output
    assert f"fail{MARKUP}" in workers.output and f"w{LINK}\\x1b[2J" in workers.output
    assert_terminal_safe(workers.output)


def test_schedules_list_show_and_history_print_data_literally(weird: pgtasks.App, dsn: str) -> None:
    name = f"nightly{RED}{LINK}"
    weird.schedules.create(name, f"mail{RED}{CLEAR}", "0 2 * * *", args=(MARKUP, CLEAR), tenant=f"t{BOLD}")
    weird.schedules.trigger(name, requested_by=f"ops{MARKUP}{CLEAR}")
    listed = run(dsn, "schedules", "list")
    assert listed.exit_code == 0, listed.output
    assert name in listed.output and f"mail{RED}\\x1b[2J" in listed.output
    one = run(dsn, "schedules", "show", name)
    assert one.exit_code == 0, one.output
    assert name in one.output and f"t{BOLD}" in one.output and "\\u001b[2J" in one.output
    history = run(dsn, "schedules", "history", name)
    assert history.exit_code == 0, history.output
    assert f"ops{MARKUP}\\x1b[2J" in history.output
    for result in (listed, one, history):
        assert_terminal_safe(result.output)


def test_messages_echo_names_with_escapes(weird: pgtasks.App, dsn: str) -> None:
    name = f"s{CLEAR}{BELL}"
    weird.schedules.create(name, f"boom{BOLD}", "0 2 * * *")
    paused = run(dsn, "schedules", "pause", name)
    assert paused.exit_code == 0 and paused.output == "schedule s\\x1b[2J\\x07: paused\n"
    missing = run(dsn, "schedules", "show", f"nope{CLEAR}")
    assert missing.exit_code == 1
    assert "\\x1b[2J" in missing.output and "\x1b" not in missing.output


# -- purge ------------------------------------------------------------------------------


def _finished_jobs(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    """Four finished jobs, ended 1 hour (succeeded, failed) and 3 days ago (succeeded,
    cancelled), and one queued job."""

    @app.task(name="plain")
    def plain() -> None: ...

    ids = [plain.delay().id for _ in range(5)]
    ages = [(ids[0], "succeeded", "1 hour"), (ids[1], "failed", "1 hour")]
    ages += [(ids[2], "succeeded", "3 days"), (ids[3], "cancelled", "3 days")]
    for job_id, status, age in ages:
        conn.execute(
            "UPDATE pgtasks.jobs SET status = %s, finished_at = now() - %s::interval"
            " WHERE id = %s AND status = 'queued'",
            (status, age, job_id),
        )


def test_purge_off_a_terminal_without_yes_refuses_and_deletes_nothing(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    _finished_jobs(app, conn)
    before = _jobs(conn)
    refused = run(dsn, "purge", "--older-than", "0")
    assert refused.exit_code == 1
    assert "stdin is not a terminal" in refused.output and "--yes" in refused.output
    assert _jobs(conn) == before


def test_purge_dry_run_counts_what_the_delete_then_deletes(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    _finished_jobs(app, conn)
    cases = [(["--older-than", "86400", "--status", "succeeded"], 1), (["--older-than", "60"], 3)]
    for options, expected in cases:
        before = _jobs(conn)
        dry = run(dsn, "purge", *options, "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert dry.output.startswith(f"would delete {expected} job(s)")
        assert _jobs(conn) == before
        done = run(dsn, "purge", *options, "--yes")
        assert done.exit_code == 0 and done.output == f"deleted {expected} job(s)\n"
        assert len(_jobs(conn)) == len(before) - expected
    assert [s for _, s in _jobs(conn)] == ["queued"]


def test_purge_older_than_must_be_a_finite_non_negative_number(dsn: str) -> None:
    for bad in ("-1", "nan", "inf"):
        result = run(dsn, "purge", "--older-than", bad, "--yes")
        assert result.exit_code == 2 and "--older-than" in result.output, bad


def _on_a_terminal(dsn: str, args: list[str], answer: str) -> tuple[int, str]:
    """Run ``pgtasks ARGS`` with stdin on a pseudo-terminal where ``answer`` is typed."""
    leader, follower = pty.openpty()
    try:
        os.write(leader, answer.encode())
        env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-m", "pgtasks", "--dsn", dsn, *args],
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=REPO,
            env=env,
        )
    finally:
        os.close(follower)
        os.close(leader)
    return done.returncode, done.stdout + done.stderr


def test_purge_at_a_terminal_asks_with_the_count(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    _finished_jobs(app, conn)
    before = _jobs(conn)
    code, output = _on_a_terminal(dsn, ["purge", "--older-than", "0"], "n\n")
    assert code == 1 and "Delete 4 job(s)" in output and "Aborted" in output
    assert _jobs(conn) == before
    code, output = _on_a_terminal(dsn, ["purge", "--older-than", "0"], "y\n")
    assert code == 0 and "deleted 4 job(s)" in output, output
    assert [s for _, s in _jobs(conn)] == ["queued"]


# -- schedules delete, embedded stop ------------------------------------------------------


def test_schedules_delete_asks_refuses_and_dry_runs(
    weird: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    weird.schedules.create("nightly", f"boom{BOLD}", "0 2 * * *", timezone="Europe/Berlin")
    count = "SELECT count(*) FROM pgtasks.schedules"
    refused = run(dsn, "schedules", "delete", "nightly")
    assert refused.exit_code == 1 and "--yes" in refused.output
    dry = run(dsn, "schedules", "delete", "nightly", "--dry-run")
    assert dry.exit_code == 0
    assert dry.output.startswith(
        "would delete schedule nightly (task boom[bold]loud, cron 0 2 * * * in Europe"
    )
    assert conn.execute(count).fetchone() == (1,)
    code, output = _on_a_terminal(dsn, ["schedules", "delete", "nightly"], "n\n")
    assert code == 1 and "Delete schedule nightly" in output
    assert conn.execute(count).fetchone() == (1,)
    deleted = run(dsn, "schedules", "delete", "nightly", "--yes")
    assert deleted.exit_code == 0 and deleted.output == "schedule nightly: deleted\n"
    assert conn.execute(count).fetchone() == (0,)
    assert run(dsn, "schedules", "delete", "nightly", "--yes").exit_code == 1  # unknown now


def test_embedded_stop_refuses_off_a_terminal_and_dry_runs(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTASKS_EMBEDDED_DIR", str(tmp_path / "pg"))  # never the user's server
    refused = run(dsn, "embedded", "stop")
    assert refused.exit_code == 1 and "--yes" in refused.output
    dry = run(dsn, "embedded", "stop", "--dry-run")
    assert dry.exit_code == 0 and dry.output.startswith("would stop nothing: no embedded server runs")
    assert run(dsn, "embedded", "stop", "--yes").output == "was not running\n"


# -- jobs cancel and retry ------------------------------------------------------------------


def test_jobs_cancel_says_what_happened(app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]) -> None:
    @app.task(name="plain")
    def plain() -> None: ...

    queued, running, finished = (plain.delay().id for _ in range(3))
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'running', attempt = 1, worker_id = 'w', started_at = now()"
        " WHERE id = %s AND status = 'queued'",
        (running,),
    )
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'succeeded', finished_at = now()"
        " WHERE id = %s AND status = 'queued'",
        (finished,),
    )
    outputs = {job_id: run(dsn, "jobs", "cancel", str(job_id)) for job_id in (queued, running, finished)}
    assert all(r.exit_code == 0 for r in outputs.values())
    assert outputs[queued].output == f"job {queued}: cancelled\n"
    assert outputs[running].output == f"job {running}: running: cancel requested (the worker stops it)\n"
    assert outputs[finished].output == f"job {finished}: already finished, nothing changed\n"
    assert app.get_job(queued).status == "cancelled"
    assert app.get_job(running).status == "running"


def test_bulk_cancel_and_retry_ask_first(app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]) -> None:
    @app.task(name="plain")
    def plain() -> None: ...

    ids = [str(plain.delay().id) for _ in range(2)]
    before = _jobs(conn)
    refused = run(dsn, "jobs", "cancel", *ids)
    assert refused.exit_code == 1 and "--yes" in refused.output
    dry = run(dsn, "jobs", "cancel", *ids, "--dry-run")
    assert dry.exit_code == 0 and dry.output.count("queued, would be cancelled") == 2
    assert _jobs(conn) == before
    assert run(dsn, "jobs", "cancel", *ids, "--yes").output.count(": cancelled\n") == 2
    assert {s for _, s in _jobs(conn)} == {"cancelled"}

    refused = run(dsn, "jobs", "retry", *ids)
    assert refused.exit_code == 1 and "--yes" in refused.output
    dry = run(dsn, "jobs", "retry", *ids, "--dry-run")
    assert dry.exit_code == 0 and dry.output.count("cancelled, would be requeued") == 2
    assert {s for _, s in _jobs(conn)} == {"cancelled"}
    assert run(dsn, "jobs", "retry", *ids, "--yes").output.count(": requeued\n") == 2
    assert {s for _, s in _jobs(conn)} == {"queued"}
    one = run(dsn, "jobs", "cancel", ids[0])  # one id: no question
    assert one.exit_code == 0 and one.output == f"job {ids[0]}: cancelled\n"


# -- a plugin's command -------------------------------------------------------------------


def test_the_index_plugin_s_search_prints_hits_literally(dsn: str) -> None:
    import pgtasks_index
    import pgtasks_index.plugin

    iapp = pgtasks.App("index", dsn=dsn, load_entry_points=False, plugins=[pgtasks_index.plugin])
    try:
        iapp.migrate()
        pgtasks_index.upsert(
            iapp,
            tenant=f"acme{CLEAR}",
            kind="document",
            key=f"doc{MARKUP}{CLEAR}",
            title=f"Report {RED} {BELL}{RTL}",
            text=f"Revenue grew {LINK} {CLEAR} in the third quarter.",
        )
    finally:
        iapp.close()
    args = ["--plugin", "pgtasks_index.plugin", "search", "revenue", "--tenant", f"acme{CLEAR}"]
    found = run(dsn, *args)
    assert found.exit_code == 0, found.output
    assert f"doc{MARKUP}\\x1b[2J" in found.output and f"Report {RED} \\x07\\u202e" in found.output
    assert "acme\\x1b[2J" in found.output
    assert_terminal_safe(found.output)


def _output_on_a_terminal(dsn: str, args: list[str]) -> str:
    """What ``pgtasks ARGS`` writes when its stdout is a (pseudo-)terminal."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        subprocess.run(
            [sys.executable, "-m", "pgtasks", "--dsn", dsn, *args],
            stdout=follower,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=True,
            cwd=REPO,
            env=env,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


def test_metrics_keep_every_queue_apart_on_a_terminal_and_in_a_pipe(app: pgtasks.App, dsn: str) -> None:
    """Queues whose names differ only in control characters (rows written by SQL: enqueue
    refuses such names) stay distinct series: piped, the exposition format byte for byte
    (click.echo used to drop the ANSI sequences, merging two of them into queue="mail"); on
    a terminal, escapes that a queue named with a literal backslash does not share."""
    from prometheus_client.parser import text_string_to_metric_families

    @app.task(name="plain", queue="mail")
    def plain() -> None: ...

    queues = ["mail\x1b[31m", "mail\x1b[32m", "mail", "mail\\x1b[31m", f"mail{RTL}"]
    ids = [plain.delay().id for _ in queues]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job_id, queue in zip(ids, queues, strict=True):
            conn.execute("UPDATE pgtasks.jobs SET queue = %s WHERE id = %s", (queue, job_id))
    args = ["--plugin", "pgtasks_metrics.plugin", "metrics"]
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    piped = subprocess.run(
        [sys.executable, "-m", "pgtasks", "--dsn", dsn, *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=True,
        cwd=REPO,
        env=env,
    ).stdout.decode("utf-8")
    queued = [
        sample.labels["queue"]
        for family in text_string_to_metric_families(piped)
        for sample in family.samples
        if sample.name == "pgtasks_jobs" and sample.labels["status"] == "queued"
    ]
    assert sorted(queued) == sorted(queues)  # one series each, none merged, none dropped
    shown = _output_on_a_terminal(dsn, args)
    assert "\x1b" not in shown and RTL not in shown
    for label in ('"mail\\x1b[31m"', '"mail\\x1b[32m"', '"mail"', '"mail\\\\x1b[31m"', '"mail\\u202e"'):
        assert shown.count(f'pgtasks_jobs{{queue={label},status="queued"}} 1.0') == 1, (label, shown)
