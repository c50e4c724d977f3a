"""Fuzz the ``pgtasks`` command line (click's ``CliRunner``) over a database holding odd rows.

Invariant for every command line: it ends with exit code 0 (done), 1 (a pgtasks
error, message only) or 2 (usage error), never with a traceback or an exception
escaping click; a `pgtasks.errors.PgtasksError` that escapes is printed by
``pgtasks.cli.main`` as ``Error: ...`` (exit 1) and is accepted, except a
`DatabaseError`: PostgreSQL refusing what the command line let through. What is
printed holds no terminal control sequence taken from the data (values shown to an
operator are escaped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from pgtasks.cli import cli
from pgtasks.errors import DatabaseError, PgtasksError

from .conftest import QUEUE, Harness, count_cases, fuzz_settings

# Values an operator's terminal must not interpret: ANSI escapes, rich markup, controls.
HOSTILE = [
    "\x1b[31mred\x1b[0m",
    "[bold]b[/bold]",
    "[link=http://x]l[/link]",
    "a\rb",
    "\x07bell",
    "é𝄞",
    "\u202etxt",
]
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# argv cannot hold NUL; bytes that are not UTF-8 reach Python as lone surrogates \udc80-\udcff.
argv_text = st.one_of(
    st.text(st.characters(exclude_characters="\x00"), max_size=20),
    st.sampled_from(HOSTILE),
    st.lists(
        st.sampled_from(["\udc80", "\udcff", "%", "'", "--", "-1", "9" * 30, "[", "\\"]), max_size=6
    ).map("".join),
    st.integers().map(str),
    st.sampled_from(["", " ", "0", "-0", "1e3", "nan", "inf", "9223372036854775808", "-9223372036854775809"]),
)
ids = st.one_of(st.integers().map(str), argv_text)


def _command(parts: list[Any]) -> list[str]:
    return [str(p) for p in parts]


commands = st.one_of(
    st.builds(
        lambda opts: ["jobs", "list", *opts],
        st.lists(
            st.one_of(
                st.tuples(
                    st.sampled_from(
                        ["--status", "-Q", "--queue", "--task", "--tenant", "--before", "--limit"]
                    ),
                    argv_text,
                ).map(list),
                st.just(["--json"]),
            ),
            max_size=4,
        ).map(lambda groups: [x for g in groups for x in g]),
    ),
    st.builds(lambda i: ["jobs", "show", i], ids),
    st.builds(
        lambda cmd, i: ["jobs", cmd, "--dry-run", *i],
        st.sampled_from(["retry", "cancel"]),
        st.lists(ids, min_size=1, max_size=3),
    ),
    st.builds(lambda i: ["jobs", "explain", i], ids),
    st.builds(lambda i, extra: ["jobs", "show", i, *extra], ids, st.lists(argv_text, max_size=2)),
    st.builds(
        lambda o, s: ["purge", "--dry-run", "--older-than", o, *s],
        argv_text,
        st.sampled_from([[], ["--status", "failed"], ["--status", "x"]]),
    ),
    st.builds(
        lambda cmd, name: ["schedules", cmd, name],
        st.sampled_from(["show", "history", "next", "pause", "resume", "trigger"]),
        argv_text,
    ),
    st.builds(
        lambda name, page, per: ["schedules", "history", name, "--page", page, "--per-page", per],
        argv_text,
        argv_text,
        argv_text,
    ),
    st.builds(
        lambda name, n, start: ["schedules", "next", name, "-n", n, "--start", start],
        argv_text,
        argv_text,
        argv_text,
    ),
    st.sampled_from(
        [
            ["schedules", "list"],
            ["queues"],
            ["stats"],
            ["workers"],
            ["jobs", "list", "--json"],
            ["schedules", "list", "--json"],
        ]
    ),
    st.lists(argv_text, max_size=4),
)


@pytest.fixture(scope="module")
def seeded(harness: Harness) -> Iterator[Harness]:
    """The module's database with odd rows to show: jobs and schedules named and filled
    with hostile text (queues the worker does not serve, so they stay as written)."""
    h = harness
    for n, text in enumerate(HOSTILE):
        h.conn.execute(
            "INSERT INTO pgtasks.jobs (task_name, queue, tenant, args, kwargs, headers, lock_key, status,"
            " finished_at, error) VALUES (%s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb, %s, 'failed', now(),"
            " jsonb_build_object('code', %s::text, 'message', %s::text, 'type', %s::text))",
            (
                text,
                f"q{n}{text}",
                text,
                f'["{n}", {{"$pgtasks": "nope", "v": 1}}]',
                "{}",
                "{}",
                text,
                text,
                text,
                text,
            ),
        )
        try:  # names the API may refuse (control characters): the jobs above still carry the text
            h.app.schedules.create(
                f"s{n}{text}".strip(), "fuzz.echo", "*/5 * * * *", args=[text], tenant=text
            )
        except PgtasksError:
            h.app.schedules.create(f"s{n}", "fuzz.echo", "*/5 * * * *", args=[text])
    assert h.count("schedules") == len(HOSTILE)
    yield h


def _seeded_rows(h: Harness) -> list[tuple[Any, ...]]:
    """The seeded jobs (not in the worker's queue, which runs triggered schedules)."""
    return h.conn.execute(
        "SELECT id, status, attempt, cancel_requested FROM pgtasks.jobs WHERE queue <> %s ORDER BY id",
        (QUEUE,),
    ).fetchall()


@fuzz_settings(ci=60, long=2500)
@given(argv=commands)
def test_cli_never_crashes(seeded: Harness, argv: list[str]) -> None:
    count_cases("cli")
    dsn = seeded.app.database.dsn
    before = _seeded_rows(seeded)
    result = CliRunner().invoke(cli, ["--dsn", dsn, *argv], catch_exceptions=True)
    if "--dry-run" in argv:
        assert _seeded_rows(seeded) == before, f"pgtasks {argv!r} changed jobs"
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        assert isinstance(exc, PgtasksError) and not isinstance(exc, DatabaseError), (
            f"pgtasks {argv!r} crashed: {exc!r}\n{result.output}"
        )
    else:
        assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.output)
    output = result.output
    assert "Traceback" not in output, output
    if result.exit_code != 2:  # click's usage errors echo the operator's own argument as typed
        assert not _CONTROL.search(output), f"control characters in the output of {argv!r}: {output!r}"
    output.encode("utf-8")  # no lone surrogate echoed back raw
